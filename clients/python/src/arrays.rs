//! Batch calls over numpy arrays, for bulk loads and scans: CIDs in as a `uint64` array,
//! values out as one contiguous `uint8` buffer (an `(n, size)` array, or a flat buffer
//! with offsets when the sizes differ), values in from any C-contiguous array viewed as
//! bytes.
//!
//! # Invariants
//! - Each value is copied once between the network and the array: payloads of a get are
//!   appended to one `Vec<u8>` that numpy then owns (no copy); the values of a put are
//!   copied once into one `Bytes` whose slices the requests carry. No Python object is
//!   made per item, and the copying happens with the GIL released.
//! - A large batch is sent in pieces of at most [`PIECE_ITEMS_MAX`] items and about
//!   [`PIECE_BYTES`] bytes, [`PIECES_IN_FLIGHT`] pieces at a time, results in order.
//! - The first failed item raises its exception with `index` set; a chunk whose size is
//!   not the expected one fails a fixed-size get with `InvalidArgumentError`.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use myriad_client::ClientError;
use myriad_types::{ChunkId, NodeId};
use numpy::ndarray::Array2;
use numpy::{PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyAny;

use crate::convert;
use crate::core::{Call, Core};
use crate::errors;
use crate::ops::Durability;

/// Most items in one request of an array call.
pub const PIECE_ITEMS_MAX: usize = 4096;
/// Payload bytes one request of an array call aims at (at least one item).
pub const PIECE_BYTES: usize = 1 << 20;
/// Requests of one array call in flight at once.
pub const PIECES_IN_FLIGHT: usize = 8;

/// The failed item (index into the call's items) and its error.
type ItemFailure = (usize, ClientError);

/// Runs `call` on pieces of `items` of `per_piece` items, [`PIECES_IN_FLIGHT`] at a
/// time; the results in order.
async fn in_pieces<I, T, F, Fut>(items: Vec<I>, per_piece: usize, call: F) -> Vec<T>
where
    I: Clone,
    F: FnMut(Vec<I>) -> Fut,
    Fut: Future<Output = T>,
{
    let pieces: Vec<Vec<I>> = items.chunks(per_piece.max(1)).map(<[I]>::to_vec).collect();
    stream::iter(pieces.into_iter().map(call))
        .buffered(PIECES_IN_FLIGHT)
        .collect()
        .await
}

/// A packed read: the payloads back to back and the `n + 1` offsets.
type Packed = (Vec<u8>, Vec<u64>);

/// Items per piece for values of about `size` bytes.
fn piece_items(size: usize) -> usize {
    (PIECE_BYTES / size.max(1)).clamp(1, PIECE_ITEMS_MAX)
}

/// CIDs from a `uint64` array (or anything numpy turns into one: a list of ints, an
/// `int64` array), copied into a `Vec`.
pub fn cid_vec(cids: &Bound<'_, PyAny>) -> PyResult<Vec<ChunkId>> {
    if let Ok(array) = cids.extract::<PyReadonlyArray1<u64>>() {
        if let Ok(slice) = array.as_slice() {
            return Ok(slice.iter().copied().map(ChunkId::from_raw).collect());
        }
    }
    let numpy = cids.py().import("numpy")?;
    let uint64 = numpy.getattr("uint64")?;
    let coerced = numpy.call_method1("ascontiguousarray", (cids, uint64))?;
    let array = coerced.extract::<PyReadonlyArray1<u64>>()?;
    let slice = array
        .as_slice()
        .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string()))?;
    Ok(slice.iter().copied().map(ChunkId::from_raw).collect())
}

/// The bytes of `values` (an array of `rows` rows, any dtype, C-contiguous after
/// coercion), copied once; returns them and the bytes per row.
fn value_rows(values: &Bound<'_, PyAny>, rows: usize) -> PyResult<(Bytes, usize)> {
    let direct = values
        .extract::<PyReadonlyArray2<u8>>()
        .ok()
        .filter(|array| array.is_c_contiguous());
    let array = match direct {
        Some(array) => array,
        None => {
            let numpy = values.py().import("numpy")?;
            let contiguous = numpy.call_method1("ascontiguousarray", (values,))?;
            let as_bytes = contiguous.call_method1("view", (numpy.getattr("uint8")?,))?;
            let shaped = as_bytes.call_method1("reshape", (rows, -1i64))?;
            shaped.extract::<PyReadonlyArray2<u8>>()?
        }
    };
    let shape = array.shape();
    if shape[0] != rows {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{} rows of values for {rows} CIDs",
            shape[0]
        )));
    }
    let size = shape[1];
    let slice = array
        .as_slice()
        .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string()))?;
    Ok((Bytes::copy_from_slice(slice), size))
}

/// Results of pieces in order, flattened; the first failure with its item index.
fn flatten<T>(pieces: Vec<Vec<Result<T, ClientError>>>) -> Result<Vec<T>, ItemFailure> {
    let mut values = Vec::with_capacity(pieces.iter().map(Vec::len).sum());
    for result in pieces.into_iter().flatten() {
        match result {
            Ok(value) => values.push(value),
            Err(error) => return Err((values.len(), error)),
        }
    }
    Ok(values)
}

/// The values of a batched get as one buffer of `count` rows of `size` bytes, or the
/// first item that failed (or has another size).
fn assemble(
    results: impl IntoIterator<Item = Result<Bytes, ClientError>>,
    count: usize,
    size: usize,
) -> Result<Vec<u8>, ItemFailure> {
    let mut buffer = Vec::with_capacity(count * size);
    for (index, result) in results.into_iter().enumerate() {
        match result {
            Ok(data) if data.len() == size => buffer.extend_from_slice(&data),
            Ok(data) => {
                let reason = format!("chunk has {} bytes, not {size}", data.len());
                return Err((index, ClientError::InvalidArgument(reason)));
            }
            Err(error) => return Err((index, error)),
        }
    }
    Ok(buffer)
}

/// Python value of a call that may have failed at one item.
fn item_result(py: Python<'_>, result: Result<Py<PyAny>, ItemFailure>) -> PyResult<Py<PyAny>> {
    result.map_err(|(index, error)| errors::item_to_py(py, error, index))
}

impl Core {
    /// Reads chunks of exactly `size` bytes each into one `(n, size)` `uint8` array.
    pub fn op_get_array(
        self: &Arc<Self>,
        cids: &Bound<'_, PyAny>,
        size: usize,
        timeout: Option<f64>,
    ) -> PyResult<Call<Result<Vec<u8>, ItemFailure>>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let cids = cid_vec(cids)?;
        let count = cids.len();
        // One piece: the blocking client takes the Rust client's blocking batch (sent per
        // owner on this thread over direct lanes).
        let single_piece = count <= piece_items(size);
        let blocking = single_piece.then(|| (Arc::clone(&api), cids.clone()));
        let future = async move {
            let pieces: Vec<Vec<Result<Bytes, ClientError>>> =
                in_pieces(cids, piece_items(size), move |piece| {
                    let api = Arc::clone(&api);
                    async move { api.get_batch(&piece).await }
                })
                .await;
            Ok(assemble(pieces.into_iter().flatten(), count, size))
        };
        let call = Call::new(self, timeout, future, move |py, result| match result {
            // One numpy array over the buffer as it is (no reshape of a flat one).
            Ok(buffer) => Array2::from_shape_vec((count, size), buffer)
                .map(|rows| PyArray2::from_owned_array(py, rows).into_any().unbind())
                .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string())),
            Err(failure) => item_result(py, Err(failure)),
        });
        Ok(match blocking {
            Some((api, cids)) => call.with_blocking(move || {
                let results = api.blocking().get_batch(&cids);
                Ok(assemble(results, count, size))
            }),
            None => call,
        })
    }

    /// Reads chunks of any size into one flat `uint8` buffer plus `n + 1` offsets
    /// (`uint64`): chunk `i` is `data[offsets[i]:offsets[i + 1]]`.
    pub fn op_get_packed(
        self: &Arc<Self>,
        cids: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Call<Result<Packed, ItemFailure>>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let cids = cid_vec(cids)?;
        let future = async move {
            let pieces: Vec<Vec<Result<Bytes, ClientError>>> =
                in_pieces(cids, PIECE_ITEMS_MAX, move |piece| {
                    let api = Arc::clone(&api);
                    async move { api.get_batch(&piece).await }
                })
                .await;
            let values = match flatten(pieces) {
                Ok(values) => values,
                Err(failure) => return Ok(Err(failure)),
            };
            let total = values.iter().map(Bytes::len).sum();
            let mut data = Vec::with_capacity(total);
            let mut offsets = Vec::with_capacity(values.len() + 1);
            offsets.push(0u64);
            for value in values {
                data.extend_from_slice(&value);
                offsets.push(data.len() as u64);
            }
            Ok(Ok((data, offsets)))
        };
        Ok(Call::new(self, timeout, future, |py, result| {
            let value = result.map(|(data, offsets)| {
                let pair = (
                    PyArray1::from_vec(py, data),
                    PyArray1::from_vec(py, offsets),
                );
                convert::object(py, pair)
            });
            match value {
                Ok(object) => object,
                Err(failure) => item_result(py, Err(failure)),
            }
        }))
    }

    /// Replaces chunks' bytes with the rows of `values` (row `i` for `cids[i]`).
    pub fn op_put_array(
        self: &Arc<Self>,
        cids: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Result<(), ItemFailure>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let cids = cid_vec(cids)?;
        let (bytes, size) = value_rows(values, cids.len())?;
        let items: Vec<(ChunkId, Bytes)> = cids
            .iter()
            .enumerate()
            .map(|(row, cid)| (*cid, bytes.slice(row * size..(row + 1) * size)))
            .collect();
        let blocking =
            (items.len() <= piece_items(size)).then(|| (Arc::clone(&api), items.clone()));
        let future = async move {
            let pieces: Vec<Vec<Result<(), ClientError>>> =
                in_pieces(items, piece_items(size), move |piece| {
                    let api = Arc::clone(&api);
                    async move { api.put_batch(&piece).await }
                })
                .await;
            Ok(flatten(pieces).map(drop))
        };
        let call = Call::new(self, timeout, future, |py, result| {
            item_result(py, result.map(|()| py.None()))
        });
        Ok(match blocking {
            Some((api, items)) => call.with_blocking(move || {
                Ok(flatten(vec![api.blocking().put_batch(&items)]).map(drop))
            }),
            None => call,
        })
    }

    /// Creates one chunk per row of `values` on `peer`; returns their CIDs as `uint64`.
    pub fn op_create_array(
        self: &Arc<Self>,
        peer: u16,
        values: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Vec<ChunkId>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let rows = values.len()?;
        let (bytes, size) = value_rows(values, rows)?;
        let payloads: Vec<Bytes> = (0..rows)
            .map(|row| bytes.slice(row * size..(row + 1) * size))
            .collect();
        let future = async move {
            let pieces: Vec<Result<Vec<ChunkId>, ClientError>> =
                in_pieces(payloads, piece_items(size), move |piece| {
                    let api = Arc::clone(&api);
                    async move { api.create_with_data(NodeId(peer), piece).await }
                })
                .await;
            let mut cids = Vec::with_capacity(rows);
            for piece in pieces {
                cids.extend(piece?);
            }
            Ok(cids)
        };
        Ok(Call::new(
            self,
            timeout,
            future,
            |py, cids: Vec<ChunkId>| {
                let raw: Vec<u64> = cids.into_iter().map(ChunkId::raw).collect();
                Ok(PyArray1::from_vec(py, raw).into_any().unbind())
            },
        ))
    }

    /// Removes the chunks of a CID array.
    pub fn op_remove_array(
        self: &Arc<Self>,
        cids: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Result<(), ItemFailure>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let cids = cid_vec(cids)?;
        let future = async move {
            let pieces: Vec<Vec<Result<(), ClientError>>> =
                in_pieces(cids, PIECE_ITEMS_MAX, move |piece| {
                    let api = Arc::clone(&api);
                    async move { api.remove_batch(&piece).await }
                })
                .await;
            Ok(flatten(pieces).map(drop))
        };
        Ok(Call::new(self, timeout, future, |py, result| {
            item_result(py, result.map(|()| py.None()))
        }))
    }
}

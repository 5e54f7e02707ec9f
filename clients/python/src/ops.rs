//! Every client operation once, as a [`Call`]: its arguments taken from Python (with the
//! GIL held), its future on the Rust client, its timeout and its Python result. The
//! blocking [`crate::client::Client`] and the async [`crate::aio::AsyncClient`] both
//! expose these (see the `calls!` macro in `client.rs`).
//!
//! Chunk calls use the chunk API of the call's timeout and durability
//! ([`Core::chunks`]); metadata calls (nameservice, barriers, temporary storage, node
//! list, status) are bounded by the call's timeout in [`Call`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_meta::{NodeState, Role};
use myriad_types::{ChunkId, NodeId};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyAny;

use crate::convert;
use crate::core::{seconds, Call, Core};
use crate::errors;

/// Optional per-call durability argument.
pub type Durability<'a, 'py> = Option<&'a Bound<'py, PyAny>>;

/// A CID from Python.
pub fn cid(raw: u64) -> ChunkId {
    ChunkId::from_raw(raw)
}

/// CIDs from Python.
pub fn cids(raw: &[u64]) -> Vec<ChunkId> {
    raw.iter().copied().map(ChunkId::from_raw).collect()
}

fn none(py: Python<'_>, _: ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

fn cid_list(py: Python<'_>, list: Vec<ChunkId>) -> PyResult<Py<PyAny>> {
    convert::object(py, list.into_iter().map(ChunkId::raw).collect::<Vec<_>>())
}

fn batch_none(
    py: Python<'_>,
    results: Vec<Result<(), myriad_client::ClientError>>,
) -> PyResult<Py<PyAny>> {
    errors::all_ok(py, results)?;
    Ok(py.None())
}

/// A payload from Python bytes (one copy, owned by the request).
pub fn payload(data: &PyBackedBytes) -> Bytes {
    Bytes::copy_from_slice(data)
}

impl Core {
    // ----- chunks ----------------------------------------------------------------------

    /// Creates one zeroed chunk of `size` bytes on `peer`.
    pub fn op_create(
        self: &Arc<Self>,
        peer: u16,
        size: u64,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<ChunkId>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let future = async move { api.create(NodeId(peer), size).await };
        Ok(Call::new(self, timeout, future, |py, cid: ChunkId| {
            convert::object(py, cid.raw())
        }))
    }

    /// Creates zeroed chunks of these sizes on `peer` (all or nothing).
    pub fn op_create_batch(
        self: &Arc<Self>,
        peer: u16,
        sizes: Vec<u64>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Vec<ChunkId>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let future = async move { api.create_batch(NodeId(peer), &sizes).await };
        Ok(Call::new(self, timeout, future, cid_list))
    }

    /// Creates chunks holding these payloads on `peer` (all or nothing).
    pub fn op_create_with_data(
        self: &Arc<Self>,
        peer: u16,
        payloads: Vec<PyBackedBytes>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Vec<ChunkId>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let payloads: Vec<Bytes> = payloads.iter().map(payload).collect();
        let future = async move { api.create_with_data(NodeId(peer), payloads).await };
        Ok(Call::new(self, timeout, future, cid_list))
    }

    /// Reads one chunk.
    pub fn op_get(self: &Arc<Self>, cid: u64, timeout: Option<f64>) -> PyResult<Call<Bytes>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let future = async move { api.get(self::cid(cid)).await };
        Ok(Call::new(self, timeout, future, convert::bytes))
    }

    /// Reads many chunks; the first failed item raises (with its `index`).
    pub fn op_get_batch(
        self: &Arc<Self>,
        cids: Vec<u64>,
        timeout: Option<f64>,
    ) -> PyResult<Call<Vec<Result<Bytes, myriad_client::ClientError>>>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let cids = self::cids(&cids);
        let future = async move { Ok(api.get_batch(&cids).await) };
        Ok(Call::new(self, timeout, future, |py, results| {
            let values = errors::all_ok(py, results)?;
            let list = values
                .into_iter()
                .map(|data| convert::bytes(py, data))
                .collect::<PyResult<Vec<_>>>()?;
            convert::object(py, list)
        }))
    }

    /// Replaces one chunk's bytes.
    pub fn op_put(
        self: &Arc<Self>,
        cid: u64,
        data: PyBackedBytes,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<()>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let data = payload(&data);
        let future = async move { api.put(self::cid(cid), data).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// Replaces many chunks' bytes; the first failed item raises.
    pub fn op_put_batch(
        self: &Arc<Self>,
        items: Vec<(u64, PyBackedBytes)>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Vec<Result<(), myriad_client::ClientError>>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let items: Vec<(ChunkId, Bytes)> = items
            .iter()
            .map(|(raw, data)| (cid(*raw), payload(data)))
            .collect();
        let future = async move { Ok(api.put_batch(&items).await) };
        Ok(Call::new(self, timeout, future, batch_none))
    }

    /// Removes one chunk.
    pub fn op_remove(
        self: &Arc<Self>,
        cid: u64,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<()>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let future = async move { api.remove(self::cid(cid)).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// Removes many chunks; the first failed item raises.
    pub fn op_remove_batch(
        self: &Arc<Self>,
        cids: Vec<u64>,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<Vec<Result<(), myriad_client::ClientError>>>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let cids = self::cids(&cids);
        let future = async move { Ok(api.remove_batch(&cids).await) };
        Ok(Call::new(self, timeout, future, batch_none))
    }

    /// A chunk's size in bytes.
    pub fn op_size(self: &Arc<Self>, cid: u64, timeout: Option<f64>) -> PyResult<Call<u64>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let future = async move { api.status(self::cid(cid)).await };
        Ok(Call::new(self, timeout, future, |py, size: u64| {
            convert::object(py, size)
        }))
    }

    /// Reads `length` bytes at `offset` of a chunk.
    pub fn op_read_at(
        self: &Arc<Self>,
        cid: u64,
        offset: u64,
        length: u64,
        timeout: Option<f64>,
    ) -> PyResult<Call<Bytes>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let future = async move { api.read_at(self::cid(cid), offset, length).await };
        Ok(Call::new(self, timeout, future, convert::bytes))
    }

    /// Overwrites bytes at `offset` of a chunk.
    pub fn op_write_at(
        self: &Arc<Self>,
        cid: u64,
        offset: u64,
        data: PyBackedBytes,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<()>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let data = payload(&data);
        let future = async move { api.write_at(self::cid(cid), offset, data).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// Changes a chunk's size (common prefix kept, growth zero-filled).
    pub fn op_resize(
        self: &Arc<Self>,
        cid: u64,
        size: u64,
        timeout: Option<f64>,
        durability: Durability,
    ) -> PyResult<Call<()>> {
        let (api, timeout) = self.chunks(timeout, durability)?;
        let future = async move { api.resize(self::cid(cid), size).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// Takes a chunk's write (or read) lock, waiting at most `wait` seconds at the owner.
    pub fn op_lock(
        self: &Arc<Self>,
        cid: u64,
        write: bool,
        wait: f64,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let wait = if wait == 0.0 {
            Duration::ZERO
        } else {
            seconds(wait, "wait")?
        };
        let future = async move { api.lock(self::cid(cid), write, wait).await };
        Ok(Call::new(self, timeout + wait, future, none))
    }

    /// Releases a lock this client holds.
    pub fn op_unlock(
        self: &Arc<Self>,
        cid: u64,
        write: bool,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (api, timeout) = self.chunks(timeout, None)?;
        let future = async move { api.unlock(self::cid(cid), write).await };
        Ok(Call::new(self, timeout, future, none))
    }

    // ----- nameservice -------------------------------------------------------------------

    /// Binds `name` to `cid`.
    pub fn op_name_register(
        self: &Arc<Self>,
        name: String,
        cid: u64,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.name_register(&name, self::cid(cid)).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// The CID bound to `name`, or `None`.
    pub fn op_name_get(
        self: &Arc<Self>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Call<Option<ChunkId>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.name_get(&name).await };
        Ok(Call::new(
            self,
            timeout,
            future,
            |py, cid: Option<ChunkId>| convert::object(py, cid.map(ChunkId::raw)),
        ))
    }

    /// Every name with its CID, as a dict.
    pub fn op_name_list(
        self: &Arc<Self>,
        timeout: Option<f64>,
    ) -> PyResult<Call<Vec<(String, ChunkId)>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.name_list().await };
        Ok(Call::new(
            self,
            timeout,
            future,
            |py, names: Vec<(String, ChunkId)>| {
                let map: std::collections::BTreeMap<String, u64> = names
                    .into_iter()
                    .map(|(name, cid)| (name, cid.raw()))
                    .collect();
                convert::object(py, map)
            },
        ))
    }

    /// Removes a name.
    pub fn op_name_remove(
        self: &Arc<Self>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.name_remove(&name).await };
        Ok(Call::new(self, timeout, future, none))
    }

    // ----- barriers ----------------------------------------------------------------------

    /// Allocates a barrier for `size` participants; returns its ID.
    pub fn op_barrier_alloc(
        self: &Arc<Self>,
        size: u32,
        timeout: Option<f64>,
    ) -> PyResult<Call<u32>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.barrier_alloc(size).await };
        Ok(Call::new(self, timeout, future, |py, id: u32| {
            convert::object(py, id)
        }))
    }

    /// Signs on to a barrier and waits (at most `timeout`) for the round to complete;
    /// returns every participant's `(node, value)`.
    pub fn op_barrier_sign_on(
        self: &Arc<Self>,
        id: u32,
        value: u64,
        timeout: Option<f64>,
    ) -> PyResult<Call<Vec<(NodeId, u64)>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.barrier_sign_on(id, value, timeout).await };
        Ok(Call::new(
            self,
            timeout,
            future,
            |py, values: Vec<(NodeId, u64)>| {
                let list: Vec<(u16, u64)> = values.into_iter().map(|(n, v)| (n.0, v)).collect();
                convert::object(py, list)
            },
        ))
    }

    /// A barrier's status dict, or `None`.
    pub fn op_barrier_status(
        self: &Arc<Self>,
        id: u32,
        timeout: Option<f64>,
    ) -> PyResult<Call<Option<myriad_proto::meta::BarrierStatus>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.barrier_status(id).await };
        Ok(Call::new(self, timeout, future, convert::barrier))
    }

    /// Changes a barrier's participant count.
    pub fn op_barrier_resize(
        self: &Arc<Self>,
        id: u32,
        size: u32,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.barrier_resize(id, size).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// Frees a barrier.
    pub fn op_barrier_free(self: &Arc<Self>, id: u32, timeout: Option<f64>) -> PyResult<Call<()>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.barrier_free(id).await };
        Ok(Call::new(self, timeout, future, none))
    }

    // ----- temporary storage -------------------------------------------------------------

    /// Stores a new blob (fails if the name exists) or, with `replace`, any blob.
    pub fn op_tmp_put(
        self: &Arc<Self>,
        name: String,
        data: PyBackedBytes,
        replace: bool,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let data = payload(&data);
        let future = async move {
            if replace {
                client.tmp_put(&name, data).await
            } else {
                client.tmp_create(&name, data).await
            }
        };
        Ok(Call::new(self, timeout, future, none))
    }

    /// A blob from temporary storage, or `None`.
    pub fn op_tmp_get(
        self: &Arc<Self>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Call<Option<Bytes>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.tmp_get(&name).await };
        Ok(Call::new(
            self,
            timeout,
            future,
            |py, data: Option<Bytes>| data.map_or(Ok(py.None()), |data| convert::bytes(py, data)),
        ))
    }

    /// Removes a blob from temporary storage.
    pub fn op_tmp_remove(
        self: &Arc<Self>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Call<()>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.tmp_remove(&name).await };
        Ok(Call::new(self, timeout, future, none))
    }

    /// Names and sizes of the blobs in temporary storage, as a dict.
    pub fn op_tmp_list(
        self: &Arc<Self>,
        timeout: Option<f64>,
    ) -> PyResult<Call<Vec<(String, u64)>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.tmp_list().await };
        Ok(Call::new(
            self,
            timeout,
            future,
            |py, list: Vec<(String, u64)>| {
                convert::object(
                    py,
                    list.into_iter()
                        .collect::<std::collections::BTreeMap<_, _>>(),
                )
            },
        ))
    }

    // ----- cluster -----------------------------------------------------------------------

    /// The superpeers' node table, as a list of dicts.
    pub fn op_nodes(
        self: &Arc<Self>,
        timeout: Option<f64>,
    ) -> PyResult<Call<Vec<myriad_meta::NodeRecord>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.nodes().await };
        Ok(Call::new(self, timeout, future, convert::nodes))
    }

    /// The IDs of the alive peers, ascending.
    pub fn op_peers(self: &Arc<Self>, timeout: Option<f64>) -> PyResult<Call<Vec<u16>>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move {
            let mut peers: Vec<u16> = client
                .nodes()
                .await?
                .into_iter()
                .filter(|node| node.role == Role::Peer && node.state == NodeState::Alive)
                .map(|node| node.id.0)
                .collect();
            peers.sort_unstable();
            Ok(peers)
        };
        Ok(Call::new(self, timeout, future, |py, peers: Vec<u16>| {
            convert::object(py, peers)
        }))
    }

    /// The superpeer group's status dict.
    pub fn op_status(
        self: &Arc<Self>,
        timeout: Option<f64>,
    ) -> PyResult<Call<myriad_proto::meta::StatusReply>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.status().await };
        Ok(Call::new(self, timeout, future, convert::status))
    }

    /// The superpeer leader's recovery table, as a dict.
    pub fn op_recovery_status(
        self: &Arc<Self>,
        timeout: Option<f64>,
    ) -> PyResult<Call<myriad_proto::recovery::RecoveryStatusReply>> {
        let (client, timeout) = (self.client().clone(), self.timeout(timeout)?);
        let future = async move { client.recovery_status().await };
        Ok(Call::new(self, timeout, future, convert::recovery))
    }
}

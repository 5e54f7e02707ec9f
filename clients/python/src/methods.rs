//! The methods that [`Client`] (blocking) and [`AsyncClient`] (`asyncio`) share: one
//! list, expanded by `calls!` into both classes, each method one [`crate::ops`] or
//! [`crate::arrays`] call run with `Call::block` or `Call::spawn`. Their Python
//! signatures and docs are also in `python/myriad/_myriad.pyi`.
//!
//! `get`, `put` and `lock` are not here: the blocking client has its own (a single get or
//! put takes the Rust client's direct blocking path; a lock is a context manager).

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyAny;

use crate::aio::AsyncClient;
use crate::client::Client;

/// Expands each `fn name(args) [core] => call;` into a blocking method of [`Client`]
/// and an awaitable-returning method of [`AsyncClient`].
macro_rules! calls {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident : $ty:ty),*) [$core:ident] => $body:expr;
    )*) => {
        #[pymethods]
        impl Client {
            $(
                $(#[$attr])*
                fn $name(&self, py: Python<'_>, $($arg: $ty),*) -> PyResult<Py<PyAny>> {
                    let $core = self.core();
                    ($body)?.block(py)
                }
            )*
        }

        #[pymethods]
        impl AsyncClient {
            $(
                $(#[$attr])*
                fn $name<'py>(
                    &self,
                    py: Python<'py>,
                    $($arg: $ty),*
                ) -> PyResult<Bound<'py, PyAny>> {
                    let $core = self.core();
                    ($body)?.spawn(py)
                }
            )*
        }
    };
}

calls! {
    /// Creates one zeroed chunk of `size` bytes on peer `peer`; returns its CID.
    #[pyo3(signature = (peer, size, *, timeout=None, durability=None))]
    fn create(peer: u16, size: u64, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_create(peer, size, timeout, durability);

    /// Creates zeroed chunks of these sizes on `peer` (all or nothing); returns the CIDs.
    #[pyo3(signature = (peer, sizes, *, timeout=None, durability=None))]
    fn create_batch(peer: u16, sizes: Vec<u64>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_create_batch(peer, sizes, timeout, durability);

    /// Creates chunks holding these payloads on `peer` (all or nothing); returns the CIDs.
    #[pyo3(signature = (peer, payloads, *, timeout=None, durability=None))]
    fn create_with_data(peer: u16, payloads: Vec<PyBackedBytes>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_create_with_data(peer, payloads, timeout, durability);

    /// Reads many chunks; returns their bytes in order. The first failed item raises
    /// (its exception's `index` names it).
    #[pyo3(signature = (cids, *, timeout=None))]
    fn get_batch(cids: Vec<u64>, timeout: Option<f64>)
        [core] => core.op_get_batch(cids, timeout);

    /// Replaces many chunks' bytes: `items` is a sequence of `(cid, data)`.
    #[pyo3(signature = (items, *, timeout=None, durability=None))]
    fn put_batch(items: Vec<(u64, PyBackedBytes)>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_put_batch(items, timeout, durability);

    /// Removes one chunk.
    #[pyo3(signature = (cid, *, timeout=None, durability=None))]
    fn remove(cid: u64, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_remove(cid, timeout, durability);

    /// Removes many chunks.
    #[pyo3(signature = (cids, *, timeout=None, durability=None))]
    fn remove_batch(cids: Vec<u64>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_remove_batch(cids, timeout, durability);

    /// A chunk's size in bytes.
    #[pyo3(signature = (cid, *, timeout=None))]
    fn size(cid: u64, timeout: Option<f64>)
        [core] => core.op_size(cid, timeout);

    /// Reads `length` bytes at `offset` of a chunk.
    #[pyo3(signature = (cid, offset, length, *, timeout=None))]
    fn read_at(cid: u64, offset: u64, length: u64, timeout: Option<f64>)
        [core] => core.op_read_at(cid, offset, length, timeout);

    /// Overwrites bytes at `offset` of a chunk.
    #[pyo3(signature = (cid, offset, data, *, timeout=None, durability=None))]
    fn write_at(cid: u64, offset: u64, data: PyBackedBytes, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_write_at(cid, offset, data, timeout, durability);

    /// Changes a chunk's size (the common prefix kept, growth zero-filled).
    #[pyo3(signature = (cid, size, *, timeout=None, durability=None))]
    fn resize(cid: u64, size: u64, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_resize(cid, size, timeout, durability);

    /// Takes a chunk's write (or read) lock for this client, waiting at most `wait`
    /// seconds at the owner (0: try once). Prefer `with client.lock(cid): ...`.
    #[pyo3(signature = (cid, *, write=true, wait=1.0, timeout=None))]
    fn lock_acquire(cid: u64, write: bool, wait: f64, timeout: Option<f64>)
        [core] => core.op_lock(cid, write, wait, timeout);

    /// Releases a lock this client holds.
    #[pyo3(signature = (cid, *, write=true, timeout=None))]
    fn unlock(cid: u64, write: bool, timeout: Option<f64>)
        [core] => core.op_unlock(cid, write, timeout);

    /// Binds `name` to `cid` (replacing an earlier binding).
    #[pyo3(signature = (name, cid, *, timeout=None))]
    fn name_register(name: String, cid: u64, timeout: Option<f64>)
        [core] => core.op_name_register(name, cid, timeout);

    /// The CID bound to `name`, or `None`.
    #[pyo3(signature = (name, *, timeout=None))]
    fn name_get(name: String, timeout: Option<f64>)
        [core] => core.op_name_get(name, timeout);

    /// Every registered name with its CID, as a dict.
    #[pyo3(signature = (*, timeout=None))]
    fn name_list(timeout: Option<f64>)
        [core] => core.op_name_list(timeout);

    /// Removes a name.
    #[pyo3(signature = (name, *, timeout=None))]
    fn name_remove(name: String, timeout: Option<f64>)
        [core] => core.op_name_remove(name, timeout);

    /// Allocates a barrier for `size` participants; returns its ID.
    #[pyo3(signature = (size, *, timeout=None))]
    fn barrier_alloc(size: u32, timeout: Option<f64>)
        [core] => core.op_barrier_alloc(size, timeout);

    /// Signs on to barrier `id` with `value`, waits (at most `timeout`) until the round
    /// is complete; returns every participant's `(node, value)`.
    #[pyo3(signature = (id, value=0, *, timeout=None))]
    fn barrier_sign_on(id: u32, value: u64, timeout: Option<f64>)
        [core] => core.op_barrier_sign_on(id, value, timeout);

    /// A barrier's status (`size`, `round`, `signed`, `last_released`), or `None`.
    #[pyo3(signature = (id, *, timeout=None))]
    fn barrier_status(id: u32, timeout: Option<f64>)
        [core] => core.op_barrier_status(id, timeout);

    /// Changes a barrier's participant count.
    #[pyo3(signature = (id, size, *, timeout=None))]
    fn barrier_resize(id: u32, size: u32, timeout: Option<f64>)
        [core] => core.op_barrier_resize(id, size, timeout);

    /// Frees a barrier.
    #[pyo3(signature = (id, *, timeout=None))]
    fn barrier_free(id: u32, timeout: Option<f64>)
        [core] => core.op_barrier_free(id, timeout);

    /// Stores a new blob in temporary storage (fails if the name exists).
    #[pyo3(signature = (name, data, *, timeout=None))]
    fn tmp_create(name: String, data: PyBackedBytes, timeout: Option<f64>)
        [core] => core.op_tmp_put(name, data, false, timeout);

    /// Stores a blob in temporary storage, replacing one of the same name.
    #[pyo3(signature = (name, data, *, timeout=None))]
    fn tmp_put(name: String, data: PyBackedBytes, timeout: Option<f64>)
        [core] => core.op_tmp_put(name, data, true, timeout);

    /// A blob from temporary storage, or `None`.
    #[pyo3(signature = (name, *, timeout=None))]
    fn tmp_get(name: String, timeout: Option<f64>)
        [core] => core.op_tmp_get(name, timeout);

    /// Removes a blob from temporary storage.
    #[pyo3(signature = (name, *, timeout=None))]
    fn tmp_remove(name: String, timeout: Option<f64>)
        [core] => core.op_tmp_remove(name, timeout);

    /// Names and sizes of the blobs in temporary storage, as a dict.
    #[pyo3(signature = (*, timeout=None))]
    fn tmp_list(timeout: Option<f64>)
        [core] => core.op_tmp_list(timeout);

    /// The superpeers' node table: a list of dicts (`id`, `role`, `address`, `state`, ...).
    #[pyo3(signature = (*, timeout=None))]
    fn nodes(timeout: Option<f64>)
        [core] => core.op_nodes(timeout);

    /// The IDs of the alive peers, ascending.
    #[pyo3(signature = (*, timeout=None))]
    fn peers(timeout: Option<f64>)
        [core] => core.op_peers(timeout);

    /// The superpeer group's status (`node`, `epoch`, `leader`, `term`, `members`, ...).
    #[pyo3(signature = (*, timeout=None))]
    fn status(timeout: Option<f64>)
        [core] => core.op_status(timeout);

    /// The superpeer leader's recovery table (`leader`, `zones`).
    #[pyo3(signature = (*, timeout=None))]
    fn recovery_status(timeout: Option<f64>)
        [core] => core.op_recovery_status(timeout);

    /// Reads chunks of exactly `size` bytes into one `(len(cids), size)` `uint8` array
    /// (`cids`: a `uint64` array or anything numpy converts to one).
    #[pyo3(signature = (cids, size, *, timeout=None))]
    fn get_array(cids: &Bound<'_, PyAny>, size: usize, timeout: Option<f64>)
        [core] => core.op_get_array(cids, size, timeout);

    /// Reads chunks of any size: returns `(data, offsets)`, a flat `uint8` buffer and
    /// `len(cids) + 1` `uint64` offsets (chunk `i` is `data[offsets[i]:offsets[i+1]]`).
    #[pyo3(signature = (cids, *, timeout=None))]
    fn get_packed(cids: &Bound<'_, PyAny>, timeout: Option<f64>)
        [core] => core.op_get_packed(cids, timeout);

    /// Replaces chunks' bytes with the rows of `values` (any C-contiguous array of
    /// `len(cids)` rows, taken as bytes: row `i` goes to `cids[i]`).
    #[pyo3(signature = (cids, values, *, timeout=None, durability=None))]
    fn put_array(cids: &Bound<'_, PyAny>, values: &Bound<'_, PyAny>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_put_array(cids, values, timeout, durability);

    /// Creates one chunk per row of `values` on `peer`; returns their CIDs (`uint64`).
    #[pyo3(signature = (peer, values, *, timeout=None, durability=None))]
    fn create_array(peer: u16, values: &Bound<'_, PyAny>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_create_array(peer, values, timeout, durability);

    /// Removes the chunks of a CID array.
    #[pyo3(signature = (cids, *, timeout=None, durability=None))]
    fn remove_array(cids: &Bound<'_, PyAny>, timeout: Option<f64>, durability: Option<&Bound<'_, PyAny>>)
        [core] => core.op_remove_array(cids, timeout, durability);
}

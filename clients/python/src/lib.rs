//! # myriad-python: the Python extension module `myriad._myriad`
//!
//! # Job
//! Python bindings over the Rust client library (`myriad-client`), not a second protocol
//! implementation: [`client::Client`] (blocking calls), [`aio::AsyncClient`] (the same
//! calls as `asyncio` awaitables), the numpy batch calls of [`arrays`] and
//! [`cluster::LocalCluster`] (a local cluster of `myriad` processes through
//! `myriad-launcher`). The pure-Python package `myriad` (`python/myriad/`) re-exports
//! them, defines the exception classes ([`errors`] raises them) and `local_cluster()`.
//!
//! # Invariants
//! - Every network wait runs with the GIL released (`Python::detach` around a blocking
//!   call, or a task on the client's runtime for the async calls), so Python threads
//!   using one or many clients proceed in parallel.
//! - Every call ends within its timeout (the call's `timeout=` or the client's default),
//!   with its result or a `myriad.errors` exception mirroring `ClientError`'s kind.
//! - Batch calls over numpy arrays copy each value once (between the network buffer and
//!   the array) and create no Python object per item.
//!
//! # Who calls it
//! Python programs through `import myriad`; built by maturin (`pyproject.toml`), tested
//! by `scripts/test-python` (pytest against a real local cluster).

pub mod aio;
pub mod arrays;
pub mod client;
pub mod cluster;
pub mod compute;
pub mod convert;
pub mod core;
pub mod errors;
pub mod methods;
pub mod ops;

use pyo3::prelude::*;

/// The extension module `myriad._myriad`.
#[pymodule]
fn _myriad(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::Client>()?;
    m.add_class::<client::ChunkLock>()?;
    m.add_class::<aio::AsyncClient>()?;
    m.add_class::<cluster::LocalCluster>()?;
    m.add("DURABILITY_LEVELS", core::DURABILITY_NAMES.to_vec())?;
    Ok(())
}

//! # myriad-testing: test support
//!
//! **Job.** Tools that tests of the whole system use to decide whether the system behaved:
//! today the [`history`] checker, which verifies that a recorded history of client
//! operations on chunks is linearizable per chunk (each chunk is a read/write register).
//! The cluster harness (real processes, SIGKILL, fault switches) joins it with the cluster.
//!
//! **Invariants.** The checker is exact (it accepts a history if and only if some
//! linearization exists, within a stated search bound) and bounded: it reports
//! [`history::CheckError::TooComplex`] instead of running without limit.
//!
//! **Callers.** Integration tests only; no production crate depends on this one.

pub mod history;
pub mod process;

//! Benchmarks of Myriad's layers, run through `myriad bench <name>`.
//!
//! Each benchmark prints human-readable figures, or JSON lines with `--json`, and compares
//! against a named baseline measured in the same run where one can be run here. None of
//! them is a timed test: they report, they do not assert.

pub mod backup_mem;
pub mod balance;
pub mod cluster;
pub mod graph500;
pub mod jobs;
pub mod kv;
pub mod log;
pub mod log_cleaner;
pub mod mem;
pub mod net;
pub mod process;
pub mod recovery;
pub mod recovery_local;
pub mod replication;
pub mod report;
pub mod tool;

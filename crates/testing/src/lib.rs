//! # myriad-testing: test support
//!
//! **Job.** Tools that tests of the whole system use to run a cluster and to decide whether
//! it behaved:
//! - [`cluster`]: [`cluster::TestCluster`], an in-process cluster of real superpeers, peers
//!   and clients on 127.0.0.1 (the production start paths), with crashes, restarts,
//!   per-link network filters ([`cluster::Link`]) and bounded waits;
//! - [`env`](mod@env): the environment seam of that harness, a [`env::Clock`] and a
//!   [`env::Transport`] ([`env::SystemClock`], [`env::NetFaults`]);
//! - [`process`]: the same for the `myriad` binary's processes (the cli tests): a local
//!   cluster started, killed and restarted through `myriad-launcher`, subcommands run with
//!   a timeout, child processes killed on drop;
//! - [`netns`]: `ip` and the can-this-machine-run-it check of the network-namespace tests;
//! - [`history`]: a checker that verifies that a recorded history of client operations on
//!   chunks is linearizable per chunk (each chunk is a read/write register);
//! - [`sim`]: a deterministic simulation of a small cluster from a seed (simulated time,
//!   network, crashes, disks) over the production chunk and backup services, checked
//!   with [`history`]; every failure replays from its seed.
//!
//! **Invariants.**
//! - Every process part (superpeer, peer, client) and thread the harness starts is stopped
//!   when the [`cluster::TestCluster`] is dropped, also when a test panics.
//! - Every wait is bounded and ends in a panic naming what it waited for.
//! - The checker is exact (it accepts a history if and only if some linearization exists,
//!   within a stated search bound) and bounded: it reports
//!   [`history::CheckError::TooComplex`] instead of running without limit.
//!
//! **Callers.** Integration tests only (as a dev-dependency); no production crate depends
//! on this one.

pub mod cluster;
pub mod env;
pub mod history;
pub mod netns;
pub mod process;
pub mod sim;

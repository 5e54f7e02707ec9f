//! The compute platform: peers run computations on the data they hold (DXRAM's job
//! service, master/slave compute groups and applications).
//!
//! # Job
//! - **Jobs** ([`Job`], [`JobRegistry`], [`JobHandle`]): short units of work run by a
//!   peer's fixed-size worker pool with work stealing ([`pool`], crossbeam's deques),
//!   submitted locally ([`ComputeService::submit`]), to a named peer
//!   ([`Jobs::submit_to`]) or to the owner of a chunk ([`Jobs::submit_to_owner`],
//!   following `NotOwner` redirections), so that they run where their data is and read it
//!   through the local chunk API ([`LocalChunkApi`]) without a network hop.
//! - **Compute groups** ([`master`], [`slave`]): one master and any number of slaves per
//!   group ID; roles from the configuration or at run time ([`client::set_role`]). Any
//!   node submits a [`TaskScript`] (TOML or JSON, [`script`]) or a single task to the
//!   master, which runs each [`Task`] on all slaves at once as a superstep (a barrier
//!   before, the collection of every slave's answer after). A task sees its group, its
//!   slave index, every slave's node ID, messaging between slaves and barriers that
//!   exchange a value per slave ([`TaskContext`]).
//! - **Applications** ([`Application`]): user code started inside a peer.
//! - A user's own peer binary registers its jobs, tasks and applications in one
//!   [`Registry`] chain and hands it to the node (`myriad::main_with` in the `myriad`
//!   crate); [`builtin`] provides scans with filters and aggregation, a parallel bulk
//!   load, and small tasks for tests and benchmarks.
//!
//! # Invariants
//! - A panicking job or task fails its handle or its run, never the peer.
//! - Nothing waits on a dead node: a failed or disconnected slave fails its run; a peer
//!   that dies with jobs queued fails their handles.
//! - Every message decodes with bounds checks ([`wire`]); no input can panic a peer.
//!
//! # Who calls it
//! `myriad-node` hosts a [`ComputeService`] in every peer; clients, the terminal and
//! benchmarks use [`client`]. It depends on the client library (chunk API, nameservice),
//! the membership, the messaging layer and the protocol's types, nothing above.

pub mod app;
pub mod builtin;
pub mod client;
pub mod env;
pub mod job;
mod master;
pub mod pool;
pub mod script;
pub mod service;
mod slave;
pub mod task;
pub mod wire;

pub use app::{AppContext, Application};
pub use client::{ComputeError, Jobs};
pub use env::{LocalChunkApi, LocalError, PeerEnv};
pub use job::{Job, JobContext, JobError, JobHandle, JobRegistry, Wire};
pub use script::TaskScript;
pub use service::{ComputeConfig, ComputeService, Registry};
pub use task::{int_value, read_int, Task, TaskContext, TaskError, TaskRegistry};
pub use wire::Role;

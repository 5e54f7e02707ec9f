//! Graph analytics on Myriad (DXGraph): Graph500 graphs stored vertex by vertex as chunks
//! and a distributed, direction-optimizing breadth-first search run by the slaves of a
//! compute group.
//!
//! # Job
//! - [`gen`]: the Graph500 Kronecker generator, deterministic from a seed, any range of
//!   the edge list generated on its own (each slave makes its share).
//! - [`io`]: edge-list files (text or binary), read share by share.
//! - [`csr`]: the vertex partition (ranges over the slaves, dense local IDs) and one
//!   part's adjacency.
//! - [`bfs`]: the BFS kernels (top-down/bottom-up over atomic bitmaps, Beamer's switch)
//!   against a small communication trait, and a sequential BFS to check them.
//! - [`validate`]: the Graph500 checks of a parent array.
//! - [`task`]: the compute tasks `graph.load`, `graph.bfs` and `graph.drop`, registered by
//!   [`register`], and the graphs a peer holds.
//!
//! # Invariants
//! - Nothing panics on input: parameters, files and messages fail with typed errors.
//! - No process holds the whole edge list: generation, file reading, loading and
//!   validation all work on one part's share.
//!
//! # Who calls it
//! The `myriad` binary registers the tasks in its peers; `myriad bench graph500` and the
//! terminal's `comptask` run them on a compute group.

pub mod bfs;
pub mod bitmap;
pub mod csr;
pub mod gen;
pub mod io;
pub mod task;
pub mod validate;

/// An edge of the input list: two vertex IDs.
pub type Edge = (u32, u32);

pub use task::register;

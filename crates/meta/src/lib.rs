//! # myriad-meta: the cluster metadata held by the superpeer group
//!
//! **Job.** The deterministic state machine that every superpeer replicates through Raft:
//! the node table (roles, addresses, liveness, the cluster epoch), range-based chunk lookup
//! per creator, the nameservice, barriers, temporary storage, the backup-zone table and each peer's
//! incarnation bases ([`PeerBases`]: where a restarted peer's zone numbers and local IDs start). It
//! also defines the commands that change that state and their explicit binary encoding.
//!
//! **Invariants.**
//! - [`MetaState::apply`] is a pure function of the state and the command: no clock, no
//!   randomness, no I/O. Two superpeers that applied the same commands hold equal states
//!   and equal [`MetaState::snapshot`] bytes.
//! - A refused command (a [`Response::Error`]) changes nothing.
//! - Every collection is bounded by a constant in [`limits`]; decoders check lengths against
//!   those limits and the input before allocating.
//! - This crate knows no network and no disk: the node crate carries commands over the
//!   messaging layer and stores the Raft log.
//!
//! **Callers.** The superpeer role of the node crate (applies committed commands, answers
//! reads) and clients/peers that build [`Command`]s and decode [`Response`]s.

pub mod command;
pub mod limits;
pub mod lookup;
pub mod node;
pub mod state;

pub use command::{BarrierOutcome, Command, MetaError, Response};
pub use lookup::{LookupRange, LookupTree};
pub use node::{Capabilities, NodeRecord, NodeState, PeerBases, RecordLayout, Role};
pub use state::{Barrier, MetaState};

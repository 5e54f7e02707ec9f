//! # myriad-placement: master-side backup bookkeeping
//!
//! **Job.** A peer (the *master* of its chunks) groups its chunks into *backup zones* of a
//! bounded payload size and gives every zone an ordered list of backup peers. This crate
//! holds the two pieces of that which are pure logic:
//!
//! - [`zones::ZoneTree`]: which zone each chunk belongs to, kept as CID ranges (a few
//!   entries per zone, never one per chunk), with per-zone payload accounting. Reused CIDs
//!   go back to their old zone.
//! - [`placement`]: choosing the backup peers of a zone: random, disjunctive first backups,
//!   rack-aware, and copysets computed deterministically by every master without a
//!   coordinator (scatter width S); replacing a failed backup.
//!
//! **Invariants.**
//! - No I/O, no clock, no hidden randomness: placement draws from a caller-supplied RNG, and
//!   copysets derive from their inputs only, so every master computes the same copysets.
//! - A zone's backups are distinct and never include the master.
//! - Zone ranges never overlap; the tree stores at most two entries per zone plus one per
//!   range of immigrated or recovered chunks.
//!
//! **Callers.** The peer role of the node crate: it asks the tree for a chunk's zone when it
//! replicates a write, opens zones and places them when a zone fills, and registers the zone
//! → backups table with the superpeer group.

pub mod placement;
pub mod zones;

pub use placement::{Candidate, Placement, PlacementError, Strategy};
pub use zones::{ZoneId, ZoneTree};

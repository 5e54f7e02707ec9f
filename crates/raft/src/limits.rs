//! Every limit of the replication crate, in one place. Decoders refuse encodings beyond
//! these before allocating; writers refuse to produce them.

/// Largest Raft node ID: superpeer IDs are Myriad's 16-bit node IDs.
pub const NODE_ID_MAX: u64 = u16::MAX as u64;

/// Largest Raft term accepted from the wire or disk: far beyond any reachable term (one per
/// election), and low enough that term arithmetic in openraft can never overflow.
pub const TERM_MAX: u64 = 1 << 62;

/// Largest log index accepted from the wire or disk, for the same reason.
pub const LOG_INDEX_MAX: u64 = 1 << 62;

/// Most nodes (voters and learners) in one membership. Groups have 1, 3 or 5 voters.
pub const MEMBERS_MAX: usize = 16;

/// Most voter sets in one membership: two while a joint-consensus change is in flight.
pub const MEMBERSHIP_CONFIGS_MAX: usize = 2;

/// Most log entries in one AppendEntries RPC (openraft's `max_payload_entries`).
pub const APPEND_ENTRIES_MAX: usize = 64;

/// Largest encoded [`myriad_meta::Command`] that [`crate::MetaRaft::write`] accepts. The
/// biggest legal command (a temporary blob of `TMP_BLOB_BYTES_MAX` plus its name) is far
/// below it.
pub const COMMAND_BYTES_MAX: usize = 2 << 20;

/// Largest record in the log file (a record holds one entry, a vote, or a log position).
pub const RECORD_BYTES_MAX: usize = 4 << 20;

/// Largest snapshot of the metadata state, on disk and on the wire.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 30;

/// Largest text of a refusal in an RPC reply.
pub const REFUSAL_TEXT_BYTES_MAX: usize = 1024;

/// Most appends waiting for the log's fsync thread (back-pressure on the Raft core).
pub const FLUSH_QUEUE_MAX: usize = 1024;

/// Capacity of openraft's API channel (client writes, reads, RPCs handed to the core).
pub const API_QUEUE_MAX: u64 = 4096;

/// Capacity of openraft's internal notification channel.
pub const NOTIFICATION_QUEUE_MAX: u64 = 65_536;

/// Capacity of openraft's channel to the state-machine worker.
pub const STATE_MACHINE_QUEUE_MAX: u64 = 1024;

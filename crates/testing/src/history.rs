//! A per-chunk linearizability checker for client histories.
//!
//! Every chunk is a register. Tests record each client operation with its start and end
//! time (any monotonic clock; only the order matters), the value written or read, and its
//! outcome:
//!
//! - [`Outcome::Ok`]: acknowledged. A write took effect at one instant between start and
//!   end; a read returned the register's value at one instant between start and end.
//! - [`Outcome::Failed`]: definitely not applied (the system refused it). Ignored.
//! - [`Outcome::Unknown`]: the client does not know (timeout, connection lost). A write may
//!   have taken effect at any instant after its start — or never; a read tells nothing.
//!
//! Written values must be unique per chunk (tests write counters), which is what makes
//! violations easy to read. The search is Wing & Gong's with Lowe's memoization of
//! (linearized set, register value) states, per chunk, bounded by a state budget.
//!
//! For the `async` durability mode, where the last acknowledged writes before a crash may be
//! lost, [`relax_for_loss_window`] turns acknowledged writes that ended within the window
//! before the crash into `Unknown` ones, and [`lost_acknowledged_writes`] measures how many
//! acknowledged writes a history shows lost.

use std::collections::{BTreeMap, HashSet};

/// A chunk's value as the checker sees it: a test-chosen unique number per write.
pub type Value = u64;

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Wrote this value.
    Write(Value),
    /// Read; `Some(v)` if the chunk held `v`, `None` if it did not exist / was empty.
    Read(Option<Value>),
}

/// What the client learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged.
    Ok,
    /// Refused: certainly not applied.
    Failed,
    /// Unknown (timeout, lost connection): a write may or may not have been applied.
    Unknown,
}

/// One recorded operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    /// The chunk (any key type that fits 64 bits, e.g. a CID).
    pub key: u64,
    /// Write or read.
    pub action: Action,
    /// When the client sent it.
    pub start: u64,
    /// When the client got its answer (for `Unknown`, when it gave up).
    pub end: u64,
    /// Acknowledged, refused or unknown.
    pub outcome: Outcome,
}

/// Why a history was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// No linearization exists for this chunk.
    #[error("chunk {key:#x} is not linearizable: {explanation}")]
    NotLinearizable {
        /// The chunk.
        key: u64,
        /// The longest linearizable prefix found and the operations that could not follow.
        explanation: String,
    },
    /// The search for this chunk exceeded its state budget.
    #[error("chunk {key:#x}: search exceeded {states} states")]
    TooComplex {
        /// The chunk.
        key: u64,
        /// The budget.
        states: usize,
    },
    /// An operation ends before it starts, or a value was written twice to one chunk.
    #[error("malformed history: {0}")]
    Malformed(String),
}

/// States explored per chunk before the checker gives up.
pub const SEARCH_STATES_MAX: usize = 2_000_000;

/// Checks every chunk's operations; `initial` is each chunk's value before the history
/// (`None`: absent).
pub fn check(history: &[Operation], initial: Option<Value>) -> Result<(), CheckError> {
    let mut per_key: BTreeMap<u64, Vec<Operation>> = BTreeMap::new();
    for operation in history {
        if operation.end < operation.start {
            return Err(CheckError::Malformed(format!(
                "operation ends before it starts: {operation:?}"
            )));
        }
        per_key.entry(operation.key).or_default().push(*operation);
    }
    for (key, operations) in per_key {
        check_register(key, &operations, initial)?;
    }
    Ok(())
}

/// One operation as the search sees it.
#[derive(Debug, Clone, Copy)]
struct Event {
    action: Action,
    start: u64,
    /// `u64::MAX` for unknown writes: they may take effect arbitrarily late.
    end: u64,
    /// May be left out (an unknown write that never took effect).
    optional: bool,
}

fn check_register(
    key: u64,
    operations: &[Operation],
    initial: Option<Value>,
) -> Result<(), CheckError> {
    let mut written = HashSet::new();
    let mut events: Vec<Event> = Vec::new();
    for operation in operations {
        if let Action::Write(value) = operation.action {
            if operation.outcome != Outcome::Failed && !written.insert(value) {
                return Err(CheckError::Malformed(format!(
                    "value {value} written twice to chunk {key:#x}"
                )));
            }
        }
        match (operation.action, operation.outcome) {
            (_, Outcome::Failed) | (Action::Read(_), Outcome::Unknown) => {}
            (Action::Write(_), Outcome::Unknown) => events.push(Event {
                action: operation.action,
                start: operation.start,
                end: u64::MAX,
                optional: true,
            }),
            (_, Outcome::Ok) => events.push(Event {
                action: operation.action,
                start: operation.start,
                end: operation.end,
                optional: false,
            }),
        }
    }
    events.sort_by_key(|event| (event.start, event.end));
    let count = events.len();
    let words = count.div_ceil(64).max(1);
    let mut seen: HashSet<(Vec<u64>, Option<Value>)> = HashSet::new();
    // Depth-first search over (linearized set, value). A stack of frames: each frame is a
    // state plus the index of the next candidate to try.
    struct Frame {
        done: Vec<u64>,
        value: Option<Value>,
        next_candidate: usize,
        linearized: usize,
    }
    let is_done = |done: &[u64], index: usize| done[index / 64] & (1 << (index % 64)) != 0;
    let mut stack = vec![Frame {
        done: vec![0; words],
        value: initial,
        next_candidate: 0,
        linearized: 0,
    }];
    let mut best = 0usize;
    let mut states = 0usize;
    while let Some(frame) = stack.last_mut() {
        // Finished if every required event is linearized (optional ones may be dropped).
        let all_required = (0..count).all(|i| events[i].optional || is_done(&frame.done, i));
        if all_required {
            return Ok(());
        }
        // The earliest end among pending required events bounds which events may go next:
        // an event can be linearized now only if it started before every pending event ends.
        let horizon = (0..count)
            .filter(|&i| !is_done(&frame.done, i))
            .map(|i| events[i].end)
            .min()
            .unwrap_or(u64::MAX);
        let mut advanced = None;
        while frame.next_candidate < count {
            let index = frame.next_candidate;
            frame.next_candidate += 1;
            if is_done(&frame.done, index) || events[index].start > horizon {
                continue;
            }
            let value = match events[index].action {
                Action::Write(value) => Some(value),
                Action::Read(read) if read == frame.value => frame.value,
                Action::Read(_) => continue,
            };
            let mut done = frame.done.clone();
            done[index / 64] |= 1 << (index % 64);
            if seen.insert((done.clone(), value)) {
                advanced = Some(Frame {
                    done,
                    value,
                    next_candidate: 0,
                    linearized: frame.linearized + 1,
                });
                break;
            }
        }
        match advanced {
            Some(next) => {
                states += 1;
                if states > SEARCH_STATES_MAX {
                    return Err(CheckError::TooComplex {
                        key,
                        states: SEARCH_STATES_MAX,
                    });
                }
                best = best.max(next.linearized);
                stack.push(next);
            }
            None => {
                stack.pop();
            }
        }
    }
    let mut required: Vec<&Event> = events.iter().filter(|e| !e.optional).collect();
    required.sort_by_key(|e| e.start);
    Err(CheckError::NotLinearizable {
        key,
        explanation: format!(
            "at most {best} of {count} operations can be ordered; operations by start: {:?}",
            required
                .iter()
                .take(12)
                .map(|e| (e.action, e.start, e.end))
                .collect::<Vec<_>>()
        ),
    })
}

/// Treats acknowledged writes that ended in `[crash_at - window, crash_at]` as unknown: in
/// `async` mode those may be lost in a crash of their owner.
pub fn relax_for_loss_window(history: &[Operation], crash_at: u64, window: u64) -> Vec<Operation> {
    history
        .iter()
        .map(|operation| {
            let in_window = operation.end <= crash_at && operation.end + window >= crash_at;
            match (operation.action, operation.outcome) {
                (Action::Write(_), Outcome::Ok) if in_window => Operation {
                    outcome: Outcome::Unknown,
                    ..*operation
                },
                _ => *operation,
            }
        })
        .collect()
}

/// Acknowledged writes that a history shows lost: for each chunk, acknowledged writes that
/// ended before the last acknowledged read started, were not followed by another
/// acknowledged write, and whose value that read did not return. (A lower bound on the loss;
/// exact when each chunk is read once after the faults, as the recovery tests do.)
pub fn lost_acknowledged_writes(history: &[Operation]) -> usize {
    let mut per_key: BTreeMap<u64, Vec<&Operation>> = BTreeMap::new();
    for operation in history.iter().filter(|o| o.outcome == Outcome::Ok) {
        per_key.entry(operation.key).or_default().push(operation);
    }
    let mut lost = 0;
    for operations in per_key.values() {
        let Some(last_read) = operations
            .iter()
            .filter(|o| matches!(o.action, Action::Read(_)))
            .max_by_key(|o| o.start)
        else {
            continue;
        };
        let Action::Read(observed) = last_read.action else {
            continue;
        };
        let last_write = operations
            .iter()
            .filter(|o| matches!(o.action, Action::Write(_)) && o.end < last_read.start)
            .max_by_key(|o| o.end);
        if let Some(write) = last_write {
            if let Action::Write(value) = write.action {
                let concurrent_or_later = operations.iter().any(|o| {
                    matches!(o.action, Action::Write(v) if Some(v) == observed)
                        && o.end >= write.start
                });
                if observed != Some(value) && !concurrent_or_later {
                    lost += 1;
                }
            }
        }
    }
    lost
}

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
//! - [`Outcome::MaybeLost`]: acknowledged, but a crash may have lost it since (made by
//!   [`relax_for_crash`]): a write took effect between start and end, or never.
//!
//! Written values must be unique per chunk (tests write counters), which is what makes
//! violations easy to read. The search is Wing & Gong's with Lowe's memoization of
//! (linearized set, register value) states, per chunk, bounded by a state budget.
//!
//! For a crash that may lose the last acknowledged writes (`async` on an owner crash,
//! `replicated` on a power loss of the whole cluster), [`relax_for_crash`] turns the
//! history into one [`check`] accepts exactly when only writes acknowledged within the
//! crash's window before it (or never acknowledged) went missing, and [`lost_writes`] lists
//! the acknowledged writes a history shows lost, with their times.

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
    /// Acknowledged, but a crash may have lost it since ([`relax_for_crash`]): a write
    /// took effect between its start and end, or (as far as later reads can tell) never.
    MaybeLost,
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
    /// May be left out (an unknown write that never took effect, a write a crash may
    /// have lost).
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
            (_, Outcome::Failed) | (Action::Read(_), Outcome::Unknown | Outcome::MaybeLost) => {}
            (Action::Write(_), Outcome::MaybeLost) => events.push(Event {
                action: operation.action,
                start: operation.start,
                end: operation.end,
                optional: true,
            }),
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
        // Candidate 2i linearizes event i; 2i + 1 drops it, for an optional event with a
        // deadline (a write a crash may have lost): left pending, its end would hold back
        // everything that started later. (Unknown writes have no deadline and simply stay
        // pending.) Either only once it could go next: dropping it later changes nothing
        // but the horizon, which only gets tighter, so the search need not try that.
        while frame.next_candidate < 2 * count {
            let index = frame.next_candidate / 2;
            let drop = frame.next_candidate % 2 == 1;
            frame.next_candidate += 1;
            if is_done(&frame.done, index) || events[index].start > horizon {
                continue;
            }
            let value = if drop {
                if !events[index].optional || events[index].end == u64::MAX {
                    continue;
                }
                frame.value
            } else {
                match events[index].action {
                    Action::Write(value) => Some(value),
                    Action::Read(read) if read == frame.value => frame.value,
                    Action::Read(_) => continue,
                }
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

/// A crash, as a test saw it, of the processes that held some chunks: they died at one
/// instant in `[start, end]` (the test's clock just before it sent the kill and once the
/// processes were gone), and the durability mode in use may lose writes acknowledged up to
/// `window` before that instant (`async`: those its owner had not sent to the backups yet;
/// `replicated`, on a power loss of every backup: those still in the backups' write
/// buffers; `durable`: none, window 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    /// The earliest instant the processes may have died.
    pub start: u64,
    /// The latest instant: every process was gone then.
    pub end: u64,
    /// How long before the crash an acknowledged write may still be lost.
    pub window: u64,
}

impl Crash {
    /// Whether a crash may lose `operation`, a write: it started before the crash was over
    /// and was either acknowledged within the window before it (or during it) or never
    /// acknowledged.
    fn may_lose(&self, operation: &Operation) -> bool {
        let Action::Write(_) = operation.action else {
            return false;
        };
        operation.start <= self.end
            && match operation.outcome {
                Outcome::Ok => operation.end >= self.start.saturating_sub(self.window),
                Outcome::Unknown | Outcome::MaybeLost => true,
                Outcome::Failed => false,
            }
    }
}

/// The history as [`check`] must see it when `crash` may lose writes: each chunk's value
/// after the crash is the value of some write linearized before it, and every write
/// linearized after that one is one the crash may lose (acknowledged within the window or
/// never). So acknowledged writes the crash may lose become [`Outcome::MaybeLost`] (they
/// took effect within their interval or, as far as later reads can tell, never), and reads that began before the crash was over and returned the value of a
/// write the crash may lose are left out (they saw a value that may since have vanished,
/// which a register cannot model). Everything else stays: an acknowledged write older than
/// the window that a later read does not show, or that is overwritten by an older value, is
/// still a violation.
pub fn relax_for_crash(history: &[Operation], crash: Crash) -> Vec<Operation> {
    let lossy: HashSet<(u64, Value)> = history
        .iter()
        .filter(|operation| crash.may_lose(operation))
        .filter_map(|operation| match operation.action {
            Action::Write(value) => Some((operation.key, value)),
            Action::Read(_) => None,
        })
        .collect();
    history
        .iter()
        .filter(|operation| match operation.action {
            Action::Read(Some(value)) => {
                operation.start > crash.end || !lossy.contains(&(operation.key, value))
            }
            _ => true,
        })
        .map(|operation| match (operation.action, operation.outcome) {
            (Action::Write(_), Outcome::Ok) if crash.may_lose(operation) => Operation {
                outcome: Outcome::MaybeLost,
                ..*operation
            },
            _ => *operation,
        })
        .collect()
}

/// An acknowledged write that a history shows lost, and the read that shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostWrite {
    /// The acknowledged write.
    pub write: Operation,
    /// The chunk's last acknowledged read, which returned an older value.
    pub read: Operation,
}

/// Every acknowledged write that the last acknowledged read of its chunk shows lost: writes
/// that ended before that read started and certainly took effect after the write whose
/// value it returned (they started after that write was acknowledged), or all of them if it
/// returned a value no write wrote (the initial one). Exact for histories in which each
/// chunk is read once after the faults, with no write running then (the restart tests); a
/// lower bound otherwise (a loss that later writes covered does not show; [`check`] with
/// [`relax_for_crash`] finds those).
pub fn lost_writes(history: &[Operation]) -> Vec<LostWrite> {
    let mut per_key: BTreeMap<u64, Vec<&Operation>> = BTreeMap::new();
    for operation in history.iter().filter(|o| o.outcome != Outcome::Failed) {
        per_key.entry(operation.key).or_default().push(operation);
    }
    let mut lost = Vec::new();
    for operations in per_key.values() {
        let Some(read) = operations
            .iter()
            .filter(|o| matches!(o.action, Action::Read(_)) && o.outcome == Outcome::Ok)
            .max_by_key(|o| o.start)
        else {
            continue;
        };
        let Action::Read(observed) = read.action else {
            continue;
        };
        // When the write of the value read took effect at the latest (an unknown write may
        // have taken effect any time after it started).
        let source = operations
            .iter()
            .find(|o| matches!(o.action, Action::Write(v) if Some(v) == observed));
        let source_end = match source {
            Some(source) if source.outcome == Outcome::Ok => source.end,
            Some(_) => u64::MAX,
            None => 0,
        };
        for write in operations.iter().filter(|o| {
            matches!(o.action, Action::Write(_))
                && o.outcome == Outcome::Ok
                && o.end < read.start
                && (source.is_none() || o.start > source_end)
        }) {
            lost.push(LostWrite {
                write: **write,
                read: **read,
            });
        }
    }
    lost
}

//! The linearizability checker against a brute-force reference on small random histories,
//! plus the classic cases by name.

use myriad_testing::history::{
    check, lost_writes, relax_for_crash, Action, CheckError, Crash, Operation, Outcome,
};
use proptest::prelude::*;

fn op(action: Action, start: u64, end: u64, outcome: Outcome) -> Operation {
    Operation {
        key: 1,
        action,
        start,
        end,
        outcome,
    }
}

fn write(value: u64, start: u64, end: u64) -> Operation {
    op(Action::Write(value), start, end, Outcome::Ok)
}

fn read(value: Option<u64>, start: u64, end: u64) -> Operation {
    op(Action::Read(value), start, end, Outcome::Ok)
}

#[test]
fn sequential_history_is_accepted() {
    let history = [
        write(1, 0, 1),
        read(Some(1), 2, 3),
        write(2, 4, 5),
        read(Some(2), 6, 7),
    ];
    assert_eq!(check(&history, None), Ok(()));
}

#[test]
fn read_of_the_old_value_after_an_acknowledged_write_is_rejected() {
    let history = [write(1, 0, 1), write(2, 2, 3), read(Some(1), 4, 5)];
    assert!(matches!(
        check(&history, None),
        Err(CheckError::NotLinearizable { key: 1, .. })
    ));
}

#[test]
fn concurrent_read_may_see_either_value_but_not_flip_back() {
    assert_eq!(check(&[write(1, 0, 10), read(None, 1, 2)], None), Ok(()));
    assert_eq!(check(&[write(1, 0, 10), read(Some(1), 1, 2)], None), Ok(()));
    // Once a read saw the new value, a later read cannot see the old one.
    let history = [write(1, 0, 10), read(Some(1), 1, 2), read(None, 3, 4)];
    assert!(check(&history, None).is_err());
}

#[test]
fn unknown_writes_may_or_may_not_have_happened() {
    let unknown = op(Action::Write(7), 0, 1, Outcome::Unknown);
    assert_eq!(check(&[unknown, read(None, 5, 6)], None), Ok(()));
    assert_eq!(check(&[unknown, read(Some(7), 5, 6)], None), Ok(()));
    // ... but it happened at most once, so the value cannot disappear again.
    assert!(check(&[unknown, read(Some(7), 5, 6), read(None, 7, 8)], None).is_err());
    // A failed write never happened.
    let failed = op(Action::Write(8), 0, 1, Outcome::Failed);
    assert!(check(&[failed, read(Some(8), 5, 6)], None).is_err());
}

/// A crash between 100 and 110 that may lose writes acknowledged within `window` before it.
fn crash(window: u64) -> Crash {
    Crash {
        start: 100,
        end: 110,
        window,
    }
}

#[test]
fn a_crash_may_lose_only_writes_acknowledged_within_its_window() {
    // Acknowledged writes 1 (long before the crash) and 2 (just before it); after the
    // crash the chunk reads 1: write 2 was lost.
    let history = [write(1, 0, 1), write(2, 95, 98), read(Some(1), 120, 121)];
    assert!(check(&history, None).is_err());
    let lost = lost_writes(&history);
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].write, history[1]);
    assert_eq!(check(&relax_for_crash(&history, crash(10)), None), Ok(()));
    // A window that does not reach back to write 2 keeps the violation.
    assert!(check(&relax_for_crash(&history, crash(1)), None).is_err());
    // Losing write 1 too (reading the initial value) is beyond a 10-unit window, and both
    // are reported lost.
    let history = [write(1, 0, 1), write(2, 95, 98), read(None, 120, 121)];
    assert!(check(&relax_for_crash(&history, crash(10)), None).is_err());
    assert_eq!(lost_writes(&history).len(), 2);
}

/// The test that shows the crash check can fail: a write acknowledged before the window
/// (at 20, window from 50) is missing after the crash. Every per-chunk loss is listed, not
/// one per chunk: here two of one chunk.
#[test]
fn a_write_acknowledged_before_the_window_and_lost_is_reported() {
    let history = [
        write(1, 0, 1),
        write(2, 10, 20),
        write(3, 30, 40),
        read(Some(1), 150, 151),
    ];
    let relaxed = relax_for_crash(&history, crash(50));
    assert!(matches!(
        check(&relaxed, None),
        Err(CheckError::NotLinearizable { key: 1, .. })
    ));
    let lost: Vec<u64> = lost_writes(&history).iter().map(|l| l.write.end).collect();
    assert_eq!(lost, [20, 40]);
    // A window reaching back to both accepts it.
    assert_eq!(check(&relax_for_crash(&history, crash(90)), None), Ok(()));
}

#[test]
fn a_read_of_a_write_the_crash_then_lost_is_no_violation() {
    // Write 2 was read before the crash and is gone after it: the chunk went back to 1.
    // Within the window that is the documented loss, not a violation.
    let history = [
        write(1, 0, 1),
        write(2, 95, 98),
        read(Some(2), 99, 99),
        read(Some(1), 120, 121),
    ];
    assert!(check(&history, None).is_err());
    assert_eq!(check(&relax_for_crash(&history, crash(10)), None), Ok(()));
    // A read after the crash that sees a value flip back is still caught.
    let history = [
        write(1, 0, 1),
        write(2, 95, 98),
        read(Some(2), 120, 121),
        read(Some(1), 130, 131),
    ];
    assert!(check(&relax_for_crash(&history, crash(10)), None).is_err());
}

#[test]
fn writes_during_and_after_the_crash() {
    // An unknown write in flight at the crash may be lost; an acknowledged write after the
    // crash may not.
    let unknown = op(Action::Write(2), 105, 107, Outcome::Unknown);
    let history = [write(1, 0, 1), unknown, read(Some(1), 120, 121)];
    assert_eq!(check(&relax_for_crash(&history, crash(0)), None), Ok(()));
    let history = [write(1, 0, 1), write(2, 115, 118), read(Some(1), 120, 121)];
    assert!(check(&relax_for_crash(&history, crash(1_000)), None).is_err());
    assert_eq!(lost_writes(&history).len(), 1);
}

#[test]
fn malformed_histories_are_reported() {
    assert!(matches!(
        check(&[write(1, 5, 4)], None),
        Err(CheckError::Malformed(_))
    ));
    assert!(matches!(
        check(&[write(1, 0, 1), write(1, 2, 3)], None),
        Err(CheckError::Malformed(_))
    ));
}

#[test]
fn keys_are_checked_independently() {
    let mut other = write(1, 0, 1);
    other.key = 2;
    // On key 1 the read sees nothing, which is fine: the write went to key 2.
    assert_eq!(check(&[other, read(None, 2, 3)], None), Ok(()));
}

#[test]
fn long_concurrent_histories_finish_within_the_budget() {
    // 4 clients, 300 operations on one chunk, each overlapping its neighbours.
    let mut history = Vec::new();
    let mut current = None;
    for i in 0..300u64 {
        let start = i * 10;
        if i % 3 == 0 {
            history.push(write(i, start, start + 25));
            current = Some(i);
        } else {
            history.push(read(current, start + 26, start + 40));
        }
    }
    assert_eq!(check(&history, None), Ok(()));
}

/// Brute force: for every subset of the writes a crash may have lost (left out), the
/// others acknowledged.
fn brute_force(history: &[Operation], initial: Option<u64>) -> bool {
    let maybe_lost: Vec<usize> = (0..history.len())
        .filter(|&i| history[i].outcome == Outcome::MaybeLost)
        .collect();
    (0..1u32 << maybe_lost.len()).any(|left_out| {
        let kept: Vec<Operation> = (0..history.len())
            .filter(|i| {
                maybe_lost
                    .iter()
                    .position(|j| j == i)
                    .is_none_or(|bit| left_out & (1 << bit) == 0)
            })
            .map(|i| match history[i].outcome {
                Outcome::MaybeLost => Operation {
                    outcome: Outcome::Ok,
                    ..history[i]
                },
                _ => history[i],
            })
            .collect();
        brute_force_plain(&kept, initial)
    })
}

/// Brute force: try every order of the required operations plus every subset of the
/// optional ones.
fn brute_force_plain(history: &[Operation], initial: Option<u64>) -> bool {
    let events: Vec<(Action, u64, u64, bool)> = history
        .iter()
        .filter(|o| {
            o.outcome == Outcome::Ok
                || (o.outcome == Outcome::Unknown && matches!(o.action, Action::Write(_)))
        })
        .map(|o| {
            let unknown = o.outcome == Outcome::Unknown;
            (
                o.action,
                o.start,
                if unknown { u64::MAX } else { o.end },
                unknown,
            )
        })
        .collect();
    let n = events.len();
    fn search(
        events: &[(Action, u64, u64, bool)],
        used: &mut Vec<bool>,
        order: &mut Vec<usize>,
        value: Option<u64>,
    ) -> bool {
        let n = events.len();
        let required_done = (0..n).all(|i| used[i] || events[i].3);
        if required_done {
            return true;
        }
        for i in 0..n {
            if used[i] {
                continue;
            }
            // Real-time order: nothing still unused may have ended before i started.
            if (0..n).any(|j| !used[j] && j != i && events[j].2 < events[i].1) {
                continue;
            }
            let next = match events[i].0 {
                Action::Write(v) => Some(v),
                Action::Read(r) if r == value => value,
                Action::Read(_) => continue,
            };
            used[i] = true;
            order.push(i);
            if search(events, used, order, next) {
                return true;
            }
            order.pop();
            used[i] = false;
        }
        false
    }
    search(&events, &mut vec![false; n], &mut Vec::new(), initial)
}

fn small_history() -> impl Strategy<Value = Vec<Operation>> {
    prop::collection::vec((0u64..12, 1u64..6, 0u8..11, 0u64..4), 1..7).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(index, (start, length, kind, read_value))| {
                let (action, outcome) = match kind {
                    0..=3 => (Action::Write(index as u64 + 1), Outcome::Ok),
                    4 => (Action::Write(index as u64 + 1), Outcome::Unknown),
                    5 => (Action::Write(index as u64 + 1), Outcome::Failed),
                    6 => (Action::Write(index as u64 + 1), Outcome::MaybeLost),
                    _ => (
                        Action::Read((read_value > 0).then_some(read_value)),
                        Outcome::Ok,
                    ),
                };
                op(action, start, start + length, outcome)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn agrees_with_brute_force_on_small_histories(history in small_history()) {
        let expected = brute_force(&history, None);
        let got = check(&history, None);
        prop_assert_eq!(got.is_ok(), expected, "history {:?} -> {:?}", history, got);
    }
}

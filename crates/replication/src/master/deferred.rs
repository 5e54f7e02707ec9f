//! Deferred acknowledgements: a `replicated` or `durable` change reported without waiting
//! (`Replicator::on_changes_deferred`) leaves a [`Waiter`] holding its stream targets and a
//! callback, instead of a thread blocked on the progress condition. Acknowledgements end
//! waiters (`on_ack`), the sender's tick ends those past their deadline or whose backup
//! stream was replaced, and shutdown ends the rest.
//!
//! Invariants: a waiter's callback runs exactly once, never under the state lock (it may
//! answer a request or take other locks), with `Ok` only once every target stream's
//! applied (or, for `durable`, durable) mark reached its sequence number: the same rule as
//! the blocking wait (`wait_targets_until`), and the same errors (`BackupReplaced`,
//! `Timeout`, `Shutdown`).

use std::time::{Duration, Instant};

use super::stream::{acks_timed_out, missing_targets, Target};
use super::zones::Registration;
use super::{Inner, State};
use crate::{Durability, ReplicaError};

/// What a deferred change calls once its acknowledgements are in, or with the error that
/// ends its wait.
pub type AckCallback = Box<dyn FnOnce(Result<(), ReplicaError>) + Send>;

/// One deferred wait for acknowledgements.
pub(super) struct Waiter {
    targets: Vec<Target>,
    /// Zones whose registration must be done first (queued changes,
    /// `Replicator::on_changes_queued`).
    zones: Vec<u32>,
    durability: Durability,
    deadline: Instant,
    done: AckCallback,
}

/// How a waiter stands against the current state: `None` while it must wait.
fn outcome(
    state: &State,
    waiter: &Waiter,
    now: Instant,
    waited: Duration,
) -> Option<Result<(), ReplicaError>> {
    let mut registering = false;
    for &zone in &waiter.zones {
        match state.zones.get(&zone).map(|z| &z.registration) {
            Some(Registration::Pending) => registering = true,
            Some(Registration::Failed(reason)) => {
                return Some(Err(ReplicaError::Registration {
                    zone,
                    reason: reason.clone(),
                }))
            }
            _ => {}
        }
    }
    if registering {
        return (now >= waiter.deadline).then(|| {
            Err(ReplicaError::Timeout {
                what: "zone registration",
                waited,
                missing: Vec::new(),
            })
        });
    }
    if waiter.durability == Durability::Async {
        return Some(Ok(()));
    }
    match missing_targets(state, &waiter.targets, waiter.durability) {
        Err(error) => Some(Err(error)),
        Ok(missing) if missing.is_empty() => Some(Ok(())),
        Ok(missing) if now >= waiter.deadline => {
            Some(Err(acks_timed_out(waiter.durability, waited, missing)))
        }
        Ok(_) => None,
    }
}

/// Callbacks to run (after the state lock is released) with their results.
pub(super) type Finished = Vec<(AckCallback, Result<(), ReplicaError>)>;

/// Runs finished callbacks; call without holding the state lock.
pub(super) fn run(finished: Finished) {
    for (done, result) in finished {
        done(result);
    }
}

impl Inner {
    /// Registers a deferred wait for `targets` (and for the registration of `zones`), or
    /// returns it as finished at once (already acknowledged, nothing to wait for, or a
    /// target already replaced).
    pub(super) fn defer(
        &self,
        state: &mut State,
        targets: Vec<Target>,
        zones: Vec<u32>,
        durability: Durability,
        done: AckCallback,
    ) -> Finished {
        let waiter = Waiter {
            targets,
            zones,
            durability,
            deadline: self.io.now() + self.config.wait_timeout,
            done,
        };
        if waiter.zones.is_empty() && (durability == Durability::Async || waiter.targets.is_empty())
        {
            return vec![(waiter.done, Ok(()))];
        }
        match outcome(state, &waiter, self.io.now(), self.config.wait_timeout) {
            Some(result) => vec![(waiter.done, result)],
            None => {
                state.waiters.push(waiter);
                Vec::new()
            }
        }
    }

    /// Takes the waiters that end now (acknowledged, timed out, backup replaced).
    pub(super) fn finished_waiters(&self, state: &mut State) -> Finished {
        if state.waiters.is_empty() {
            return Vec::new();
        }
        let now = self.io.now();
        let waited = self.config.wait_timeout;
        let mut finished = Vec::new();
        let mut index = 0;
        while index < state.waiters.len() {
            match outcome(state, &state.waiters[index], now, waited) {
                Some(result) => {
                    let waiter = state.waiters.swap_remove(index);
                    finished.push((waiter.done, result));
                }
                None => index += 1,
            }
        }
        finished
    }

    /// Takes every waiter with `error` (shutdown).
    pub(super) fn fail_waiters(state: &mut State, error: &ReplicaError) -> Finished {
        state
            .waiters
            .drain(..)
            .map(|waiter| (waiter.done, Err(error.clone())))
            .collect()
    }
}

//! A node's lease with the superpeers: how long it may still act as the owner of its
//! chunks without hearing from them.
//!
//! # Job
//! A peer that was paused (SIGSTOP, a VM freeze, a long stall) or cut off from the
//! superpeers may have been declared failed, and its chunks recovered and changed on
//! other peers, before it notices. Without a bound it would keep serving reads of the old
//! values and accepting `async` writes that nobody keeps. The lease is that bound: the
//! peer serves chunks only while [`Lease::holds`].
//!
//! # Protocol (see `myriad_proto::meta::Heartbeat`)
//! - Every heartbeat reply gets a number ([`Lease::reply_sent`]); the time it was *sent*
//!   is remembered for the last few.
//! - A heartbeat names the last reply its superpeer *received* (`acked`) and the lease
//!   length; the lease then holds until that reply's sending time plus the length
//!   ([`Lease::acked`]). The join request's sending time starts the first lease.
//! - The superpeer declares a node failed only after `failure_timeout` of silence counted
//!   from the arrival of its last reply, and leases are shorter than that; a reply
//!   arrives after it was sent, so the lease has ended on the peer's own clock before the
//!   verdict, whatever the message delays.
//!
//! # Invariants
//! - The lease only moves forward, and only from a reply the superpeer has seen.
//! - Counted on the monotonic clock (it keeps running while the process is stopped).
//!
//! # Who calls it
//! [`crate::membership::Membership`] renews it; the node's chunk service checks it before
//! serving.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Replies whose sending times are remembered (heartbeats come every interval; an
/// acknowledgement names one of the last few replies).
const REMEMBERED_REPLIES: usize = 16;

/// A node's lease. See the module docs.
#[derive(Debug)]
pub struct Lease {
    origin: Instant,
    /// Nanoseconds after `origin` until which the lease holds; 0: never granted.
    until_ns: AtomicU64,
    /// The last replies: (number, nanoseconds after `origin` when it was sent).
    sent: Mutex<Sent>,
}

#[derive(Debug)]
struct Sent {
    next: u64,
    recent: [(u64, u64); REMEMBERED_REPLIES],
}

impl Default for Lease {
    fn default() -> Self {
        Lease::new()
    }
}

impl Lease {
    /// A lease not granted yet.
    pub fn new() -> Lease {
        Lease {
            origin: Instant::now(),
            until_ns: AtomicU64::new(0),
            sent: Mutex::new(Sent {
                next: 1,
                recent: [(0, 0); REMEMBERED_REPLIES],
            }),
        }
    }

    /// Nanoseconds from `origin` to `at` (callers pass instants not before `origin`).
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn extend_to(&self, until_ns: u64) {
        self.until_ns.fetch_max(until_ns, Ordering::AcqRel);
    }

    /// Grants the lease for `length` from `sent`, the moment a request the superpeers
    /// answered was sent (the join). A `sent` before this lease was made grants nothing
    /// (it cannot be counted on this lease's clock without moving it later).
    pub fn grant_from(&self, sent: Instant, length: Duration) {
        if sent < self.origin {
            return;
        }
        let length = u64::try_from(length.as_nanos()).unwrap_or(u64::MAX);
        self.extend_to(self.nanos(sent).saturating_add(length).max(1));
    }

    /// Numbers a heartbeat reply about to be sent and remembers when.
    pub fn reply_sent(&self) -> u64 {
        let now = self.nanos(Instant::now());
        let mut sent = self.sent.lock();
        let number = sent.next;
        sent.next += 1;
        let slot = (number % REMEMBERED_REPLIES as u64) as usize;
        sent.recent[slot] = (number, now);
        number
    }

    /// A heartbeat acknowledged reply `acked` and grants `length_ms` from its sending.
    /// Unknown or forgotten numbers (and 0) grant nothing.
    pub fn acked(&self, acked: u64, length_ms: u32) {
        if acked == 0 {
            return;
        }
        let start = {
            let sent = self.sent.lock();
            let slot = (acked % REMEMBERED_REPLIES as u64) as usize;
            match sent.recent[slot] {
                (number, at) if number == acked => at,
                _ => return,
            }
        };
        self.extend_to(
            start
                .saturating_add(u64::from(length_ms) * 1_000_000)
                .max(1),
        );
    }

    /// Whether the lease holds now.
    pub fn holds(&self) -> bool {
        self.remaining().is_some()
    }

    /// How long the lease still holds (`None`: it has ended or was never granted).
    pub fn remaining(&self) -> Option<Duration> {
        let until = self.until_ns.load(Ordering::Acquire);
        let now = self.nanos(Instant::now());
        (until > now).then(|| Duration::from_nanos(until - now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counts_from_the_sending_of_the_acknowledged_reply() {
        let lease = Lease::new();
        assert!(!lease.holds(), "no lease before any grant");
        let first = lease.reply_sent();
        let second = lease.reply_sent();
        assert_eq!((first, second), (1, 2));
        // Unknown and zero acknowledgements grant nothing.
        lease.acked(0, 10_000);
        lease.acked(99, 10_000);
        assert!(!lease.holds());
        lease.acked(first, 10_000);
        let remaining = lease.remaining().expect("granted");
        assert!(remaining <= Duration::from_secs(10));
        assert!(remaining > Duration::from_secs(9));
    }

    #[test]
    fn a_lease_ends_on_its_own_and_never_moves_back() {
        let lease = Lease::new();
        let reply = lease.reply_sent();
        lease.acked(reply, 30);
        assert!(lease.holds());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!lease.holds(), "a 30 ms lease still holds after 60 ms");
        // A late acknowledgement of an old reply does not bring it back.
        lease.acked(reply, 30);
        assert!(!lease.holds());
        // A longer grant, then a shorter one: the longer stands.
        let next = lease.reply_sent();
        lease.acked(next, 10_000);
        lease.acked(next, 1);
        assert!(lease.remaining().expect("granted") > Duration::from_secs(9));
    }

    #[test]
    fn forgotten_replies_grant_nothing() {
        let lease = Lease::new();
        let old = lease.reply_sent();
        for _ in 0..REMEMBERED_REPLIES {
            lease.reply_sent();
        }
        lease.acked(old, 10_000);
        assert!(!lease.holds(), "a reply pushed out of memory was honoured");
    }

    #[test]
    fn the_join_grants_from_when_it_was_sent() {
        let before = Instant::now();
        let lease = Lease::new();
        lease.grant_from(before, Duration::from_secs(5));
        assert!(
            !lease.holds(),
            "a start before the lease existed was honoured"
        );
        let sent = Instant::now();
        lease.grant_from(sent, Duration::from_secs(5));
        assert!(lease.remaining().expect("granted") <= Duration::from_secs(5));
        let expired = Lease::new();
        expired.grant_from(Instant::now(), Duration::ZERO);
        assert!(!expired.holds());
    }
}

//! Network filters for tests: simulated faults on the link to one node (drop, partition,
//! delay), set per remote node on an endpoint with `NetHandle::set_fault` /
//! `NetHandle::add_fault` and healed with `NetHandle::clear_fault`. The in-process test
//! cluster and a future simulator cut, slow and heal links with them.
//!
//! # Filters
//! | [`Fault`] | effect towards the node |
//! |---|---|
//! | `DropOutgoing` | everything sent to it is lost (requests time out); responses too |
//! | `DropIncoming` | everything received from it is discarded before any handler, responses too |
//! | `Partition` | both drops |
//! | `DelayOutgoing { ms }` | every frame to it is written to the socket `ms` after it was queued |
//! | `DelayIncoming { ms }` | every byte from it is handed to the frame decoder `ms` after it was read |
//!
//! Each direction is filtered on its own; `add_fault` combines filters (say a delay out and
//! a drop in), `set_fault` replaces what was set. A drop wins over a delay in the same
//! direction. Filters apply to the node's connection and the lanes it opened to this
//! endpoint, also to connections opened later; `request_blocking` takes no lane to a node
//! with a filter set.
//!
//! # Delays keep the order
//! A delay works on the byte stream of one connection, not on messages: the writer holds
//! what it took from the send queue in a [`DelayLine`] and writes it when due; the reader
//! holds what it read in another and decodes it when due. A line is first in, first out,
//! so whatever follows a delayed frame waits behind it, also after the delay was lowered
//! or cleared (the line drains in order, then the connection returns to the plain path).
//! Held bytes count as queued (send side) or stop the reading (receive side, above
//! `receive_unprocessed_bytes_max`), so memory stays bounded and a delayed link also
//! limits throughput, as a real one would (one queue's worth per delay).
//!
//! # Cost when no filter is set
//! Each connection has a [`LinkFilter`]: one byte of filter bits, loaded with one relaxed
//! atomic load per frame queued (`Conn::try_enqueue`), per batch written (the writer
//! task), per read (the reader task) and per delivery (handler threads, with the fence
//! flag). The bits are zero when nothing is set, and everything else here runs only when
//! they are not. The endpoint's per-node table is consulted by senders only while some
//! filter is set anywhere (`Shared::faults_any`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use bytes::{BufMut, Bytes};
use tokio::time::Instant;

/// A simulated network fault towards one node (for tests of partitions, lossy links and
/// slow links). See the module docs for what each does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Everything sent to the node is silently lost (requests time out).
    DropOutgoing,
    /// Everything received from the node is silently discarded.
    DropIncoming,
    /// Both: the node is cut off as by a network partition.
    Partition,
    /// Everything sent to the node leaves `ms` milliseconds after it was queued, in order.
    DelayOutgoing {
        /// The delay in milliseconds (0: no delay).
        ms: u64,
    },
    /// Everything received from the node is handled `ms` milliseconds after it was read,
    /// in order.
    DelayIncoming {
        /// The delay in milliseconds (0: no delay).
        ms: u64,
    },
}

/// The filters set towards one node: the combination of its [`Fault`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkFaults {
    pub drop_outgoing: bool,
    pub drop_incoming: bool,
    /// 0: none.
    pub delay_outgoing_ms: u64,
    /// 0: none.
    pub delay_incoming_ms: u64,
}

impl LinkFaults {
    /// Just `fault`.
    pub fn of(fault: Fault) -> Self {
        let mut faults = Self::default();
        faults.add(fault);
        faults
    }

    /// Adds `fault` to what is set (a second delay in one direction replaces the first).
    pub fn add(&mut self, fault: Fault) {
        match fault {
            Fault::DropOutgoing => self.drop_outgoing = true,
            Fault::DropIncoming => self.drop_incoming = true,
            Fault::Partition => {
                self.drop_outgoing = true;
                self.drop_incoming = true;
            }
            Fault::DelayOutgoing { ms } => self.delay_outgoing_ms = ms,
            Fault::DelayIncoming { ms } => self.delay_incoming_ms = ms,
        }
    }

    /// Whether nothing is set.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// The faults that make up this set, drops first.
    pub fn list(&self) -> Vec<Fault> {
        let mut list = Vec::new();
        match (self.drop_outgoing, self.drop_incoming) {
            (true, true) => list.push(Fault::Partition),
            (true, false) => list.push(Fault::DropOutgoing),
            (false, true) => list.push(Fault::DropIncoming),
            (false, false) => {}
        }
        if self.delay_outgoing_ms > 0 {
            list.push(Fault::DelayOutgoing {
                ms: self.delay_outgoing_ms,
            });
        }
        if self.delay_incoming_ms > 0 {
            list.push(Fault::DelayIncoming {
                ms: self.delay_incoming_ms,
            });
        }
        list
    }

    fn bits(&self) -> u8 {
        let mut bits = 0;
        if self.drop_outgoing {
            bits |= DROP_OUTGOING;
        }
        if self.drop_incoming {
            bits |= DROP_INCOMING;
        }
        if self.delay_outgoing_ms > 0 {
            bits |= DELAY_OUTGOING;
        }
        if self.delay_incoming_ms > 0 {
            bits |= DELAY_INCOMING;
        }
        bits
    }
}

/// Filter bit: frames queued on the connection are lost.
pub(crate) const DROP_OUTGOING: u8 = 1;
/// Filter bit: messages read from the connection are discarded.
pub(crate) const DROP_INCOMING: u8 = 1 << 1;
/// Filter bit: the writer holds frames for the outgoing delay.
pub(crate) const DELAY_OUTGOING: u8 = 1 << 2;
/// Filter bit: the reader holds bytes for the incoming delay.
pub(crate) const DELAY_INCOMING: u8 = 1 << 3;

/// One connection's copy of its node's filters, read on the hot paths.
#[derive(Debug, Default)]
pub(crate) struct LinkFilter {
    bits: AtomicU8,
    delay_outgoing_ms: AtomicU64,
    delay_incoming_ms: AtomicU64,
}

impl LinkFilter {
    /// The filter bits: zero when no filter is set (one relaxed load, the hot-path check).
    #[inline]
    pub fn bits(&self) -> u8 {
        self.bits.load(Ordering::Relaxed)
    }

    /// Sets the filters (the delays before the bits, so that a side that sees a delay bit
    /// with [`LinkFilter::delay_outgoing`] also sees its delay).
    pub fn set(&self, faults: &LinkFaults) {
        self.delay_outgoing_ms
            .store(faults.delay_outgoing_ms, Ordering::Relaxed);
        self.delay_incoming_ms
            .store(faults.delay_incoming_ms, Ordering::Relaxed);
        self.bits.store(faults.bits(), Ordering::Release);
    }

    /// The outgoing delay now (zero if none).
    pub fn delay_outgoing(&self) -> Duration {
        if self.bits.load(Ordering::Acquire) & DELAY_OUTGOING == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.delay_outgoing_ms.load(Ordering::Relaxed))
    }

    /// The incoming delay now (zero if none).
    pub fn delay_incoming(&self) -> Duration {
        if self.bits.load(Ordering::Acquire) & DELAY_INCOMING == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.delay_incoming_ms.load(Ordering::Relaxed))
    }
}

/// Bytes of one connection held back by a delay: first in, first out, each piece with the
/// time it is due. A piece is never due before the piece ahead of it (a lowered delay
/// makes later bytes wait behind earlier ones rather than overtake them).
#[derive(Debug, Default)]
pub(crate) struct DelayLine {
    pieces: VecDeque<(Instant, Bytes)>,
    bytes: usize,
}

impl DelayLine {
    /// Holds `piece` until `due` (or until the piece ahead of it is due, if later).
    pub fn push(&mut self, due: Instant, piece: Bytes) {
        if piece.is_empty() {
            return;
        }
        let due = match self.pieces.back() {
            Some((last, _)) => due.max(*last),
            None => due,
        };
        self.bytes += piece.len();
        self.pieces.push_back((due, piece));
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// When the first piece is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pieces.front().map(|(due, _)| *due)
    }

    /// The first piece if it is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Bytes> {
        if self.next_due()? > now {
            return None;
        }
        let (_, piece) = self.pieces.pop_front()?;
        self.bytes -= piece.len();
        Some(piece)
    }

    /// Copies as many due bytes as fit into `buf`, in order (a piece may be split);
    /// returns how many.
    pub fn take_due_into(&mut self, now: Instant, buf: &mut impl BufMut) -> usize {
        let mut copied = 0;
        while buf.remaining_mut() > 0 {
            let Some((due, piece)) = self.pieces.front_mut() else {
                break;
            };
            if *due > now {
                break;
            }
            let n = piece.len().min(buf.remaining_mut());
            buf.put_slice(piece.get(..n).unwrap_or_default());
            copied += n;
            self.bytes -= n;
            if n == piece.len() {
                self.pieces.pop_front();
            } else {
                *piece = piece.slice(n..);
            }
        }
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_combine_and_list_back() {
        let mut faults = LinkFaults::of(Fault::DelayOutgoing { ms: 50 });
        faults.add(Fault::DropIncoming);
        assert_eq!(
            faults.list(),
            vec![Fault::DropIncoming, Fault::DelayOutgoing { ms: 50 }]
        );
        faults.add(Fault::DropOutgoing);
        faults.add(Fault::DelayIncoming { ms: 7 });
        faults.add(Fault::DelayOutgoing { ms: 0 });
        assert_eq!(
            faults.list(),
            vec![Fault::Partition, Fault::DelayIncoming { ms: 7 }]
        );
        assert!(LinkFaults::default().is_none());
        assert!(LinkFaults::of(Fault::DelayIncoming { ms: 0 }).is_none());
    }

    #[test]
    fn the_filter_bits_are_zero_without_a_filter_and_delays_follow_the_bits() {
        let filter = LinkFilter::default();
        assert_eq!(filter.bits(), 0);
        assert_eq!(filter.delay_outgoing(), Duration::ZERO);
        filter.set(&LinkFaults::of(Fault::DelayOutgoing { ms: 20 }));
        assert_eq!(filter.bits(), DELAY_OUTGOING);
        assert_eq!(filter.delay_outgoing(), Duration::from_millis(20));
        assert_eq!(filter.delay_incoming(), Duration::ZERO);
        filter.set(&LinkFaults::of(Fault::Partition));
        assert_eq!(filter.bits(), DROP_OUTGOING | DROP_INCOMING);
        assert_eq!(filter.delay_outgoing(), Duration::ZERO);
        filter.set(&LinkFaults::default());
        assert_eq!(filter.bits(), 0);
    }

    #[test]
    fn a_delay_line_keeps_the_order_when_the_delay_is_lowered() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut line = DelayLine::default();
        line.push(at(100), Bytes::from_static(b"abc"));
        // Due earlier, but behind "abc": waits for it.
        line.push(at(10), Bytes::from_static(b"de"));
        line.push(at(10), Bytes::new());
        assert_eq!(line.bytes(), 5);
        assert_eq!(line.pop_due(at(50)), None);
        let mut buf = Vec::new();
        assert_eq!(line.take_due_into(at(50), &mut buf), 0);
        assert_eq!(line.pop_due(at(100)), Some(Bytes::from_static(b"abc")));
        assert_eq!(line.next_due(), Some(at(100)));
        let mut small = [0u8; 1];
        assert_eq!(line.take_due_into(at(100), &mut &mut small[..]), 1);
        assert_eq!(&small, b"d");
        assert_eq!(line.take_due_into(at(100), &mut buf), 1);
        assert_eq!(buf, b"e");
        assert!(line.is_empty());
        assert_eq!(line.bytes(), 0);
    }
}

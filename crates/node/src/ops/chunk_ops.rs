//! Counts and latency histograms of the chunk requests a peer serves, by operation type
//! and result: plain atomics bumped on the request path, read at scrape time.
//!
//! # Job
//! [`ChunkOps::record`] takes the encoded request and reply (only their first byte, the
//! type tag, and the request's first CID for the per-range counters, [`ChunkOps::heat`]) and, for one request in [`LATENCY_SAMPLE_EVERY`] per thread ([`Timer`]), the
//! time it took from reaching the peer's handler to its reply; [`ChunkOps::snapshot`]
//! reads everything for the metrics endpoint. Requests are all counted; latencies are
//! sampled because two clock reads cost about as much as the rest of the bookkeeping on
//! the I/O thread's inline path (measured: 30 ns the record, 140 ns a clock read on the
//! busy 2-core test VM).
//!
//! # Invariants
//! - Recording never locks and never allocates: one array slot per (type, result), fixed
//!   histogram buckets ([`LATENCY_BUCKETS_US`]).
//! - A snapshot is not atomic across slots (a scrape may see a count without its bucket
//!   yet); every counter only grows.
//!
//! # Who calls it
//! The peer's CHUNK dispatch (`peer::dispatch`, `peer::slow_path`, the chunk service's
//! blocking path) records; `ops::peer_metrics` reads.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::range_heat::RangeHeat;

/// One request in this many (counted per thread) has its latency measured.
pub const LATENCY_SAMPLE_EVERY: u32 = 8;

thread_local! {
    /// Requests this thread started timers for.
    static STARTED: Cell<u32> = const { Cell::new(0) };
}

/// The clock of one request: running for one request in [`LATENCY_SAMPLE_EVERY`] started
/// on this thread, else empty (the request is counted, not timed).
#[derive(Debug, Clone, Copy)]
pub struct Timer(Option<Instant>);

impl Timer {
    /// Starts the timer of a request that just reached the handler.
    pub fn start() -> Timer {
        let index = STARTED.with(|started| {
            let index = started.get();
            started.set(index.wrapping_add(1));
            index
        });
        Timer(
            index
                .is_multiple_of(LATENCY_SAMPLE_EVERY)
                .then(Instant::now),
        )
    }

    /// A timer that always measures (tests).
    pub fn always() -> Timer {
        Timer(Some(Instant::now()))
    }

    /// The time since the start, if this request is timed.
    pub fn elapsed(&self) -> Option<Duration> {
        self.0.map(|start| start.elapsed())
    }
}

/// Tags of `myriad_proto::chunk`'s private `tag` module that [`ChunkOps`] reads: replies
/// that failed as a whole (and, for tests, a few more).
mod tags {
    pub const REPLY_FAILED: u8 = 7;
    pub const REPLY_MALFORMED: u8 = 8;
    #[cfg(test)]
    pub const REPLY_DATA: u8 = 2;
    #[cfg(test)]
    pub const REPLY_STATUSES: u8 = 3;
    #[cfg(test)]
    pub const GET: u8 = 3;
    #[cfg(test)]
    pub const PUT: u8 = 4;
}

/// Upper bounds of the latency buckets, in microseconds (a last, unbounded bucket follows).
pub const LATENCY_BUCKETS_US: [u64; 15] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    1_000_000,
];

/// The operation names by request tag (index = tag; 0 and unknown tags are "other").
pub const OP_NAMES: [&str; 15] = [
    "other",
    "create",
    "create_with_data",
    "get",
    "put",
    "remove",
    "insert",
    "read_at",
    "write_at",
    "resize",
    "lock",
    "unlock",
    "status",
    "list",
    "stats",
];

/// The results a reply is counted under.
pub const RESULT_NAMES: [&str; 2] = ["ok", "failed"];

const OPS: usize = OP_NAMES.len();
const BUCKETS: usize = LATENCY_BUCKETS_US.len() + 1;

/// The counters of one operation type.
#[derive(Debug, Default)]
struct OpSlot {
    /// Requests by result ([`RESULT_NAMES`]).
    results: [AtomicU64; 2],
    /// Latency histogram of the timed requests (not cumulative; the last bucket is
    /// unbounded).
    buckets: [AtomicU64; BUCKETS],
    /// Sum of latencies in nanoseconds.
    sum_ns: AtomicU64,
}

/// The chunk request counters of one peer. See the module documentation.
#[derive(Debug, Default)]
pub struct ChunkOps {
    slots: [OpSlot; OPS],
    heat: RangeHeat,
}

/// One operation type in a [`ChunkOps::snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpSnapshot {
    /// The operation ([`OP_NAMES`]).
    pub op: &'static str,
    /// Requests by result, in [`RESULT_NAMES`] order.
    pub results: [u64; 2],
    /// Histogram of the timed requests, per bucket (not cumulative, as
    /// `prometheus-client`'s encoder takes them): `(upper bound in seconds, timed requests
    /// above the previous bound and at most this one)`, the last bound `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the timed requests' latencies in seconds.
    pub sum_seconds: f64,
}

impl OpSnapshot {
    /// Requests of this type, whatever the result.
    pub fn count(&self) -> u64 {
        self.results.iter().sum()
    }

    /// Timed requests of this type (the histogram's count).
    pub fn timed(&self) -> u64 {
        self.buckets.iter().map(|&(_, count)| count).sum()
    }
}

/// Whether an encoded chunk reply failed as a whole (`Failed`, `Malformed`, or empty).
fn reply_failed(reply: &[u8]) -> bool {
    matches!(
        reply.first(),
        None | Some(&tags::REPLY_FAILED) | Some(&tags::REPLY_MALFORMED)
    )
}

impl ChunkOps {
    /// Counts one request (`request` and `reply` encoded; only their tags are read) and,
    /// if `timer` runs, adds its latency to the histogram.
    pub fn record(&self, request: &[u8], reply: &[u8], timer: Timer) {
        let op = match request.first() {
            Some(&tag) if usize::from(tag) < OPS => usize::from(tag),
            _ => 0,
        };
        if let Some(cid) = myriad_proto::chunk::request_first_cid(request) {
            self.heat.record(cid);
        }
        let slot = &self.slots[op];
        slot.results[usize::from(reply_failed(reply))].fetch_add(1, Ordering::Relaxed);
        let Some(elapsed) = timer.elapsed() else {
            return;
        };
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_US
            .iter()
            .position(|&bound| micros <= bound)
            .unwrap_or(BUCKETS - 1);
        slot.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        slot.sum_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The requests per CID range (counted by each request's first CID).
    pub fn heat(&self) -> &RangeHeat {
        &self.heat
    }

    /// Every operation type's figures (types never seen included, at zero).
    pub fn snapshot(&self) -> Vec<OpSnapshot> {
        OP_NAMES
            .iter()
            .zip(&self.slots)
            .map(|(&op, slot)| {
                let buckets = slot
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(index, count)| {
                        let bound = LATENCY_BUCKETS_US
                            .get(index)
                            .map_or(f64::INFINITY, |&us| us as f64 / 1e6);
                        (bound, count.load(Ordering::Relaxed))
                    })
                    .collect();
                OpSnapshot {
                    op,
                    results: [
                        slot.results[0].load(Ordering::Relaxed),
                        slot.results[1].load(Ordering::Relaxed),
                    ],
                    buckets,
                    sum_seconds: slot.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
                }
            })
            .collect()
    }

    /// Requests served so far, every type and result except `stats` (the superpeers'
    /// status samplers ask for stats every second; they are no load of the peer).
    pub fn total(&self) -> u64 {
        self.slots
            .iter()
            .zip(OP_NAMES)
            .filter(|(_, op)| *op != "stats")
            .flat_map(|(slot, _)| &slot.results)
            .map(|count| count.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timer that started `ago`.
    fn timer(ago: Duration) -> Timer {
        Timer(Instant::now().checked_sub(ago))
    }

    #[test]
    fn counts_by_type_result_and_bucket() {
        let ops = ChunkOps::default();
        ops.record(
            &[tags::GET, 9],
            &[tags::REPLY_DATA],
            timer(Duration::from_micros(30)),
        );
        ops.record(
            &[tags::GET],
            &[tags::REPLY_FAILED],
            timer(Duration::from_millis(2)),
        );
        ops.record(
            &[tags::PUT],
            &[tags::REPLY_STATUSES],
            timer(Duration::from_secs(3)),
        );
        ops.record(&[200], &[], Timer::always());
        ops.record(&[14], &[6], Timer::always());
        let snapshot = ops.snapshot();
        let get = snapshot.iter().find(|s| s.op == "get").expect("get");
        assert_eq!(get.results, [1, 1]);
        // About 30 µs falls in the 50 µs bucket (a slow test machine may take longer), 2 ms
        // in the 2.5 ms bucket.
        let at = |bound: f64| get.buckets.iter().find(|b| b.0 == bound).expect("bucket").1;
        assert_eq!(at(0.000_025), 0);
        assert_eq!(at(0.002_5), 1);
        assert_eq!(get.buckets.last().expect("inf"), &(f64::INFINITY, 0));
        assert_eq!(get.timed(), 2);
        assert!(
            get.sum_seconds >= 0.002_03 && get.sum_seconds < 0.1,
            "{}",
            get.sum_seconds
        );
        let put = snapshot.iter().find(|s| s.op == "put").expect("put");
        assert_eq!(put.results, [1, 0]);
        assert_eq!(
            put.buckets[LATENCY_BUCKETS_US.len() - 1].1,
            0,
            "3 s is past 1 s"
        );
        assert_eq!(put.buckets.last().expect("inf").1, 1);
        assert_eq!(put.timed(), 1);
        let other = snapshot.iter().find(|s| s.op == "other").expect("other");
        assert_eq!(other.results, [0, 1], "an empty reply counts as failed");
        assert_eq!(ops.total(), 4, "stats requests are not counted");
    }

    #[test]
    fn one_request_in_eight_per_thread_is_timed() {
        let ops = ChunkOps::default();
        std::thread::spawn(move || {
            for _ in 0..100 {
                ops.record(&[tags::GET], &[tags::REPLY_DATA], Timer::start());
            }
            let get = ops
                .snapshot()
                .into_iter()
                .find(|s| s.op == "get")
                .expect("get");
            assert_eq!(get.count(), 100, "every request counted");
            assert_eq!(get.timed(), 13, "requests 0, 8, ..., 96 timed");
        })
        .join()
        .expect("thread");
    }
}

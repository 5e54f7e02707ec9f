//! Monitoring like DXMonitor: each peer pushes a compact summary of itself to the
//! superpeers every few seconds ([`crate::types::MONITOR_REPORT`]); anyone asks a
//! superpeer for the reports it kept ([`crate::types::MONITOR_QUERY`]).
//!
//! # Job
//! [`MonitorReport`] carries running totals (CPU time, bytes sent and received, bytes
//! written to the backup logs, requests served) and current levels (resident memory,
//! chunks, payload and free bytes), so that a reader computes rates from two consecutive
//! reports and a lost report costs resolution, not correctness. It also names the peer's
//! hottest CID ranges ([`HotRange`], at most [`HOT_RANGES_MAX`]) with their request rates
//! over the interval before the report. [`MonitorQuery`] names one
//! node or all; [`MonitorReply`] gives each node's kept reports, oldest first.
//!
//! # Invariants
//! Decoding never panics; counts are bounded by [`MONITOR_NODES_MAX`],
//! [`MONITOR_REPORTS_MAX`] and [`HOT_RANGES_MAX`] and by the bytes present; a hot range
//! whose first CID is above its last, or of two creators, is refused.
//!
//! # Who calls it
//! Peers (pushing), superpeers (keeping and answering), the client library's
//! `Client::monitoring` and `myriad term`'s `monitoring`.

use bytes::Bytes;
use myriad_types::codec::{Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};

use crate::{get_count, ProtoError};

/// Most nodes one reply lists.
pub const MONITOR_NODES_MAX: usize = 1 << 16;
/// Most reports one reply gives per node.
pub const MONITOR_REPORTS_MAX: usize = 4_096;
/// Most hot ranges one report names.
pub const HOT_RANGES_MAX: usize = 16;
/// Fields of one report (each at least one byte on the wire; the hot ranges' count one).
const REPORT_FIELDS: usize = 11;
/// Bytes of one hot range on the wire at least (two CIDs and a varint).
const HOT_RANGE_BYTES_MIN: usize = 17;

/// A CID range and the requests per second for its chunks a peer served over the
/// interval before its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotRange {
    /// First CID of the range.
    pub first: ChunkId,
    /// Last CID of the range (same creator, `first <= last`).
    pub last: ChunkId,
    /// Requests per second naming a CID of the range (by their first CID).
    pub requests_per_sec: u64,
}

/// One peer's summary at one moment (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorReport {
    /// When it was taken, milliseconds since the Unix epoch (the peer's clock).
    pub unix_ms: u64,
    /// The process's CPU time so far (user plus system), in milliseconds.
    pub cpu_ms: u64,
    /// Resident memory of the process, bytes.
    pub rss_bytes: u64,
    /// Bytes sent to other nodes so far (over the connections open now).
    pub net_sent_bytes: u64,
    /// Bytes received from other nodes so far (same).
    pub net_received_bytes: u64,
    /// Bytes the backup side wrote to its logs so far (0 without backups).
    pub disk_written_bytes: u64,
    /// Chunks stored.
    pub chunks: u64,
    /// Payload bytes of the stored chunks.
    pub payload_bytes: u64,
    /// Free bytes of the chunk memory.
    pub free_bytes: u64,
    /// Remote chunk requests served so far.
    pub requests_served: u64,
    /// The hottest CID ranges over the last interval, hottest first (at most
    /// [`HOT_RANGES_MAX`]).
    pub hot_ranges: Vec<HotRange>,
}

impl MonitorReport {
    fn put(&self, encoder: &mut Encoder) {
        encoder
            .put_varint(self.unix_ms)
            .put_varint(self.cpu_ms)
            .put_varint(self.rss_bytes)
            .put_varint(self.net_sent_bytes)
            .put_varint(self.net_received_bytes)
            .put_varint(self.disk_written_bytes)
            .put_varint(self.chunks)
            .put_varint(self.payload_bytes)
            .put_varint(self.free_bytes)
            .put_varint(self.requests_served)
            .put_varint(self.hot_ranges.len() as u64);
        for range in &self.hot_ranges {
            encoder
                .put_u64_le(range.first.raw())
                .put_u64_le(range.last.raw())
                .put_varint(range.requests_per_sec);
        }
    }

    fn get(decoder: &mut Decoder) -> Result<MonitorReport, ProtoError> {
        let mut report = MonitorReport {
            unix_ms: decoder.get_varint("report time")?,
            cpu_ms: decoder.get_varint("CPU time")?,
            rss_bytes: decoder.get_varint("resident bytes")?,
            net_sent_bytes: decoder.get_varint("bytes sent")?,
            net_received_bytes: decoder.get_varint("bytes received")?,
            disk_written_bytes: decoder.get_varint("bytes written")?,
            chunks: decoder.get_varint("chunks")?,
            payload_bytes: decoder.get_varint("payload bytes")?,
            free_bytes: decoder.get_varint("free bytes")?,
            requests_served: decoder.get_varint("requests served")?,
            hot_ranges: Vec::new(),
        };
        let count = get_count(decoder, "hot ranges", HOT_RANGES_MAX, HOT_RANGE_BYTES_MIN)?;
        report.hot_ranges.reserve_exact(count);
        for _ in 0..count {
            let first = ChunkId::from_raw(decoder.get_u64_le("hot range first CID")?);
            let last = ChunkId::from_raw(decoder.get_u64_le("hot range last CID")?);
            if first.raw() > last.raw() || first.creator() != last.creator() {
                return Err(ProtoError::Invalid {
                    what: "hot range",
                    detail: format!("{first}..={last} is not a range of one creator"),
                });
            }
            let requests_per_sec = decoder.get_varint("hot range rate")?;
            report.hot_ranges.push(HotRange {
                first,
                last,
                requests_per_sec,
            });
        }
        Ok(report)
    }

    /// The report's bytes: its ten figures as varints in declaration order, then the hot
    /// ranges' count (varint) and per range its first and last CID (u64 LE) and rate
    /// (varint).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(REPORT_FIELDS * 5 + self.hot_ranges.len() * 20);
        self.put(&mut encoder);
        encoder.finish()
    }

    /// Decodes a report; fails on short or trailing bytes.
    pub fn decode(payload: Bytes) -> Result<MonitorReport, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let report = MonitorReport::get(&mut decoder)?;
        decoder.finish()?;
        Ok(report)
    }
}

/// Which reports a [`MonitorQuery`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorQuery {
    /// One node, or every node that reported.
    pub node: Option<NodeId>,
    /// Most reports per node, newest kept (0: only the newest one).
    pub history: u32,
}

impl MonitorQuery {
    /// The query's bytes: tag 0 (all) or 1 + node (u16 LE), then `history` (varint).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(8);
        match self.node {
            None => encoder.put_u8(0),
            Some(node) => encoder.put_u8(1).put_u16_le(node.0),
        };
        encoder.put_varint(u64::from(self.history));
        encoder.finish()
    }

    /// Decodes a query.
    pub fn decode(payload: Bytes) -> Result<MonitorQuery, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let node = match decoder.get_u8("monitor query tag")? {
            0 => None,
            1 => Some(NodeId(decoder.get_u16_le("node")?)),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "monitor query",
                    tag,
                })
            }
        };
        let history = decoder.get_varint_u32("history")?;
        decoder.finish()?;
        Ok(MonitorQuery { node, history })
    }
}

/// The reports a superpeer kept: per node, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorReply {
    /// Each node with its reports.
    pub nodes: Vec<(NodeId, Vec<MonitorReport>)>,
}

impl MonitorReply {
    /// The reply's bytes: node count, then per node its ID (u16 LE), report count and
    /// reports.
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::new();
        encoder.put_varint(self.nodes.len() as u64);
        for (node, reports) in &self.nodes {
            encoder.put_u16_le(node.0).put_varint(reports.len() as u64);
            for report in reports {
                report.put(&mut encoder);
            }
        }
        encoder.finish()
    }

    /// Decodes a reply.
    pub fn decode(payload: Bytes) -> Result<MonitorReply, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let count = get_count(&mut decoder, "monitored nodes", MONITOR_NODES_MAX, 3)?;
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            let node = NodeId(decoder.get_u16_le("node")?);
            let reports = get_count(&mut decoder, "reports", MONITOR_REPORTS_MAX, REPORT_FIELDS)?;
            let mut list = Vec::with_capacity(reports);
            for _ in 0..reports {
                list.push(MonitorReport::get(&mut decoder)?);
            }
            nodes.push((node, list));
        }
        decoder.finish()?;
        Ok(MonitorReply { nodes })
    }
}

/// Runs every decoder of this family on `bytes` (for the fuzz target).
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    if let Ok(report) = MonitorReport::decode(payload.clone()) {
        assert_eq!(MonitorReport::decode(report.encode()), Ok(report));
    }
    if let Ok(query) = MonitorQuery::decode(payload.clone()) {
        assert_eq!(MonitorQuery::decode(query.encode()), Ok(query));
    }
    if let Ok(reply) = MonitorReply::decode(payload) {
        assert_eq!(MonitorReply::decode(reply.encode()), Ok(reply.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_queries_and_replies_round_trip_and_bad_bytes_are_refused() {
        let report = MonitorReport {
            unix_ms: 1_790_000_000_000,
            cpu_ms: 12_345,
            rss_bytes: 80 << 20,
            net_sent_bytes: 1 << 33,
            net_received_bytes: 7,
            disk_written_bytes: 0,
            chunks: 1_000_000,
            payload_bytes: 64_000_000,
            free_bytes: 1 << 30,
            requests_served: 99,
            hot_ranges: vec![HotRange {
                first: ChunkId::from_raw(0x0002_0000_0000_0100),
                last: ChunkId::from_raw(0x0002_0000_0000_01ff),
                requests_per_sec: 12_000,
            }],
        };
        assert_eq!(MonitorReport::decode(report.encode()), Ok(report.clone()));
        // A range backwards, or over two creators, is refused.
        for (first, last) in [
            (0x0002_0000_0000_01ffu64, 0x0002_0000_0000_0100u64),
            (0x0002_0000_0000_0100, 0x0003_0000_0000_0100),
        ] {
            let bad = MonitorReport {
                hot_ranges: vec![HotRange {
                    first: ChunkId::from_raw(first),
                    last: ChunkId::from_raw(last),
                    requests_per_sec: 1,
                }],
                ..report.clone()
            };
            assert!(MonitorReport::decode(bad.encode()).is_err());
        }
        // More ranges than the limit are refused.
        let many = MonitorReport {
            hot_ranges: vec![report.hot_ranges[0]; HOT_RANGES_MAX + 1],
            ..report.clone()
        };
        assert!(MonitorReport::decode(many.encode()).is_err());
        for query in [
            MonitorQuery {
                node: None,
                history: 0,
            },
            MonitorQuery {
                node: Some(NodeId(3)),
                history: 150,
            },
        ] {
            assert_eq!(MonitorQuery::decode(query.encode()), Ok(query));
        }
        let reply = MonitorReply {
            nodes: vec![
                (NodeId(2), vec![report.clone(), report.clone()]),
                (NodeId(3), vec![]),
            ],
        };
        assert_eq!(MonitorReply::decode(reply.encode()), Ok(reply));
        let mut long = report.encode().to_vec();
        long.push(0);
        assert!(MonitorReport::decode(Bytes::from(long)).is_err());
        assert!(MonitorQuery::decode(Bytes::from_static(&[9, 0])).is_err());
        // A count the bytes cannot hold is refused before anything is allocated.
        assert!(MonitorReply::decode(Bytes::from_static(&[0xff, 0xff, 0x03])).is_err());
        fuzz_decode(&[1, 2, 0, 5]);
    }
}

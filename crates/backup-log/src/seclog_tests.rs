//! Tests of `seclog`.

use super::*;
use crate::header::{encode, EncodeArgs};
use crate::storage::{MemStorage, Storage};
use proptest::prelude::{prop_oneof, Just, Strategy};

const SEGMENT: usize = 16384;

fn log(segments: usize) -> SecondaryLog {
    let storage = MemStorage::new();
    let file = storage.open("s", (segments * SEGMENT) as u64).unwrap();
    SecondaryLog::new(
        std::sync::Arc::from(file),
        1,
        SEGMENT,
        (SEGMENT / 2 - 64) as u32,
        vec![
            SegmentInfo {
                used: 0,
                generation: 0
            };
            segments
        ],
        None,
    )
}

fn batch(first_cid: u64, count: usize, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count as u64 {
        let args = EncodeArgs {
            cid: (1 << 48) | (first_cid + i),
            zone_owner: 1,
            epoch: 0,
            version: 0,
            chain: None,
        };
        encode(&args, &vec![i as u8; payload], &mut out);
    }
    out
}

/// Every used segment parses to exactly its fill level with verified checksums.
fn entries_on_disk(log: &SecondaryLog) -> usize {
    let mut total = 0;
    let mut buf = AlignedBuf::zeroed(SEGMENT);
    for (i, s) in log.segments().iter().enumerate() {
        if s.used == 0 {
            continue;
        }
        SecondaryLog::read_segment(log.file().as_ref(), SEGMENT, i, SEGMENT, &mut buf).unwrap();
        assert_eq!(
            decode_segment_header(&buf),
            Some(SegmentHeader {
                generation: s.generation,
                format: FORMAT_VERSION
            })
        );
        let end = scan_segment(&buf, SEGMENT, 1, u32::MAX, s.generation, true, |_, _| {
            total += 1
        });
        assert_eq!(end, s.used as usize, "segment {i} ends where RAM says");
    }
    total
}

#[test]
fn entries_never_span_segments_and_appends_share_the_active_segment() {
    let mut l = log(6);
    for round in 0..10 {
        l.append(&batch(round * 100, 20, 200), false, &mut Vec::new())
            .unwrap();
    }
    assert_eq!(entries_on_disk(&l), 200);
    // 200 entries of ~210 bytes fill about 3 segments, not 10.
    assert!(l.free_segments() >= 2, "{:?}", l.segments());
    // A batch of 3/4 of a segment or more starts a new segment.
    let active = l.active();
    l.append(&batch(5000, 60, 200), false, &mut Vec::new())
        .unwrap();
    assert_ne!(l.active(), active);
    assert_eq!(entries_on_disk(&l), 260);
}

#[test]
fn the_last_free_segment_is_kept_for_reorganization() {
    let mut l = log(3);
    let big = batch(0, 170, 200); // more than two segments
    match l.append(&big, false, &mut Vec::new()) {
        Err(PlaceError::NoSpace { placed }) => {
            assert!(placed > 0 && placed < big.len());
            assert_eq!(l.free_segments(), 1);
            // The reorganizer may use it.
            let rest = &big[placed..];
            let written = l.write_closed(rest, &mut Vec::new()).unwrap().unwrap();
            assert_eq!(written.len(), 1);
            assert_eq!(l.free_segments(), 0);
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert_eq!(entries_on_disk(&l), 170);
    // A freed segment reads as free and its old entries never verify again.
    let index = l.segments().iter().position(|s| s.used > 0).unwrap();
    let old_generation = l.segments()[index].generation;
    let written_before = l.device_bytes_written();
    l.free(index).unwrap();
    // The zero page over the header is a disk write and counts as one.
    assert_eq!(l.device_bytes_written(), written_before + PAGE_BYTES as u64);
    let mut buf = AlignedBuf::zeroed(SEGMENT);
    SecondaryLog::read_segment(l.file().as_ref(), SEGMENT, index, SEGMENT, &mut buf).unwrap();
    assert_eq!(decode_segment_header(&buf), None);
    let end = scan_segment(
        &buf,
        SEGMENT,
        1,
        u32::MAX,
        old_generation + 100,
        true,
        |_, _| {},
    );
    assert_eq!(end, SEGMENT_HEADER_BYTES);
}

/// Every chunk of `log`, in log order: (CID, epoch, version, chain, payload); checks
/// that every used segment scans to its fill level and returns the bytes the chunks
/// take by [`header::Entry::stored_bytes`] per segment.
#[allow(clippy::type_complexity)]
fn chunks_on_disk(
    log: &SecondaryLog,
) -> (
    Vec<(u64, u16, u32, Option<header::ChainLink>, Vec<u8>)>,
    Vec<usize>,
) {
    let mut out = Vec::new();
    let mut stored = vec![0; log.segments().len()];
    let mut buf = AlignedBuf::zeroed(SEGMENT);
    // Segments in the order they were started (generations increase).
    let mut order: Vec<(usize, SegmentInfo)> = log
        .segments()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| s.used > 0)
        .collect();
    order.sort_by_key(|(_, s)| s.generation);
    for (i, s) in order {
        SecondaryLog::read_segment(log.file().as_ref(), SEGMENT, i, SEGMENT, &mut buf).unwrap();
        let end = scan_segment(&buf, SEGMENT, 1, u32::MAX, s.generation, true, |_, e| {
            let h = e.header;
            stored[i] += e.stored_bytes();
            out.push((h.cid, h.epoch, h.version, h.chain, e.payload.to_vec()));
        });
        assert_eq!(end, s.used as usize, "segment {i} ends where RAM says");
    }
    (out, stored)
}

fn with_runs(segments: usize) -> SecondaryLog {
    log(segments).with_runs(256)
}

/// One chunk to write: step from the previous CID (0 = a foreign creator's CID),
/// payload length, epoch, version, and whether it is a link of a chain.
type Item = (u8, usize, u16, u32, bool);

fn items() -> impl Strategy<Value = Vec<Item>> {
    proptest::collection::vec(
        (
            prop_oneof![8 => Just(1u8), 1 => Just(0u8), 1 => 2u8..4],
            prop_oneof![4 => Just(64usize), 1 => Just(0usize), 1 => 1usize..300, 1 => 256usize..3000],
            prop_oneof![4 => Just(3u16), 1 => 0u16..5],
            prop_oneof![4 => Just(1u32), 1 => 0u32..70_000],
            prop_oneof![9 => Just(false), 1 => Just(true)],
        ),
        1..400,
    )
}

/// Encodes `items` as write-buffer batches of at most `per_batch` entries; returns
/// the batches and what each chunk is.
#[allow(clippy::type_complexity)]
fn batches(
    items: &[Item],
    per_batch: usize,
    first_lid: u64,
) -> (
    Vec<Vec<u8>>,
    Vec<(u64, u16, u32, Option<header::ChainLink>, Vec<u8>)>,
) {
    let mut batches = Vec::new();
    let mut expected = Vec::new();
    let mut lid = first_lid;
    for (n, part) in items.chunks(per_batch.max(1)).enumerate() {
        let mut out = Vec::new();
        for (k, &(step, len, epoch, version, link)) in part.iter().enumerate() {
            let cid = if step == 0 {
                (2 << 48) | (n * 1000 + k) as u64
            } else {
                lid = (lid + u64::from(step)) & ((1 << 48) - 1);
                (1 << 48) | lid
            };
            let chain = link.then_some(header::ChainLink { index: 0, count: 2 });
            let payload: Vec<u8> = (0..len)
                .map(|b| (b as u8) ^ (k as u8).wrapping_mul(7))
                .collect();
            let args = EncodeArgs {
                cid,
                zone_owner: 1,
                epoch,
                version,
                chain,
            };
            encode(&args, &payload, &mut out);
            expected.push((cid, epoch, version, chain, payload));
        }
        batches.push(out);
    }
    (batches, expected)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// With run entries on, a log holds exactly the chunks written, in order, each
    /// with its CID, epoch, version, chain position and payload; runs are cut where a
    /// segment ends; placements count every chunk once and add up to each segment's
    /// entry bytes; and the log is never larger than without runs.
    #[test]
    fn runs_store_exactly_the_chunks_written(
        items in items(),
        per_batch in 1usize..200,
        first_lid in prop_oneof![Just(0u64), Just((1u64 << 48) - 40), 0u64..1 << 40],
    ) {
        let (batches, expected) = batches(&items, per_batch, first_lid);
        let mut plain = log(96);
        let mut runs = with_runs(96);
        // The same entries apart, with other bytes between them (as one zone's entries
        // lie in a write-buffer half).
        let mut apart = with_runs(96);
        let mut placed = Vec::new();
        for (n, b) in batches.iter().enumerate() {
            plain.append(b, false, &mut Vec::new()).unwrap();
            runs.append(b, false, &mut placed).unwrap();
            let mut spread = Vec::new();
            let mut headers = Vec::new();
            for (k, (offset, h)) in walk_batch(b, 1, u32::MAX).unwrap().into_iter().enumerate() {
                spread.extend(std::iter::repeat_n(0xA5u8, (n + k) % 3 * 7));
                headers.push((spread.len(), h));
                spread.extend_from_slice(&b[offset..offset + h.entry_bytes()]);
            }
            apart.append_walked(&spread, &headers, false, &mut Vec::new(), None).unwrap();
        }
        let (got, stored) = chunks_on_disk(&runs);
        proptest::prop_assert_eq!(&got, &expected);
        proptest::prop_assert_eq!(chunks_on_disk(&plain).0, expected.clone());
        proptest::prop_assert_eq!(chunks_on_disk(&apart).0, expected.clone());
        proptest::prop_assert_eq!(apart.used_bytes(), runs.used_bytes());
        proptest::prop_assert_eq!(placed.len(), expected.len());
        for ((h, _), e) in placed.iter().zip(&expected) {
            proptest::prop_assert_eq!((h.cid, h.epoch, h.version), (e.0, e.1, e.2));
        }
        for (i, s) in runs.segments().iter().enumerate() {
            let from_placed: u64 = placed
                .iter()
                .filter(|(_, loc)| loc.segment as usize == i && loc.generation == s.generation)
                .map(|(_, loc)| u64::from(loc.bytes))
                .sum();
            let entries = (s.used as usize).saturating_sub(SEGMENT_HEADER_BYTES);
            proptest::prop_assert_eq!(from_placed, entries as u64, "segment {}", i);
            proptest::prop_assert_eq!(stored[i], entries, "segment {}", i);
        }
        proptest::prop_assert!(runs.used_bytes() <= plain.used_bytes());
    }

    /// Runs cut by a full log: the part placed before `NoSpace` plus the rest written
    /// by the reorganizer's path hold every chunk once.
    #[test]
    fn runs_survive_a_full_log(count in 100usize..400, len in prop_oneof![Just(64usize), 1usize..200]) {
        let items: Vec<Item> = (0..count).map(|_| (1, len, 3, 1, false)).collect();
        let (b, expected) = batches(&items, count, 10);
        let b = &b[0];
        let segments = ((count * (len + 16)) / SEGMENT).max(1) + 1;
        let mut l = with_runs(segments);
        match l.append(b, false, &mut Vec::new()) {
            Ok(()) => {}
            Err(PlaceError::NoSpace { placed }) => {
                l.write_closed(&b[placed..], &mut Vec::new()).unwrap().unwrap();
            }
            Err(e) => panic!("{e:?}"),
        }
        proptest::prop_assert_eq!(chunks_on_disk(&l).0, expected);
    }
}

#[test]
fn consecutive_small_chunks_share_one_header() {
    let mut plain = log(8);
    let mut runs = with_runs(8);
    let b = batch(0, 100, 64);
    plain.append(&b, false, &mut Vec::new()).unwrap();
    runs.append(&b, false, &mut Vec::new()).unwrap();
    // 100 entries of 64 + 8 or 9 header bytes, against one run header.
    assert!(plain.used_bytes() > 100 * 72, "{}", plain.used_bytes());
    assert!(runs.used_bytes() < 100 * 64 + 64, "{}", runs.used_bytes());
    assert_eq!(entries_on_disk(&runs), 100);
}

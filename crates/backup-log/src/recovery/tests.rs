//! Tests of recovery reads: the version table, the pipeline, validation.

use super::*;
use crate::header::{self, encode, ChainLink, EncodeArgs};
use crate::version::{Version, VersionState};
use proptest::prelude::*;

/// A segment of entries for `owner` (checksums for generation 0), rebased to
/// `generation` by XOR of each stored checksum, as the secondary log stores them.
/// CID, epoch, version, chain position (index, count) and payload of a test entry.
type TestEntry = (u64, u16, u32, Option<(u8, u8)>, Vec<u8>);

fn segment(entries: &[TestEntry], generation: u32) -> Vec<u8> {
    let mut out = vec![0u8; seclog::SEGMENT_HEADER_BYTES];
    for (cid, epoch, version, chain, payload) in entries {
        let args = EncodeArgs {
            cid: *cid,
            zone_owner: 7,
            epoch: *epoch,
            version: *version & header::VERSION_IN_EPOCH_MAX,
            chain: chain.map(|(index, count)| ChainLink {
                index: index % count.max(2),
                count: count.max(2),
            }),
        };
        let at = out.len();
        encode(&args, payload, &mut out);
        let h = header::decode_header(&out[at..], 7, u32::MAX).unwrap();
        header::rebase_crc(&mut out[at..], &h, 0, generation);
    }
    out
}

fn entries() -> impl Strategy<Value = Vec<TestEntry>> {
    proptest::collection::vec(
        (
            prop_oneof![
                (0u64..1 << 20).prop_map(|lid| (7u64 << 48) | lid),
                any::<u64>(),
            ],
            any::<u16>(),
            any::<u32>(),
            proptest::option::of((any::<u8>(), any::<u8>())),
            proptest::collection::vec(any::<u8>(), 0..300),
        ),
        0..40,
    )
}

proptest! {
    /// The one-pass checksum check (`Entry::verify`, which the scans use) agrees with
    /// the `crc32c` crate's two-call checksum on every entry of intact and damaged
    /// segments, for the right and for other generations.
    #[test]
    fn one_pass_verify_equals_the_crate_checksum(
        entries in entries(),
        generation in any::<u32>(),
        scan_generation in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        damage in proptest::option::of((any::<usize>(), 1u8..=255)),
    ) {
        let mut bytes = segment(&entries, generation);
        if let Some((at, flip)) = damage {
            let at = seclog::SEGMENT_HEADER_BYTES + at % (bytes.len() - seclog::SEGMENT_HEADER_BYTES + 1);
            if let Some(b) = bytes.get_mut(at) {
                *b ^= flip;
            }
        }
        let generation = scan_generation.unwrap_or(generation);
        let mut checked = Vec::new();
        seclog::scan_segment(&bytes, bytes.len(), 7, 4096, generation, false, |_, e| {
            let before = e.header_raw.get(..e.header.crc_offset()).unwrap_or(&[]);
            let reference = crc32c::crc32c_append(crc32c::crc32c(before), e.payload)
                ^ generation
                == e.header.crc;
            checked.push((e.verify(generation), reference));
        });
        for (got, want) in checked {
            prop_assert_eq!(got, want);
        }
    }

    /// The table built record by record answers as a map folded from the same
    /// records (newest version per CID, removes not live), whatever their order and
    /// mix of dense, scattered and foreign CIDs.
    #[test]
    fn recovery_table_equals_a_folded_map(
        records in proptest::collection::vec(
            (
                prop_oneof![
                    4 => (0u64..3000).prop_map(|lid| (7u64 << 48) | ((1 << 20) + lid)),
                    1 => (0u64..1 << 30).prop_map(|lid| (7u64 << 48) | lid),
                    1 => any::<u64>(),
                ],
                0u16..4,
                0u32..4,
                any::<bool>(),
            ),
            0..3000,
        ),
        expected_records in 0usize..5000,
    ) {
        let mut table = RecoveryTable::new(7, expected_records);
        let mut reference: CidMap<VersionState> = CidMap::default();
        for &(cid, epoch, version, deleted) in &records {
            let state = VersionState {
                version: Version { epoch, version },
                deleted,
            };
            table.add(cid, state);
            match reference.get(&cid) {
                Some(old) if !state.version.is_newer_than(old.version) => {}
                _ => {
                    reference.insert(cid, state);
                }
            }
        }
        for &(cid, ..) in &records {
            let want = reference.get(&cid).filter(|s| !s.deleted).map(|s| s.version);
            prop_assert_eq!(table.live(cid).map(Slot::version), want);
            prop_assert_eq!(table.live(cid ^ (1 << 40)).map(Slot::version),
                reference.get(&(cid ^ (1 << 40))).filter(|s| !s.deleted).map(|s| s.version));
        }
        // A CID is in exactly one of the two parts.
        for &cid in table.sparse.keys() {
            let inside = cid.checked_sub(table.base).is_some_and(|i| i < table.dense.len() as u64);
            prop_assert!(!inside);
        }
    }
}

#[test]
fn a_recycled_batch_keeps_its_allocation() {
    let payload = vec![1u8; 8];
    let mut batch: Vec<RecoveredChunk<'_>> = Vec::with_capacity(1000);
    batch.push(RecoveredChunk {
        cid: 1,
        payload: &payload,
    });
    let pointer = batch.as_ptr() as usize;
    let recycled: Vec<RecoveredChunk<'static>> = recycle(batch);
    assert!(recycled.is_empty());
    assert!(recycled.capacity() >= 1000);
    assert_eq!(recycled.as_ptr() as usize, pointer);
}

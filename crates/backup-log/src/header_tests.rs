//! Tests of `header`.

use super::*;
use proptest::prelude::*;

fn args() -> impl Strategy<Value = EncodeArgs> {
    (
        any::<u64>(),
        any::<u16>(),
        any::<bool>(),
        any::<u16>(),
        0..=VERSION_IN_EPOCH_MAX,
        proptest::option::of((2u8..=255).prop_flat_map(|c| (0..c, Just(c)))),
    )
        .prop_map(|(cid, owner, own, epoch, version, chain)| EncodeArgs {
            // Half the cases use a CID of the zone owner (short LID forms).
            cid: if own {
                (u64::from(owner) << 48) | (cid >> (cid % 64) as u32 & ((1 << 48) - 1))
            } else {
                cid
            },
            zone_owner: owner,
            epoch,
            version,
            chain: chain.map(|(index, count)| ChainLink { index, count }),
        })
}

/// The encoder written field by field, for comparison with the one-pass
/// [`build_header`]: the smallest width that holds each value, the checksum over the
/// header bytes before it and then the payload (two CRC calls).
fn reference_encode(a: &EncodeArgs, payload: &[u8]) -> Vec<u8> {
    fn smallest(value: u64, widths: &[usize]) -> (u8, usize) {
        for (code, &w) in widths.iter().enumerate() {
            if w >= 8 || value < (1u64 << (8 * w)) {
                return (code as u8, w);
            }
        }
        ((widths.len() - 1) as u8, widths[widths.len() - 1])
    }
    let (cid_code, cid_w, cid_field) =
        if (a.cid >> 48) as u16 == a.zone_owner && a.cid & ((1 << 48) - 1) < 1 << 32 {
            let lid = a.cid & ((1 << 48) - 1);
            let (c, w) = smallest(lid, &CID_WIDTHS[..3]);
            (c, w, lid)
        } else {
            (3, 8, a.cid)
        };
    let (len_code, len_w) = smallest(payload.len() as u64, &LENGTH_WIDTHS);
    let (ver_code, ver_w) = smallest(u64::from(a.version), &VERSION_WIDTHS);
    let kind = if a.chain.is_some() {
        KIND_LINK
    } else {
        KIND_WHOLE
    };
    let mut h = vec![kind | (cid_code << 2) | (len_code << 4) | (ver_code << 6)];
    if let Some(link) = a.chain {
        h.push(link.index);
        h.push(link.count);
    }
    h.extend_from_slice(&cid_field.to_le_bytes()[..cid_w]);
    h.extend_from_slice(&(payload.len() as u64).to_le_bytes()[..len_w]);
    h.extend_from_slice(&a.epoch.to_le_bytes());
    h.extend_from_slice(&a.version.to_le_bytes()[..ver_w]);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h), payload);
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(payload);
    h
}

proptest! {
    /// The one-pass header (widths by comparison, fields stored as whole words,
    /// checksum of header and payload in one call) is byte for byte the reference
    /// encoding, for every width of every field.
    #[test]
    fn one_pass_header_equals_the_reference_encoding(
        a in args(),
        len in prop_oneof![0usize..300, 250usize..70_000],
        seed in any::<u8>(),
    ) {
        let payload: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        let expected = reference_encode(&a, &payload);
        let mut out = Vec::new();
        encode(&a, &payload, &mut out);
        prop_assert_eq!(&out, &expected);
        let h = build_header(&a, &payload);
        prop_assert_eq!(&h.to_array()[..h.len()], &expected[..expected.len() - payload.len()]);
        prop_assert!(h.to_array()[h.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn header_round_trips(a in args(), payload in proptest::collection::vec(any::<u8>(), 0..300), gen in any::<u32>()) {
        let mut out = vec![0xEE];
        encode(&a, &payload, &mut out);
        let bytes = &out[1..];
        prop_assert_eq!(bytes.len(), encoded_header_bytes(&a, payload.len()) + payload.len());
        prop_assert_ne!(bytes[0], 0);
        let e = decode(bytes, a.zone_owner, u32::MAX).unwrap();
        prop_assert_eq!(e.header.cid, a.cid);
        prop_assert_eq!(e.header.epoch, a.epoch);
        prop_assert_eq!(e.header.version, a.version);
        prop_assert_eq!(e.header.chain, a.chain);
        prop_assert_eq!(e.payload, &payload[..]);
        prop_assert!(e.verify(0));
        let mut moved = bytes.to_vec();
        rebase_crc(&mut moved, &e.header, 0, gen);
        let m = decode(&moved, a.zone_owner, u32::MAX).unwrap();
        prop_assert!(m.verify(gen));
        prop_assert_eq!(m.verify(gen ^ 1), false);
    }

    #[test]
    fn every_cut_is_rejected_and_every_flip_is_caught(a in args(), payload in proptest::collection::vec(any::<u8>(), 1..64), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut out = Vec::new();
        encode(&a, &payload, &mut out);
        for cut in 0..out.len() {
            prop_assert!(decode(&out[..cut], a.zone_owner, u32::MAX).is_err());
        }
        let i = pos.index(out.len());
        out[i] ^= 1 << bit;
        if let Ok(e) = decode(&out, a.zone_owner, u32::MAX) {
            prop_assert!(!e.verify(0) || e.header.entry_bytes() != out.len());
        }
    }

    /// The word-at-a-time decoder (enough bytes for the largest header) gives exactly
    /// what the field-by-field decoder gives, on valid headers and on garbage alike.
    #[test]
    fn whole_header_decoder_equals_the_checked_one(
        a in args(),
        payload in proptest::collection::vec(any::<u8>(), 0..40),
        garbage in proptest::collection::vec(any::<u8>(), HEADER_BYTES_MAX..64),
        max in prop_oneof![Just(u32::MAX), any::<u32>(), 0u32..64],
        owner in any::<u16>(),
    ) {
        let mut valid = Vec::new();
        encode(&a, &payload, &mut valid);
        valid.resize(valid.len().max(HEADER_BYTES_MAX), 0);
        for (bytes, owner) in [(&valid, a.zone_owner), (&garbage, owner)] {
            let raw = bytes.first_chunk::<HEADER_BYTES_MAX>().unwrap();
            prop_assert_eq!(
                decode_header_whole(raw, owner, max),
                decode_header_checked(bytes, owner, max)
            );
        }
    }

    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), owner in any::<u16>(), max in any::<u32>()) {
        if let Ok(e) = decode(&bytes, owner, max) {
            prop_assert!(e.header.entry_bytes() <= bytes.len());
            prop_assert!(e.header.payload_bytes <= max);
        }
    }
}

/// A run entry of `count` chunks of `per` bytes from `a` (chain dropped), for
/// generation `gen`; chunk `i`'s payload bytes are `i ^ seed`.
fn run_entry(a: &EncodeArgs, count: usize, per: usize, seed: u8, gen: u32) -> Vec<u8> {
    let a = EncodeArgs { chain: None, ..*a };
    let mut out = vec![0u8; run_entry_bytes(&a, count, per)];
    write_run(&mut out, &a, count, per, gen, |area| {
        for (i, b) in area.iter_mut().enumerate() {
            *b = (i / per.max(1)) as u8 ^ seed;
        }
    });
    out
}

/// `a` with a CID whose run of `count` stays inside its creator's local IDs.
fn run_start(a: &EncodeArgs, count: usize) -> EncodeArgs {
    let lid = (a.cid & LID_MASK).min(LID_MASK + 1 - count as u64);
    EncodeArgs {
        cid: (a.cid & !LID_MASK) | lid,
        chain: None,
        ..*a
    }
}

proptest! {
    /// A run entry decodes to its count, first CID and total length, verifies for its
    /// generation only, and hands out each chunk with its CID, epoch, version and
    /// payload; chunk bytes add up to the entry.
    #[test]
    fn run_entries_round_trip(a in args(), count in 2usize..300, per in prop_oneof![0usize..80, 250usize..300], seed in any::<u8>(), gen in any::<u32>()) {
        let a = run_start(&a, count);
        let bytes = run_entry(&a, count, per, seed, gen);
        prop_assert_eq!(bytes.len(), encoded_header_bytes(&a, per) + 2 + count * per);
        let e = decode(&bytes, a.zone_owner, u32::MAX).unwrap();
        prop_assert_eq!(e.header.run as usize, count);
        prop_assert_eq!(e.header.cid, a.cid);
        prop_assert_eq!(e.header.payload_bytes as usize, count * per);
        prop_assert_eq!(e.header.chunk_payload_bytes() as usize, per);
        prop_assert_eq!(e.header.entry_bytes(), bytes.len());
        prop_assert!(e.verify(gen));
        prop_assert!(!e.verify(gen ^ 1));
        let members: Vec<Entry<'_>> = e.run_members().collect();
        prop_assert_eq!(members.len(), count);
        let mut total = 0;
        for (i, m) in members.iter().enumerate() {
            prop_assert_eq!(m.header.cid, a.cid + i as u64);
            prop_assert_eq!((m.header.epoch, m.header.version, m.header.chain), (a.epoch, a.version, None));
            prop_assert_eq!(m.payload.len(), per);
            prop_assert!(m.payload.iter().all(|&b| b == i as u8 ^ seed));
            prop_assert_eq!(m.run_index, Some(i as u16));
            prop_assert!(!m.verify(gen));
            total += m.stored_bytes();
        }
        prop_assert_eq!(total, bytes.len());
        // Both decoders agree on it.
        let mut padded = bytes.clone();
        padded.resize(padded.len().max(HEADER_BYTES_MAX), 0);
        let raw = padded.first_chunk::<HEADER_BYTES_MAX>().unwrap();
        prop_assert_eq!(
            decode_header_whole(raw, a.zone_owner, u32::MAX),
            decode_header_checked(&padded, a.zone_owner, u32::MAX)
        );
        // A limit below the run's total refuses it.
        if count * per > 0 {
            let refused = matches!(
                decode(&bytes, a.zone_owner, (count * per - 1) as u32),
                Err(DecodeError::TooLong { .. })
            );
            prop_assert!(refused);
        }
    }

    #[test]
    fn every_cut_and_flip_of_a_run_is_caught(a in args(), count in 2usize..20, per in 1usize..40, pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let a = run_start(&a, count);
        let mut bytes = run_entry(&a, count, per, 5, 0);
        for cut in 0..bytes.len() {
            prop_assert!(decode(&bytes[..cut], a.zone_owner, u32::MAX).is_err());
        }
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        if let Ok(e) = decode(&bytes, a.zone_owner, u32::MAX) {
            prop_assert!(!e.verify(0) || e.header.entry_bytes() != bytes.len());
        }
    }
}

#[test]
fn runs_of_one_chunk_or_past_the_last_local_id_are_refused() {
    let a = EncodeArgs {
        cid: (7 << 48) | 10,
        zone_owner: 7,
        epoch: 1,
        version: 1,
        chain: None,
    };
    let mut bytes = run_entry(&a, 2, 8, 0, 0);
    bytes[1] = 1; // count 1
    assert_eq!(
        decode(&bytes, 7, u32::MAX).unwrap_err(),
        DecodeError::BadRun { count: 1 }
    );
    // A full CID whose run would pass the creator's last local ID.
    let last = EncodeArgs {
        cid: (9 << 48) | (LID_MASK - 1),
        ..a
    };
    let mut bytes = run_entry(&last, 2, 8, 0, 0);
    assert!(decode(&bytes, 7, u32::MAX).is_ok());
    bytes[1] = 3;
    assert_eq!(
        decode(&bytes, 7, u32::MAX).unwrap_err(),
        DecodeError::BadRun { count: 3 }
    );
}

#[test]
fn zero_is_end_of_data_and_small_entry_is_small() {
    assert_eq!(
        decode(&[0, 1, 2], 0, 100).unwrap_err(),
        DecodeError::EndOfData
    );
    let a = EncodeArgs {
        cid: (7 << 48) | 200,
        zone_owner: 7,
        epoch: 1,
        version: 0,
        chain: None,
    };
    assert_eq!(encoded_header_bytes(&a, 64), HEADER_BYTES_MIN);
    let mut out = Vec::new();
    encode(&a, &[9; 64], &mut out);
    assert_eq!(out.len(), HEADER_BYTES_MIN + 64);
    let e = decode(&out, 7, 64).unwrap();
    assert_eq!(e.header.cid, (7 << 48) | 200);
    assert!(matches!(
        decode(&out, 7, 63),
        Err(DecodeError::TooLong { .. })
    ));
}

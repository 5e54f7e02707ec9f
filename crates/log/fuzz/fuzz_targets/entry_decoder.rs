//! Fuzzes the log entry decoder with arbitrary bytes: it must never panic or read outside
//! its input, and whatever it accepts must re-encode to the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_log::header::{decode, encode, EncodeArgs};

fuzz_target!(|data: &[u8]| {
    let (params, bytes) = data.split_at(data.len().min(6));
    let mut p = [0u8; 6];
    p[..params.len()].copy_from_slice(params);
    let owner = u16::from_le_bytes([p[0], p[1]]);
    let max = u32::from_le_bytes([p[2], p[3], p[4], p[5]]);
    // Walk entries back to back as a segment scan does.
    let mut at = 0;
    while let Some(rest) = bytes.get(at..) {
        let Ok(entry) = decode(rest, owner, max) else { break };
        let h = entry.header;
        assert!(h.entry_bytes() <= rest.len());
        assert!(h.payload_bytes <= max);
        assert_eq!(entry.payload.len(), h.payload_bytes as usize);
        let _ = entry.verify(0);
        let mut again = Vec::new();
        encode(
            &EncodeArgs {
                cid: h.cid,
                zone_owner: owner,
                epoch: h.epoch,
                version: h.version,
                chain: h.chain,
            },
            entry.payload,
            &mut again,
        );
        let e2 = decode(&again, owner, max).expect("re-encoded entry decodes");
        assert_eq!(
            (e2.header.cid, e2.header.epoch, e2.header.version, e2.header.chain),
            (h.cid, h.epoch, h.version, h.chain)
        );
        assert_eq!(e2.payload, entry.payload);
        assert!(e2.verify(0));
        at += h.entry_bytes().max(1);
    }
});

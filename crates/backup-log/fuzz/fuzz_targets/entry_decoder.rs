//! Fuzzes the log entry decoder with arbitrary bytes: it must never panic or read outside
//! its input, and whatever it accepts must re-encode to the same fields (a run entry: each
//! of its chunks, and the run as a whole).
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_backup_log::header::{decode, encode, run_entry_bytes, write_run, EncodeArgs};

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
        if h.run >= 2 {
            let per = h.chunk_payload_bytes() as usize;
            assert_eq!(per * usize::from(h.run), h.payload_bytes as usize);
            let mut count = 0;
            for (i, m) in entry.run_members().enumerate() {
                assert_eq!(m.header.cid, h.cid + i as u64);
                assert_eq!(m.payload.len(), per);
                count += 1;
            }
            assert_eq!(count, usize::from(h.run));
            let args = EncodeArgs {
                cid: h.cid,
                zone_owner: owner,
                epoch: h.epoch,
                version: h.version,
                chain: None,
            };
            let mut again = vec![0u8; run_entry_bytes(&args, count, per)];
            write_run(&mut again, &args, count, per, 0, |area| {
                area.copy_from_slice(entry.payload)
            });
            let e2 = decode(&again, owner, max).expect("re-encoded run decodes");
            assert_eq!(
                (e2.header.cid, e2.header.run, e2.header.epoch, e2.header.version),
                (h.cid, h.run, h.epoch, h.version)
            );
            assert_eq!(e2.payload, entry.payload);
            assert!(e2.verify(0));
            at += h.entry_bytes().max(1);
            continue;
        }
        at += h.entry_bytes().max(1);
    }
});

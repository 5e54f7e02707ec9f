//! Fuzzes the version-log block decoder (record blocks and run blocks) with arbitrary
//! bytes: it must never panic, and feeding the same bytes in windows of any size must
//! visit the same records and end at the same place as feeding them whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_backup_log::{BlockDecoder, VersionRecord};

fuzz_target!(|data: &[u8]| {
    let Some((&window, bytes)) = data.split_first() else {
        return;
    };
    let window = usize::from(window) * 37 + 1;
    let mut whole = BlockDecoder::new();
    let mut all: Vec<VersionRecord> = Vec::new();
    whole.feed(bytes, &mut |r| all.push(r));
    let mut parts = BlockDecoder::new();
    let mut seen: Vec<VersionRecord> = Vec::new();
    for part in bytes.chunks(window) {
        parts.feed(part, &mut |r| seen.push(r));
    }
    assert_eq!(whole.finish(), parts.finish());
    assert_eq!(all, seen);
    if let Some((_, end)) = whole.finish() {
        assert!(end as usize <= bytes.len());
    }
});

//! Feeds arbitrary bytes to the log's frame reader and record decoder and to the snapshot
//! file decoder: they must never panic; a decoded record must round-trip through its frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_raft::log_store::{read_frame, Frame, LogRecord};
use myriad_raft::state_machine::decode_snapshot_file;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Frame::Record(record, length) = read_frame(rest) {
        if let Ok(decoded) = LogRecord::from_bytes(record) {
            let frame = decoded.to_frame().expect("a decoded record fits a frame");
            match read_frame(&frame) {
                Frame::Record(again, _) => {
                    assert_eq!(LogRecord::from_bytes(again).expect("decodes"), decoded)
                }
                other => panic!("re-framed record reads as {other:?}"),
            }
        }
        rest = &rest[length..];
    }
    if let Ok(decoded) = LogRecord::from_bytes(data) {
        assert_eq!(
            LogRecord::from_bytes(&decoded.to_bytes()).expect("decodes"),
            decoded
        );
    }
    let _ = decode_snapshot_file(data);
});

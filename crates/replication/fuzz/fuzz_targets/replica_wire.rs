//! Arbitrary bytes into the replication stream's decoders (log messages and
//! acknowledgments a backup or master receives): decode or error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    myriad_replication::wire::fuzz_decode(data);
});

//! Arbitrary bytes into every decoder of the chunk, migration, recovery, monitoring and
//! log control families (what peers, superpeers and clients exchange): each must decode
//! or return an error, never panic or over-allocate.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    myriad_proto::chunk::fuzz_decode(data);
    myriad_proto::migrate::fuzz_decode(data);
    myriad_proto::monitor::fuzz_decode(data);
    myriad_proto::logctl::fuzz_decode(data);
    myriad_proto::recovery::fuzz_decode(data);
});

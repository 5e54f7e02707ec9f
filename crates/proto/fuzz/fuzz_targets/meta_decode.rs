//! Arbitrary bytes into every decoder of the metadata family (metadata requests and
//! replies, joins, heartbeats, failure reports, events, barrier releases): each must decode
//! or return an error, never panic or over-allocate.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    myriad_proto::meta::fuzz_decode(data);
});

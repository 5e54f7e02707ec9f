//! Arbitrary bytes into every decoder of the compute messages (jobs, submissions, task
//! runs, group requests, barriers, slave data): each must decode or return an error,
//! never panic or over-allocate.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    myriad_compute::wire::fuzz_decode(data);
});

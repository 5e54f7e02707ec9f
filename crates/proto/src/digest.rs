//! Test support: a digest of many encodings and a seeded sampler, for the byte-identity
//! tests of every message family (issue 16 moved the byte codec to `myriad_types::codec`;
//! the expected digests were recorded with the codec that first wrote these formats).

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

/// FNV-1a over each encoding's length (8 bytes, little-endian) and bytes: one number that
/// changes when any byte of any encoding does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) encodings: usize,
    pub(crate) bytes: usize,
    pub(crate) fnv: u64,
}

impl Digest {
    pub(crate) fn new() -> Digest {
        Digest {
            encodings: 0,
            bytes: 0,
            fnv: 0xcbf2_9ce4_8422_2325,
        }
    }

    pub(crate) fn add(&mut self, encoding: &[u8]) {
        self.encodings += 1;
        self.bytes += encoding.len();
        for &byte in (encoding.len() as u64).to_le_bytes().iter().chain(encoding) {
            self.fnv = (self.fnv ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The next value of `strategy` from a seeded runner (the same sequence on every run).
pub(crate) fn sample<S: Strategy>(runner: &mut TestRunner, strategy: &S) -> S::Value {
    strategy
        .new_tree(runner)
        .expect("the strategy yields a value")
        .current()
}

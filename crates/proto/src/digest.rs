//! Test support: a digest of many encodings and a seeded sampler, for the byte-identity
//! tests of every message family (issue 16 moved the byte codec to `myriad_types::codec`;
//! the expected digests were recorded with the codec that first wrote these formats).

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

pub(crate) use myriad_types::digest::EncodingDigest as Digest;

/// The next value of `strategy` from a seeded runner (the same sequence on every run).
pub(crate) fn sample<S: Strategy>(runner: &mut TestRunner, strategy: &S) -> S::Value {
    strategy
        .new_tree(runner)
        .expect("the strategy yields a value")
        .current()
}

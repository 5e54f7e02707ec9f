//! Helpers shared by the process tests that read chunks back through a client (each such
//! test file includes this module). Process set-up lives in `myriad_testing::process`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::chunk::BlockingChunks;
use myriad_client::membership::Membership;
use myriad_client::ClientError;
use myriad_types::ChunkId;

/// Reads every expected chunk until all are right or `bound` passed since `since`; the
/// time it took and how many were wrong in the first pass.
pub fn verify(
    chunks: &BlockingChunks<'_, Membership>,
    expected: &BTreeMap<ChunkId, Option<Bytes>>,
    since: Instant,
    bound: Duration,
) -> (Duration, usize) {
    let mut first_wrong = 0;
    let all: Vec<ChunkId> = expected.keys().copied().collect();
    let mut first_pass = true;
    loop {
        let mut wrong = Vec::new();
        for batch in all.chunks(1_000) {
            for (cid, result) in batch.iter().zip(chunks.get_batch(batch)) {
                let want = expected.get(cid).cloned().flatten();
                match (result, want) {
                    (Ok(data), Some(want)) if data == want => {}
                    (Err(ClientError::NotFound(_)), None) => {}
                    (other, want) => wrong.push((*cid, format!("{other:?}"), want.is_some())),
                }
            }
        }
        if wrong.is_empty() {
            return (since.elapsed(), first_wrong);
        }
        assert!(
            since.elapsed() < bound,
            "{} of {} chunks wrong {:?} after the fault, e.g. {:?}",
            wrong.len(),
            all.len(),
            since.elapsed(),
            &wrong[..wrong.len().min(5)]
        );
        if first_pass {
            first_wrong = wrong.len();
            println!(
                "first pass ({} ms): {} chunks not yet right, e.g. {:?}",
                since.elapsed().as_millis(),
                wrong.len(),
                &wrong[..wrong.len().min(3)]
            );
            first_pass = false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

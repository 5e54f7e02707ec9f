//! Helpers shared by the process tests (each test file includes this module).

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

/// Copies the nodes' logs out of the test directory when the test panics (declared
/// before the cluster guard, so it runs after the processes are killed).
pub struct KeepLogsOnPanic(pub std::path::PathBuf);

impl Drop for KeepLogsOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let from = self.0.join("cluster").join("logs");
        let to = std::env::temp_dir().join(format!(
            "myriad-test-logs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        if std::fs::create_dir_all(&to).is_ok() {
            if let Ok(entries) = std::fs::read_dir(&from) {
                for entry in entries.flatten() {
                    let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
                }
            }
            eprintln!("node logs kept in {}", to.display());
        }
    }
}

//! An example of a user's own peer binary: Myriad's whole command line, whose peers also
//! run this crate's job, task and application.
//!
//! # Job
//! - [`CountWords`] (job `example.count-words`): counts the words of one text chunk; sent
//!   to the chunk's owner ([`myriad_compute::Jobs::submit_to_owner`]) it reads the chunk
//!   there, without a network hop, and returns `(node, words)`.
//! - [`SumOfKind`] (task `example.sum-of-kind`, params `{ "kind": K }`): every slave of a
//!   compute group sums the `value` field of its own records of kind `K` (records: u64
//!   kind at offset 0, u64 value at offset 8, little endian), using the built-in scan.
//! - [`Report`] (application `example.report`): writes this peer's chunk count to the
//!   temporary storage as `report.<node>` (started with `compapp NODE example.report`).
//!
//! # Who calls it
//! `src/main.rs` (the binary) and this crate's tests, which run the binary as a cluster.

use bytes::Bytes;
use myriad_compute::builtin::{scan, FieldEquals, ScanAggregate, ScanSpec};
use myriad_compute::{
    int_value, AppContext, Application, Job, JobContext, Registry, Task, TaskContext, Wire,
};
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};

/// Everything this binary adds to the built-ins: one call, handed to `myriad::main_with`.
pub fn registry() -> Registry {
    Registry::with_builtins()
        .job::<CountWords>()
        .task(SumOfKind)
        .app(Report)
}

/// Counts the words of a text chunk where it is stored.
#[derive(Debug, Clone, Copy)]
pub struct CountWords(pub ChunkId);

impl Wire for CountWords {
    fn put(&self, out: &mut Encoder) {
        self.0.put(out);
    }
    fn get(input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(CountWords(ChunkId::get(input)?))
    }
}

impl Job for CountWords {
    const NAME: &'static str = "example.count-words";
    type Output = (NodeId, u64);
    fn run(self, ctx: &JobContext) -> Result<(NodeId, u64), String> {
        let text = ctx
            .local()?
            .get(self.0)
            .map_err(|error| error.to_string())?;
        let words = String::from_utf8_lossy(&text).split_whitespace().count() as u64;
        Ok((ctx.node_id(), words))
    }
}

/// A record as this example stores it: kind and value, little endian.
pub fn record(kind: u64, value: u64) -> Bytes {
    let mut data = kind.to_le_bytes().to_vec();
    data.extend_from_slice(&value.to_le_bytes());
    Bytes::from(data)
}

#[derive(serde::Deserialize)]
struct KindParams {
    kind: u64,
}

/// Sums the values of one kind of record on every slave.
pub struct SumOfKind;

impl Task for SumOfKind {
    fn name(&self) -> &str {
        "example.sum-of-kind"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: KindParams = ctx.params_json()?;
        let spec = ScanSpec {
            aggregate: ScanAggregate::Sum,
            field_offset: 8,
            min_size: 16,
            filter: Some(FieldEquals {
                offset: 0,
                equals: params.kind,
            }),
        };
        let found = scan(&ctx.local(), &spec)?;
        Ok(int_value(found.sum as i64))
    }
}

/// Writes this peer's chunk count to the temporary storage.
pub struct Report;

impl Application for Report {
    fn name(&self) -> &str {
        "example.report"
    }
    fn run(&self, ctx: &AppContext) -> Result<(), String> {
        let env = ctx.env();
        let stats = env.local().stats().map_err(|error| error.to_string())?;
        let name = format!("report.{}", env.membership.node_id().0);
        let data = Bytes::from(stats.chunks.to_string());
        let client = env.client.blocking();
        client
            .tmp_create(&name, data.clone())
            .or_else(|_| client.tmp_put(&name, data))
            .map_err(|error| error.to_string())
    }
}

//! Built-in jobs and tasks every peer has.
//!
//! # Job
//! Jobs:
//! - [`EmptyJob`] (`builtin.empty`): does nothing (throughput benchmarks).
//! - [`WhoAmI`] (`builtin.whoami`): the node that ran it.
//! - [`ReadLocal`] (`builtin.read-local`): reads a chunk through the *local* chunk API
//!   only (fails on any other peer than its owner) and returns `(node, bytes)`: the proof
//!   that a delegated job ran where its data is.
//! - [`ScanJob`] (`builtin.scan`): [`scan`] of this peer's chunks.
//! - [`SleepJob`] (`builtin.sleep`): waits some milliseconds (tests of queued jobs).
//!
//! Tasks (parameters as JSON, e.g. from a script's `params` table):
//! - `builtin.scan` ([`ScanSpec`]): every slave scans its own chunks with a filter and
//!   aggregates (count, sum of a little-endian u64 field, or collect the CIDs).
//! - `builtin.load` (`{ "path": FILE }`): a parallel bulk load: slave `i` of `n` stores
//!   lines `i, i+n, i+2n, …` of the file as chunks in batches; returns its count.
//! - `builtin.value` (`{ "value": V }` or `{ "values": [V0, V1, …] }` by slave index):
//!   returns an integer (for script conditions).
//! - `builtin.sleep` (`{ "ms": M }`): waits, checking for an abort (tests).
//! - `builtin.barrier` (`{ "rounds": R }`): R barriers; returns the median round in µs.
//! - `builtin.exchange` (`{ "messages": K }`): K messages to every slave, one barrier;
//!   returns the number received (checks the barrier's delivery guarantee).
//!
//! # Who calls it
//! [`crate::Registry::with_builtins`]; users through scripts, the terminal and jobs.

use std::io::BufRead;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};
use serde::Deserialize;

use crate::env::LocalChunkApi;
use crate::job::{Job, JobContext, Wire};
use crate::service::Registry;
use crate::task::{int_value, Task, TaskContext};

/// Chunks read per local batch while scanning, and created per batch while loading.
pub const BATCH: usize = 512;
/// Most ranges a scan asks the chunk service for.
const SCAN_RANGES_MAX: u64 = 1 << 20;

/// Registers every built-in job and task.
pub fn register(registry: &mut Registry) {
    registry
        .jobs
        .register::<EmptyJob>()
        .register::<WhoAmI>()
        .register::<ReadLocal>()
        .register::<ScanJob>()
        .register::<SleepJob>();
    registry
        .tasks
        .register(ScanTask)
        .register(LoadTask)
        .register(ValueTask)
        .register(SleepTask)
        .register(BarrierTask)
        .register(ExchangeTask);
}

/// Does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmptyJob;

impl Wire for EmptyJob {
    fn put(&self, _out: &mut Encoder) {}
    fn get(_input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(EmptyJob)
    }
}

impl Job for EmptyJob {
    const NAME: &'static str = "builtin.empty";
    type Output = ();
    fn run(self, _ctx: &JobContext) -> Result<(), String> {
        Ok(())
    }
}

/// Waits this many milliseconds, then returns the node that ran it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SleepJob(pub u64);

impl Wire for SleepJob {
    fn put(&self, out: &mut Encoder) {
        out.put_u64_le(self.0);
    }
    fn get(input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(SleepJob(input.get_u64_le("sleep ms")?))
    }
}

impl Job for SleepJob {
    const NAME: &'static str = "builtin.sleep";
    type Output = NodeId;
    fn run(self, ctx: &JobContext) -> Result<NodeId, String> {
        std::thread::sleep(Duration::from_millis(self.0));
        Ok(ctx.node_id())
    }
}

/// Returns the node that ran it.
#[derive(Debug, Clone, Copy, Default)]
pub struct WhoAmI;

impl Wire for WhoAmI {
    fn put(&self, _out: &mut Encoder) {}
    fn get(_input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(WhoAmI)
    }
}

impl Job for WhoAmI {
    const NAME: &'static str = "builtin.whoami";
    type Output = NodeId;
    fn run(self, ctx: &JobContext) -> Result<NodeId, String> {
        Ok(ctx.node_id())
    }
}

/// Reads one chunk through the local chunk API only; returns `(node, bytes)`.
#[derive(Debug, Clone, Copy)]
pub struct ReadLocal(pub ChunkId);

impl Wire for ReadLocal {
    fn put(&self, out: &mut Encoder) {
        self.0.put(out);
    }
    fn get(input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(ReadLocal(ChunkId::get(input)?))
    }
}

impl Job for ReadLocal {
    const NAME: &'static str = "builtin.read-local";
    type Output = (NodeId, Bytes);
    fn run(self, ctx: &JobContext) -> Result<(NodeId, Bytes), String> {
        let data = ctx
            .local()?
            .get(self.0)
            .map_err(|error| error.to_string())?;
        Ok((ctx.node_id(), data))
    }
}

/// What a scan computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ScanAggregate {
    /// The number of matching chunks.
    #[default]
    Count,
    /// The sum of the u64 field at `field_offset` over the matching chunks.
    Sum,
    /// The matching CIDs.
    Cids,
}

/// A filter: the little-endian u64 at `offset` equals `equals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldEquals {
    /// Byte offset of the field.
    pub offset: u64,
    /// The value it must have.
    pub equals: u64,
}

/// A scan of a peer's local chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ScanSpec {
    /// What to compute.
    pub aggregate: ScanAggregate,
    /// The summed field's offset (a little-endian u64).
    pub field_offset: u64,
    /// Only chunks of at least this many bytes.
    pub min_size: u64,
    /// Only chunks whose field matches.
    pub filter: Option<FieldEquals>,
}

/// What a scan found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanResult {
    /// Matching chunks.
    pub count: u64,
    /// The sum (wrapping) of the field over the matching chunks that hold it.
    pub sum: u64,
    /// The matching CIDs (only for [`ScanAggregate::Cids`]).
    pub cids: Vec<ChunkId>,
}

fn field(data: &[u8], offset: u64) -> Option<u64> {
    let start = usize::try_from(offset).ok()?;
    let bytes = data.get(start..start.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// Scans every chunk this peer holds with `spec`.
pub fn scan(local: &LocalChunkApi<'_>, spec: &ScanSpec) -> Result<ScanResult, String> {
    let (ranges, truncated) = local
        .ranges(SCAN_RANGES_MAX)
        .map_err(|error| error.to_string())?;
    if truncated {
        return Err(format!(
            "more than {SCAN_RANGES_MAX} chunk ranges; scan refused"
        ));
    }
    let mut result = ScanResult::default();
    let mut batch: Vec<ChunkId> = Vec::with_capacity(BATCH);
    let flush = |batch: &mut Vec<ChunkId>, result: &mut ScanResult| {
        for (cid, data) in batch.iter().zip(local.get_batch(batch)) {
            // Chunks removed meanwhile (or moved away) are skipped.
            let Ok(data) = data else { continue };
            if (data.len() as u64) < spec.min_size {
                continue;
            }
            if let Some(filter) = spec.filter {
                if field(&data, filter.offset) != Some(filter.equals) {
                    continue;
                }
            }
            result.count += 1;
            if let Some(value) = field(&data, spec.field_offset) {
                result.sum = result.sum.wrapping_add(value);
            }
            if spec.aggregate == ScanAggregate::Cids {
                result.cids.push(*cid);
            }
        }
        batch.clear();
    };
    for (first, last) in ranges {
        if first.creator() != last.creator() {
            return Err(format!("range {first}..={last} spans creators"));
        }
        for local_id in first.local_id()..=last.local_id() {
            let cid = ChunkId::new(first.creator(), local_id).ok_or("local ID out of range")?;
            batch.push(cid);
            if batch.len() == BATCH {
                flush(&mut batch, &mut result);
            }
        }
    }
    flush(&mut batch, &mut result);
    Ok(result)
}

/// [`scan`] as a job (sent to a peer, or delegated to the owner of a chunk); returns
/// `(count, sum, cids)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanJob(pub ScanSpec);

impl Wire for ScanJob {
    fn put(&self, out: &mut Encoder) {
        let spec = &self.0;
        out.put_u8(spec.aggregate as u8)
            .put_u64_le(spec.field_offset)
            .put_u64_le(spec.min_size);
        match spec.filter {
            Some(filter) => out
                .put_u8(1)
                .put_u64_le(filter.offset)
                .put_u64_le(filter.equals),
            None => out.put_u8(0),
        };
    }
    fn get(input: &mut Decoder) -> Result<Self, DecodeError> {
        let aggregate = match input.get_u8("aggregate")? {
            0 => ScanAggregate::Count,
            1 => ScanAggregate::Sum,
            2 => ScanAggregate::Cids,
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "aggregate",
                    tag: u64::from(tag),
                })
            }
        };
        let field_offset = input.get_u64_le("field offset")?;
        let min_size = input.get_u64_le("min size")?;
        let filter = match input.get_bool("filter")? {
            true => Some(FieldEquals {
                offset: input.get_u64_le("filter offset")?,
                equals: input.get_u64_le("filter value")?,
            }),
            false => None,
        };
        Ok(ScanJob(ScanSpec {
            aggregate,
            field_offset,
            min_size,
            filter,
        }))
    }
}

impl Job for ScanJob {
    const NAME: &'static str = "builtin.scan";
    type Output = (u64, (u64, Vec<ChunkId>));
    fn run(self, ctx: &JobContext) -> Result<Self::Output, String> {
        let result = scan(&ctx.local()?, &self.0)?;
        Ok((result.count, (result.sum, result.cids)))
    }
}

/// The `builtin.scan` task (see the module documentation): count and sum return an
/// integer, `cids` the list of CIDs.
struct ScanTask;

impl Task for ScanTask {
    fn name(&self) -> &str {
        "builtin.scan"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let spec: Option<ScanSpec> = ctx.params_json()?;
        let spec = spec.unwrap_or_default();
        let result = scan(&ctx.local(), &spec)?;
        Ok(match spec.aggregate {
            ScanAggregate::Count => int_value(result.count as i64),
            ScanAggregate::Sum => int_value(result.sum as i64),
            ScanAggregate::Cids => result.cids.to_bytes(),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadParams {
    path: String,
}

/// The `builtin.load` task (see the module documentation).
struct LoadTask;

impl Task for LoadTask {
    fn name(&self) -> &str {
        "builtin.load"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: LoadParams = ctx.params_json()?;
        let file = std::fs::File::open(&params.path)
            .map_err(|error| format!("opening {}: {error}", params.path))?;
        let (index, slaves) = (ctx.index(), ctx.slaves().len());
        let local = ctx.local();
        let mut batch: Vec<Bytes> = Vec::with_capacity(BATCH);
        let mut stored = 0i64;
        for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|error| format!("reading {}: {error}", params.path))?;
            if number % slaves != index {
                continue;
            }
            batch.push(Bytes::from(line));
            if batch.len() == BATCH {
                stored += local
                    .create_with_data(std::mem::take(&mut batch))
                    .map_err(|error| error.to_string())?
                    .len() as i64;
            }
            if ctx.is_aborted() {
                return Err("aborted".into());
            }
        }
        if !batch.is_empty() {
            stored += local
                .create_with_data(batch)
                .map_err(|error| error.to_string())?
                .len() as i64;
        }
        Ok(int_value(stored))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValueParams {
    value: Option<i64>,
    values: Option<Vec<i64>>,
}

/// The `builtin.value` task.
struct ValueTask;

impl Task for ValueTask {
    fn name(&self) -> &str {
        "builtin.value"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: ValueParams = ctx.params_json()?;
        let value = match (params.values, params.value) {
            (Some(values), _) => *values
                .get(ctx.index())
                .ok_or_else(|| format!("no value for slave {}", ctx.index()))?,
            (None, Some(value)) => value,
            (None, None) => return Err("builtin.value needs `value` or `values`".into()),
        };
        Ok(int_value(value))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SleepParams {
    ms: u64,
}

/// The `builtin.sleep` task.
struct SleepTask;

impl Task for SleepTask {
    fn name(&self) -> &str {
        "builtin.sleep"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: SleepParams = ctx.params_json()?;
        let until = Instant::now() + Duration::from_millis(params.ms);
        while Instant::now() < until {
            if ctx.is_aborted() {
                return Err("aborted while sleeping".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(int_value(0))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BarrierParams {
    rounds: u32,
}

/// The `builtin.barrier` task: the median barrier round in µs on this slave.
struct BarrierTask;

impl Task for BarrierTask {
    fn name(&self) -> &str {
        "builtin.barrier"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: BarrierParams = ctx.params_json()?;
        let mut rounds = Vec::with_capacity(params.rounds as usize);
        for _ in 0..params.rounds.max(1) {
            let started = Instant::now();
            ctx.barrier(Bytes::new())
                .map_err(|error| error.to_string())?;
            rounds.push(started.elapsed().as_micros() as i64);
        }
        rounds.sort_unstable();
        Ok(int_value(rounds[rounds.len() / 2]))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExchangeParams {
    messages: u32,
}

/// The `builtin.exchange` task.
struct ExchangeTask;

impl Task for ExchangeTask {
    fn name(&self) -> &str {
        "builtin.exchange"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: ExchangeParams = ctx.params_json()?;
        for to in 0..ctx.slaves().len() {
            for number in 0..params.messages {
                ctx.send(to, Bytes::from(number.to_le_bytes().to_vec()))
                    .map_err(|error| error.to_string())?;
            }
        }
        ctx.barrier(Bytes::new())
            .map_err(|error| error.to_string())?;
        let mut received = 0i64;
        while ctx.try_recv().map_err(|error| error.to_string())?.is_some() {
            received += 1;
        }
        Ok(int_value(received))
    }
}

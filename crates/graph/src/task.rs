//! The compute tasks that load a graph into a group's slaves and run BFS on it, and the
//! graphs a peer holds between tasks.
//!
//! # Job
//! Run on a compute group (every slave at once, see `myriad_compute`); parameters and
//! answers are JSON.
//! - `graph.load` ([`LoadParams`]): each slave generates its share of a Kronecker edge list
//!   (or reads its share of a file), sends every edge in both directions to the owners of
//!   the source vertices in batches, builds its part's adjacency, writes one **chunk per
//!   vertex** (payload: degree as `u32`, then the neighbours' global IDs as `u32`, little
//!   endian) in batches of [`CHUNK_BATCH`], and keeps the part as a [`LoadedGraph`] under
//!   the graph's name. Answer: [`LoadReport`].
//! - `graph.roots` ([`RootsParams`]): the same `count` random roots of nonzero degree on
//!   every slave (candidates from the seed, their owners' degrees exchanged); answer: the
//!   roots as a JSON array.
//! - `graph.bfs` ([`BfsParams`]): one BFS per root ([`crate::bfs`]), timed between two
//!   barriers, then (unless `validate` is false) the Graph500 validation, distributed:
//!   the parent arrays are exchanged, each slave checks its share of the input edges, the
//!   tree-edge marks are ORed. Answer: a [`RootReport`] per root.
//! - `graph.drop` (`{"name": ...}`): forgets the graph and removes its chunks.
//!
//! # Vertex ID ↔ CID mapping
//! Vertex `v` is owned by slave `p = v / w` (see [`crate::csr::Partition`]); its local ID
//! is `l = v − p·w`. The loader creates the chunks of local IDs `0, 1, 2, …` in order, so
//! a fresh peer hands out consecutive CIDs and the mapping is a few runs
//! ([`CidRun`]: first local ID, first CID, length), kept in [`LoadedGraph::cid_runs`];
//! `cid(l) = run.first_cid + (l − run.first_local)`. DXGraph made CIDs the vertex IDs
//! outright; runs keep the mapping exact even when the peer's local IDs are not dense.
//!
//! # Where the BFS reads the graph
//! The vertex chunks are the stored graph. The BFS reads an index over them: compressed
//! sparse rows ([`crate::csr::Adjacency`]) that the loader builds by reading every vertex
//! chunk of its part back from the chunk store after writing them (the lists it wrote are
//! dropped first, unless `verify` asks to compare the two), so a BFS makes no chunk calls
//! and no copies, and what it traverses is what the store holds. The rows cost 4 bytes per
//! directed edge and 8 per vertex on top of the chunks; `LoadReport` gives both.
//!
//! # Invariants
//! - A BFS runs only on the slaves, in the order, that loaded the graph (checked).
//! - A dead slave or an aborted run fails the task on every slave with the
//!   communication error; a slave without the graph fails with a clear message.
//!
//! # Who calls it
//! Registered into peers by [`register`]; `myriad bench graph500` and the terminal's
//! `comptask` run them.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use bytes::Bytes;
use myriad_compute::{Registry, Task, TaskContext};
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::bfs::{bfs, BfsError, BfsOptions, Comm};
use crate::bitmap::Bitmap;
use crate::csr::{Adjacency, Partition};
use crate::gen::{splitmix64, Kronecker};
use crate::io::{read_share, EdgeFormat};
use crate::validate::{check_edges, check_tree_edges_found, tree_levels};
use crate::Edge;

/// Vertex chunks created per call.
pub const CHUNK_BATCH: usize = 4096;

/// Directed edges per message while loading.
const LOAD_BATCH_PAIRS: usize = 64 * 1024;

/// Adds `graph.load`, `graph.roots`, `graph.bfs` and `graph.drop` to `registry`.
pub fn register(registry: Registry) -> Registry {
    registry
        .task(LoadTask)
        .task(RootsTask)
        .task(BfsTask)
        .task(DropTask)
}

/// A run of consecutive CIDs for consecutive local vertex IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CidRun {
    /// The first local vertex ID of the run.
    pub first_local: u64,
    /// Its CID.
    pub first_cid: u64,
    /// Vertices in the run.
    pub len: u64,
}

/// One slave's part of a loaded graph.
#[derive(Debug)]
pub struct LoadedGraph {
    /// The partition of all vertices over the slaves.
    pub partition: Partition,
    /// This slave's part.
    pub part: usize,
    /// The slaves that loaded it, by part.
    pub slaves: Vec<NodeId>,
    /// This part's adjacency (what the BFS reads).
    pub adjacency: Adjacency,
    /// This slave's share of the input edge list (for the validation).
    pub edges: Vec<Edge>,
    /// The vertex chunks (see the module documentation).
    pub cid_runs: Vec<CidRun>,
}

impl LoadedGraph {
    /// The CID of local vertex `local`.
    pub fn cid(&self, local: u64) -> Option<ChunkId> {
        cid_of(&self.cid_runs, local)
    }
}

/// The CID of local vertex `local` in `runs` (sorted by first local ID).
fn cid_of(runs: &[CidRun], local: u64) -> Option<ChunkId> {
    let index = runs.partition_point(|run| run.first_local + run.len <= local);
    let run = runs.get(index)?;
    (local >= run.first_local).then(|| ChunkId::from_raw(run.first_cid + (local - run.first_local)))
}

static GRAPHS: LazyLock<Mutex<HashMap<String, Arc<LoadedGraph>>>> = LazyLock::new(Default::default);

/// The graph of this name held by this process.
pub fn loaded(name: &str) -> Option<Arc<LoadedGraph>> {
    GRAPHS.lock().get(name).cloned()
}

fn this_graph(ctx: &TaskContext, name: &str) -> Result<Arc<LoadedGraph>, String> {
    let graph = loaded(name).ok_or_else(|| {
        format!(
            "slave {} (node {}) holds no graph named {name:?}: run graph.load first",
            ctx.index(),
            ctx.node_id()
        )
    })?;
    if graph.slaves != ctx.slaves() || graph.part != ctx.index() {
        return Err(format!(
            "graph {name:?} was loaded by slaves {:?}; this run has {:?}",
            graph.slaves,
            ctx.slaves()
        ));
    }
    Ok(graph)
}

/// [`Comm`] over a task's messaging and barriers.
struct TaskComm<'a>(&'a TaskContext);

impl Comm for TaskComm<'_> {
    fn parts(&self) -> usize {
        self.0.slaves().len()
    }
    fn part(&self) -> usize {
        self.0.index()
    }
    fn send(&self, to: usize, data: Bytes) -> Result<(), BfsError> {
        self.0
            .send(to, data)
            .map_err(|error| BfsError::Comm(error.to_string()))
    }
    fn exchange(&self, value: Bytes) -> Result<Vec<Bytes>, BfsError> {
        self.0
            .barrier(value)
            .map_err(|error| BfsError::Comm(error.to_string()))
    }
    fn try_recv(&self) -> Result<Option<(usize, Bytes)>, BfsError> {
        self.0
            .try_recv()
            .map_err(|error| BfsError::Comm(error.to_string()))
    }
}

fn default_name() -> String {
    "graph".into()
}
fn default_edgefactor() -> u32 {
    16
}
fn default_seed() -> u64 {
    1
}
fn default_true() -> bool {
    true
}

/// Parameters of `graph.load`: a Kronecker graph (`scale`) or a file (`file`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadParams {
    /// The graph's name (default `graph`).
    #[serde(default = "default_name")]
    pub name: String,
    /// Kronecker scale (log2 vertices).
    #[serde(default)]
    pub scale: Option<u32>,
    /// Edges per vertex (default 16).
    #[serde(default = "default_edgefactor")]
    pub edgefactor: u32,
    /// Generator seed (default 1).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// An edge-list file every slave can read (instead of `scale`).
    #[serde(default)]
    pub file: Option<String>,
    /// The file's format (default text).
    #[serde(default)]
    pub format: Option<EdgeFormat>,
    /// Keep the lists written until the rows are rebuilt from the chunks, and compare.
    #[serde(default)]
    pub verify: bool,
}

/// One slave's answer to `graph.load`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    /// Vertices of the graph.
    pub vertices: u64,
    /// Input edges of the whole graph.
    pub edges: u64,
    /// This slave's vertices.
    pub local_vertices: u64,
    /// This slave's directed adjacency entries (after removing loops and duplicates).
    pub local_adjacency: u64,
    /// Bytes of this slave's chunk store used by the vertex chunks.
    pub chunk_bytes: u64,
    /// Bytes of the rows the BFS reads.
    pub csr_bytes: u64,
    /// Seconds generating or reading the edges.
    pub generate_secs: f64,
    /// Seconds sending the edges to their owners (until every slave has its pairs).
    pub distribute_secs: f64,
    /// Seconds building the rows.
    pub rows_secs: f64,
    /// Seconds writing the vertex chunks.
    pub chunks_secs: f64,
    /// Seconds reading the vertex chunks back into the rows the BFS reads.
    #[serde(default)]
    pub index_secs: f64,
    /// Seconds of the whole load on this slave.
    pub load_secs: f64,
}

/// The `graph.load` task (see the module documentation).
pub struct LoadTask;

impl Task for LoadTask {
    fn name(&self) -> &str {
        "graph.load"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: LoadParams = ctx.params_json()?;
        let report = load(ctx, &params)?;
        serde_json::to_vec(&report)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    }
}

fn read_u64(value: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    let len = value.len().min(8);
    raw[..len].copy_from_slice(&value[..len]);
    u64::from_le_bytes(raw)
}

/// This slave's share of the input edges and the vertex count.
fn input_edges(
    ctx: &TaskContext,
    comm: &TaskComm<'_>,
    params: &LoadParams,
) -> Result<(Vec<Edge>, u64, u64), String> {
    let (part, parts) = (ctx.index(), ctx.slaves().len());
    let edges = match (&params.file, params.scale) {
        (Some(file), _) => read_share(
            std::path::Path::new(file),
            params.format.unwrap_or(EdgeFormat::Text),
            part,
            parts,
        )
        .map_err(|e| e.to_string())?,
        (None, Some(scale)) => {
            let kronecker = Kronecker::new(scale, params.edgefactor, params.seed);
            kronecker.check()?;
            let perm = kronecker.permutation();
            let (start, end) = kronecker.share(part, parts);
            kronecker.edges(&perm, start, end).collect()
        }
        (None, None) => return Err("graph.load needs `scale` or `file`".into()),
    };
    let local_max = edges.iter().map(|&(u, v)| u.max(v) as u64 + 1).max();
    let value = [
        local_max.unwrap_or(0).to_le_bytes(),
        (edges.len() as u64).to_le_bytes(),
    ]
    .concat();
    let all = comm
        .exchange(Bytes::from(value))
        .map_err(|e| e.to_string())?;
    let mut vertices = all.iter().map(|v| read_u64(v)).max().unwrap_or(0);
    let total: u64 = all
        .iter()
        .map(|v| read_u64(v.get(8..).unwrap_or(&[])))
        .sum();
    if params.file.is_none() {
        vertices = 1u64 << params.scale.unwrap_or(0);
    }
    Ok((edges, vertices, total))
}

/// Sends each edge in both directions to the source's owner; this part's pairs as
/// `(local source, target)`.
fn distribute(
    comm: &TaskComm<'_>,
    partition: &Partition,
    edges: &[Edge],
) -> Result<Vec<(u32, u32)>, String> {
    let part = comm.part();
    let first = partition.first(part);
    let mut pairs = Vec::with_capacity(edges.len() * 2 / partition.parts.max(1) + 16);
    let mut buffers: Vec<Vec<u8>> = vec![Vec::new(); partition.parts];
    for &(u, v) in edges {
        if u == v {
            continue;
        }
        for (s, t) in [(u, v), (v, u)] {
            let owner = partition.owner(s);
            if owner == part {
                pairs.push(((u64::from(s) - first) as u32, t));
            } else {
                let buffer = &mut buffers[owner];
                buffer.extend_from_slice(&s.to_le_bytes());
                buffer.extend_from_slice(&t.to_le_bytes());
                if buffer.len() >= LOAD_BATCH_PAIRS * 8 {
                    comm.send(owner, Bytes::from(std::mem::take(buffer)))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
    }
    for (owner, buffer) in buffers.into_iter().enumerate() {
        if !buffer.is_empty() {
            comm.send(owner, Bytes::from(buffer))
                .map_err(|e| e.to_string())?;
        }
    }
    comm.exchange(Bytes::new()).map_err(|e| e.to_string())?;
    while let Some((from, data)) = comm.try_recv().map_err(|e| e.to_string())? {
        for pair in data.chunks_exact(8) {
            let s = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
            let t = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
            if partition.owner(s) != part {
                return Err(format!("slave {from} sent vertex {s}, not ours"));
            }
            pairs.push(((u64::from(s) - first) as u32, t));
        }
    }
    Ok(pairs)
}

/// The chunk payload of a vertex: degree, then neighbours (little-endian `u32`).
pub fn vertex_payload(neighbours: &[u32]) -> Bytes {
    let mut data = Vec::with_capacity(4 + neighbours.len() * 4);
    data.extend_from_slice(&(neighbours.len() as u32).to_le_bytes());
    for &v in neighbours {
        data.extend_from_slice(&v.to_le_bytes());
    }
    Bytes::from(data)
}

/// Writes one chunk per local vertex; the CID runs and the bytes used.
fn store_chunks(ctx: &TaskContext, adjacency: &Adjacency) -> Result<(Vec<CidRun>, u64), String> {
    let local = ctx.local();
    let before = local.stats().map_err(|e| e.to_string())?.used_bytes;
    let mut runs: Vec<CidRun> = Vec::new();
    let vertices = adjacency.vertices();
    let mut start = 0;
    while start < vertices {
        let end = (start + CHUNK_BATCH).min(vertices);
        let payloads = (start..end)
            .map(|v| vertex_payload(adjacency.neighbours(v)))
            .collect();
        let cids = local
            .create_with_data(payloads)
            .map_err(|e| format!("writing vertex chunks: {e}"))?;
        for (offset, cid) in cids.into_iter().enumerate() {
            let l = (start + offset) as u64;
            match runs.last_mut() {
                Some(run)
                    if run.first_cid + run.len == cid.raw() && run.first_local + run.len == l =>
                {
                    run.len += 1;
                }
                _ => runs.push(CidRun {
                    first_local: l,
                    first_cid: cid.raw(),
                    len: 1,
                }),
            }
        }
        start = end;
        if ctx.is_aborted() {
            return Err("the run was aborted while writing chunks".into());
        }
    }
    let after = local.stats().map_err(|e| e.to_string())?.used_bytes;
    Ok((runs, after.saturating_sub(before)))
}

/// Appends the neighbours held by one vertex chunk (a little-endian u32 degree, then that
/// many u32 vertex IDs) to `targets`; a chunk of another shape is an error, never a panic.
fn decode_vertex(data: &[u8], targets: &mut Vec<u32>) -> Result<(), String> {
    let (head, rest) = data
        .split_first_chunk::<4>()
        .ok_or_else(|| format!("a vertex chunk of {} bytes has no degree", data.len()))?;
    let degree = u32::from_le_bytes(*head) as usize;
    if rest.len() != degree.saturating_mul(4) {
        return Err(format!(
            "a vertex chunk says degree {degree} but holds {} bytes of neighbours",
            rest.len()
        ));
    }
    targets.extend(
        rest.chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    Ok(())
}

/// Builds the rows the BFS reads by reading every vertex chunk of this part back from the
/// chunk store (see the module documentation); `entries` sizes the target array.
fn rows_from_chunks(
    ctx: &TaskContext,
    vertices: u64,
    runs: &[CidRun],
    entries: usize,
) -> Result<Adjacency, String> {
    let local = ctx.local();
    let mut offsets = Vec::with_capacity(vertices as usize + 1);
    offsets.push(0u64);
    let mut targets = Vec::with_capacity(entries);
    let mut start = 0;
    while start < vertices {
        let end = (start + CHUNK_BATCH as u64).min(vertices);
        let cids: Vec<ChunkId> = (start..end)
            .map(|l| cid_of(runs, l).ok_or_else(|| format!("no CID for local vertex {l}")))
            .collect::<Result<_, _>>()?;
        for (l, data) in (start..end).zip(local.get_batch(&cids)) {
            let data = data.map_err(|e| format!("reading vertex chunk {l}: {e}"))?;
            decode_vertex(&data, &mut targets).map_err(|e| format!("local vertex {l}: {e}"))?;
            offsets.push(targets.len() as u64);
        }
        start = end;
        if ctx.is_aborted() {
            return Err("the run was aborted while reading chunks".into());
        }
    }
    Ok(Adjacency { offsets, targets })
}

fn load(ctx: &TaskContext, params: &LoadParams) -> Result<LoadReport, String> {
    let started = Instant::now();
    let comm = TaskComm(ctx);
    // Loading a name again replaces the graph: the old one's chunks go first.
    drop_graph(ctx, &params.name)?;
    let (edges, vertices, total_edges) = input_edges(ctx, &comm, params)?;
    let generate_secs = started.elapsed().as_secs_f64();
    if vertices == 0 || vertices > u64::from(u32::MAX) {
        return Err(format!(
            "{vertices} vertices: not a graph this loader takes"
        ));
    }
    let partition = Partition::new(vertices, ctx.slaves().len());
    let part = ctx.index();
    let phase = Instant::now();
    let pairs = distribute(&comm, &partition, &edges)?;
    let distribute_secs = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    let adjacency = Adjacency::from_pairs(
        partition.count(part) as usize,
        partition.first(part),
        &pairs,
    );
    drop(pairs);
    let rows_secs = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    let (cid_runs, chunk_bytes) = store_chunks(ctx, &adjacency)?;
    let chunks_secs = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    let vertex_count = adjacency.vertices() as u64;
    let entries = adjacency.targets.len();
    let written = if params.verify {
        Some(adjacency)
    } else {
        drop(adjacency);
        None
    };
    let adjacency = rows_from_chunks(ctx, vertex_count, &cid_runs, entries)?;
    if written.is_some_and(|written| written != adjacency) {
        return Err(
            "the rows read back from the vertex chunks differ from the lists written".into(),
        );
    }
    let index_secs = phase.elapsed().as_secs_f64();
    let graph = LoadedGraph {
        partition,
        part,
        slaves: ctx.slaves().to_vec(),
        adjacency,
        edges,
        cid_runs,
    };
    // Everybody loaded before anybody reports.
    comm.exchange(Bytes::new()).map_err(|e| e.to_string())?;
    let report = LoadReport {
        vertices,
        edges: total_edges,
        local_vertices: graph.adjacency.vertices() as u64,
        local_adjacency: graph.adjacency.targets.len() as u64,
        chunk_bytes,
        csr_bytes: graph.adjacency.bytes(),
        generate_secs,
        distribute_secs,
        rows_secs,
        chunks_secs,
        index_secs,
        load_secs: started.elapsed().as_secs_f64(),
    };
    GRAPHS.lock().insert(params.name.clone(), Arc::new(graph));
    Ok(report)
}

/// Parameters of `graph.roots`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RootsParams {
    /// The graph's name (default `graph`).
    #[serde(default = "default_name")]
    pub name: String,
    /// Roots wanted.
    pub count: usize,
    /// Seed of the candidates (default 1).
    #[serde(default = "default_seed")]
    pub seed: u64,
}

/// The `graph.roots` task (see the module documentation).
pub struct RootsTask;

impl Task for RootsTask {
    fn name(&self) -> &str {
        "graph.roots"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: RootsParams = ctx.params_json()?;
        let graph = this_graph(ctx, &params.name)?;
        let comm = TaskComm(ctx);
        let partition = graph.partition;
        let mut state = params.seed ^ 0x524F_4F54_5321;
        let mut roots: Vec<u32> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        const CANDIDATES: usize = 1024;
        for _round in 0..64 {
            if roots.len() >= params.count {
                break;
            }
            let candidates: Vec<u32> = (0..CANDIDATES)
                .map(|_| (splitmix64(&mut state) % partition.vertices) as u32)
                .collect();
            let mine = Bitmap::new(CANDIDATES);
            let first = partition.first(graph.part);
            for (i, &c) in candidates.iter().enumerate() {
                if partition.owner(c) == graph.part
                    && graph.adjacency.degree((u64::from(c) - first) as usize) > 0
                {
                    mine.set(i);
                }
            }
            let all = comm
                .exchange(Bytes::from(mine.to_bytes()))
                .map_err(|e| e.to_string())?;
            let good = Bitmap::new(CANDIDATES);
            for piece in &all {
                good.or_bytes(0, piece);
            }
            for i in good.ones() {
                if roots.len() < params.count && seen.insert(candidates[i]) {
                    roots.push(candidates[i]);
                }
            }
        }
        serde_json::to_vec(&roots)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    }
}

/// Parameters of `graph.bfs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BfsParams {
    /// The graph's name (default `graph`).
    #[serde(default = "default_name")]
    pub name: String,
    /// The roots, one BFS each.
    pub roots: Vec<u32>,
    /// Worker threads per slave (default: the machine's cores over the slaves, at least 1).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Direction optimization (default true; false: top-down only).
    #[serde(default = "default_true")]
    pub direction_optimizing: bool,
    /// Run the Graph500 validation after each BFS (default true).
    #[serde(default = "default_true")]
    pub validate: bool,
}

/// One slave's result for one root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootReport {
    /// The root.
    pub root: u32,
    /// Seconds of the BFS on this slave (between the barriers before and after it).
    pub secs: f64,
    /// Levels.
    pub levels: u32,
    /// Of them, bottom-up.
    pub bottom_up_levels: u32,
    /// Vertices reached.
    pub reached: u64,
    /// Input edges in the root's component (from the validation; 0 without it).
    pub edges: u64,
    /// Whether this slave's share of the validation passed (false without it).
    pub valid: bool,
    /// The first failed check on this slave.
    pub error: Option<String>,
}

/// The `graph.bfs` task (see the module documentation).
pub struct BfsTask;

impl Task for BfsTask {
    fn name(&self) -> &str {
        "graph.bfs"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: BfsParams = ctx.params_json()?;
        let graph = this_graph(ctx, &params.name)?;
        let comm = TaskComm(ctx);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let options = BfsOptions {
            direction_optimizing: params.direction_optimizing,
            threads: params
                .threads
                .unwrap_or(cores / ctx.slaves().len().max(1))
                .clamp(1, 256),
            ..BfsOptions::default()
        };
        let mut reports = Vec::with_capacity(params.roots.len());
        for &root in &params.roots {
            comm.exchange(Bytes::new()).map_err(|e| e.to_string())?;
            let started = Instant::now();
            let outcome = bfs(&comm, &graph.partition, &graph.adjacency, root, &options)
                .map_err(|e| format!("BFS from {root}: {e}"))?;
            comm.exchange(Bytes::new()).map_err(|e| e.to_string())?;
            let secs = started.elapsed().as_secs_f64();
            let mut report = RootReport {
                root,
                secs,
                levels: outcome.levels,
                bottom_up_levels: outcome.bottom_up_levels,
                reached: outcome.reached,
                edges: 0,
                valid: false,
                error: None,
            };
            if params.validate {
                let (edges, error) = validate_distributed(&comm, &graph, root, &outcome.parents)?;
                report.edges = edges;
                report.valid = error.is_none();
                report.error = error;
            }
            reports.push(report);
        }
        serde_json::to_vec(&reports)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    }
}

/// The Graph500 validation across the slaves: the component's edge count and this
/// slave's first failed check. Communication failures are errors.
fn validate_distributed(
    comm: &TaskComm<'_>,
    graph: &LoadedGraph,
    root: u32,
    parents: &[u32],
) -> Result<(u64, Option<String>), String> {
    let mut bytes = Vec::with_capacity(parents.len() * 4);
    for &p in parents {
        bytes.extend_from_slice(&p.to_le_bytes());
    }
    let pieces = comm
        .exchange(Bytes::from(bytes))
        .map_err(|e| e.to_string())?;
    let mut all = Vec::with_capacity(graph.partition.vertices as usize);
    for piece in &pieces {
        all.extend(
            piece
                .chunks_exact(4)
                .map(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]])),
        );
    }
    let mut error = None;
    if all.len() as u64 != graph.partition.vertices {
        error = Some(format!(
            "{} parents for {} vertices",
            all.len(),
            graph.partition.vertices
        ));
    }
    let levels = match tree_levels(&all, root) {
        Ok(levels) => levels,
        Err(e) => {
            error.get_or_insert(e.to_string());
            vec![-1; all.len()]
        }
    };
    let check = check_edges(&all, &levels, graph.edges.iter().copied());
    if let Some(e) = check.error {
        error.get_or_insert(e.to_string());
    }
    let mut value = check.edges_in_component.to_le_bytes().to_vec();
    value.extend_from_slice(&check.found.to_bytes());
    let marks = comm
        .exchange(Bytes::from(value))
        .map_err(|e| e.to_string())?;
    let found = Bitmap::new(all.len());
    let mut edges = 0;
    for piece in &marks {
        edges += read_u64(piece);
        found.or_bytes(0, piece.get(8..).unwrap_or(&[]));
    }
    let first = graph.partition.first(graph.part) as usize;
    let range = first..(first + parents.len()).min(all.len());
    if error.is_none() {
        if let Err(e) = check_tree_edges_found(&all, root, &found, range) {
            error = Some(e.to_string());
        }
    }
    Ok((edges, error))
}

#[derive(Deserialize)]
struct NameParams {
    #[serde(default = "default_name")]
    name: String,
}

/// The `graph.drop` task (see the module documentation).
pub struct DropTask;

impl Task for DropTask {
    fn name(&self) -> &str {
        "graph.drop"
    }
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String> {
        let params: NameParams = ctx.params_json()?;
        let removed = drop_graph(ctx, &params.name)?;
        Ok(myriad_compute::int_value(removed as i64))
    }
}

/// Forgets the graph `name` and removes its vertex chunks; how many were removed.
fn drop_graph(ctx: &TaskContext, name: &str) -> Result<usize, String> {
    let Some(graph) = GRAPHS.lock().remove(name) else {
        return Ok(0);
    };
    let cids: Vec<ChunkId> = graph
        .cid_runs
        .iter()
        .flat_map(|run| (0..run.len).map(move |i| ChunkId::from_raw(run.first_cid + i)))
        .collect();
    let client = ctx.env().client.blocking();
    let chunks = client.chunks();
    for batch in cids.chunks(CHUNK_BATCH) {
        if let Some(Err(e)) = chunks.remove_batch(batch).into_iter().find(Result::is_err) {
            return Err(format!("removing vertex chunks: {e}"));
        }
    }
    Ok(cids.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vertex_chunks_decode_back_to_their_lists() {
        let mut targets = vec![7];
        decode_vertex(&vertex_payload(&[1, 5, 9]), &mut targets).expect("a well-formed chunk");
        decode_vertex(&vertex_payload(&[]), &mut targets).expect("a vertex without edges");
        assert_eq!(targets, vec![7, 1, 5, 9]);
    }

    #[test]
    fn malformed_vertex_chunks_are_errors() {
        let mut targets = Vec::new();
        assert!(decode_vertex(&[1, 0], &mut targets).is_err(), "no degree");
        let mut short = vertex_payload(&[1, 2]).to_vec();
        short.pop();
        assert!(
            decode_vertex(&short, &mut targets).is_err(),
            "a truncated list"
        );
        let mut long = vertex_payload(&[1]).to_vec();
        long.extend_from_slice(&[0, 0, 0, 0]);
        assert!(decode_vertex(&long, &mut targets).is_err(), "extra bytes");
        let huge = u32::MAX.to_le_bytes();
        assert!(
            decode_vertex(&huge, &mut targets).is_err(),
            "a degree beyond the chunk"
        );
        assert!(targets.is_empty(), "nothing appended on errors");
    }
}

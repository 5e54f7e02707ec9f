//! The BFS: a level-synchronous, direction-optimizing kernel run by every part at once,
//! written against a small communication trait ([`Comm`]) so that it runs in a compute
//! group's slaves, in threads of one process (tests), or alone; and a plain sequential
//! BFS to check it against.
//!
//! # Job
//! [`bfs`] computes one part's parent array for a root. Per part: three bitmaps over the
//! local vertices (current frontier, next frontier, visited) with atomic claims, and
//! `threads` worker threads taking blocks of 4,096 vertices from a shared counter.
//! - **Top-down** level: every frontier vertex's neighbours; a local neighbour is claimed
//!   at once (visited `fetch_or`, parent, next frontier); a remote one is appended as a
//!   `(vertex, parent)` pair to the worker's buffer for its owner, sent in batches of
//!   [`BATCH_PAIRS`]; after a barrier the received pairs are claimed the same way.
//! - **Bottom-up** level: the parts exchange their frontier bitmaps (one barrier, `n/8`
//!   bytes in all); every unvisited local vertex scans its neighbours until one is in the
//!   global frontier. No per-edge messages at all.
//! - **Level synchronization**: one barrier per level exchanges each part's next-frontier
//!   vertex count `n_f`, its edge count `m_f` and its unexplored edge count `m_u`; every
//!   part takes the same decisions from the sums: stop when `n_f = 0`; Beamer's switch
//!   top-down → bottom-up when `m_f > m_u / α` (α = 14) and back when `n_f < n / β`
//!   (β = 24). (The thesis prints `m/10` and `n/(14k)`; these are Beamer et al.'s.)
//!
//! # Invariants
//! - Every vertex is claimed at most once per BFS: its parent is written by the claimant.
//! - All parts run the same mode at each level (decisions come from the same sums).
//! - A failing [`Comm`] fails the BFS with its error; nothing waits forever.
//!
//! # Who calls it
//! The BFS task ([`crate::task`]), tests, the benchmark (indirectly).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use bytes::Bytes;
use thiserror::Error;

use crate::bitmap::Bitmap;
use crate::csr::{Adjacency, Partition};

/// "No parent": the vertex was not reached.
pub const NO_PARENT: u32 = u32::MAX;

/// Remote `(vertex, parent)` pairs per message.
pub const BATCH_PAIRS: usize = 16 * 1024;

/// Vertices per unit of work a worker takes.
const BLOCK_WORDS: usize = 64;

/// Why a BFS (or its communication) failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BfsError {
    /// Sending, a barrier or a receive failed (a slave died, the run was aborted).
    #[error("communication failed: {0}")]
    Comm(String),
    /// A message or value did not have the expected form.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The root is not a vertex of the graph.
    #[error("root {root} is not below the vertex count {vertices}")]
    BadRoot {
        /// The root asked for.
        root: u32,
        /// The graph's vertices.
        vertices: u64,
    },
}

/// How the parts talk: one-way messages and barriers exchanging a value per part.
pub trait Comm: Sync {
    /// The number of parts.
    fn parts(&self) -> usize;
    /// This part's index.
    fn part(&self) -> usize;
    /// Sends `data` to part `to` (to itself: straight into its own inbox).
    fn send(&self, to: usize, data: Bytes) -> Result<(), BfsError>;
    /// A barrier: returns every part's `value` by index; when it returns, every message
    /// any part sent before entering it can be received here.
    fn exchange(&self, value: Bytes) -> Result<Vec<Bytes>, BfsError>;
    /// A waiting message `(from, data)`, if any.
    fn try_recv(&self) -> Result<Option<(usize, Bytes)>, BfsError>;
}

/// The one-part [`Comm`]: no messages, barriers return the own value.
#[derive(Debug, Default)]
pub struct Solo;

impl Comm for Solo {
    fn parts(&self) -> usize {
        1
    }
    fn part(&self) -> usize {
        0
    }
    fn send(&self, _to: usize, _data: Bytes) -> Result<(), BfsError> {
        Err(BfsError::Comm("a single part sends nothing".into()))
    }
    fn exchange(&self, value: Bytes) -> Result<Vec<Bytes>, BfsError> {
        Ok(vec![value])
    }
    fn try_recv(&self) -> Result<Option<(usize, Bytes)>, BfsError> {
        Ok(None)
    }
}

/// How to run a BFS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfsOptions {
    /// Switch between top-down and bottom-up (false: top-down only).
    pub direction_optimizing: bool,
    /// Worker threads of this part.
    pub threads: usize,
    /// Beamer's α (top-down → bottom-up when `m_f > m_u / α`).
    pub alpha: u64,
    /// Beamer's β (bottom-up → top-down when `n_f < n / β`).
    pub beta: u64,
}

impl Default for BfsOptions {
    fn default() -> Self {
        BfsOptions {
            direction_optimizing: true,
            threads: 1,
            alpha: 14,
            beta: 24,
        }
    }
}

/// One part's result of a BFS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BfsOutcome {
    /// Parent (global ID) of each local vertex, [`NO_PARENT`] if unreached; the root is
    /// its own parent.
    pub parents: Vec<u32>,
    /// Levels run.
    pub levels: u32,
    /// Of them, bottom-up.
    pub bottom_up_levels: u32,
    /// Vertices reached in all parts.
    pub reached: u64,
}

struct State<'a> {
    partition: &'a Partition,
    part: usize,
    first: u64,
    adjacency: &'a Adjacency,
    visited: Bitmap,
    current: Bitmap,
    next: Bitmap,
    parents: Vec<AtomicU32>,
    threads: usize,
}

impl State<'_> {
    /// Claims local vertex `local` for `parent`; true if it was unvisited.
    #[inline]
    fn claim(&self, local: usize, parent: u32) -> bool {
        if self.visited.test_and_set(local) {
            self.parents[local].store(parent, Ordering::Relaxed);
            self.next.set(local);
            true
        } else {
            false
        }
    }

    /// Runs `work(first word, end word)` on the workers over all words of the local
    /// bitmaps, in blocks; the results are collected.
    fn parallel<T: Send>(&self, work: impl Fn(usize, usize) -> T + Sync) -> Vec<T> {
        let words = self.visited.word_count();
        let cursor = AtomicUsize::new(0);
        let run = || {
            let mut out = Vec::new();
            loop {
                let start = cursor.fetch_add(BLOCK_WORDS, Ordering::Relaxed);
                if start >= words {
                    return out;
                }
                out.push(work(start, (start + BLOCK_WORDS).min(words)));
            }
        };
        if self.threads <= 1 {
            return run();
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = (1..self.threads).map(|_| scope.spawn(run)).collect();
            let mut all = run();
            for handle in handles {
                match handle.join() {
                    Ok(part) => all.extend(part),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            all
        })
    }

    /// One top-down level: local claims and remote pairs sent per owner.
    fn top_down(&self, comm: &dyn Comm) -> Result<(), BfsError> {
        let parts = self.partition.parts;
        let results = self.parallel(|start, end| -> Result<(), BfsError> {
            let mut buffers: Vec<Vec<u8>> = vec![Vec::new(); parts];
            for word_index in start..end {
                let mut bits = self.current.word(word_index);
                while bits != 0 {
                    let local = word_index * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let me = (self.first + local as u64) as u32;
                    for &v in self.adjacency.neighbours(local) {
                        let owner = self.partition.owner(v);
                        if owner == self.part {
                            self.claim((u64::from(v) - self.first) as usize, me);
                        } else {
                            let buffer = &mut buffers[owner];
                            buffer.extend_from_slice(&v.to_le_bytes());
                            buffer.extend_from_slice(&me.to_le_bytes());
                            if buffer.len() >= BATCH_PAIRS * 8 {
                                comm.send(owner, Bytes::from(std::mem::take(buffer)))?;
                            }
                        }
                    }
                }
            }
            for (owner, buffer) in buffers.into_iter().enumerate() {
                if !buffer.is_empty() {
                    comm.send(owner, Bytes::from(buffer))?;
                }
            }
            Ok(())
        });
        results.into_iter().collect::<Result<(), BfsError>>()?;
        if parts > 1 {
            comm.exchange(Bytes::new())?;
            while let Some((_, data)) = comm.try_recv()? {
                if data.len() % 8 != 0 {
                    return Err(BfsError::Malformed(format!(
                        "{} bytes of pairs",
                        data.len()
                    )));
                }
                for pair in data.chunks_exact(8) {
                    let v = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
                    let parent = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
                    let local = u64::from(v).wrapping_sub(self.first);
                    if self.partition.owner(v) != self.part || local >= self.parents.len() as u64 {
                        return Err(BfsError::Malformed(format!("vertex {v} is not ours")));
                    }
                    self.claim(local as usize, parent);
                }
            }
        }
        Ok(())
    }

    /// One bottom-up level against the global frontier.
    fn bottom_up(&self, frontier: &Bitmap) {
        self.parallel(|start, end| {
            for word_index in start..end {
                let mut open = !self.visited.word(word_index);
                if word_index + 1 == self.visited.word_count()
                    && !self.parents.len().is_multiple_of(64)
                {
                    open &= (1u64 << (self.parents.len() % 64)) - 1;
                }
                let mut found = 0u64;
                while open != 0 {
                    let bit = open.trailing_zeros() as usize;
                    open &= open - 1;
                    let local = word_index * 64 + bit;
                    for &u in self.adjacency.neighbours(local) {
                        if frontier.get(u as usize) {
                            self.parents[local].store(u, Ordering::Relaxed);
                            found |= 1 << bit;
                            break;
                        }
                    }
                }
                self.visited.or_word(word_index, found);
                self.next.or_word(word_index, found);
            }
        });
    }

    /// The next frontier's vertex and edge counts.
    fn next_counts(&self) -> (u64, u64) {
        let counts = self.parallel(|start, end| {
            let (mut n, mut m) = (0u64, 0u64);
            for word_index in start..end {
                let mut bits = self.next.word(word_index);
                n += u64::from(bits.count_ones());
                while bits != 0 {
                    m += self
                        .adjacency
                        .degree(word_index * 64 + bits.trailing_zeros() as usize);
                    bits &= bits - 1;
                }
            }
            (n, m)
        });
        counts
            .into_iter()
            .fold((0, 0), |(n, m), (a, b)| (n + a, m + b))
    }
}

fn encode_counts(values: [u64; 3]) -> Bytes {
    let mut out = Vec::with_capacity(24);
    for value in values {
        out.extend_from_slice(&value.to_le_bytes());
    }
    Bytes::from(out)
}

fn sum_counts(values: &[Bytes]) -> Result<[u64; 3], BfsError> {
    let mut sums = [0u64; 3];
    for value in values {
        if value.len() != 24 {
            return Err(BfsError::Malformed(format!(
                "counts of {} bytes",
                value.len()
            )));
        }
        for (i, sum) in sums.iter_mut().enumerate() {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&value[i * 8..i * 8 + 8]);
            *sum += u64::from_le_bytes(raw);
        }
    }
    Ok(sums)
}

/// Runs one BFS from `root` on this part (see the module documentation). Every part must
/// call it with the same root, partition and options.
pub fn bfs(
    comm: &dyn Comm,
    partition: &Partition,
    adjacency: &Adjacency,
    root: u32,
    options: &BfsOptions,
) -> Result<BfsOutcome, BfsError> {
    if u64::from(root) >= partition.vertices {
        return Err(BfsError::BadRoot {
            root,
            vertices: partition.vertices,
        });
    }
    let part = comm.part();
    let local_vertices = adjacency.vertices();
    let mut state = State {
        partition,
        part,
        first: partition.first(part),
        adjacency,
        visited: Bitmap::new(local_vertices),
        current: Bitmap::new(local_vertices),
        next: Bitmap::new(local_vertices),
        parents: (0..local_vertices)
            .map(|_| AtomicU32::new(NO_PARENT))
            .collect(),
        threads: options.threads.max(1),
    };
    let mut unexplored = adjacency.targets.len() as u64;
    let (mut n_f, mut m_f) = (0, 0);
    if partition.owner(root) == part {
        let local = (u64::from(root) - state.first) as usize;
        state.claim(local, root);
        n_f = 1;
        m_f = adjacency.degree(local);
    }
    let mut bottom_up = false;
    let (mut levels, mut bottom_up_levels, mut reached) = (0u32, 0u32, 0u64);
    let global_frontier = Bitmap::new(if options.direction_optimizing {
        partition.vertices as usize
    } else {
        0
    });
    loop {
        unexplored -= m_f;
        let [total_n, total_m, total_u] =
            sum_counts(&comm.exchange(encode_counts([n_f, m_f, unexplored]))?)?;
        reached += total_n;
        if total_n == 0 {
            break;
        }
        std::mem::swap(&mut state.current, &mut state.next);
        state.next.clear();
        if options.direction_optimizing {
            if !bottom_up && total_m > total_u / options.alpha.max(1) {
                bottom_up = true;
            } else if bottom_up && total_n < partition.vertices / options.beta.max(1) {
                bottom_up = false;
            }
        }
        if bottom_up {
            let pieces = comm.exchange(Bytes::from(state.current.to_bytes()))?;
            global_frontier.clear();
            for (index, piece) in pieces.iter().enumerate() {
                global_frontier.or_bytes((partition.first(index) / 64) as usize, piece);
            }
            state.bottom_up(&global_frontier);
            bottom_up_levels += 1;
        } else {
            state.top_down(comm)?;
        }
        levels += 1;
        (n_f, m_f) = state.next_counts();
    }
    Ok(BfsOutcome {
        parents: state
            .parents
            .into_iter()
            .map(AtomicU32::into_inner)
            .collect(),
        levels,
        bottom_up_levels,
        reached,
    })
}

/// Levels of a plain sequential top-down BFS over `edges` (undirected) from `root`:
/// `-1` for unreached vertices. The reference the kernels are tested against.
pub fn sequential_levels(vertices: usize, edges: &[crate::Edge], root: u32) -> Vec<i64> {
    let partition = Partition::new(vertices as u64, 1);
    let adjacency =
        Adjacency::from_pairs(vertices, 0, &crate::csr::local_pairs(&partition, 0, edges));
    let mut levels = vec![-1i64; vertices];
    let mut queue = std::collections::VecDeque::new();
    levels[root as usize] = 0;
    queue.push_back(root as usize);
    while let Some(u) = queue.pop_front() {
        for &v in adjacency.neighbours(u) {
            if levels[v as usize] < 0 {
                levels[v as usize] = levels[u] + 1;
                queue.push_back(v as usize);
            }
        }
    }
    levels
}

/// Parts as threads of one process: [`Comm`]s sharing inboxes and a barrier (tests, and
/// running the distributed kernel without a cluster). Make one with [`ThreadComm::group`]
/// and hand one member to each thread.
#[derive(Debug)]
pub struct ThreadComm {
    part: usize,
    shared: std::sync::Arc<ThreadShared>,
}

#[derive(Debug)]
struct ThreadShared {
    inboxes: Vec<parking_lot::Mutex<std::collections::VecDeque<(usize, Bytes)>>>,
    slots: parking_lot::Mutex<Vec<Bytes>>,
    barrier: std::sync::Barrier,
}

impl ThreadComm {
    /// `parts` connected members, by part index.
    pub fn group(parts: usize) -> Vec<ThreadComm> {
        let parts = parts.max(1);
        let shared = std::sync::Arc::new(ThreadShared {
            inboxes: (0..parts).map(|_| Default::default()).collect(),
            slots: parking_lot::Mutex::new(vec![Bytes::new(); parts]),
            barrier: std::sync::Barrier::new(parts),
        });
        (0..parts)
            .map(|part| ThreadComm {
                part,
                shared: std::sync::Arc::clone(&shared),
            })
            .collect()
    }
}

impl Comm for ThreadComm {
    fn parts(&self) -> usize {
        self.shared.inboxes.len()
    }
    fn part(&self) -> usize {
        self.part
    }
    fn send(&self, to: usize, data: Bytes) -> Result<(), BfsError> {
        let inbox = self
            .shared
            .inboxes
            .get(to)
            .ok_or_else(|| BfsError::Comm(format!("no part {to}")))?;
        inbox.lock().push_back((self.part, data));
        Ok(())
    }
    fn exchange(&self, value: Bytes) -> Result<Vec<Bytes>, BfsError> {
        self.shared.slots.lock()[self.part] = value;
        self.shared.barrier.wait();
        let values = self.shared.slots.lock().clone();
        // Nobody overwrites a slot before everybody read them all.
        self.shared.barrier.wait();
        Ok(values)
    }
    fn try_recv(&self) -> Result<Option<(usize, Bytes)>, BfsError> {
        Ok(self.shared.inboxes[self.part].lock().pop_front())
    }
}

/// Runs [`bfs`] from `root` over `edges` split into `parts` parts, each a thread of this
/// process ([`ThreadComm`]); the global parent array.
pub fn bfs_in_threads(
    vertices: u64,
    edges: &[crate::Edge],
    parts: usize,
    root: u32,
    options: &BfsOptions,
) -> Result<Vec<u32>, BfsError> {
    let partition = Partition::new(vertices, parts);
    let adjacencies: Vec<Adjacency> = (0..partition.parts)
        .map(|part| {
            Adjacency::from_pairs(
                partition.count(part) as usize,
                partition.first(part),
                &crate::csr::local_pairs(&partition, part, edges),
            )
        })
        .collect();
    let comms = ThreadComm::group(partition.parts);
    let outcomes: Vec<Result<BfsOutcome, BfsError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&adjacencies)
            .map(|(comm, adjacency)| {
                let partition = &partition;
                scope.spawn(move || bfs(comm, partition, adjacency, root, options))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err(BfsError::Comm("a part panicked".into())))
            })
            .collect()
    });
    let mut parents = Vec::with_capacity(vertices as usize);
    for outcome in outcomes {
        parents.extend(outcome?.parents);
    }
    Ok(parents)
}

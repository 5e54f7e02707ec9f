//! Vertex partitioning and one part's adjacency in compressed sparse rows.
//!
//! # Job
//! - [`Partition`]: vertices split by range over `parts` slaves: part `p` owns
//!   `p·w .. min((p+1)·w, n)` with `w = ⌈n / parts⌉`. The Kronecker generator permutes the
//!   vertex IDs, so ranges are as balanced as a random distribution (DXGraph's choice) and
//!   the owner of a vertex is one division. A vertex's **local ID** is its offset in its
//!   part's range (dense, from 0, as DXGraph's per-node local IDs).
//! - [`Adjacency`]: the out-neighbours (global IDs) of one part's vertices, built from
//!   directed `(local source, global target)` pairs with a counting sort; each list sorted
//!   and without duplicates or self-loops.
//!
//! # Invariants
//! `offsets.len() == local vertices + 1`, `offsets` ascending, last = `targets.len()`.
//!
//! # Who calls it
//! The load task ([`crate::task`]), the BFS ([`crate::bfs`]), tests.

/// A vertex range partition (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Vertices of the whole graph.
    pub vertices: u64,
    /// Parts.
    pub parts: usize,
    /// Vertices per part (the last may have fewer).
    pub width: u64,
}

impl Partition {
    /// `vertices` split over `parts` parts; the width is rounded up to a multiple of 64
    /// so that each part's bitmaps are whole words of the global bitmap.
    pub fn new(vertices: u64, parts: usize) -> Partition {
        let parts = parts.max(1);
        Partition {
            vertices,
            parts,
            width: vertices.div_ceil(parts as u64).max(1).div_ceil(64) * 64,
        }
    }

    /// The part owning vertex `v` (below `vertices`).
    #[inline]
    pub fn owner(&self, v: u32) -> usize {
        (u64::from(v) / self.width) as usize
    }

    /// The first vertex of part `part`.
    pub fn first(&self, part: usize) -> u64 {
        (part as u64 * self.width).min(self.vertices)
    }

    /// The vertices of part `part`.
    pub fn count(&self, part: usize) -> u64 {
        self.first(part + 1) - self.first(part)
    }
}

/// One part's adjacency (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adjacency {
    /// Where each local vertex's neighbours start in `targets` (one more than vertices).
    pub offsets: Vec<u64>,
    /// The neighbours, global IDs.
    pub targets: Vec<u32>,
}

impl Adjacency {
    /// Builds the adjacency of `vertices` local vertices from `(local source, global
    /// target)` pairs (sources out of range are dropped); self-loops are dropped when
    /// `first` (the part's first vertex) is given for the comparison.
    pub fn from_pairs(vertices: usize, first: u64, pairs: &[(u32, u32)]) -> Adjacency {
        let mut counts = vec![0u64; vertices + 1];
        for &(source, _) in pairs {
            if (source as usize) < vertices {
                counts[source as usize + 1] += 1;
            }
        }
        for i in 0..vertices {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut targets = vec![0u32; counts[vertices] as usize];
        for &(source, target) in pairs {
            if (source as usize) < vertices {
                let slot = &mut fill[source as usize];
                targets[*slot as usize] = target;
                *slot += 1;
            }
        }
        // Sort each list, drop duplicates and self-loops, compact in place.
        let mut offsets = Vec::with_capacity(vertices + 1);
        offsets.push(0u64);
        let mut write = 0usize;
        for v in 0..vertices {
            let (start, end) = (counts[v] as usize, counts[v + 1] as usize);
            targets[start..end].sort_unstable();
            let me = first + v as u64;
            let mut last: Option<u32> = None;
            for read in start..end {
                let target = targets[read];
                if Some(target) != last && u64::from(target) != me {
                    targets[write] = target;
                    write += 1;
                }
                last = Some(target);
            }
            offsets.push(write as u64);
        }
        targets.truncate(write);
        targets.shrink_to_fit();
        Adjacency { offsets, targets }
    }

    /// Local vertices.
    pub fn vertices(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The neighbours of local vertex `v`.
    #[inline]
    pub fn neighbours(&self, v: usize) -> &[u32] {
        &self.targets[self.offsets[v] as usize..self.offsets[v + 1] as usize]
    }

    /// The degree of local vertex `v`.
    #[inline]
    pub fn degree(&self, v: usize) -> u64 {
        self.offsets[v + 1] - self.offsets[v]
    }

    /// Bytes of the two arrays.
    pub fn bytes(&self) -> u64 {
        (self.offsets.len() * 8 + self.targets.len() * 4) as u64
    }
}

/// The directed pairs of `edges` (both directions) whose source `part` owns, as
/// `(local source, global target)`: the single-process way to build a part's adjacency.
pub fn local_pairs(partition: &Partition, part: usize, edges: &[crate::Edge]) -> Vec<(u32, u32)> {
    let first = partition.first(part);
    let mut pairs = Vec::new();
    for &(u, v) in edges {
        for (s, t) in [(u, v), (v, u)] {
            if partition.owner(s) == part {
                pairs.push(((u64::from(s) - first) as u32, t));
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_every_vertex_once() {
        let partition = Partition::new(300, 3);
        assert_eq!(
            (0..3).map(|p| partition.count(p)).collect::<Vec<_>>(),
            vec![128, 128, 44]
        );
        assert_eq!(partition.owner(299), 2);
        assert_eq!(partition.owner(128), 1);
        assert_eq!(partition.owner(127), 0);
        // More parts than words: the tail parts are empty.
        let small = Partition::new(10, 3);
        assert_eq!((small.count(0), small.count(1), small.count(2)), (10, 0, 0));
    }

    #[test]
    fn adjacency_is_sorted_without_duplicates_or_loops() {
        let partition = Partition::new(4, 1);
        let edges = [(0, 1), (1, 0), (2, 2), (3, 1), (0, 3)];
        let adjacency = Adjacency::from_pairs(4, 0, &local_pairs(&partition, 0, &edges));
        assert_eq!(adjacency.neighbours(0), &[1, 3]);
        assert_eq!(adjacency.neighbours(1), &[0, 3]);
        assert!(adjacency.neighbours(2).is_empty());
        assert_eq!(adjacency.neighbours(3), &[0, 1]);
    }
}

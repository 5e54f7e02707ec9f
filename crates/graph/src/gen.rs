//! The Graph500 Kronecker (R-MAT) edge generator, deterministic from a seed and
//! splittable: any process generates any range of the edge list without the rest.
//!
//! # Job
//! [`Kronecker`] describes a graph (`scale`, `edgefactor`, seed, initiator A/B/C with
//! D = 1 − A − B − C); [`Kronecker::edges`] yields the edges at positions `start..end` of
//! the final (permuted and shuffled) edge list, so each slave of a compute group generates
//! its own share and nobody holds the whole list.
//!
//! # How an edge is made (the Graph500 specification's recipe)
//! 1. Edge number `k` gets its own random stream (SplitMix64 of the seed and `k`): a
//!    counter-based generator, so the edge does not depend on who generates it.
//! 2. For each of the `scale` bits, one quadrant of the adjacency matrix is chosen with
//!    probabilities A, B, C, D (A: neither endpoint's bit set, B: the second's, C: the
//!    first's, D: both).
//! 3. **Vertex permutation**: both endpoints are renamed by a random permutation of
//!    `0..2^scale` (Fisher–Yates from the seed; every process builds the same one, 4 bytes
//!    per vertex), so vertex IDs carry no locality or degree information.
//! 4. **Edge shuffle**: position `i` of the output list holds generated edge
//!    `k = (a·i + b) mod M` with `a` odd and coprime to `M`: a bijection, so the list is a
//!    permutation of the generated edges in an order unrelated to how they were made.
//!
//! # Invariants
//! - The same parameters give the same edges at the same positions, on every machine.
//! - Exactly `edgefactor · 2^scale` edges; every endpoint is below `2^scale`. Self-loops and
//!   duplicates occur, as in the specification.
//!
//! # Who calls it
//! The load task ([`crate::task`]), tests, and anyone wanting a Graph500 edge list.

use crate::Edge;

/// The Graph500 initiator probabilities A, B, C (D = 1 − A − B − C = 0.05).
pub const INITIATOR: (f64, f64, f64) = (0.57, 0.19, 0.19);

/// The largest scale this crate accepts (vertex IDs are `u32`).
pub const SCALE_MAX: u32 = 31;

/// One step of SplitMix64: the next value of the stream whose state is `state`.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A Kronecker graph's parameters (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kronecker {
    /// log2 of the vertex count.
    pub scale: u32,
    /// Edges per vertex.
    pub edgefactor: u32,
    /// The seed every random choice derives from.
    pub seed: u64,
    /// Initiator probability A.
    pub a: f64,
    /// Initiator probability B.
    pub b: f64,
    /// Initiator probability C.
    pub c: f64,
}

impl Kronecker {
    /// The Graph500 graph of this scale and edge factor with the standard initiator.
    pub fn new(scale: u32, edgefactor: u32, seed: u64) -> Kronecker {
        let (a, b, c) = INITIATOR;
        Kronecker {
            scale,
            edgefactor,
            seed,
            a,
            b,
            c,
        }
    }

    /// Checks the parameters: scale 1..=31, a positive edge factor, probabilities that
    /// sum to at most 1.
    pub fn check(&self) -> Result<(), String> {
        if self.scale == 0 || self.scale > SCALE_MAX {
            return Err(format!("scale {} is not in 1..={SCALE_MAX}", self.scale));
        }
        if self.edgefactor == 0 {
            return Err("edgefactor must be positive".into());
        }
        let sum = self.a + self.b + self.c;
        if self.a < 0.0 || self.b < 0.0 || self.c < 0.0 || sum > 1.0 {
            return Err(format!(
                "initiator {}/{}/{} is not a distribution",
                self.a, self.b, self.c
            ));
        }
        Ok(())
    }

    /// Vertex count, `2^scale`.
    pub fn vertices(&self) -> u64 {
        1u64 << self.scale
    }

    /// Edge count, `edgefactor · 2^scale`.
    pub fn edge_count(&self) -> u64 {
        self.vertices() * u64::from(self.edgefactor)
    }

    /// The vertex permutation (new name of vertex `v` at index `v`).
    pub fn permutation(&self) -> Vec<u32> {
        let n = self.vertices() as usize;
        let mut perm: Vec<u32> = (0..n as u64).map(|v| v as u32).collect();
        let mut state = self.seed ^ 0x5045_524D_5554_4521;
        for i in (1..n).rev() {
            let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
            perm.swap(i, j);
        }
        perm
    }

    /// The edge shuffle's multiplier and offset (`k = (a·i + b) mod M`).
    fn shuffle(&self) -> (u64, u64) {
        let m = self.edge_count();
        let mut state = self.seed ^ 0x5348_5546_464C_4521;
        let mut a = (splitmix64(&mut state) % m) | 1;
        while gcd(a, m) != 1 {
            a = (a + 2) % m;
        }
        (a, splitmix64(&mut state) % m)
    }

    /// The initiator as cumulative 32-bit thresholds (A, A+B, A+B+C).
    fn thresholds(&self) -> [u64; 3] {
        let scale = |p: f64| (p.clamp(0.0, 1.0) * 4_294_967_296.0) as u64;
        [
            scale(self.a),
            scale(self.a + self.b),
            scale(self.a + self.b + self.c),
        ]
    }

    /// Generated edge number `k`, before the vertex permutation.
    #[inline]
    fn raw_edge(&self, k: u64, [a, ab, abc]: [u64; 3]) -> (u32, u32) {
        let mut state = self.seed ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let (mut u, mut v) = (0u32, 0u32);
        let mut bits = 0u64;
        for level in 0..self.scale {
            // 32 random bits per level (two levels per draw): plenty for probabilities
            // given to two digits.
            if level % 2 == 0 {
                bits = splitmix64(&mut state);
            }
            let r = bits & 0xFFFF_FFFF;
            bits >>= 32;
            // Quadrant A (0, 0), B (0, 1), C (1, 0), D (1, 1), without branches.
            let bu = u32::from(r >= ab);
            let bv = u32::from(r >= a) ^ bu ^ u32::from(r >= abc);
            u |= bu << level;
            v |= bv << level;
        }
        (u, v)
    }

    /// The edges at positions `start..end` of the final list (clamped to the edge count),
    /// with `perm` from [`Kronecker::permutation`].
    pub fn edges<'a>(
        &'a self,
        perm: &'a [u32],
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = Edge> + 'a {
        let m = self.edge_count();
        let (a, b) = self.shuffle();
        let thresholds = self.thresholds();
        // With a power-of-two edge count (edge factor 16) the modulo is a mask.
        let mask = m.is_power_of_two().then(|| m - 1);
        (start.min(m)..end.min(m)).map(move |i| {
            let k = match mask {
                Some(mask) => a.wrapping_mul(i).wrapping_add(b) & mask,
                None => ((u128::from(a) * u128::from(i) + u128::from(b)) % u128::from(m)) as u64,
            };
            let (u, v) = self.raw_edge(k, thresholds);
            (perm[u as usize], perm[v as usize])
        })
    }

    /// The share `part` of `parts` of the edge list: positions `start..end`.
    pub fn share(&self, part: usize, parts: usize) -> (u64, u64) {
        share(self.edge_count(), part, parts)
    }
}

/// Positions `start..end` of part `part` when `count` items are split into `parts` nearly
/// equal ranges.
pub fn share(count: u64, part: usize, parts: usize) -> (u64, u64) {
    let parts = parts.max(1) as u128;
    let count128 = u128::from(count);
    let start = count128 * part as u128 / parts;
    let end = count128 * (part as u128 + 1) / parts;
    (start as u64, end as u64)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_count_range_and_determinism() {
        let graph = Kronecker::new(10, 16, 7);
        let perm = graph.permutation();
        let all: Vec<Edge> = graph.edges(&perm, 0, u64::MAX).collect();
        assert_eq!(all.len() as u64, 16 << 10);
        assert!(all.iter().all(|&(u, v)| u < 1024 && v < 1024));
        let again: Vec<Edge> = graph.edges(&perm, 0, u64::MAX).collect();
        assert_eq!(all, again);
        let other = Kronecker::new(10, 16, 8);
        let other_edges: Vec<Edge> = other.edges(&other.permutation(), 0, u64::MAX).collect();
        assert_ne!(all, other_edges);
        // Shares generated separately concatenate to the whole list.
        let mut pieces = Vec::new();
        for part in 0..3 {
            let (start, end) = graph.share(part, 3);
            pieces.extend(graph.edges(&perm, start, end));
        }
        assert_eq!(pieces, all);
    }

    #[test]
    fn each_level_picks_quadrants_with_the_initiator_probabilities() {
        // Without the vertex permutation, bit `l` of (u, v) is level l's quadrant:
        // u's bit set in C and D (0.24), v's in B and D (0.24), both in D (0.05).
        let graph = Kronecker::new(12, 16, 5);
        let identity: Vec<u32> = (0..1u32 << 12).collect();
        let (mut u_set, mut v_set, mut both, mut total) = (0u64, 0u64, 0u64, 0u64);
        for (u, v) in graph.edges(&identity, 0, u64::MAX) {
            for level in 0..12 {
                let (bu, bv) = ((u >> level) & 1, (v >> level) & 1);
                u_set += u64::from(bu);
                v_set += u64::from(bv);
                both += u64::from(bu & bv);
                total += 1;
            }
        }
        let share = |count: u64| count as f64 / total as f64;
        assert!((share(u_set) - 0.24).abs() < 0.005, "{}", share(u_set));
        assert!((share(v_set) - 0.24).abs() < 0.005, "{}", share(v_set));
        assert!((share(both) - 0.05).abs() < 0.003, "{}", share(both));
    }

    #[test]
    fn the_permutation_is_a_bijection() {
        let graph = Kronecker::new(12, 16, 3);
        let mut perm = graph.permutation();
        perm.sort_unstable();
        assert!(perm.iter().enumerate().all(|(i, &v)| i as u32 == v));
    }

    #[test]
    fn the_degree_distribution_is_skewed() {
        let graph = Kronecker::new(12, 16, 11);
        let perm = graph.permutation();
        let n = graph.vertices() as usize;
        let mut degree = vec![0u64; n];
        for (u, v) in graph.edges(&perm, 0, u64::MAX) {
            degree[u as usize] += 1;
            degree[v as usize] += 1;
        }
        let mean = 2.0 * graph.edge_count() as f64 / n as f64;
        let max = *degree.iter().max().expect("vertices") as f64;
        let isolated = degree.iter().filter(|&&d| d == 0).count();
        // R-MAT with A = 0.57: a few hubs, many isolated vertices, unlike a uniform graph
        // (whose max degree at mean 32 stays below ~70 and has no isolated vertex).
        assert!(max > 20.0 * mean, "max degree {max}, mean {mean}");
        assert!(isolated > n / 10, "{isolated} isolated of {n}");
        // The hubs are spread over the ID space by the permutation: the highest-degree
        // vertex is not vertex 0.
        let hub = degree
            .iter()
            .enumerate()
            .max_by_key(|(_, d)| **d)
            .map(|(v, _)| v);
        assert_ne!(hub, Some(0));
    }
}

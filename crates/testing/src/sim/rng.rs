//! The simulator's only source of randomness: a seeded SplitMix64 generator.
//!
//! Job: every choice of a simulation run (delays, drops, crash times, client operations)
//! is drawn from one [`SimRng`] created from the run's seed, in the order the event loop
//! makes the choices, so a seed replays the same run.
//!
//! Invariants: no other randomness is used by the simulator (no `HashMap` iteration order,
//! no wall clock); the same seed gives the same sequence on every platform.
//!
//! Callers: the simulator's event loop (`sim::world`) and network ([`super::net`]).

/// A SplitMix64 pseudo-random generator (Steele, Lea, Flood 2014): tiny, fast, and good
/// enough for choosing interleavings.
#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        self.next_u64() % bound
    }

    /// A number in `low..=high` (`low` when `high < low`).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low).saturating_add(1))
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }

    /// An index into a slice of `len` elements (`len` must not be 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_sequence() {
        let mut a = SimRng::new(42);
        let mut b = SimRng::new(42);
        let first: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let second: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(first, second);
        assert_ne!(SimRng::new(43).next_u64(), first[0]);
        assert!((0..1000).all(|_| a.between(3, 5) >= 3 && a.between(3, 5) <= 5));
    }
}

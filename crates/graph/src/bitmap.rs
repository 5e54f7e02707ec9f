//! A fixed-size bitmap of atomic 64-bit words: the BFS's frontiers and visited set.
//!
//! # Job
//! One bit per vertex (DXGraph's `BitVector`). [`Bitmap::test_and_set`] is the atomic
//! claim of a vertex (`fetch_or`): exactly one of several threads that try it wins.
//!
//! # Invariants
//! Bits at or above `len` are never set (the constructors and setters keep the last word's
//! tail clear), so word-wise counts and ORs stay exact.
//!
//! # Who calls it
//! The BFS kernels ([`crate::bfs`]) and the validation ([`crate::validate`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// A bitmap of `len` bits (see the module documentation).
#[derive(Debug)]
pub struct Bitmap {
    words: Vec<AtomicU64>,
    len: usize,
}

impl Bitmap {
    /// An all-clear bitmap of `len` bits.
    pub fn new(len: usize) -> Bitmap {
        Bitmap {
            words: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// Bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Words (64 bits each).
    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// Word `index`.
    #[inline]
    pub fn word(&self, index: usize) -> u64 {
        self.words[index].load(Ordering::Relaxed)
    }

    /// ORs `bits` into word `index`.
    #[inline]
    pub fn or_word(&self, index: usize, bits: u64) {
        if bits != 0 {
            self.words[index].fetch_or(bits, Ordering::Relaxed);
        }
    }

    /// Whether bit `bit` is set.
    #[inline]
    pub fn get(&self, bit: usize) -> bool {
        self.words[bit >> 6].load(Ordering::Relaxed) & (1 << (bit & 63)) != 0
    }

    /// Sets bit `bit`.
    #[inline]
    pub fn set(&self, bit: usize) {
        self.words[bit >> 6].fetch_or(1 << (bit & 63), Ordering::Relaxed);
    }

    /// Sets bit `bit`; true if this call changed it (the caller claimed the vertex).
    #[inline]
    pub fn test_and_set(&self, bit: usize) -> bool {
        let mask = 1 << (bit & 63);
        let word = &self.words[bit >> 6];
        word.load(Ordering::Relaxed) & mask == 0
            && word.fetch_or(mask, Ordering::Relaxed) & mask == 0
    }

    /// Clears every bit.
    pub fn clear(&self) {
        for word in &self.words {
            word.store(0, Ordering::Relaxed);
        }
    }

    /// Set bits.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// The words as little-endian bytes (8 per word).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.words.len() * 8);
        for word in &self.words {
            out.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        out
    }

    /// ORs `bytes` (as made by [`Bitmap::to_bytes`]) into the words from word `first` on;
    /// bits past the end are ignored.
    pub fn or_bytes(&self, first: usize, bytes: &[u8]) {
        for (offset, piece) in bytes.chunks_exact(8).enumerate() {
            let index = first + offset;
            if index >= self.words.len() {
                break;
            }
            let mut raw = [0u8; 8];
            raw.copy_from_slice(piece);
            let mut bits = u64::from_le_bytes(raw);
            if index + 1 == self.words.len() && !self.len.is_multiple_of(64) {
                bits &= (1u64 << (self.len % 64)) - 1;
            }
            self.or_word(index, bits);
        }
    }

    /// The set bits, ascending.
    pub fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(index, word)| {
            let mut bits = word.load(Ordering::Relaxed);
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(index * 64 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_counts_and_bytes() {
        let map = Bitmap::new(130);
        assert!(map.test_and_set(129));
        assert!(!map.test_and_set(129));
        map.set(3);
        assert_eq!(map.count(), 2);
        assert_eq!(map.ones().collect::<Vec<_>>(), vec![3, 129]);
        let copy = Bitmap::new(130);
        copy.or_bytes(0, &map.to_bytes());
        assert_eq!(copy.ones().collect::<Vec<_>>(), vec![3, 129]);
        // Bits past the length are dropped.
        let short = Bitmap::new(66);
        short.or_bytes(0, &map.to_bytes());
        assert_eq!(short.ones().collect::<Vec<_>>(), vec![3]);
    }
}

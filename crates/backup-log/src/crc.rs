//! CRC32C of an entry: the header bytes before the checksum field, then the payload.
//!
//! Job: compute the entry checksum in one call from the header while it is still in two
//! registers (see `header::build_header`) and the payload. Small entries dominate the
//! append path's CPU time, so they take a short path: with SSE 4.2 (checked per call,
//! cached by the standard library) the header words and then the payload go through the
//! CRC32C instruction 8 bytes at a time from any alignment, and their last 1–7 bytes as at
//! most one 4-, 2- and 1-byte step each (the `crc32c` crate aligns to 8 bytes first, ends
//! byte by byte, and needs the header in memory and two calls). Larger payloads, and CPUs
//! without SSE 4.2, go to the `crc32c` crate, whose three interleaved streams are faster
//! for large inputs.
//!
//! Callers: the header encoder. Tested against the `crc32c` crate.

/// Payloads up to this size take the short path (the crate interleaves three streams
/// from 3 × 256 bytes on).
const SHORT_PATH_MAX: usize = 3 * 256;

/// CRC32C of `head` followed by `tail` (the same value as `crc32c(head ++ tail)`), with
/// the `crc32c` crate.
#[inline]
fn crc32c_two(head: &[u8], tail: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), tail)
}

/// CRC32C of the first `head_len` (at most 24) bytes of the little-endian words `lo`
/// (bytes 0..16) and `hi` (16..24), followed by `tail`: an entry header still in
/// registers, then its payload.
#[inline]
pub(crate) fn crc32c_words(lo: u128, hi: u64, head_len: usize, tail: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if tail.len() < SHORT_PATH_MAX && std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: `x86::crc32c_words` needs only SSE 4.2 (its `target_feature`), which
            // this CPU has: checked on the line above. It reads only through the slice.
            return unsafe { x86::crc32c_words(lo, hi, head_len, tail) };
        }
    }
    let mut head = [0u8; 24];
    head[..16].copy_from_slice(&lo.to_le_bytes());
    head[16..].copy_from_slice(&hi.to_le_bytes());
    crc32c_two(&head[..head_len.min(24)], tail)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

    /// Folds `bytes` into `crc` (the inverted running value): whole 8-byte words, then
    /// the rest as at most one 4-, one 2- and one 1-byte step.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    fn fold(crc: u32, bytes: &[u8]) -> u32 {
        let mut c = u64::from(crc);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            c = _mm_crc32_u64(c, u64::from_le_bytes(word));
        }
        // `_mm_crc32_u64` leaves the upper 32 bits zero.
        let mut c = c as u32;
        let mut rest = words.remainder();
        if rest.len() >= 4 {
            let mut word = [0u8; 4];
            word.copy_from_slice(&rest[..4]);
            c = _mm_crc32_u32(c, u32::from_le_bytes(word));
            rest = &rest[4..];
        }
        if rest.len() >= 2 {
            c = _mm_crc32_u16(c, u16::from_le_bytes([rest[0], rest[1]]));
            rest = &rest[2..];
        }
        if let Some(&b) = rest.first() {
            c = _mm_crc32_u8(c, b);
        }
        c
    }

    /// Folds the low `n` (below 8) bytes of `word` into `crc`: one 4-, 2- and 1-byte step
    /// at most.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    fn fold_partial(mut crc: u32, mut word: u64, n: usize) -> u32 {
        if n & 4 != 0 {
            crc = _mm_crc32_u32(crc, word as u32);
            word >>= 32;
        }
        if n & 2 != 0 {
            crc = _mm_crc32_u16(crc, word as u16);
            word >>= 16;
        }
        if n & 1 != 0 {
            crc = _mm_crc32_u8(crc, word as u8);
        }
        crc
    }

    /// See [`super::crc32c_words`].
    #[target_feature(enable = "sse4.2")]
    pub(super) fn crc32c_words(lo: u128, hi: u64, head_len: usize, tail: &[u8]) -> u32 {
        let words = [lo as u64, (lo >> 64) as u64, hi];
        let n = head_len.min(24);
        let mut c = u64::from(u32::MAX);
        for &w in &words[..n / 8] {
            c = _mm_crc32_u64(c, w);
        }
        let mut c = c as u32;
        if let Some(&w) = words.get(n / 8) {
            c = fold_partial(c, w, n % 8);
        }
        !fold(c, tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The first `head.len()` (at most 24) bytes as the two little-endian words.
    fn words(head: &[u8]) -> (u128, u64) {
        let mut raw = [0u8; 24];
        raw[..head.len()].copy_from_slice(head);
        let mut lo = [0u8; 16];
        lo.copy_from_slice(&raw[..16]);
        let mut hi = [0u8; 8];
        hi.copy_from_slice(&raw[16..]);
        (u128::from_le_bytes(lo), u64::from_le_bytes(hi))
    }

    proptest! {
        /// Any words (bytes past `head_len` ignored) and any tail, from any alignment.
        #[test]
        fn words_equal_the_checksum_of_their_bytes_then_the_tail(
            lo in any::<u128>(),
            hi in any::<u64>(),
            head_len in 0usize..=24,
            tail in proptest::collection::vec(any::<u8>(), 0..1000),
            skip in 0usize..8,
        ) {
            // `skip` moves the tail's start off any alignment the allocator gave it.
            let tail = tail.get(skip..).unwrap_or(&[]);
            let mut all = lo.to_le_bytes().to_vec();
            all.extend_from_slice(&hi.to_le_bytes());
            all.truncate(head_len);
            all.extend_from_slice(tail);
            prop_assert_eq!(crc32c_words(lo, hi, head_len, tail), crc32c::crc32c(&all));
        }
    }

    #[test]
    fn every_length_around_the_short_path_limit_and_known_value() {
        let data: Vec<u8> = (0..2 * SHORT_PATH_MAX).map(|i| (i * 7 + 3) as u8).collect();
        for head in 0..=24 {
            let (lo, hi) = words(&data[..head]);
            for len in (0..40).chain(SHORT_PATH_MAX - 9..SHORT_PATH_MAX + 9) {
                let tail = &data[head..head + len];
                let expected = crc32c::crc32c(&data[..head + len]);
                assert_eq!(crc32c_words(lo, hi, head, tail), expected);
                assert_eq!(crc32c_two(&data[..head], tail), expected);
            }
        }
        // The standard check value of CRC-32C.
        let (lo, hi) = words(b"1234");
        assert_eq!(crc32c_words(lo, hi, 4, b"56789"), 0xE306_9283);
    }
}

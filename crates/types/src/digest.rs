//! A fingerprint of many encodings, for the format-identity tests of every layer.
//!
//! A test encodes a fixed, seeded sample of values, folds each encoding into an
//! [`EncodingDigest`] and compares the result with one recorded when the format was last
//! meant to change; any changed byte of any encoding changes the digest. Not a checksum of
//! data at rest (that is CRC32C, in the log engine) and not for hostile input.

/// FNV-1a over each encoding's length (8 bytes, little-endian) and bytes, with counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodingDigest {
    /// Encodings folded in.
    pub encodings: usize,
    /// Their bytes in total.
    pub bytes: usize,
    /// The FNV-1a state.
    pub fnv: u64,
}

impl EncodingDigest {
    /// FNV-1a's 64-bit offset basis.
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    /// FNV-1a's 64-bit prime.
    const PRIME: u64 = 0x0100_0000_01b3;

    /// The digest of no encodings.
    pub fn new() -> EncodingDigest {
        EncodingDigest {
            encodings: 0,
            bytes: 0,
            fnv: Self::OFFSET_BASIS,
        }
    }

    /// Folds in one encoding (its length first, so boundaries between encodings count).
    pub fn add(&mut self, encoding: &[u8]) {
        self.encodings += 1;
        self.bytes += encoding.len();
        for &byte in (encoding.len() as u64).to_le_bytes().iter().chain(encoding) {
            self.fnv = (self.fnv ^ u64::from(byte)).wrapping_mul(Self::PRIME);
        }
    }
}

impl Default for EncodingDigest {
    fn default() -> EncodingDigest {
        EncodingDigest::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_or_boundary_changes_the_digest() {
        let digest = |parts: &[&[u8]]| {
            let mut digest = EncodingDigest::new();
            parts.iter().for_each(|part| digest.add(part));
            digest
        };
        let base = digest(&[b"ab", b"c"]);
        assert_eq!(base, digest(&[b"ab", b"c"]));
        assert_ne!(base.fnv, digest(&[b"ab", b"d"]).fnv);
        assert_ne!(base.fnv, digest(&[b"a", b"bc"]).fnv);
        assert_eq!((base.encodings, base.bytes), (2, 3));
    }
}

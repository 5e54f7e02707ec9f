//! Explicit binary encoding of metadata commands, responses and snapshots.
//!
//! Integers are LEB128 varints (unsigned) unless a fixed width is named; byte strings and
//! strings are a varint length followed by the bytes. The [`Reader`] checks every length
//! against the bytes that remain before it allocates, so a hostile length can never make it
//! allocate more than the input holds.

use thiserror::Error;

/// Why a byte string could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("input truncated while reading {0}")]
    Truncated(&'static str),
    /// A varint ran over 10 bytes, over the width of its type, or was overlong.
    #[error("varint too long or out of range for {0}")]
    VarintOverflow(&'static str),
    /// A tag or enum discriminant has no meaning.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which field held the tag.
        what: &'static str,
        /// The value found.
        tag: u64,
    },
    /// A string was not UTF-8.
    #[error("invalid UTF-8 in {0}")]
    InvalidUtf8(&'static str),
    /// A length or count exceeds its limit.
    #[error("{what} of {value} exceeds the limit {max}")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// Bytes were left after the last field.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// The content is well-formed but violates an invariant (e.g. overlapping ranges).
    #[error("invalid content: {0}")]
    Invalid(&'static str),
}

/// Appends encoded fields to a byte vector.
#[derive(Debug, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// The bytes written so far.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// One byte.
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    /// An unsigned LEB128 varint.
    pub fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }

    /// A fixed-width little-endian u64.
    pub fn u64_le(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// A length-prefixed byte string.
    pub fn bytes(&mut self, value: &[u8]) {
        self.varint(value.len() as u64);
        self.bytes.extend_from_slice(value);
    }

    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, value: &str) {
        self.bytes(value.as_bytes());
    }

    /// `false` as 0, `true` as 1.
    pub fn bool(&mut self, value: bool) {
        self.u8(u8::from(value));
    }
}

/// Reads encoded fields from a byte slice, bounds-checked.
#[derive(Debug)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.rest.len()))
        }
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        let (&first, rest) = self
            .rest
            .split_first()
            .ok_or(DecodeError::Truncated(what))?;
        self.rest = rest;
        Ok(first)
    }

    /// A boolean stored as 0 or 1.
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::UnknownTag {
                what,
                tag: u64::from(tag),
            }),
        }
    }

    /// An unsigned LEB128 varint of at most 64 bits.
    pub fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for index in 0..10 {
            let byte = self.u8(what)?;
            let bits = u64::from(byte & 0x7f);
            if index == 9 && bits > 1 {
                return Err(DecodeError::VarintOverflow(what));
            }
            value |= bits << (7 * index);
            if byte & 0x80 == 0 {
                // One encoding per value: a last byte of zero after the first is overlong.
                if byte == 0 && index > 0 {
                    return Err(DecodeError::VarintOverflow(what));
                }
                return Ok(value);
            }
        }
        Err(DecodeError::VarintOverflow(what))
    }

    /// A varint that must fit `max`.
    pub fn varint_max(&mut self, what: &'static str, max: u64) -> Result<u64, DecodeError> {
        let value = self.varint(what)?;
        if value > max {
            return Err(DecodeError::TooLarge { what, value, max });
        }
        Ok(value)
    }

    /// A varint that must fit 16 bits.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let value = self.varint(what)?;
        u16::try_from(value).map_err(|_| DecodeError::VarintOverflow(what))
    }

    /// A varint that must fit 32 bits.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let value = self.varint(what)?;
        u32::try_from(value).map_err(|_| DecodeError::VarintOverflow(what))
    }

    /// A fixed-width little-endian u64.
    pub fn u64_le(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let raw = self.take(8, what)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(raw);
        Ok(u64::from_le_bytes(array))
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], DecodeError> {
        let length = self.varint_max(what, max as u64)? as usize;
        self.take(length, what)
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes.
    pub fn str(&mut self, what: &'static str, max: usize) -> Result<&'a str, DecodeError> {
        let raw = self.bytes(what, max)?;
        std::str::from_utf8(raw).map_err(|_| DecodeError::InvalidUtf8(what))
    }

    /// A count of items that each take at least `min_item_bytes` bytes, checked against the
    /// remaining input (so a count can never allocate beyond the input) and `max`.
    pub fn count(
        &mut self,
        what: &'static str,
        min_item_bytes: usize,
        max: usize,
    ) -> Result<usize, DecodeError> {
        let count = self.varint_max(what, max as u64)? as usize;
        if count.saturating_mul(min_item_bytes.max(1)) > self.rest.len() {
            return Err(DecodeError::Truncated(what));
        }
        Ok(count)
    }

    fn take(&mut self, length: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if length > self.rest.len() {
            return Err(DecodeError::Truncated(what));
        }
        let (head, rest) = self.rest.split_at(length);
        self.rest = rest;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trips_edges() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut writer = Writer::new();
            writer.varint(value);
            let bytes = writer.into_bytes();
            let mut reader = Reader::new(&bytes);
            assert_eq!(reader.varint("v"), Ok(value));
            reader.finish().unwrap();
        }
    }

    #[test]
    fn varint_rejects_overlong_and_truncated() {
        let overlong = [0xffu8; 11];
        assert_eq!(
            Reader::new(&overlong).varint("v"),
            Err(DecodeError::VarintOverflow("v"))
        );
        let too_wide = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(
            Reader::new(&too_wide).varint("v"),
            Err(DecodeError::VarintOverflow("v"))
        );
        assert_eq!(
            Reader::new(&[0x80]).varint("v"),
            Err(DecodeError::Truncated("v"))
        );
        assert_eq!(
            Reader::new(&[0x80, 0x00]).varint("v"),
            Err(DecodeError::VarintOverflow("v")),
            "an overlong zero has a second encoding"
        );
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        let mut writer = Writer::new();
        writer.varint(u64::MAX >> 1);
        let bytes = writer.into_bytes();
        assert!(Reader::new(&bytes).bytes("b", 1 << 20).is_err());
        assert!(Reader::new(&bytes).count("c", 1, usize::MAX).is_err());
        let mut writer = Writer::new();
        writer.varint(5);
        writer.u8(1);
        let bytes = writer.into_bytes();
        assert_eq!(
            Reader::new(&bytes).bytes("b", 100),
            Err(DecodeError::Truncated("b"))
        );
    }
}

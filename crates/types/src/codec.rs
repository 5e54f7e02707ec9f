//! The one byte codec of Myriad's wire and disk formats: compact varints, fixed-width
//! little-endian integers and length-prefixed byte strings. No serde format: every layer
//! writes its messages and records field by field with [`Encoder`] and reads them back with
//! [`Decoder`]; the byte layout is documented in `docs/wire-format.md` ("Payload encoders").
//!
//! Invariants:
//! - Varints are LEB128 (7 bits per byte, low bits first, high bit = "more"); the decoder
//!   accepts only the minimal encoding of a value (no trailing zero groups) and at most
//!   [`VARINT_BYTES_MAX`] bytes, so every value has exactly one encoding. Signed varints are
//!   zigzag-mapped first (0, -1, 1, -2, … → 0, 1, 2, 3, …).
//! - Two encodings of small integers exist and are named apart: `put_u16_le`/`get_u16_le`
//!   (and `u32`, `u64`, `i64`) are fixed-width little-endian; `get_varint_u16`/
//!   `get_varint_u32` read a varint and check that it fits the type.
//! - Every `get_*` of [`Decoder`] checks the bytes left before it reads or slices; a length
//!   or count read from the input is checked against the caller's limit and the bytes
//!   actually present before anything is allocated, so hostile input costs at most its own
//!   size. No input makes a decoder panic.
//! - Every error names the field it was reading (the `what` argument), e.g. "input
//!   truncated while reading address".
//! - A [`Decoder`] over a [`Bytes`] payload hands out slices that share the payload's
//!   buffer ([`Decoder::get_bytes`], [`Decoder::get_raw`]): no copy on the chunk paths.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

/// Longest LEB128 encoding of a `u64`: 10 bytes (9 × 7 bits + 1 bit).
pub const VARINT_BYTES_MAX: usize = 10;

/// Why bytes could not be decoded. Each variant names the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The input ended inside a field, or a count promises more items than the bytes left
    /// can hold.
    #[error("input truncated while reading {0}")]
    Truncated(&'static str),
    /// A varint ran over 10 bytes, over 64 bits, or over the width of its type.
    #[error("varint too long or out of range for {0}")]
    VarintOverflow(&'static str),
    /// A varint has a trailing zero group (not the minimal encoding of its value).
    #[error("varint for {0} is not minimally encoded")]
    VarintNotMinimal(&'static str),
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
    /// A value, length or count exceeds its limit.
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
    #[error("{extra_bytes} trailing bytes after the last field")]
    TrailingBytes {
        /// How many.
        extra_bytes: usize,
    },
    /// The content is well-formed but violates an invariant (e.g. overlapping ranges).
    #[error("invalid content: {0}")]
    Invalid(&'static str),
}

/// Writes fields one after the other into a growable buffer.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: BytesMut,
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty encoder with room for `capacity_bytes` bytes.
    pub fn with_capacity(capacity_bytes: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(capacity_bytes),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// One byte.
    pub fn put_u8(&mut self, value: u8) -> &mut Self {
        self.buf.put_u8(value);
        self
    }

    /// `false` as the byte 0, `true` as 1.
    pub fn put_bool(&mut self, value: bool) -> &mut Self {
        self.put_u8(u8::from(value))
    }

    /// A `u16`, 2 bytes little-endian.
    pub fn put_u16_le(&mut self, value: u16) -> &mut Self {
        self.buf.put_u16_le(value);
        self
    }

    /// A `u32`, 4 bytes little-endian.
    pub fn put_u32_le(&mut self, value: u32) -> &mut Self {
        self.buf.put_u32_le(value);
        self
    }

    /// A `u64`, 8 bytes little-endian.
    pub fn put_u64_le(&mut self, value: u64) -> &mut Self {
        self.buf.put_u64_le(value);
        self
    }

    /// An `i64`, 8 bytes little-endian two's complement.
    pub fn put_i64_le(&mut self, value: i64) -> &mut Self {
        self.buf.put_i64_le(value);
        self
    }

    /// A `u64` as a LEB128 varint (1 byte below 128, at most [`VARINT_BYTES_MAX`]).
    pub fn put_varint(&mut self, mut value: u64) -> &mut Self {
        while value >= 0x80 {
            self.buf.put_u8((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        self.buf.put_u8(value as u8);
        self
    }

    /// An `i64` as a zigzag-mapped varint (small magnitudes of either sign are short).
    pub fn put_varint_signed(&mut self, value: i64) -> &mut Self {
        self.put_varint(((value << 1) ^ (value >> 63)) as u64)
    }

    /// A byte string prefixed by its length as a varint.
    pub fn put_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.put_varint(bytes.len() as u64);
        self.buf.put_slice(bytes);
        self
    }

    /// A UTF-8 string, encoded like [`Encoder::put_bytes`].
    pub fn put_str(&mut self, text: &str) -> &mut Self {
        self.put_bytes(text.as_bytes())
    }

    /// Raw bytes with no length prefix (the reader must know the length).
    pub fn put_raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.put_slice(bytes);
        self
    }

    /// The encoding, ready to send without another copy.
    pub fn finish(self) -> Bytes {
        self.buf.freeze()
    }

    /// The encoding as a vector (for records kept or written as `Vec<u8>`; no copy).
    pub fn into_vec(self) -> Vec<u8> {
        self.buf.into()
    }
}

/// What a [`Decoder`] reads: a shared payload or a borrowed slice.
#[derive(Debug, Clone)]
enum Input<'a> {
    Shared(Bytes),
    Borrowed(&'a [u8]),
}

/// Reads fields one after the other, checking every length against the bytes present.
///
/// Built over a [`Bytes`] payload ([`Decoder::new`]), it hands out byte strings that share
/// the payload's buffer; built over a borrowed slice ([`Decoder::from_slice`]), it reads in
/// place and copies only what [`Decoder::get_bytes`] or [`Decoder::get_raw`] return.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    input: Input<'a>,
    position: usize,
}

impl Decoder<'static> {
    /// A decoder over `payload`; byte strings it returns share the payload's buffer.
    pub fn new(payload: Bytes) -> Self {
        Self {
            input: Input::Shared(payload),
            position: 0,
        }
    }
}

impl<'a> Decoder<'a> {
    /// A decoder over borrowed bytes (no copy of the input).
    pub fn from_slice(input: &'a [u8]) -> Self {
        Self {
            input: Input::Borrowed(input),
            position: 0,
        }
    }

    fn all(&self) -> &[u8] {
        match &self.input {
            Input::Shared(bytes) => bytes,
            Input::Borrowed(slice) => slice,
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.all().len().saturating_sub(self.position)
    }

    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra_bytes => Err(DecodeError::TrailingBytes { extra_bytes }),
        }
    }

    /// Advances over `count` bytes and returns their range in the input.
    fn take(&mut self, count: usize, what: &'static str) -> Result<Range<usize>, DecodeError> {
        if count > self.remaining() {
            return Err(DecodeError::Truncated(what));
        }
        let start = self.position;
        self.position += count;
        Ok(start..self.position)
    }

    fn take_slice(&mut self, count: usize, what: &'static str) -> Result<&[u8], DecodeError> {
        let range = self.take(count, what)?;
        self.all().get(range).ok_or(DecodeError::Truncated(what))
    }

    fn take_array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let slice = self.take_slice(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    /// `count` bytes as a [`Bytes`]: shared with the payload, or copied from a borrowed
    /// input.
    fn take_bytes(&mut self, count: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        let range = self.take(count, what)?;
        match &self.input {
            Input::Shared(bytes) => Ok(bytes.slice(range)),
            Input::Borrowed(slice) => slice
                .get(range)
                .map(Bytes::copy_from_slice)
                .ok_or(DecodeError::Truncated(what)),
        }
    }

    /// One byte.
    pub fn get_u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        let byte = *self
            .all()
            .get(self.position)
            .ok_or(DecodeError::Truncated(what))?;
        self.position += 1;
        Ok(byte)
    }

    /// A boolean written by [`Encoder::put_bool`]: 0 or 1, anything else is refused.
    pub fn get_bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.get_u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::UnknownTag {
                what,
                tag: u64::from(tag),
            }),
        }
    }

    /// A `u16`, 2 bytes little-endian.
    pub fn get_u16_le(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take_array(what)?))
    }

    /// A `u32`, 4 bytes little-endian.
    pub fn get_u32_le(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take_array(what)?))
    }

    /// A `u64`, 8 bytes little-endian.
    pub fn get_u64_le(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take_array(what)?))
    }

    /// An `i64`, 8 bytes little-endian two's complement.
    pub fn get_i64_le(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take_array(what)?))
    }

    /// A LEB128 varint written by [`Encoder::put_varint`]; refuses encodings longer than
    /// [`VARINT_BYTES_MAX`], beyond 64 bits, or not minimal.
    pub fn get_varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for index in 0..VARINT_BYTES_MAX {
            let byte = self.get_u8(what)?;
            if index == VARINT_BYTES_MAX - 1 && byte > 1 {
                return Err(DecodeError::VarintOverflow(what));
            }
            value |= u64::from(byte & 0x7f) << (7 * index);
            if byte & 0x80 == 0 {
                // One encoding per value: a last byte of zero after the first is overlong.
                if byte == 0 && index > 0 {
                    return Err(DecodeError::VarintNotMinimal(what));
                }
                return Ok(value);
            }
        }
        Err(DecodeError::VarintOverflow(what))
    }

    /// A varint that must not exceed `max` ([`DecodeError::TooLarge`] otherwise).
    pub fn get_varint_max(&mut self, what: &'static str, max: u64) -> Result<u64, DecodeError> {
        let value = self.get_varint(what)?;
        if value > max {
            return Err(DecodeError::TooLarge { what, value, max });
        }
        Ok(value)
    }

    /// A varint that must fit 16 bits (not the fixed-width [`Decoder::get_u16_le`]).
    pub fn get_varint_u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let value = self.get_varint(what)?;
        u16::try_from(value).map_err(|_| DecodeError::VarintOverflow(what))
    }

    /// A varint that must fit 32 bits (not the fixed-width [`Decoder::get_u32_le`]).
    pub fn get_varint_u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let value = self.get_varint(what)?;
        u32::try_from(value).map_err(|_| DecodeError::VarintOverflow(what))
    }

    /// A zigzag varint written by [`Encoder::put_varint_signed`].
    pub fn get_varint_signed(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        let raw = self.get_varint(what)?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// A count (varint) of items that each take at least `min_item_bytes` bytes: at most
    /// `max`, and refused as truncated when the bytes left cannot hold that many items, so
    /// the caller may allocate `count` slots without trusting the input.
    pub fn get_count(
        &mut self,
        what: &'static str,
        min_item_bytes: usize,
        max: usize,
    ) -> Result<usize, DecodeError> {
        let value = self.get_varint_max(what, max as u64)?;
        let count = usize::try_from(value).map_err(|_| DecodeError::TooLarge {
            what,
            value,
            max: max as u64,
        })?;
        if count.saturating_mul(min_item_bytes.max(1)) > self.remaining() {
            return Err(DecodeError::Truncated(what));
        }
        Ok(count)
    }

    /// A length-prefixed byte string of at most `max` bytes, read in place (the limit is
    /// checked before the bytes are looked at).
    pub fn get_slice(&mut self, what: &'static str, max: usize) -> Result<&[u8], DecodeError> {
        let length = self.get_varint_max(what, max as u64)?;
        let length = usize::try_from(length).map_err(|_| DecodeError::Truncated(what))?;
        self.take_slice(length, what)
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes, read in place.
    pub fn get_str(&mut self, what: &'static str, max: usize) -> Result<&str, DecodeError> {
        let raw = self.get_slice(what, max)?;
        std::str::from_utf8(raw).map_err(|_| DecodeError::InvalidUtf8(what))
    }

    /// A length-prefixed byte string, bounded only by the input. Over a [`Bytes`] payload
    /// it shares the payload's buffer (no copy); over a borrowed slice it is copied.
    pub fn get_bytes(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let declared = self.get_varint(what)?;
        let length = usize::try_from(declared).map_err(|_| DecodeError::Truncated(what))?;
        self.take_bytes(length, what)
    }

    /// `count` raw bytes (no length prefix), shared or copied like [`Decoder::get_bytes`].
    pub fn get_raw(&mut self, what: &'static str, count: usize) -> Result<Bytes, DecodeError> {
        self.take_bytes(count, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            let mut encoder = Encoder::new();
            encoder.put_varint(value);
            let bytes = encoder.into_vec();
            let mut decoder = Decoder::from_slice(&bytes);
            assert_eq!(decoder.get_varint("v"), Ok(value));
            decoder.finish().unwrap();
        }
    }

    #[test]
    fn varint_lengths_match_the_documented_sizes() {
        for (value, bytes) in [
            (0u64, 1usize),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::MAX, VARINT_BYTES_MAX),
        ] {
            let mut encoder = Encoder::new();
            encoder.put_varint(value);
            assert_eq!(encoder.len(), bytes, "value {value}");
        }
    }

    #[test]
    fn varint_rejects_overlong_non_minimal_and_truncated_input() {
        for decode in [
            |bytes: &'static [u8]| Decoder::new(Bytes::from_static(bytes)).get_varint("v"),
            |bytes: &'static [u8]| Decoder::from_slice(bytes).get_varint("v"),
        ] {
            assert_eq!(decode(&[0xff; 11]), Err(DecodeError::VarintOverflow("v")));
            let tenth_too_big = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
            assert_eq!(decode(tenth_too_big), Err(DecodeError::VarintOverflow("v")));
            assert_eq!(decode(&[0x80]), Err(DecodeError::Truncated("v")));
            assert_eq!(decode(&[]), Err(DecodeError::Truncated("v")));
            assert_eq!(
                decode(&[0x80, 0x00]),
                Err(DecodeError::VarintNotMinimal("v")),
                "an overlong zero has a second encoding"
            );
            assert_eq!(
                decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]),
                Err(DecodeError::VarintNotMinimal("v"))
            );
            assert_eq!(
                decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
                Ok(u64::MAX)
            );
        }
    }

    #[test]
    fn varints_of_narrow_types_are_range_checked() {
        let mut encoder = Encoder::new();
        encoder
            .put_varint(u64::from(u16::MAX))
            .put_varint(u64::from(u16::MAX) + 1)
            .put_varint(u64::from(u32::MAX))
            .put_varint(u64::from(u32::MAX) + 1)
            .put_varint(9)
            .put_varint(10);
        let mut decoder = Decoder::new(encoder.finish());
        assert_eq!(decoder.get_varint_u16("a"), Ok(u16::MAX));
        assert_eq!(
            decoder.get_varint_u16("b"),
            Err(DecodeError::VarintOverflow("b"))
        );
        assert_eq!(decoder.get_varint_u32("c"), Ok(u32::MAX));
        assert_eq!(
            decoder.get_varint_u32("d"),
            Err(DecodeError::VarintOverflow("d"))
        );
        assert_eq!(decoder.get_varint_max("e", 9), Ok(9));
        assert_eq!(
            decoder.get_varint_max("f", 9),
            Err(DecodeError::TooLarge {
                what: "f",
                value: 10,
                max: 9
            })
        );
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        let mut encoder = Encoder::new();
        encoder.put_varint(u64::MAX >> 1);
        let bytes = encoder.into_vec();
        assert!(Decoder::from_slice(&bytes).get_slice("b", 1 << 20).is_err());
        assert!(Decoder::from_slice(&bytes)
            .get_count("c", 1, usize::MAX)
            .is_err());
        assert_eq!(
            Decoder::from_slice(&bytes).get_bytes("b"),
            Err(DecodeError::Truncated("b"))
        );
        let mut encoder = Encoder::new();
        encoder.put_varint(5).put_u8(1);
        let bytes = encoder.into_vec();
        assert_eq!(
            Decoder::from_slice(&bytes).get_slice("b", 100),
            Err(DecodeError::Truncated("b"))
        );
        assert_eq!(
            Decoder::from_slice(&bytes).get_slice("b", 4),
            Err(DecodeError::TooLarge {
                what: "b",
                value: 5,
                max: 4
            })
        );
        // Five items of at least one byte each need five bytes; one is left.
        assert_eq!(
            Decoder::from_slice(&bytes).get_count("c", 1, 10),
            Err(DecodeError::Truncated("c"))
        );
        // An item size of 0 counts as 1: a count never exceeds the bytes left.
        assert_eq!(
            Decoder::from_slice(&bytes).get_count("c", 0, 10),
            Err(DecodeError::Truncated("c"))
        );
        assert_eq!(Decoder::from_slice(&[1, 9]).get_count("c", 1, 10), Ok(1));
    }

    #[test]
    fn length_prefix_larger_than_input_is_truncated_not_allocated() {
        let mut encoder = Encoder::new();
        encoder.put_varint(u64::MAX);
        let mut decoder = Decoder::new(encoder.finish());
        assert_eq!(
            decoder.get_bytes("payload"),
            Err(DecodeError::Truncated("payload"))
        );
    }

    #[test]
    fn fixed_width_integers_are_little_endian() {
        let mut encoder = Encoder::new();
        encoder.put_u32_le(0x0403_0201).put_u16_le(0x0605);
        assert_eq!(&encoder.finish()[..], &[1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn errors_name_the_field() {
        let mut decoder = Decoder::from_slice(&[2, 7]);
        assert_eq!(
            decoder.get_bool("released"),
            Err(DecodeError::UnknownTag {
                what: "released",
                tag: 2
            })
        );
        assert_eq!(
            decoder.get_u16_le("rack").unwrap_err().to_string(),
            "input truncated while reading rack"
        );
        let decoder = Decoder::from_slice(&[1, 2, 3]);
        assert_eq!(
            decoder.finish(),
            Err(DecodeError::TrailingBytes { extra_bytes: 3 })
        );
        assert_eq!(
            Decoder::from_slice(&[1, 0xff]).get_str("name", 10),
            Err(DecodeError::InvalidUtf8("name"))
        );
    }

    #[test]
    fn shared_payloads_are_sliced_not_copied() {
        let mut encoder = Encoder::new();
        encoder.put_bytes(b"payload").put_raw(b"tail");
        let payload = encoder.finish();
        let mut decoder = Decoder::new(payload.clone());
        let bytes = decoder.get_bytes("data").unwrap();
        let tail = decoder.get_raw("tail", 4).unwrap();
        decoder.finish().unwrap();
        assert_eq!(&bytes[..], b"payload");
        assert_eq!(&tail[..], b"tail");
        let range = payload.as_ptr_range();
        assert!(
            range.contains(&bytes.as_ptr()),
            "the slice shares the buffer"
        );
        assert!(
            range.contains(&tail.as_ptr()),
            "the slice shares the buffer"
        );
    }

    #[derive(Debug, Clone)]
    enum Field {
        U8(u8),
        Bool(bool),
        U16(u16),
        U32(u32),
        U64(u64),
        I64(i64),
        Varint(u64),
        VarintU16(u16),
        VarintU32(u32),
        Signed(i64),
        Bytes(Vec<u8>),
        Str(String),
        Raw(Vec<u8>),
    }

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            any::<u8>().prop_map(Field::U8),
            any::<bool>().prop_map(Field::Bool),
            any::<u16>().prop_map(Field::U16),
            any::<u32>().prop_map(Field::U32),
            any::<u64>().prop_map(Field::U64),
            any::<i64>().prop_map(Field::I64),
            any::<u64>().prop_map(Field::Varint),
            any::<u16>().prop_map(Field::VarintU16),
            any::<u32>().prop_map(Field::VarintU32),
            any::<i64>().prop_map(Field::Signed),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Field::Bytes),
            ".{0,40}".prop_map(Field::Str),
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(Field::Raw),
        ]
    }

    fn encode(fields: &[Field]) -> Bytes {
        let mut encoder = Encoder::new();
        for field in fields {
            match field {
                Field::U8(v) => encoder.put_u8(*v),
                Field::Bool(v) => encoder.put_bool(*v),
                Field::U16(v) => encoder.put_u16_le(*v),
                Field::U32(v) => encoder.put_u32_le(*v),
                Field::U64(v) => encoder.put_u64_le(*v),
                Field::I64(v) => encoder.put_i64_le(*v),
                Field::Varint(v) => encoder.put_varint(*v),
                Field::VarintU16(v) => encoder.put_varint(u64::from(*v)),
                Field::VarintU32(v) => encoder.put_varint(u64::from(*v)),
                Field::Signed(v) => encoder.put_varint_signed(*v),
                Field::Bytes(v) => encoder.put_bytes(v),
                Field::Str(v) => encoder.put_str(v),
                Field::Raw(v) => encoder.put_raw(v),
            };
        }
        encoder.finish()
    }

    fn check_fields(decoder: &mut Decoder<'_>, fields: &[Field]) -> Result<(), TestCaseError> {
        for field in fields {
            match field {
                Field::U8(v) => prop_assert_eq!(decoder.get_u8("f")?, *v),
                Field::Bool(v) => prop_assert_eq!(decoder.get_bool("f")?, *v),
                Field::U16(v) => prop_assert_eq!(decoder.get_u16_le("f")?, *v),
                Field::U32(v) => prop_assert_eq!(decoder.get_u32_le("f")?, *v),
                Field::U64(v) => prop_assert_eq!(decoder.get_u64_le("f")?, *v),
                Field::I64(v) => prop_assert_eq!(decoder.get_i64_le("f")?, *v),
                Field::Varint(v) => prop_assert_eq!(decoder.get_varint("f")?, *v),
                Field::VarintU16(v) => prop_assert_eq!(decoder.get_varint_u16("f")?, *v),
                Field::VarintU32(v) => prop_assert_eq!(decoder.get_varint_u32("f")?, *v),
                Field::Signed(v) => prop_assert_eq!(decoder.get_varint_signed("f")?, *v),
                Field::Bytes(v) => {
                    let mut copy = decoder.clone();
                    prop_assert_eq!(copy.get_slice("f", v.len())?, &v[..]);
                    prop_assert_eq!(&decoder.get_bytes("f")?[..], &v[..]);
                }
                Field::Str(v) => prop_assert_eq!(decoder.get_str("f", v.len())?, v.as_str()),
                Field::Raw(v) => prop_assert_eq!(&decoder.get_raw("f", v.len())?[..], &v[..]),
            }
        }
        Ok(())
    }

    /// Every getter, picked by `op`, on whatever input is left.
    fn apply(decoder: &mut Decoder<'_>, op: u8, limit: usize) -> Result<Vec<u8>, DecodeError> {
        Ok(match op % 17 {
            0 => vec![decoder.get_u8("f")?],
            1 => vec![u8::from(decoder.get_bool("f")?)],
            2 => decoder.get_u16_le("f")?.to_le_bytes().to_vec(),
            3 => decoder.get_u32_le("f")?.to_le_bytes().to_vec(),
            4 => decoder.get_u64_le("f")?.to_le_bytes().to_vec(),
            5 => decoder.get_i64_le("f")?.to_le_bytes().to_vec(),
            6 => decoder.get_varint("f")?.to_le_bytes().to_vec(),
            7 => decoder
                .get_varint_max("f", limit as u64)?
                .to_le_bytes()
                .to_vec(),
            8 => decoder.get_varint_u16("f")?.to_le_bytes().to_vec(),
            9 => decoder.get_varint_u32("f")?.to_le_bytes().to_vec(),
            10 => decoder.get_varint_signed("f")?.to_le_bytes().to_vec(),
            11 => decoder
                .get_count("f", limit % 5, limit)?
                .to_le_bytes()
                .to_vec(),
            12 => decoder.get_slice("f", limit)?.to_vec(),
            13 => decoder.get_str("f", limit)?.as_bytes().to_vec(),
            14 => decoder.get_bytes("f")?.to_vec(),
            15 => decoder.get_raw("f", limit % 9)?.to_vec(),
            _ => vec![u8::try_from(decoder.remaining().min(255)).unwrap_or(255)],
        })
    }

    proptest! {
        #[test]
        fn every_field_sequence_round_trips(fields in proptest::collection::vec(field(), 0..40)) {
            let bytes = encode(&fields);
            let mut shared = Decoder::new(bytes.clone());
            check_fields(&mut shared, &fields)?;
            prop_assert!(shared.finish().is_ok());
            let mut borrowed = Decoder::from_slice(&bytes);
            check_fields(&mut borrowed, &fields)?;
            prop_assert!(borrowed.finish().is_ok());
        }

        #[test]
        fn every_strict_prefix_is_truncated(fields in proptest::collection::vec(field(), 1..10)) {
            let bytes = encode(&fields);
            for cut in 0..bytes.len() {
                let mut decoder = Decoder::new(bytes.slice(..cut));
                prop_assert!(check_fields(&mut decoder, &fields).is_err() || decoder.finish().is_err());
            }
        }

        /// Arbitrary bytes through arbitrary getters: no panic, and a shared and a borrowed
        /// decoder agree on every result.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(
            input in proptest::collection::vec(any::<u8>(), 0..64),
            ops in proptest::collection::vec((any::<u8>(), 0usize..80), 0..24),
        ) {
            let mut shared = Decoder::new(Bytes::from(input.clone()));
            let mut borrowed = Decoder::from_slice(&input);
            for (op, limit) in ops {
                prop_assert_eq!(apply(&mut shared, op, limit), apply(&mut borrowed, op, limit));
                prop_assert_eq!(shared.remaining(), borrowed.remaining());
            }
            prop_assert_eq!(shared.finish(), borrowed.finish());
        }
    }
}

//! Explicit payload encoders: compact varints, fixed-width little-endian integers and
//! length-prefixed byte slices. No serde wire format: every layer above writes its payloads
//! field by field with [`Encoder`] and reads them back with [`Decoder`].
//!
//! Invariants:
//! - Every `get_*` of [`Decoder`] checks the remaining length before it reads or slices;
//!   a length read from the input is compared with the bytes actually present before
//!   anything is allocated or sliced, so hostile input can cost at most its own size.
//! - Varints are LEB128 (7 bits per byte, low bits first, high bit = "more"); the decoder
//!   accepts only the minimal encoding of a value (no trailing zero groups) and at most
//!   [`VARINT_BYTES_MAX`] bytes, so every value has exactly one encoding.
//! - Signed varints are zigzag-mapped first (0, -1, 1, -2, … → 0, 1, 2, 3, …).
//!
//! Callers: message handlers and senders of every layer above `myriad-net`; the format is
//! documented in `docs/wire-format.md` ("Payload encoders").

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

/// Longest LEB128 encoding of a `u64`: 10 bytes (9 × 7 bits + 1 bit).
pub const VARINT_BYTES_MAX: usize = 10;

/// Writes a payload field by field into a growable buffer.
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

    /// A `u16`, 2 bytes little-endian.
    pub fn put_u16(&mut self, value: u16) -> &mut Self {
        self.buf.put_u16_le(value);
        self
    }

    /// A `u32`, 4 bytes little-endian.
    pub fn put_u32(&mut self, value: u32) -> &mut Self {
        self.buf.put_u32_le(value);
        self
    }

    /// A `u64`, 8 bytes little-endian.
    pub fn put_u64(&mut self, value: u64) -> &mut Self {
        self.buf.put_u64_le(value);
        self
    }

    /// An `i64`, 8 bytes little-endian two's complement.
    pub fn put_i64(&mut self, value: i64) -> &mut Self {
        self.buf.put_i64_le(value);
        self
    }

    /// A `u64` as a compact LEB128 varint (1 byte below 128, at most 10 bytes).
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

    /// A byte slice prefixed by its length as a varint.
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

    /// The encoded payload, ready to send without another copy.
    pub fn finish(self) -> Bytes {
        self.buf.freeze()
    }
}

/// Reads a payload field by field, checking every length against the bytes present.
///
/// Slices ([`Decoder::get_bytes`]) share the payload's buffer (no copy).
#[derive(Debug, Clone)]
pub struct Decoder {
    buf: Bytes,
    position: usize,
}

impl Decoder {
    /// A decoder over `payload`.
    pub fn new(payload: Bytes) -> Self {
        Self {
            buf: payload,
            position: 0,
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.position)
    }

    fn take(&mut self, count: usize) -> Result<&[u8], DecodeError> {
        let end = self
            .position
            .checked_add(count)
            .ok_or(DecodeError::Truncated)?;
        let slice = self
            .buf
            .get(self.position..end)
            .ok_or(DecodeError::Truncated)?;
        self.position = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    /// One byte.
    pub fn get_u8(&mut self) -> Result<u8, DecodeError> {
        Ok(u8::from_le_bytes(self.take_array()?))
    }

    /// A little-endian `u16`.
    pub fn get_u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take_array()?))
    }

    /// A little-endian `u32`.
    pub fn get_u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    /// A little-endian `u64`.
    pub fn get_u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// A little-endian `i64`.
    pub fn get_i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take_array()?))
    }

    /// A LEB128 varint written by [`Encoder::put_varint`]; rejects overlong and
    /// non-minimal encodings.
    pub fn get_varint(&mut self) -> Result<u64, DecodeError> {
        let mut value: u64 = 0;
        for index in 0..VARINT_BYTES_MAX {
            let byte = self.get_u8()?;
            let group = u64::from(byte & 0x7f);
            let shift = 7 * index as u32;
            if index == VARINT_BYTES_MAX - 1 && byte > 1 {
                return Err(DecodeError::VarintOverflow);
            }
            value |= group << shift;
            if byte & 0x80 == 0 {
                if byte == 0 && index > 0 {
                    return Err(DecodeError::VarintNotMinimal);
                }
                return Ok(value);
            }
        }
        Err(DecodeError::VarintOverflow)
    }

    /// A zigzag varint written by [`Encoder::put_varint_signed`].
    pub fn get_varint_signed(&mut self) -> Result<i64, DecodeError> {
        let raw = self.get_varint()?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// A length-prefixed byte slice, sharing the payload's buffer.
    pub fn get_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let declared = self.get_varint()?;
        let length = usize::try_from(declared).map_err(|_| DecodeError::Truncated)?;
        if length > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let start = self.position;
        self.position += length;
        Ok(self.buf.slice(start..self.position))
    }

    /// A length-prefixed UTF-8 string.
    pub fn get_str(&mut self) -> Result<String, DecodeError> {
        let bytes = self.get_bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidUtf8)
    }

    /// `count` raw bytes (no length prefix), sharing the payload's buffer.
    pub fn get_raw(&mut self, count: usize) -> Result<Bytes, DecodeError> {
        if count > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let start = self.position;
        self.position += count;
        Ok(self.buf.slice(start..self.position))
    }

    /// Checks that the whole payload was consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra_bytes => Err(DecodeError::TrailingBytes { extra_bytes }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn varint_lengths_match_the_documented_sizes() {
        for (value, bytes) in [
            (0u64, 1usize),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::MAX, 10),
        ] {
            let mut encoder = Encoder::new();
            encoder.put_varint(value);
            assert_eq!(encoder.len(), bytes, "value {value}");
        }
    }

    #[test]
    fn varint_rejects_overlong_and_non_minimal_input() {
        let overlong = Bytes::from_static(&[0xff; 11]);
        assert_eq!(
            Decoder::new(overlong).get_varint(),
            Err(DecodeError::VarintOverflow)
        );
        let tenth_too_big =
            Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]);
        assert_eq!(
            Decoder::new(tenth_too_big).get_varint(),
            Err(DecodeError::VarintOverflow)
        );
        let non_minimal = Bytes::from_static(&[0x80, 0x00]);
        assert_eq!(
            Decoder::new(non_minimal).get_varint(),
            Err(DecodeError::VarintNotMinimal)
        );
    }

    #[test]
    fn length_prefix_larger_than_input_is_truncated_not_allocated() {
        let mut encoder = Encoder::new();
        encoder.put_varint(u64::MAX);
        let mut decoder = Decoder::new(encoder.finish());
        assert_eq!(decoder.get_bytes(), Err(DecodeError::Truncated));
    }

    #[test]
    fn fixed_width_integers_are_little_endian() {
        let mut encoder = Encoder::new();
        encoder.put_u32(0x0403_0201).put_u16(0x0605);
        assert_eq!(&encoder.finish()[..], &[1, 2, 3, 4, 5, 6]);
    }

    #[derive(Debug, Clone)]
    enum Field {
        U8(u8),
        U16(u16),
        U32(u32),
        U64(u64),
        I64(i64),
        Varint(u64),
        Signed(i64),
        Bytes(Vec<u8>),
        Str(String),
    }

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            any::<u8>().prop_map(Field::U8),
            any::<u16>().prop_map(Field::U16),
            any::<u32>().prop_map(Field::U32),
            any::<u64>().prop_map(Field::U64),
            any::<i64>().prop_map(Field::I64),
            any::<u64>().prop_map(Field::Varint),
            any::<i64>().prop_map(Field::Signed),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Field::Bytes),
            ".{0,40}".prop_map(Field::Str),
        ]
    }

    proptest! {
        #[test]
        fn every_field_sequence_round_trips(fields in proptest::collection::vec(field(), 0..40)) {
            let mut encoder = Encoder::new();
            for f in &fields {
                match f {
                    Field::U8(v) => { encoder.put_u8(*v); }
                    Field::U16(v) => { encoder.put_u16(*v); }
                    Field::U32(v) => { encoder.put_u32(*v); }
                    Field::U64(v) => { encoder.put_u64(*v); }
                    Field::I64(v) => { encoder.put_i64(*v); }
                    Field::Varint(v) => { encoder.put_varint(*v); }
                    Field::Signed(v) => { encoder.put_varint_signed(*v); }
                    Field::Bytes(v) => { encoder.put_bytes(v); }
                    Field::Str(v) => { encoder.put_str(v); }
                }
            }
            let mut decoder = Decoder::new(encoder.finish());
            for f in &fields {
                match f {
                    Field::U8(v) => prop_assert_eq!(decoder.get_u8()?, *v),
                    Field::U16(v) => prop_assert_eq!(decoder.get_u16()?, *v),
                    Field::U32(v) => prop_assert_eq!(decoder.get_u32()?, *v),
                    Field::U64(v) => prop_assert_eq!(decoder.get_u64()?, *v),
                    Field::I64(v) => prop_assert_eq!(decoder.get_i64()?, *v),
                    Field::Varint(v) => prop_assert_eq!(decoder.get_varint()?, *v),
                    Field::Signed(v) => prop_assert_eq!(decoder.get_varint_signed()?, *v),
                    Field::Bytes(v) => prop_assert_eq!(&decoder.get_bytes()?[..], &v[..]),
                    Field::Str(v) => prop_assert_eq!(&decoder.get_str()?, v),
                }
            }
            prop_assert!(decoder.finish().is_ok());
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(input in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut decoder = Decoder::new(Bytes::from(input));
            while decoder.remaining() > 0 {
                if decoder.get_bytes().is_err() && decoder.get_varint_signed().is_err() {
                    break;
                }
            }
        }
    }
}

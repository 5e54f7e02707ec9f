//! Byte identity with the two codecs this one replaced (issue 16): the metadata codec
//! (`myriad_meta::codec`: `Writer`/`Reader`, metadata commands, snapshots, the Raft log and
//! RPCs) and the messaging layer's payload codec (`myriad_net::codec`: `Encoder`/`Decoder`,
//! the cluster protocol and the replication stream). The expected bytes below were printed
//! by the old codecs for the same calls, before they were deleted; the new codec must
//! produce exactly them and read them back.

use bytes::Bytes;
use myriad_types::codec::{DecodeError, Decoder, Encoder};

/// What the metadata codec's `Writer` wrote for: `u8(7)`; `varint` of 0, 1, 127, 128, 300,
/// 16 383, 16 384, `u16::MAX`, `u32::MAX`, `u64::MAX`; `u64_le(0x0102030405060708)`;
/// `bytes(b"abc")`; `bytes(b"")`; `str("héllo")`; `bool(true)`; `bool(false)`.
const META_CODEC_BYTES: &[u8] = &[
    0x07, 0x00, 0x01, 0x7f, 0x80, 0x01, 0xac, 0x02, 0xff, 0x7f, 0x80, 0x80, 0x01, 0xff, 0xff, 0x03,
    0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x08,
    0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x03, 0x61, 0x62, 0x63, 0x00, 0x06, 0x68, 0xc3, 0xa9,
    0x6c, 0x6c, 0x6f, 0x01, 0x00,
];

/// What the messaging layer's `Encoder` wrote for: `put_u8(0xfe)`; `put_u16(0xbeef)`;
/// `put_u32(0xdeadbeef)`; `put_u64(1 << 40 | 5)`; `put_i64(-2)`; `put_varint` of 0, 127, 128,
/// 16 384, `u64::MAX`; `put_varint_signed` of 0, -1, 1, 63, -64, 64, `i64::MAX`, `i64::MIN`;
/// `put_bytes(b"xyz")`; `put_bytes(b"")`; `put_str("ü")`; `put_raw(&[1, 2])`.
const NET_CODEC_BYTES: &[u8] = &[
    0xfe, 0xef, 0xbe, 0xef, 0xbe, 0xad, 0xde, 0x05, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0xfe,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x7f, 0x80, 0x01, 0x80, 0x80, 0x01, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00, 0x01, 0x02, 0x7e, 0x7f, 0x80, 0x01, 0xfe,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0x01, 0x03, 0x78, 0x79, 0x7a, 0x00, 0x02, 0xc3, 0xbc, 0x01, 0x02,
];

const META_VARINTS: [u64; 10] = [
    0,
    1,
    127,
    128,
    300,
    16_383,
    16_384,
    u16::MAX as u64,
    u32::MAX as u64,
    u64::MAX,
];

const NET_VARINTS: [u64; 5] = [0, 127, 128, 16_384, u64::MAX];

const NET_SIGNED: [i64; 8] = [0, -1, 1, 63, -64, 64, i64::MAX, i64::MIN];

#[test]
fn writes_what_the_metadata_codec_wrote() {
    let mut out = Encoder::new();
    out.put_u8(7);
    for value in META_VARINTS {
        out.put_varint(value);
    }
    out.put_u64_le(0x0102_0304_0506_0708)
        .put_bytes(b"abc")
        .put_bytes(b"")
        .put_str("h\u{e9}llo")
        .put_bool(true)
        .put_bool(false);
    assert_eq!(out.into_vec(), META_CODEC_BYTES);
}

#[test]
fn reads_what_the_metadata_codec_wrote() {
    let mut input = Decoder::from_slice(META_CODEC_BYTES);
    assert_eq!(input.get_u8("byte"), Ok(7));
    for value in META_VARINTS {
        assert_eq!(input.get_varint("varint"), Ok(value));
    }
    assert_eq!(input.get_u64_le("fixed"), Ok(0x0102_0304_0506_0708));
    assert_eq!(input.get_slice("bytes", 3), Ok(&b"abc"[..]));
    assert_eq!(input.get_slice("bytes", 0), Ok(&b""[..]));
    assert_eq!(input.get_str("text", 6), Ok("h\u{e9}llo"));
    assert_eq!(input.get_bool("flag"), Ok(true));
    assert_eq!(input.get_bool("flag"), Ok(false));
    input.finish().expect("nothing left");
}

#[test]
fn writes_what_the_messaging_codec_wrote() {
    let mut out = Encoder::new();
    out.put_u8(0xfe)
        .put_u16_le(0xbeef)
        .put_u32_le(0xdead_beef)
        .put_u64_le((1 << 40) | 5)
        .put_i64_le(-2);
    for value in NET_VARINTS {
        out.put_varint(value);
    }
    for value in NET_SIGNED {
        out.put_varint_signed(value);
    }
    out.put_bytes(b"xyz")
        .put_bytes(b"")
        .put_str("\u{fc}")
        .put_raw(&[1, 2]);
    assert_eq!(&out.finish()[..], NET_CODEC_BYTES);
}

#[test]
fn reads_what_the_messaging_codec_wrote() {
    let mut input = Decoder::new(Bytes::from_static(NET_CODEC_BYTES));
    assert_eq!(input.get_u8("byte"), Ok(0xfe));
    assert_eq!(input.get_u16_le("u16"), Ok(0xbeef));
    assert_eq!(input.get_u32_le("u32"), Ok(0xdead_beef));
    assert_eq!(input.get_u64_le("u64"), Ok((1 << 40) | 5));
    assert_eq!(input.get_i64_le("i64"), Ok(-2));
    for value in NET_VARINTS {
        assert_eq!(input.get_varint("varint"), Ok(value));
    }
    for value in NET_SIGNED {
        assert_eq!(input.get_varint_signed("signed"), Ok(value));
    }
    assert_eq!(input.get_bytes("bytes").as_deref(), Ok(&b"xyz"[..]));
    assert_eq!(input.get_bytes("bytes").as_deref(), Ok(&b""[..]));
    assert_eq!(input.get_str("text", 2), Ok("\u{fc}"));
    assert_eq!(input.get_raw("raw", 2).as_deref(), Ok(&[1u8, 2][..]));
    input.finish().expect("nothing left");
}

/// The two old decoders refused the same inputs; so does the one decoder.
#[test]
fn refuses_what_both_old_codecs_refused() {
    for bad in [
        &[0x80u8, 0x00][..],
        &[0xff; 11][..],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..],
        &[0x80][..],
    ] {
        assert!(
            Decoder::from_slice(bad).get_varint("v").is_err(),
            "{bad:02x?}"
        );
        assert!(Decoder::new(Bytes::copy_from_slice(bad))
            .get_varint("v")
            .is_err());
    }
    assert_eq!(
        Decoder::from_slice(&[0x80, 0x80, 0x04]).get_varint_u16("node"),
        Err(DecodeError::VarintOverflow("node"))
    );
}

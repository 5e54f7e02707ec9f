//! Feeds arbitrary bytes to the frame decoder and the reassembler the way the connection
//! reader does (in read-sized pieces chosen by the input), and decodes every complete
//! payload with the payload decoder. Nothing may panic; every frame handed out must match
//! its header, and a reassembled message must stay within its limit.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use myriad_net::wire::{FrameDecoder, Reassembler};
use myriad_types::codec::Decoder;

/// Small limits so that the fuzzer reaches the "too large" paths quickly.
const FRAME_PAYLOAD_BYTES_MAX: usize = 4096;
const MESSAGE_BYTES_MAX: usize = 16 * 1024;

fuzz_target!(|input: &[u8]| {
    let Some((&piece_seed, stream)) = input.split_first() else {
        return;
    };
    let piece_bytes = usize::from(piece_seed).max(1);
    let decoder = FrameDecoder::new(FRAME_PAYLOAD_BYTES_MAX);
    let mut reassembler = Reassembler::new(MESSAGE_BYTES_MAX);
    let mut buf = BytesMut::new();
    for piece in stream.chunks(piece_bytes) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    assert_eq!(frame.payload.len(), frame.header.payload_bytes as usize);
                    assert!(frame.payload.len() <= FRAME_PAYLOAD_BYTES_MAX);
                    match reassembler.push(frame) {
                        Ok(Some(message)) => {
                            assert!(message.payload.len() <= MESSAGE_BYTES_MAX);
                            let mut payload = Decoder::new(message.payload);
                            while payload.remaining() > 0 {
                                if payload.get_bytes("bytes").is_err()
                                    && payload.get_varint("varint").is_err()
                                {
                                    break;
                                }
                            }
                        }
                        Ok(None) => assert!(reassembler.buffered_bytes() <= MESSAGE_BYTES_MAX),
                        Err(_) => return,
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});

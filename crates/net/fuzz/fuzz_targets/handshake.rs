//! Arbitrary bytes as the handshake messages a peer could send: the greeting (with and
//! without the lane flag), the proof and the verdict byte. Nothing may panic, a decoded
//! greeting must re-encode to the same bytes, and a proof made of fuzz bytes must not
//! verify against a real greeting pair.
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_net::wire::{self, Greeting, Verdict, GREETING_BYTES, PROOF_BYTES};

fuzz_target!(|input: &[u8]| {
    let mut greeting_bytes = [0u8; GREETING_BYTES];
    let taken = input.len().min(GREETING_BYTES);
    greeting_bytes[..taken].copy_from_slice(&input[..taken]);
    if let Ok(greeting) = Greeting::decode(&greeting_bytes) {
        // The flags byte (lane or not) survives a round trip; unknown flag bits never decode.
        assert_eq!(greeting.encode(), greeting_bytes);
        assert_eq!(greeting.lane, greeting_bytes[5] & wire::GREETING_FLAG_LANE != 0);
    } else {
        assert!(
            greeting_bytes[..4] != wire::HANDSHAKE_MAGIC
                || greeting_bytes[4] != wire::PROTOCOL_VERSION
                || greeting_bytes[5] & !wire::GREETING_FLAG_LANE != 0
        );
    }
    let rest = &input[taken..];
    if let Some(&byte) = rest.first() {
        let _ = Verdict::decode(byte);
    }
    if rest.len() > PROOF_BYTES {
        let mut proof = [0u8; PROOF_BYTES];
        proof.copy_from_slice(&rest[1..=PROOF_BYTES]);
        let ours = Greeting { node: 1, instance: 2, nonce: [3; 16], lane: true }.encode();
        let genuine = wire::acceptor_proof(b"secret", &ours, &greeting_bytes);
        if proof != genuine {
            assert!(wire::verify_acceptor_proof(b"secret", &ours, &greeting_bytes, &proof).is_err());
        }
    }
});

//! Feeds arbitrary bytes to the RPC request and reply decoders: they must never panic, and
//! whatever decodes must re-encode canonically (decoding the re-encoding gives the same).
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_raft::{RpcReply, RpcRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = RpcRequest::from_bytes(data) {
        let encoded = request.to_bytes();
        let again = RpcRequest::from_bytes(&encoded).expect("a re-encoded request decodes");
        assert_eq!(again.to_bytes(), encoded);
    }
    if let Ok(reply) = RpcReply::from_bytes(data) {
        let again = RpcReply::from_bytes(&reply.to_bytes()).expect("a re-encoded reply decodes");
        assert_eq!(again, reply);
    }
});

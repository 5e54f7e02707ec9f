//! Logging control at run time: an operator changes a node's log filter
//! ([`crate::types::LOG_LEVEL`]) or reads a backup peer's log engine state
//! ([`crate::types::LOG_INFO`]).
//!
//! # Job
//! [`LogLevelRequest`] carries a filter in `tracing`'s `EnvFilter` syntax (`debug`,
//! `info,myriad_node::peer=debug`: per module), or nothing to only read the current one.
//! Both types are answered with a [`TextReply`]: the filter in force, or the log engine's
//! figures as JSON text, or why not.
//!
//! # Invariants
//! Decoding never panics; texts are at most [`LOG_TEXT_BYTES_MAX`] bytes.
//!
//! # Who calls it
//! `myriad term` (`loggerlevel`, `loginfo`) through the client library; peers and
//! superpeers answer (`myriad_node::ops::log_control`).

use bytes::Bytes;
use myriad_types::codec::{Decoder, Encoder};

use crate::ProtoError;

/// Longest filter or answer text.
pub const LOG_TEXT_BYTES_MAX: usize = 1 << 20;

/// Set (or, with `None`, read) a node's log filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLevelRequest {
    /// The new filter, in `EnvFilter` syntax.
    pub filter: Option<String>,
}

impl LogLevelRequest {
    /// The request's bytes: tag 0 (read), or tag 1 + the filter (string).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::new();
        match &self.filter {
            None => encoder.put_u8(0),
            Some(filter) => encoder.put_u8(1).put_str(filter),
        };
        encoder.finish()
    }

    /// Decodes a request.
    pub fn decode(payload: Bytes) -> Result<LogLevelRequest, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let filter = match decoder.get_u8("log level tag")? {
            0 => None,
            1 => Some(
                decoder
                    .get_str("log filter", LOG_TEXT_BYTES_MAX)?
                    .to_owned(),
            ),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "log level request",
                    tag,
                })
            }
        };
        decoder.finish()?;
        Ok(LogLevelRequest { filter })
    }
}

/// A text answer, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextReply {
    /// The answer.
    Ok(String),
    /// Why the request failed.
    Failed(String),
}

impl TextReply {
    /// The reply's bytes: tag 0 + text, or tag 1 + reason (strings).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::new();
        match self {
            TextReply::Ok(text) => encoder.put_u8(0).put_str(text),
            TextReply::Failed(reason) => encoder.put_u8(1).put_str(reason),
        };
        encoder.finish()
    }

    /// Decodes a reply.
    pub fn decode(payload: Bytes) -> Result<TextReply, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let reply = match decoder.get_u8("text reply tag")? {
            0 => TextReply::Ok(decoder.get_str("text", LOG_TEXT_BYTES_MAX)?.to_owned()),
            1 => TextReply::Failed(decoder.get_str("reason", LOG_TEXT_BYTES_MAX)?.to_owned()),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "text reply",
                    tag,
                })
            }
        };
        decoder.finish()?;
        Ok(reply)
    }
}

/// Runs every decoder of this family on `bytes` (for the fuzz target).
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    if let Ok(request) = LogLevelRequest::decode(payload.clone()) {
        assert_eq!(request.encode(), payload);
    }
    if let Ok(reply) = TextReply::decode(payload.clone()) {
        assert_eq!(reply.encode(), payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        for request in [
            LogLevelRequest { filter: None },
            LogLevelRequest {
                filter: Some("info,myriad_node::peer=debug".into()),
            },
        ] {
            assert_eq!(LogLevelRequest::decode(request.encode()), Ok(request));
        }
        for reply in [TextReply::Ok("{}".into()), TextReply::Failed("no".into())] {
            assert_eq!(TextReply::decode(reply.encode()), Ok(reply));
        }
        assert!(LogLevelRequest::decode(Bytes::from_static(&[7])).is_err());
        assert!(TextReply::decode(Bytes::from_static(&[0])).is_err());
    }
}

//! A minimal Redis (RESP2) client for `bench kv`'s own Redis driver: the same closed-loop
//! threads that drive Myriad drive Redis, one connection per thread, so both sides have
//! exactly the same requests in flight (see [`super::redis`] for the mapping).
//!
//! # What it speaks
//! Commands are sent as RESP arrays of bulk strings ([`encode_command`]); replies are
//! parsed by [`parse_reply`] (simple strings, errors, integers, bulk strings, arrays).
//!
//! # Invariants
//! [`parse_reply`] is a pure, bounds-checked function over bytes: a malformed or oversized
//! reply is a [`RespError`], never a panic; an incomplete one is `Ok(None)` (read more).
//! Array nesting is limited to [`DEPTH_MAX`] and lengths to [`BULK_BYTES_MAX`].

use std::io::{Read, Write};
use std::net::TcpStream;

/// Longest simple-string, error or integer line accepted.
const LINE_BYTES_MAX: usize = 4096;
/// Largest bulk string accepted.
pub const BULK_BYTES_MAX: usize = 1 << 20;
/// Largest array accepted.
const ARRAY_LEN_MAX: usize = 1 << 16;
/// Deepest array nesting accepted.
pub const DEPTH_MAX: usize = 4;
/// Read buffer size of a connection.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// A malformed or unexpected reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RespError {
    /// A byte sequence that is not RESP.
    #[error("malformed reply: {0}")]
    Malformed(&'static str),
    /// A line, bulk string or array beyond the limits.
    #[error("reply too long")]
    TooLong,
    /// The server answered with an error.
    #[error("redis error: {0}")]
    Server(String),
}

/// One parsed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK` and the like.
    Simple(String),
    /// `:<n>`.
    Integer(i64),
    /// `$<n>` with its bytes (`None`: the null bulk string `$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*<n>` with its elements (`None`: the null array `*-1`).
    Array(Option<Vec<Reply>>),
    /// `-ERR ...`.
    Error(String),
}

/// Appends one command (a RESP array of bulk strings) to `out`.
pub fn encode_command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
}

/// The line at the start of `buf` (without `\r\n`) and the bytes it took.
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, RespError> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(end) if end > LINE_BYTES_MAX => Err(RespError::TooLong),
        Some(end) => Ok(Some((&buf[..end], end + 2))),
        None if buf.len() > LINE_BYTES_MAX => Err(RespError::TooLong),
        None => Ok(None),
    }
}

fn number(text: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or(RespError::Malformed("bad number"))
}

/// Parses one reply at the start of `buf`: `Ok(Some((reply, bytes used)))`, `Ok(None)`
/// when `buf` holds only part of it.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, RespError> {
    parse_at(buf, 0)
}

fn parse_at(buf: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, RespError> {
    let Some((&kind, _)) = buf.split_first() else {
        return Ok(None);
    };
    let Some((text, used)) = line(&buf[1..])? else {
        return Ok(None);
    };
    let used = used + 1;
    let as_string = || String::from_utf8_lossy(text).into_owned();
    match kind {
        b'+' => Ok(Some((Reply::Simple(as_string()), used))),
        b'-' => Ok(Some((Reply::Error(as_string()), used))),
        b':' => Ok(Some((Reply::Integer(number(text)?), used))),
        b'$' => {
            let len = number(text)?;
            if len == -1 {
                return Ok(Some((Reply::Bulk(None), used)));
            }
            let len = usize::try_from(len).map_err(|_| RespError::Malformed("bulk length"))?;
            if len > BULK_BYTES_MAX {
                return Err(RespError::TooLong);
            }
            let end = used + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(RespError::Malformed("bulk string not ended by CRLF"));
            }
            Ok(Some((Reply::Bulk(Some(buf[used..end].to_vec())), end + 2)))
        }
        b'*' => {
            let len = number(text)?;
            if len == -1 {
                return Ok(Some((Reply::Array(None), used)));
            }
            let len = usize::try_from(len).map_err(|_| RespError::Malformed("array length"))?;
            if len > ARRAY_LEN_MAX || depth >= DEPTH_MAX {
                return Err(RespError::TooLong);
            }
            let mut items = Vec::with_capacity(len.min(64));
            let mut at = used;
            for _ in 0..len {
                match parse_at(&buf[at..], depth + 1)? {
                    Some((item, item_used)) => {
                        items.push(item);
                        at += item_used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        _ => Err(RespError::Malformed("unknown reply type")),
    }
}

/// A blocking connection to a Redis server.
pub struct RespConnection {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    start: usize,
    out: Vec<u8>,
}

impl RespConnection {
    /// Connects to `127.0.0.1:port` (no Nagle delay).
    pub fn connect(port: u16) -> Result<RespConnection, String> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| format!("connecting to redis on port {port}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        Ok(RespConnection {
            stream,
            buf: Vec::with_capacity(READ_CHUNK_BYTES),
            start: 0,
            out: Vec::with_capacity(4096),
        })
    }

    /// Queues a command; nothing is sent until [`flush`](Self::flush).
    pub fn queue(&mut self, parts: &[&[u8]]) {
        encode_command(&mut self.out, parts);
    }

    /// Sends every queued command in one write.
    pub fn flush(&mut self) -> Result<(), String> {
        let result = self
            .stream
            .write_all(&self.out)
            .map_err(|e| format!("redis write: {e}"));
        self.out.clear();
        result
    }

    /// Reads the next reply; a server error is [`RespError::Server`].
    pub fn read_reply(&mut self) -> Result<Reply, String> {
        loop {
            match parse_reply(&self.buf[self.start..]).map_err(|e| e.to_string())? {
                Some((Reply::Error(message), used)) => {
                    self.start += used;
                    return Err(RespError::Server(message).to_string());
                }
                Some((reply, used)) => {
                    self.start += used;
                    if self.start == self.buf.len() {
                        self.buf.clear();
                        self.start = 0;
                    }
                    return Ok(reply);
                }
                None => {
                    if self.start > 0 {
                        self.buf.drain(..self.start);
                        self.start = 0;
                    }
                    let old = self.buf.len();
                    self.buf.resize(old + READ_CHUNK_BYTES, 0);
                    let read = self.stream.read(&mut self.buf[old..]);
                    let read = match read {
                        Ok(0) => {
                            self.buf.truncate(old);
                            return Err("redis closed the connection".into());
                        }
                        Ok(read) => read,
                        Err(e) => {
                            self.buf.truncate(old);
                            return Err(format!("redis read: {e}"));
                        }
                    };
                    self.buf.truncate(old + read);
                }
            }
        }
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, parts: &[&[u8]]) -> Result<Reply, String> {
        self.queue(parts);
        self.flush()?;
        self.read_reply()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"k", b"va"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nva\r\n");
    }

    #[test]
    fn parses_every_reply_kind_and_partial_input() {
        let cases: [(&[u8], Reply); 6] = [
            (b"+OK\r\n", Reply::Simple("OK".into())),
            (b"-ERR no\r\n", Reply::Error("ERR no".into())),
            (b":42\r\n", Reply::Integer(42)),
            (b"$3\r\nabc\r\n", Reply::Bulk(Some(b"abc".to_vec()))),
            (b"$-1\r\n", Reply::Bulk(None)),
            (
                b"*2\r\n:1\r\n$1\r\nx\r\n",
                Reply::Array(Some(vec![
                    Reply::Integer(1),
                    Reply::Bulk(Some(b"x".to_vec())),
                ])),
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(
                parse_reply(bytes).expect("valid"),
                Some((expected, bytes.len()))
            );
            for cut in 0..bytes.len() {
                assert_eq!(
                    parse_reply(&bytes[..cut]),
                    Ok(None),
                    "{bytes:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_and_oversized_replies() {
        assert!(parse_reply(b"?x\r\n").is_err());
        assert!(parse_reply(b":x\r\n").is_err());
        assert!(parse_reply(b"$3\r\nabcd\r\n").is_err());
        assert!(parse_reply(b"$-2\r\n").is_err());
        assert_eq!(
            parse_reply(format!("${}\r\n", BULK_BYTES_MAX + 1).as_bytes()),
            Err(RespError::TooLong)
        );
        assert_eq!(parse_reply(&[b'+'; 5000]), Err(RespError::TooLong));
        let deep = "*1\r\n".repeat(DEPTH_MAX + 1) + ":1\r\n";
        assert_eq!(parse_reply(deep.as_bytes()), Err(RespError::TooLong));
    }

    #[test]
    fn random_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let alphabet = b"+-:$*\r\n0123456789-abc";
        for _ in 0..20_000 {
            let len = rng.gen_range(0..40);
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect();
            if let Ok(Some((_, used))) = parse_reply(&bytes) {
                assert!(used <= bytes.len());
            }
        }
    }
}

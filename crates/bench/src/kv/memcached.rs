//! The memcached baseline of `bench kv`: a `memcached` started here on a free 127.0.0.1
//! port, driven by this crate's closed-loop driver over the text protocol.
//!
//! # Load
//! - single get: `get <key>`; single set: `set <key> 0 0 <n>` + value, one outstanding;
//! - batched get: one multi-key `get k1 .. kB` per call (B = `--batch`);
//! - batched set: B `set` commands written at once (pipelined), then B replies read.
//!
//! Keys are `key:<12-digit index>`, preloaded before measuring, so every get must hit: a
//! miss fails the run (it would mean eviction, which makes figures meaningless).
//!
//! # Invariants
//! The reply parsers ([`parse_get_reply`], [`parse_store_reply`]) are pure functions over
//! bytes, bounds-checked: a malformed or oversized reply is a [`MemcacheError`], never a
//! panic; a partial reply is `Ok(None)` (read more).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use super::driver::WorkerFn;
use super::redis::{free_port, on_path, wait_listening, ChildGuard};

/// Longest reply line accepted.
const LINE_BYTES_MAX: usize = 4096;
/// Largest value accepted in a reply.
const VALUE_BYTES_MAX: usize = 1 << 20;
/// Read buffer size of a connection.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// A malformed or unexpected memcached reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemcacheError {
    /// A line that is not a valid reply here.
    #[error("unexpected reply line {0:?}")]
    Unexpected(String),
    /// The server reported an error.
    #[error("server error: {0}")]
    Server(String),
    /// A line or value longer than the limits.
    #[error("reply too long")]
    TooLong,
}

/// One `VALUE` block of a get reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueItem {
    /// The key.
    pub key: String,
    /// Its flags.
    pub flags: u32,
    /// Its value's length in bytes.
    pub bytes: usize,
}

/// The reply to a `set`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreReply {
    /// `STORED`.
    Stored,
    /// `NOT_STORED`.
    NotStored,
}

/// Finds the end of the first `\r\n` line of `buf`: `Ok(Some(index of '\r'))`.
fn line_end(buf: &[u8]) -> Result<Option<usize>, MemcacheError> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(end) if end > LINE_BYTES_MAX => Err(MemcacheError::TooLong),
        Some(end) => Ok(Some(end)),
        None if buf.len() > LINE_BYTES_MAX => Err(MemcacheError::TooLong),
        None => Ok(None),
    }
}

fn error_line(line: &str) -> Option<MemcacheError> {
    if line == "ERROR" || line.starts_with("SERVER_ERROR") || line.starts_with("CLIENT_ERROR") {
        Some(MemcacheError::Server(line.to_string()))
    } else {
        None
    }
}

/// Parses a complete get reply (`VALUE` blocks then `END`) from the start of `buf`:
/// `Ok(Some((items, bytes consumed)))`, `Ok(None)` if incomplete.
pub fn parse_get_reply(buf: &[u8]) -> Result<Option<(Vec<ValueItem>, usize)>, MemcacheError> {
    let mut items = Vec::new();
    let mut at = 0;
    loop {
        let rest = &buf[at..];
        let Some(end) = line_end(rest)? else {
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&rest[..end]).into_owned();
        if line == "END" {
            return Ok(Some((items, at + end + 2)));
        }
        if let Some(error) = error_line(&line) {
            return Err(error);
        }
        let mut words = line.split(' ');
        let (Some("VALUE"), Some(key), Some(flags), Some(bytes)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(MemcacheError::Unexpected(line));
        };
        let flags: u32 = flags
            .parse()
            .map_err(|_| MemcacheError::Unexpected(line.clone()))?;
        let bytes: usize = bytes
            .parse()
            .map_err(|_| MemcacheError::Unexpected(line.clone()))?;
        if bytes > VALUE_BYTES_MAX {
            return Err(MemcacheError::TooLong);
        }
        let data_start = end + 2;
        let block_end = data_start + bytes + 2;
        if rest.len() < block_end {
            return Ok(None);
        }
        if &rest[data_start + bytes..block_end] != b"\r\n" {
            return Err(MemcacheError::Unexpected(format!(
                "value of {key} not followed by CRLF"
            )));
        }
        items.push(ValueItem {
            key: key.to_string(),
            flags,
            bytes,
        });
        at += block_end;
    }
}

/// Parses one store reply from the start of `buf`: `Ok(Some((reply, consumed)))`,
/// `Ok(None)` if incomplete.
pub fn parse_store_reply(buf: &[u8]) -> Result<Option<(StoreReply, usize)>, MemcacheError> {
    let Some(end) = line_end(buf)? else {
        return Ok(None);
    };
    let line = String::from_utf8_lossy(&buf[..end]);
    let reply = match line.as_ref() {
        "STORED" => StoreReply::Stored,
        "NOT_STORED" => StoreReply::NotStored,
        other => {
            return Err(error_line(other).unwrap_or_else(|| MemcacheError::Unexpected(other.into())))
        }
    };
    Ok(Some((reply, end + 2)))
}

/// The key of index `index`.
pub fn key_name(index: u64) -> String {
    format!("key:{index:012}")
}

/// One client connection.
pub struct MemcachedConnection {
    stream: TcpStream,
    buf: Vec<u8>,
    filled: usize,
    request: Vec<u8>,
    value: Vec<u8>,
}

impl MemcachedConnection {
    /// Connects to `127.0.0.1:port` with Nagle off.
    pub fn connect(port: u16, object_bytes: usize) -> Result<Self, String> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| format!("connecting to memcached: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        Ok(MemcachedConnection {
            stream,
            buf: vec![0; READ_CHUNK_BYTES],
            filled: 0,
            request: Vec::with_capacity(4096),
            value: vec![b'x'; object_bytes],
        })
    }

    /// Reads until `parse` finds a complete reply; consumes it.
    fn read_reply<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, MemcacheError>,
    ) -> Result<T, String> {
        loop {
            if let Some((reply, used)) =
                parse(&self.buf[..self.filled]).map_err(|e| e.to_string())?
            {
                self.buf.copy_within(used..self.filled, 0);
                self.filled -= used;
                return Ok(reply);
            }
            if self.filled == self.buf.len() {
                let grown = self.buf.len() * 2;
                if grown > 64 * READ_CHUNK_BYTES {
                    return Err("memcached reply too large".into());
                }
                self.buf.resize(grown, 0);
            }
            let read = self
                .stream
                .read(&mut self.buf[self.filled..])
                .map_err(|e| format!("reading from memcached: {e}"))?;
            if read == 0 {
                return Err("memcached closed the connection".into());
            }
            self.filled += read;
        }
    }

    /// `set`s the keys, pipelined: all requests written, then all replies read.
    pub fn set(&mut self, keys: &[u64]) -> Result<(), String> {
        self.request.clear();
        for &key in keys {
            let _ = write!(
                self.request,
                "set {} 0 0 {}\r\n",
                key_name(key),
                self.value.len()
            );
            self.request.extend_from_slice(&self.value);
            self.request.extend_from_slice(b"\r\n");
        }
        self.stream
            .write_all(&self.request)
            .map_err(|e| format!("writing to memcached: {e}"))?;
        for _ in keys {
            match self.read_reply(parse_store_reply)? {
                StoreReply::Stored => {}
                StoreReply::NotStored => return Err("memcached: NOT_STORED".into()),
            }
        }
        Ok(())
    }

    /// One (multi-key) `get`; every key must hit.
    pub fn get(&mut self, keys: &[u64]) -> Result<(), String> {
        self.request.clear();
        self.request.extend_from_slice(b"get");
        for &key in keys {
            let _ = write!(self.request, " {}", key_name(key));
        }
        self.request.extend_from_slice(b"\r\n");
        self.stream
            .write_all(&self.request)
            .map_err(|e| format!("writing to memcached: {e}"))?;
        let items = self.read_reply(parse_get_reply)?;
        // memcached answers a repeated key once per occurrence; a miss drops an item.
        if items.len() != keys.len() {
            return Err(format!(
                "memcached returned {} of {} keys (evicted or not preloaded)",
                items.len(),
                keys.len()
            ));
        }
        Ok(())
    }
}

/// A running `memcached` (killed on drop).
pub struct MemcachedServer {
    port: u16,
    _child: ChildGuard,
}

impl MemcachedServer {
    /// Starts `memcached` on a free port with `memory_mb` of cache and `threads` worker
    /// threads; `Ok(None)` if it is not installed.
    pub fn start(memory_mb: u64, threads: usize) -> Result<Option<MemcachedServer>, String> {
        if !on_path("memcached") {
            return Ok(None);
        }
        let port = free_port()?;
        let child = Command::new("memcached")
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-m", &memory_mb.to_string(), "-t", &threads.to_string()])
            // Needed when run as root; ignored otherwise.
            .args(["-u", "root"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting memcached: {e}"))?;
        let guard = ChildGuard(child);
        wait_listening(port, "memcached")?;
        Ok(Some(MemcachedServer {
            port,
            _child: guard,
        }))
    }

    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self._child.0.id()
    }

    /// Stores every key of `0..keys` with an `object_bytes` value.
    pub fn preload(&self, keys: u64, object_bytes: usize) -> Result<(), String> {
        let mut connection = MemcachedConnection::connect(self.port, object_bytes)?;
        let indexes: Vec<u64> = (0..keys).collect();
        for chunk in indexes.chunks(256) {
            connection.set(chunk)?;
        }
        Ok(())
    }

    /// One worker per thread, each with its own connection, doing gets or sets.
    pub fn workers(
        &self,
        threads: usize,
        object_bytes: usize,
        get: bool,
    ) -> Result<Vec<WorkerFn>, String> {
        (0..threads)
            .map(|_| {
                let mut connection = MemcachedConnection::connect(self.port, object_bytes)?;
                let worker: WorkerFn = if get {
                    Box::new(move |keys: &[u64]| connection.get(keys))
                } else {
                    Box::new(move |keys: &[u64]| connection.set(keys))
                };
                Ok(worker)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_reply_with_values_and_partial_input() {
        let reply =
            b"VALUE key:000000000001 0 3\r\nabc\r\nVALUE key:000000000002 5 0\r\n\r\nEND\r\nextra";
        let (items, used) = parse_get_reply(reply).expect("valid").expect("complete");
        assert_eq!(used, reply.len() - "extra".len());
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].key, "key:000000000001");
        assert_eq!(items[0].bytes, 3);
        assert_eq!(items[1].flags, 5);
        for cut in 0..used {
            assert_eq!(parse_get_reply(&reply[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(parse_get_reply(b"END\r\n"), Ok(Some((vec![], 5))));
    }

    #[test]
    fn get_reply_errors() {
        assert!(matches!(
            parse_get_reply(b"SERVER_ERROR out of memory\r\n"),
            Err(MemcacheError::Server(_))
        ));
        assert!(matches!(
            parse_get_reply(b"VALUE k x 3\r\nabc\r\nEND\r\n"),
            Err(MemcacheError::Unexpected(_))
        ));
        assert!(matches!(
            parse_get_reply(b"VALUE k 0 3\r\nabcd\r\nEND\r\n"),
            Err(MemcacheError::Unexpected(_))
        ));
        assert_eq!(
            parse_get_reply(b"VALUE k 0 99999999\r\n"),
            Err(MemcacheError::TooLong)
        );
        assert_eq!(parse_get_reply(&[b'a'; 5000]), Err(MemcacheError::TooLong));
    }

    #[test]
    fn store_replies() {
        assert_eq!(
            parse_store_reply(b"STORED\r\nSTORED\r\n"),
            Ok(Some((StoreReply::Stored, 8)))
        );
        assert_eq!(parse_store_reply(b"STOR"), Ok(None));
        assert_eq!(
            parse_store_reply(b"NOT_STORED\r\n"),
            Ok(Some((StoreReply::NotStored, 12)))
        );
        assert!(matches!(
            parse_store_reply(b"CLIENT_ERROR bad data chunk\r\n"),
            Err(MemcacheError::Server(_))
        ));
        assert!(matches!(
            parse_store_reply(b"WHAT\r\n"),
            Err(MemcacheError::Unexpected(_))
        ));
    }
}

//! A connection's byte stream: plain TCP, or TCP carrying a rustls session.
//!
//! Job: give the reader and writer tasks (and the handshakes in `endpoint`) one stream
//! type with tokio's readiness style API (`readable`/`try_read_buf`,
//! `writable`/`try_write_vectored`), whether or not the bytes are encrypted, plus the
//! async helpers the handshakes use (`read_exact`, `write_all`) and the TLS handshake
//! itself ([`NetStream::tls_connect`], [`NetStream::tls_accept`]).
//!
//! Invariants:
//! - The reader and the writer share one stream (`Arc`); for TLS the session sits in a
//!   mutex that is never held across an `.await` (each call locks, moves bytes between
//!   the socket and the session without blocking, unlocks).
//! - Plaintext the session accepted may wait in the session as ciphertext when the socket
//!   is full: a writer calls [`NetStream::flush`] before it parks, and a sender that wrote
//!   directly ([`NetStream::try_write_vectored`] outside the writer task) wakes the writer
//!   when [`NetStream::wants_flush`] says ciphertext stayed behind.
//! - [`NetStream::readable`] returns at once while decrypted bytes wait in the session
//!   (the socket may have nothing more to say).
//!
//! Called by: `conn` (writer task), `reader` (reader task), `endpoint` (dial, accept).

use std::io::{IoSlice, Read, Write};

use bytes::BufMut;
use parking_lot::Mutex;
use tokio::net::TcpStream;

use crate::tls::{CertRole, TlsConfig};

/// Bytes decrypted per read call at most (one TLS record's worth of plaintext).
const TLS_READ_CHUNK: usize = 16 * 1024;

/// A TLS session and the buffer its plaintext is read through (allocated once per
/// connection, not per read).
struct TlsState {
    session: rustls::Connection,
    scratch: Box<[u8]>,
}

impl TlsState {
    fn new(session: rustls::Connection) -> Mutex<Self> {
        Mutex::new(Self {
            session,
            scratch: vec![0u8; TLS_READ_CHUNK].into_boxed_slice(),
        })
    }
}

/// A plain or TLS stream over one TCP socket.
pub(crate) struct NetStream {
    tcp: TcpStream,
    tls: Option<Mutex<TlsState>>,
    /// The role the other end's certificate names (TLS only; read once after the
    /// handshake).
    peer_role: Option<CertRole>,
}

/// The role named by the certificate the other end of `session` presented.
pub(crate) fn peer_role(session: &rustls::CommonState) -> Option<CertRole> {
    session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(CertRole::of_certificate)
}

impl std::fmt::Debug for NetStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetStream")
            .field("tcp", &self.tcp)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// `Read`/`Write` on a tokio socket without waiting: `WouldBlock` when not ready.
struct TryIo<'a>(&'a TcpStream);

impl Read for TryIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for TryIo<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn invalid(error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, error.to_string())
}

fn would_block(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::WouldBlock
}

/// Runs a TLS handshake on `tcp` to its end (both directions flushed).
async fn handshake(tcp: &TcpStream, session: &mut rustls::Connection) -> std::io::Result<()> {
    loop {
        if session.wants_write() {
            match session.write_tls(&mut TryIo(tcp)) {
                Ok(_) => {}
                Err(error) if would_block(&error) => tcp.writable().await?,
                Err(error) => return Err(error),
            }
            continue;
        }
        if !session.is_handshaking() {
            return Ok(());
        }
        tcp.readable().await?;
        match session.read_tls(&mut TryIo(tcp)) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed during the TLS handshake",
                ))
            }
            Ok(_) => {
                if let Err(error) = session.process_new_packets() {
                    // Send the alert that says why, if the socket takes it.
                    let _ = session.write_tls(&mut TryIo(tcp));
                    return Err(invalid(format!("TLS handshake: {error}")));
                }
            }
            Err(error) if would_block(&error) => {}
            Err(error) => return Err(error),
        }
    }
}

impl NetStream {
    /// A plain TCP stream.
    pub(crate) fn plain(tcp: TcpStream) -> Self {
        Self {
            tcp,
            tls: None,
            peer_role: None,
        }
    }

    /// The role the other end's certificate names (`None` without TLS, or if it names
    /// no single role).
    pub(crate) fn peer_role(&self) -> Option<CertRole> {
        self.peer_role
    }

    /// Whether the stream is encrypted.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The connector's TLS handshake on a connected socket.
    pub(crate) async fn tls_connect(tcp: TcpStream, tls: &TlsConfig) -> std::io::Result<Self> {
        let session = rustls::ClientConnection::new(tls.client.clone(), tls.server_name.clone())
            .map_err(invalid)?;
        let mut session = rustls::Connection::Client(session);
        handshake(&tcp, &mut session).await?;
        Ok(Self {
            tcp,
            peer_role: peer_role(&session),
            tls: Some(TlsState::new(session)),
        })
    }

    /// The acceptor's TLS handshake on an accepted socket. A connector that speaks
    /// plaintext (no TLS record first) is refused with a clear error.
    pub(crate) async fn tls_accept(tcp: TcpStream, tls: &TlsConfig) -> std::io::Result<Self> {
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await? == 1 && first[0] != 0x16 {
            return Err(invalid(
                "plaintext connection to a TLS endpoint (the connector needs TLS)",
            ));
        }
        let session = rustls::ServerConnection::new(tls.server.clone()).map_err(invalid)?;
        let mut session = rustls::Connection::Server(session);
        handshake(&tcp, &mut session).await?;
        Ok(Self {
            tcp,
            peer_role: peer_role(&session),
            tls: Some(TlsState::new(session)),
        })
    }

    /// Waits until a read may make progress: the socket is readable, or (TLS) decrypted
    /// bytes are waiting in the session.
    pub(crate) async fn readable(&self) -> std::io::Result<()> {
        if let Some(tls) = &self.tls {
            let state = tls.lock().session.process_new_packets().map_err(invalid)?;
            if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() {
                return Ok(());
            }
        }
        self.tcp.readable().await
    }

    /// Reads what is there into `buf` without waiting: `WouldBlock` if nothing is.
    /// `Ok(0)` at the end of the stream.
    pub(crate) fn try_read_buf(&self, buf: &mut impl BufMut) -> std::io::Result<usize> {
        let Some(tls) = &self.tls else {
            return self.tcp.try_read_buf(buf);
        };
        let mut tls = tls.lock();
        let TlsState { session, scratch } = &mut *tls;
        let want = buf.remaining_mut().min(scratch.len());
        loop {
            match session.reader().read(&mut scratch[..want]) {
                Ok(read) => {
                    buf.put_slice(&scratch[..read]);
                    return Ok(read);
                }
                Err(error) if would_block(&error) => {}
                Err(error) => return Err(error),
            }
            // Nothing decrypted: feed the session from the socket.
            match session.read_tls(&mut TryIo(&self.tcp)) {
                Ok(0) => return Ok(0),
                Ok(_) => {
                    session.process_new_packets().map_err(invalid)?;
                    if session.wants_write() {
                        // An alert or key update to answer: best effort, the writer's
                        // next flush sends the rest.
                        let _ = session.write_tls(&mut TryIo(&self.tcp));
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Waits until the socket may take bytes.
    pub(crate) async fn writable(&self) -> std::io::Result<()> {
        self.tcp.writable().await
    }

    /// Writes (TLS: encrypts) what it can of `slices` without waiting; `WouldBlock` if the
    /// socket takes nothing. For TLS, accepted bytes may wait in the session until the
    /// socket takes them: call [`NetStream::flush`] before going idle.
    pub(crate) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let Some(tls) = &self.tls else {
            return self.tcp.try_write_vectored(slices);
        };
        let session = &mut tls.lock().session;
        // Ciphertext of earlier writes goes first; with it still waiting, take nothing new.
        while session.wants_write() {
            if session.write_tls(&mut TryIo(&self.tcp))? == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
        }
        // rustls (0.23) fills each record from as many slices as fit, so small frames
        // share records without being gathered into one buffer first (up to its 64 KiB
        // send buffer per call).
        let accepted = session.writer().write_vectored(slices)?;
        while session.wants_write() {
            match session.write_tls(&mut TryIo(&self.tcp)) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(error) if would_block(&error) => break,
                Err(error) => return Err(error),
            }
        }
        if accepted == 0 && !slices.iter().all(|slice| slice.is_empty()) {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(accepted)
    }

    /// Whether ciphertext waits in the TLS session for the socket (always `false` for
    /// plain TCP): then someone must [`flush`](Self::flush).
    pub(crate) fn wants_flush(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|tls| tls.lock().session.wants_write())
    }

    /// Writes out every ciphertext byte waiting in the TLS session (no-op for plain TCP).
    pub(crate) async fn flush(&self) -> std::io::Result<()> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        loop {
            let result = {
                let session = &mut tls.lock().session;
                if !session.wants_write() {
                    return Ok(());
                }
                session.write_tls(&mut TryIo(&self.tcp))
            };
            match result {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(error) if would_block(&error) => self.tcp.writable().await?,
                Err(error) => return Err(error),
            }
        }
    }

    /// Reads exactly `buf.len()` bytes (handshakes).
    pub(crate) async fn read_exact(&self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            self.readable().await?;
            let mut rest = &mut buf[filled..];
            match self.try_read_buf(&mut rest) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(read) => filled += read,
                Err(error) if would_block(&error) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Writes all of `bytes` and flushes (handshakes).
    pub(crate) async fn write_all(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut written = 0;
        while written < bytes.len() {
            self.writable().await?;
            match self.try_write_vectored(&[IoSlice::new(&bytes[written..])]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(count) => written += count,
                Err(error) if would_block(&error) => {}
                Err(error) => return Err(error),
            }
        }
        self.flush().await
    }
}

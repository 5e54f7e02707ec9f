//! Direct request lanes: the calling side of `NetHandle::request_blocking`'s fast path.
//!
//! A lane is a TCP connection to one node that carries requests of one calling thread at a
//! time, written and read by that thread itself with blocking socket calls: one write and
//! (for a response that fits one read) one read per request, no hand-off to the endpoint's
//! I/O thread and back. Lanes are opened with the normal authenticated handshake plus the
//! lane flag in the connector's greeting (`docs/wire-format.md`, "Lanes"); the accepting
//! node serves them with its usual reader task and handlers but never makes one its
//! connection to the caller (no replacement, no `ConnectionLost` events). Under TLS a lane
//! is a TLS connection of its own ([`LaneSocket`]: the same client configuration and
//! checks as the endpoint's connections, handshaken by the blocking dial), whose session
//! the calling thread drives itself.
//!
//! This module holds the per-node pools of idle lanes and the blocking request on one
//! lane; the endpoint decides when a lane is used and opens lanes (`endpoint/lanes.rs`,
//! `endpoint/dial.rs`) and fences them (`endpoint/handle.rs`).
//!
//! Invariants:
//! - A lane carries one request at a time; it goes back to its pool only after a complete,
//!   matching response was read and nothing else is buffered. Any failure (timeout, socket
//!   error, a bad frame, an unexpected byte) drops it: no late response is ever read as the
//!   answer to a later request.
//! - At most `Config::lanes_per_node_max` lanes per node are open or being opened
//!   (`NodeLanes::sockets` plus `NodeLanes::opening`).
//! - Closing a node's lanes (fence, shutdown) shuts down every open socket, also those in
//!   use: their calls fail at once, and the lanes are dropped when handed back.
//! - Every read is bounded by the request's deadline (the socket's receive timeout, set
//!   only when it changes, or the clock while spinning), every write by the send timeout.
//! - A lane's socket is in non-blocking mode only after a spin or a stale check, until a
//!   blocking read or write needs it back (`Lane::nonblocking` tracks the mode, so
//!   back-to-back spinning requests switch it once, not per request).
//!
//! Spinning: a caller that is alone (no other thread of the process waits on a lane of
//! any endpoint, see [`OutgoingLanes::caller`]) polls its lane with non-blocking reads
//! for up to `Config::lane_spin` before it blocks, as DXNet's threads busy-poll while the
//! CPUs are not overprovisioned. Where idle CPUs halt (virtual machines), a thread that blocks for
//! a response pays the wake-up of a halted CPU on top of the round trip; polling keeps
//! its CPU running. Callers that share the CPUs (more than one waiting) never spin, and
//! a spinning thread that finds it lost its CPU meanwhile (the machine is busy) pauses
//! spinning for the whole process for a while (`SpinGate`).

use std::collections::HashMap;
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

use crate::error::FrameError;
use crate::wire::{FrameDecoder, FrameHeader, Kind, Reassembler, HEADER_BYTES};
use crate::NodeId;

/// Bytes a lane asks the kernel for per read, at least (small responses fit one read).
const LANE_READ_BYTES: usize = 8 * 1024;

/// A receive timeout set on a lane's socket may exceed the time left by this much before
/// it is set again (so that back-to-back requests with one timeout make no extra system
/// call; a deadline may thus be overshot by this much).
const READ_TIMEOUT_SLACK: Duration = Duration::from_millis(1);

/// Figures about the direct request lanes to and from one node (see
/// `NetHandle::lane_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Lanes this endpoint opened to the node (idle or in use).
    pub outgoing_open: usize,
    /// Of those, lanes idle in the pool.
    pub outgoing_idle: usize,
    /// Lanes the node opened to this endpoint and this endpoint serves.
    pub incoming: usize,
    /// Lanes opened to the node since the endpoint started (for reuse figures).
    pub outgoing_opened_total: u64,
    /// Reads on lanes to the node that found data while their caller spun (see
    /// `Config::lane_spin`), since the endpoint started; counted when a lane goes back to
    /// the pool or is dropped.
    pub outgoing_spin_reads_total: u64,
}

/// Why a request on a lane failed; the lane is dropped in every case.
#[derive(Debug)]
pub(crate) enum LaneFailure {
    /// The deadline passed before the response arrived.
    Timeout,
    /// The socket failed or the peer closed it.
    Io(std::io::Error),
    /// The peer sent something other than the response.
    Protocol(FrameError),
    /// A frame of the wrong kind, ID or type arrived.
    Unexpected,
}

impl std::fmt::Display for LaneFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaneFailure::Timeout => write!(f, "timed out"),
            LaneFailure::Io(error) => write!(f, "socket error: {error}"),
            LaneFailure::Protocol(error) => write!(f, "protocol violation: {error}"),
            LaneFailure::Unexpected => write!(f, "a frame that is not the response"),
        }
    }
}

/// A lane's byte stream: its TCP socket, plain or carrying a rustls client session. Reads
/// and writes behave as the socket's (blocking with its timeouts, or non-blocking with
/// `WouldBlock`), on plaintext. A TLS write may leave ciphertext in the session when the
/// socket takes less: [`Write::flush`] sends it (the next write sends it first, too).
pub(crate) struct LaneSocket {
    tcp: TcpStream,
    tls: Option<Box<rustls::ClientConnection>>,
}

impl std::fmt::Debug for LaneSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneSocket")
            .field("tcp", &self.tcp)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl LaneSocket {
    /// A plain lane socket.
    pub fn plain(tcp: TcpStream) -> Self {
        Self { tcp, tls: None }
    }

    /// A lane socket whose TLS session (handshaken or not: the first read or write
    /// completes the handshake's I/O) runs over `tcp`.
    pub fn tls(tcp: TcpStream, session: rustls::ClientConnection) -> Self {
        Self {
            tcp,
            tls: Some(Box::new(session)),
        }
    }

    /// The role the other end's certificate names (`None` without TLS).
    pub fn peer_role(&self) -> Option<crate::CertRole> {
        self.tls
            .as_deref()
            .and_then(|session| crate::stream::peer_role(session))
    }

    /// The TCP socket (modes, timeouts, shutdown).
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Runs the TLS handshake to its end (blocking, bounded by the socket's timeouts);
    /// nothing to do for a plain socket.
    pub fn handshake(&mut self) -> std::io::Result<()> {
        if let Some(session) = &mut self.tls {
            while session.is_handshaking() {
                session.complete_io(&mut self.tcp)?;
            }
        }
        self.flush()
    }
}

impl Read for LaneSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(session) = &mut self.tls else {
            return self.tcp.read(buf);
        };
        loop {
            match session.reader().read(buf) {
                Ok(read) => return Ok(read),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
            // Nothing decrypted yet: feed the session from the socket (as its mode says).
            if session.read_tls(&mut self.tcp)? == 0 {
                return Ok(0);
            }
            session.process_new_packets().map_err(|error| {
                // Send the alert that says why, if the socket takes it.
                let _ = session.write_tls(&mut self.tcp);
                std::io::Error::new(std::io::ErrorKind::InvalidData, error)
            })?;
        }
    }
}

impl Write for LaneSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
        if self.tls.is_none() {
            return self.tcp.write_vectored(slices);
        }
        // Ciphertext of earlier writes goes first; with it still waiting, take nothing new.
        self.flush()?;
        let Some(session) = &mut self.tls else {
            return Ok(0);
        };
        // One record for a frame's header and payload (rustls fills records from as many
        // slices as fit); its ciphertext goes out on the next write or flush.
        session.writer().write_vectored(slices)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(session) = &mut self.tls {
            while session.wants_write() {
                if session.write_tls(&mut self.tcp)? == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
            }
        }
        Ok(())
    }
}

/// One open lane, owned by the pool or by the thread using it.
#[derive(Debug)]
pub(crate) struct Lane {
    id: u64,
    socket: LaneSocket,
    buf: BytesMut,
    read_timeout: Option<Duration>,
    last_used: Instant,
    /// The peer's endpoint instance (a lane of an older instance is never reused).
    pub peer_instance: u64,
    next_request_id: u32,
    /// Whether the socket is in non-blocking mode (set by a spinning read or the stale
    /// check; blocking reads and writes switch it back when they need it).
    nonblocking: bool,
    /// Reads that found data while spinning, not yet added to the node's total.
    spin_reads: u64,
    /// A spin of the last request lost its CPU (see [`Caller::spun_on`]).
    spin_preempted: bool,
}

impl Lane {
    /// Whether the peer has closed the lane (or sent bytes nobody asked for) while it was
    /// idle. Checked only for lanes idle longer than `idle_min`: a request on a lane the
    /// peer closed would fail with `ConnectionLost` although a new lane would work.
    pub fn is_stale(&mut self, idle_min: Duration) -> bool {
        if self.last_used.elapsed() < idle_min {
            return false;
        }
        if self.set_nonblocking(true).is_err() {
            return true;
        }
        let mut probe = [0u8; 1];
        !matches!(
            self.socket.tcp.peek(&mut probe),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock
        )
    }

    /// Switches the socket's mode if it is not `nonblocking` already.
    fn set_nonblocking(&mut self, nonblocking: bool) -> std::io::Result<()> {
        if self.nonblocking != nonblocking {
            self.socket.tcp.set_nonblocking(nonblocking)?;
            self.nonblocking = nonblocking;
        }
        Ok(())
    }

    /// Sends one request and reads its response (reassembling fragments), blocking this
    /// thread until the response is complete or `deadline` passes.
    pub fn call(
        &mut self,
        header: FrameHeader,
        payload: &Bytes,
        deadline: Instant,
        spin: Duration,
        message_bytes_max: usize,
    ) -> Result<Bytes, LaneFailure> {
        let sent = self.send(header, payload)?;
        self.receive(&sent, deadline, spin, message_bytes_max)
    }

    /// Writes one request (its message ID assigned here); returns the header sent, which
    /// [`receive`](Self::receive) matches the response against. Nothing else may be sent
    /// on the lane until that response was read.
    pub fn send(
        &mut self,
        header: FrameHeader,
        payload: &Bytes,
    ) -> Result<FrameHeader, LaneFailure> {
        let request_id = self.next_request_id;
        self.next_request_id = self.next_request_id.wrapping_add(1).max(1);
        let header = FrameHeader {
            message_id: request_id,
            ..header
        };
        self.write_frame(&header.encode(), payload)?;
        Ok(header)
    }

    /// Reads the response to the request `sent` (reassembling fragments), blocking this
    /// thread until it is complete or `deadline` passes. For up to `spin` (zero: not at
    /// all) the thread polls the socket instead of blocking (see the module docs).
    pub fn receive(
        &mut self,
        sent: &FrameHeader,
        deadline: Instant,
        spin: Duration,
        message_bytes_max: usize,
    ) -> Result<Bytes, LaneFailure> {
        let mut spin_until = (!spin.is_zero())
            .then(|| Instant::now().checked_add(spin))
            .flatten()
            .map(|until| until.min(deadline));
        let decoder = FrameDecoder::default();
        let mut reassembler = Reassembler::new(message_bytes_max);
        loop {
            while let Some(frame) = decoder
                .decode(&mut self.buf)
                .map_err(LaneFailure::Protocol)?
            {
                let got = frame.header;
                if got.kind != Kind::Response
                    || got.message_id != sent.message_id
                    || got.type_id != sent.type_id
                    || got.subtype != sent.subtype
                {
                    return Err(LaneFailure::Unexpected);
                }
                if let Some(message) = reassembler.push(frame).map_err(LaneFailure::Protocol)? {
                    if !self.buf.is_empty() {
                        return Err(LaneFailure::Unexpected);
                    }
                    self.last_used = Instant::now();
                    return Ok(message.payload);
                }
            }
            let needed = decoder
                .bytes_needed(&self.buf)
                .saturating_sub(self.buf.len());
            let bytes = needed.max(LANE_READ_BYTES);
            let spun = match spin_until {
                Some(until) => self.spin_read(bytes, until)?,
                None => false,
            };
            if !spun {
                // The spin is over for this response (or there was none): block.
                spin_until = None;
                self.read_some(bytes, deadline)?;
            }
        }
    }

    fn write_frame(
        &mut self,
        head: &[u8; HEADER_BYTES],
        payload: &Bytes,
    ) -> Result<(), LaneFailure> {
        let mut head = &head[..];
        let mut body = &payload[..];
        loop {
            // Once the frame is written, what TLS left in its session goes out.
            let done = head.is_empty() && body.is_empty();
            let result = if done {
                self.socket.flush().map(|()| 0)
            } else {
                self.socket
                    .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
            };
            let written = match result {
                Ok(0) if done => return Ok(()),
                Ok(0) => return Err(LaneFailure::Io(std::io::ErrorKind::WriteZero.into())),
                Ok(written) => written,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                // Left non-blocking by a spin and the send buffer is full: block (bounded
                // by the send timeout) for the rest.
                Err(error)
                    if self.nonblocking && error.kind() == std::io::ErrorKind::WouldBlock =>
                {
                    self.set_nonblocking(false).map_err(LaneFailure::Io)?;
                    continue;
                }
                Err(error) if is_timeout(&error) => return Err(LaneFailure::Timeout),
                Err(error) => return Err(LaneFailure::Io(error)),
            };
            let from_head = written.min(head.len());
            head = head.get(from_head..).unwrap_or_default();
            body = body.get(written - from_head..).unwrap_or_default();
        }
    }

    /// Polls the socket with non-blocking reads of up to `bytes` bytes (appended to the
    /// buffer) until one returns data (`true`) or `until` passes (`false`: nothing read).
    fn spin_read(&mut self, bytes: usize, until: Instant) -> Result<bool, LaneFailure> {
        self.set_nonblocking(true).map_err(LaneFailure::Io)?;
        let start = self.buf.len();
        self.buf.resize(start + bytes, 0);
        let mut polled = Instant::now();
        let outcome = loop {
            match self
                .socket
                .read(self.buf.get_mut(start..).unwrap_or_default())
            {
                Ok(0) => break Err(LaneFailure::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(read) => {
                    self.spin_reads += 1;
                    break Ok(read);
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    let now = Instant::now();
                    if now.duration_since(polled) >= SPIN_PREEMPTED_GAP {
                        // This thread lost its CPU meanwhile: stop spinning.
                        self.spin_preempted = true;
                        break Ok(0);
                    }
                    if now >= until {
                        break Ok(0);
                    }
                    polled = now;
                    // Lets a thread that waits for this CPU (the answering node's, when
                    // it runs on this machine) go first; returns at once otherwise.
                    std::thread::yield_now();
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => break Err(LaneFailure::Io(error)),
            }
        };
        self.buf.truncate(start + *outcome.as_ref().unwrap_or(&0));
        outcome.map(|read| read > 0)
    }

    /// One read of up to `bytes` bytes appended to the buffer, waiting at most until
    /// `deadline`.
    fn read_some(&mut self, bytes: usize, deadline: Instant) -> Result<(), LaneFailure> {
        self.set_nonblocking(false).map_err(LaneFailure::Io)?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LaneFailure::Timeout);
            }
            let fits = self
                .read_timeout
                .is_some_and(|set| set <= left + READ_TIMEOUT_SLACK);
            if !fits {
                self.socket
                    .tcp
                    .set_read_timeout(Some(left))
                    .map_err(LaneFailure::Io)?;
                self.read_timeout = Some(left);
            }
            let start = self.buf.len();
            self.buf.resize(start + bytes, 0);
            let result = self
                .socket
                .read(self.buf.get_mut(start..).unwrap_or_default());
            self.buf.truncate(start + *result.as_ref().unwrap_or(&0));
            match result {
                Ok(0) => return Err(LaneFailure::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(_) => return Ok(()),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                // The receive timeout ran out: check the deadline again (a timeout set
                // for an earlier, shorter wait may have ended early).
                Err(error) if is_timeout(&error) => {
                    self.read_timeout = None;
                }
                Err(error) => return Err(LaneFailure::Io(error)),
            }
        }
    }
}

fn is_timeout(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The lanes to one node.
#[derive(Debug, Default)]
struct NodeLanes {
    /// Lanes waiting for a caller, most recently used last.
    idle: Vec<Lane>,
    /// A second handle to every open lane's socket (idle or in use), by lane ID, to shut
    /// it down when the node's lanes are closed.
    sockets: HashMap<u64, TcpStream>,
    /// Lanes being opened (counted against the limit).
    opening: usize,
    /// Lanes opened so far.
    opened_total: u64,
    /// Spinning reads that found data, of the lanes handed back or dropped so far.
    spin_reads_total: u64,
}

/// What [`OutgoingLanes::take`] found.
#[derive(Debug)]
pub(crate) enum Take {
    /// An idle lane, now owned by the caller.
    Idle(Lane),
    /// No idle lane; the caller may open one (a slot is reserved: call
    /// [`OutgoingLanes::opened`] or [`OutgoingLanes::open_failed`]).
    Open,
    /// The node has its maximum of lanes, all in use.
    Full,
}

/// A gap this long between two polls of a spinning read means its thread lost the CPU
/// (another thread wanted it): spinning then pauses for [`SPIN_PAUSE`].
const SPIN_PREEMPTED_GAP: Duration = Duration::from_micros(20);

/// How long nobody of the process spins after a spinning thread lost its CPU.
const SPIN_PAUSE: Duration = Duration::from_millis(100);

/// Whether the callers of a process may spin (see the module docs): the threads in a
/// blocking request on lanes now, over all endpoints (a process with one client per
/// thread has many endpoints, and their callers share the CPUs all the same), and a
/// pause after a spinning thread lost its CPU (the machine is busy: a spinning thread
/// would use up its share and then wait behind others once its answer is there).
#[derive(Debug, Default)]
pub(crate) struct SpinGate {
    callers: AtomicUsize,
    /// Nanoseconds after `epoch` before which nobody spins.
    paused_until: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl SpinGate {
    const fn new() -> SpinGate {
        SpinGate {
            callers: AtomicUsize::new(0),
            paused_until: AtomicU64::new(0),
            epoch: std::sync::OnceLock::new(),
        }
    }

    fn now_ns(&self) -> u64 {
        let elapsed = self.epoch.get_or_init(Instant::now).elapsed();
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The process's [`SpinGate`].
static SPIN_GATE: SpinGate = SpinGate::new();

/// The calling side's lanes, per node.
#[derive(Debug)]
pub(crate) struct OutgoingLanes {
    nodes: Mutex<HashMap<NodeId, NodeLanes>>,
    next_id: AtomicU64,
    /// Who may spin: the process-wide [`SPIN_GATE`] (a test's own in unit tests).
    gate: &'static SpinGate,
}

impl Default for OutgoingLanes {
    fn default() -> Self {
        OutgoingLanes {
            nodes: Mutex::default(),
            next_id: AtomicU64::default(),
            gate: &SPIN_GATE,
        }
    }
}

/// A thread's blocking request (or batch of requests) on lanes, counted while it lives.
#[derive(Debug)]
pub(crate) struct Caller<'a> {
    gate: &'a SpinGate,
}

impl Caller<'_> {
    /// How long this caller may spin for a response now: `spin` while it is the only
    /// caller of the process and spinning is not paused, else zero (the CPUs are
    /// shared: block at once).
    pub fn spin(&self, spin: Duration) -> Duration {
        let gate = self.gate;
        let alone = gate.callers.load(Ordering::Relaxed) <= 1;
        if alone && gate.now_ns() >= gate.paused_until.load(Ordering::Relaxed) {
            spin
        } else {
            Duration::ZERO
        }
    }

    /// After a request on `lane`: pauses spinning if its spin lost the CPU.
    pub fn spun_on(&self, lane: &mut Lane) {
        if std::mem::take(&mut lane.spin_preempted) {
            let pause = u64::try_from(SPIN_PAUSE.as_nanos()).unwrap_or(u64::MAX);
            let until = self.gate.now_ns().saturating_add(pause);
            self.gate.paused_until.fetch_max(until, Ordering::Relaxed);
        }
    }
}

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.gate.callers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl OutgoingLanes {
    /// Counts the calling thread as waiting on lanes (of any endpoint of the process)
    /// until the guard is dropped.
    pub fn caller(&self) -> Caller<'static> {
        self.gate.callers.fetch_add(1, Ordering::Relaxed);
        Caller { gate: self.gate }
    }

    /// Takes an idle lane to `node` or reserves the right to open one (at most `max`).
    pub fn take(&self, node: NodeId, max: usize) -> Take {
        let mut nodes = self.nodes.lock();
        let lanes = nodes.entry(node).or_default();
        if let Some(lane) = lanes.idle.pop() {
            return Take::Idle(lane);
        }
        if lanes.sockets.len() + lanes.opening >= max {
            return Take::Full;
        }
        lanes.opening += 1;
        Take::Open
    }

    /// A reserved opening failed or was refused: frees its slot.
    pub fn open_failed(&self, node: NodeId) {
        if let Some(lanes) = self.nodes.lock().get_mut(&node) {
            lanes.opening = lanes.opening.saturating_sub(1);
        }
    }

    /// A reserved opening succeeded: registers the lane (in use by the caller). Idle lanes
    /// of another instance of the peer (it restarted) are closed. `None` (and the slot
    /// freed) if the socket cannot be duplicated.
    pub fn opened(&self, node: NodeId, socket: LaneSocket, peer_instance: u64) -> Option<Lane> {
        let handle = socket.tcp.try_clone();
        let mut nodes = self.nodes.lock();
        let lanes = nodes.entry(node).or_default();
        lanes.opening = lanes.opening.saturating_sub(1);
        let handle = handle.ok()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lanes.sockets.insert(id, handle);
        lanes.opened_total += 1;
        let stale: Vec<Lane> = {
            let (keep, stale) = std::mem::take(&mut lanes.idle)
                .into_iter()
                .partition(|lane| lane.peer_instance == peer_instance);
            lanes.idle = keep;
            stale
        };
        for lane in &stale {
            lanes.sockets.remove(&lane.id);
        }
        drop(nodes);
        Some(Lane {
            id,
            socket,
            buf: BytesMut::new(),
            read_timeout: None,
            last_used: Instant::now(),
            peer_instance,
            next_request_id: 1,
            nonblocking: false,
            spin_reads: 0,
            spin_preempted: false,
        })
    }

    /// Hands a lane that finished a request cleanly back to the pool (dropped if the
    /// node's lanes were closed meanwhile).
    pub fn give_back(&self, node: NodeId, mut lane: Lane) {
        let mut nodes = self.nodes.lock();
        if let Some(lanes) = nodes.get_mut(&node) {
            lanes.spin_reads_total += std::mem::take(&mut lane.spin_reads);
            if lanes.sockets.contains_key(&lane.id) {
                lanes.idle.push(lane);
            }
        }
    }

    /// Drops a lane that failed (its socket closes).
    pub fn discard(&self, node: NodeId, lane: Lane) {
        if let Some(lanes) = self.nodes.lock().get_mut(&node) {
            lanes.sockets.remove(&lane.id);
            lanes.spin_reads_total += lane.spin_reads;
        }
        let _ = lane.socket.tcp.shutdown(Shutdown::Both);
    }

    /// Closes every lane to `node`, also those in use (their calls fail).
    pub fn close_node(&self, node: NodeId) {
        let lanes = self.nodes.lock().remove(&node);
        if let Some(lanes) = lanes {
            for socket in lanes.sockets.values() {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }

    /// Closes every lane (endpoint shutdown).
    pub fn close_all(&self) {
        let nodes: Vec<NodeLanes> = self.nodes.lock().drain().map(|(_, lanes)| lanes).collect();
        for lanes in nodes {
            for socket in lanes.sockets.values() {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }

    /// Closes lanes idle for longer than `idle_max`.
    pub fn sweep(&self, idle_max: Duration) {
        let mut closed = Vec::new();
        {
            let mut nodes = self.nodes.lock();
            for lanes in nodes.values_mut() {
                let (keep, old): (Vec<Lane>, Vec<Lane>) = std::mem::take(&mut lanes.idle)
                    .into_iter()
                    .partition(|lane| lane.last_used.elapsed() <= idle_max);
                lanes.idle = keep;
                for lane in &old {
                    lanes.sockets.remove(&lane.id);
                }
                closed.extend(old);
            }
        }
        for lane in closed {
            let _ = lane.socket.tcp.shutdown(Shutdown::Both);
        }
    }

    /// The calling side's figures for `node` (`incoming` left 0).
    pub fn stats(&self, node: NodeId) -> LaneStats {
        let nodes = self.nodes.lock();
        match nodes.get(&node) {
            Some(lanes) => LaneStats {
                outgoing_open: lanes.sockets.len(),
                outgoing_idle: lanes.idle.len(),
                incoming: 0,
                outgoing_opened_total: lanes.opened_total,
                outgoing_spin_reads_total: lanes.spin_reads_total,
            },
            None => LaneStats::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lone_caller_spins() {
        // A gate of its own: other tests of this process use the process-wide one.
        let lanes = OutgoingLanes {
            gate: Box::leak(Box::new(SpinGate::new())),
            ..OutgoingLanes::default()
        };
        let spin = Duration::from_micros(50);
        let first = lanes.caller();
        assert_eq!(first.spin(spin), spin, "alone");
        let second = lanes.caller();
        assert_eq!(
            first.spin(spin),
            Duration::ZERO,
            "two callers share the CPUs"
        );
        assert_eq!(second.spin(spin), Duration::ZERO);
        drop(second);
        assert_eq!(first.spin(spin), spin, "alone again");
        // A spin that lost its CPU pauses spinning.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let stream = TcpStream::connect(listener.local_addr().expect("address")).expect("dial");
        assert!(matches!(lanes.take(NodeId(2), 1), Take::Open));
        let mut lane = lanes
            .opened(NodeId(2), LaneSocket::plain(stream), 1)
            .expect("lane");
        lane.spin_preempted = true;
        first.spun_on(&mut lane);
        assert!(!lane.spin_preempted, "noted once");
        assert_eq!(first.spin(spin), Duration::ZERO, "paused");
        drop(first);
        assert_eq!(lanes.gate.callers.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_write_on_a_socket_a_spin_left_non_blocking_waits_for_room() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let stream = TcpStream::connect(listener.local_addr().expect("address")).expect("dial");
        let (mut peer, _) = listener.accept().expect("accept");
        let lanes = OutgoingLanes::default();
        assert!(matches!(lanes.take(NodeId(2), 1), Take::Open));
        let mut lane = lanes
            .opened(NodeId(2), LaneSocket::plain(stream), 1)
            .expect("lane");
        lane.set_nonblocking(true).expect("non-blocking");
        // Far more than the socket buffers hold while the peer does not read yet.
        let payload = Bytes::from(vec![7u8; 8 << 20]);
        let expected = HEADER_BYTES + payload.len();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut received = 0;
            let mut chunk = vec![0u8; 1 << 16];
            while received < expected {
                match peer.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => received += read,
                }
            }
            received
        });
        let header = FrameHeader {
            kind: crate::wire::Kind::Request,
            ordered: false,
            fragment: crate::wire::Fragment::Whole,
            type_id: 1,
            subtype: 1,
            message_id: 0,
            payload_bytes: payload.len() as u32,
        };
        lane.send(header, &payload).expect("written in full");
        assert!(
            !lane.nonblocking,
            "the full send buffer switched it to blocking"
        );
        assert_eq!(reader.join().expect("reader"), expected);
    }
}

//! A connection's reader task: reads the socket, cuts frames, completes responses, runs
//! inline handlers and hands the other messages to the handler pool in batches, and
//! applies receive-side flow control.
//!
//! Particular to this module: it is the only code that turns received bytes into work
//! (everything above the wire decoder), and the only place that stops reading a
//! connection. It sits above `conn` (the connection it reads for), `handler` (the handler
//! table and the inline run) and `pool` (the batch it hands off); what it needs from its
//! endpoint comes through the narrow [`ReaderContext`] trait, so it never names the
//! endpoint.
//!
//! Invariants: frames are handled in stream order; per read, ordered messages go in one
//! batch to the connection's pool lane and unordered ones in another; unprocessed bytes
//! stay within `receive_unprocessed_bytes_max` plus one read (the reader waits for the
//! handlers above the limit).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

use crate::config::{READ_BUFFER_BYTES, READ_BUFFER_BYTES_MIN, READ_SPACE_BYTES_MIN};
use crate::conn::{CloseReason, Conn, Direct};
use crate::error::FrameError;
use crate::fault::{DelayLine, DELAY_INCOMING, DROP_INCOMING};
use crate::handler::{self, type_key, Delivery, HandlerMap, Registered};
use crate::pool::Batch;
use crate::stream::NetStream;
use crate::wire::{FrameDecoder, Kind, Reassembler, HEADER_BYTES};

/// What the reader needs from its endpoint.
pub(crate) trait ReaderContext {
    /// The current handler table.
    fn handlers(&self) -> Arc<HandlerMap>;
    /// Hands a batch to the handler pool (ordered batches to the connection's lane).
    fn dispatch(&self, batch: Batch, ordered: bool);
    /// Milliseconds since the endpoint started.
    fn now_ms(&self) -> u64;
}

/// How long a connection whose receive buffer grew (a burst of large messages, such as
/// replication during a bulk load) must stay quiet, with the buffer empty, before the
/// buffer is exchanged for a fresh [`READ_BUFFER_BYTES_MIN`] one. The grown buffer (up to
/// [`READ_BUFFER_BYTES`], resident once walked through) is freed when the last frame cut
/// from it is dropped.
pub(crate) const RECEIVE_BUFFER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The reader task: reads, cuts frames, dispatches, and applies flow control. Returns why
/// the connection ended.
pub(crate) async fn reader_loop(
    conn: Arc<Conn>,
    stream: Arc<NetStream>,
    context: &impl ReaderContext,
) -> CloseReason {
    let decoder = FrameDecoder::default();
    let mut reassembler = Reassembler::new(conn.limits.message_bytes_max);
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES_MIN);
    // How much the buffer grows by when it runs out of space (see READ_BUFFER_BYTES_MIN).
    let mut step = READ_BUFFER_BYTES_MIN;
    let mut closed = conn.close_watch();
    // Set while an incoming delay (test filter) holds or may hold bytes.
    let mut delayed: Option<Box<IncomingDelay>> = None;
    loop {
        let needed = decoder.bytes_needed(&buf).saturating_sub(buf.len());
        if buf.capacity() - buf.len() < needed.max(READ_SPACE_BYTES_MIN) {
            buf.reserve(needed.max(step));
        }
        let before = buf.len();
        // Read at most one read buffer's worth (or the rest of a large frame): this bounds
        // how far past the flow-control limit one read can go.
        let offered = (buf.capacity() - before).min(needed.max(READ_BUFFER_BYTES));
        let mut limited = (&mut buf).limit(needed.max(READ_BUFFER_BYTES));
        // A buffer that grew for a burst and holds nothing is dropped for a fresh small
        // one once the connection has been quiet for a while (see RECEIVE_BUFFER_IDLE).
        let shrinkable = step > READ_BUFFER_BYTES_MIN && before == 0;
        let read = match delayed.as_mut() {
            None => tokio::select! {
                biased;
                _ = closed.changed() => return CloseReason::Closed,
                read = read_some(&stream, &mut limited) => read,
                () = async { tokio::time::sleep(RECEIVE_BUFFER_IDLE).await }, if shrinkable => {
                    buf = BytesMut::with_capacity(READ_BUFFER_BYTES_MIN);
                    step = READ_BUFFER_BYTES_MIN;
                    conn.set_receive_buffer_bytes(step);
                    continue;
                }
            },
            Some(delay) => tokio::select! {
                biased;
                _ = closed.changed() => return CloseReason::Closed,
                read = delay.read(&conn, &stream, &mut limited) => read,
            },
        };
        let received = match read {
            Ok(0) if buf.is_empty() => return CloseReason::PeerClosed,
            Ok(0) => {
                return CloseReason::Protocol(FrameError::Truncated {
                    buffered_bytes: buf.len(),
                })
            }
            Ok(received) => received,
            Err(error) => return CloseReason::Io(error.to_string()),
        };
        if received >= offered && step < READ_BUFFER_BYTES {
            step = (step * 2).min(READ_BUFFER_BYTES);
            conn.set_receive_buffer_bytes(step);
        }
        conn.touch(context.now_ms());
        conn.count_read(received);
        // The one fault check of this path: one relaxed load (see `crate::fault`).
        let filter = conn.filter.bits();
        if filter & DELAY_INCOMING != 0 && delayed.is_none() {
            // Cold: an incoming delay was just set; the bytes of this read are the first
            // it holds (any partial frame before them stays in `buf`, ahead of them).
            let mut delay = Box::<IncomingDelay>::default();
            delay.hold(&conn, buf.split_off(before).freeze());
            delayed = Some(delay);
            continue;
        }
        if delayed.as_ref().is_some_and(|delay| delay.drained(filter)) {
            delayed = None;
        }
        let dropping = filter & DROP_INCOMING != 0;
        if let Err(error) = cut_and_dispatch(
            &conn,
            &decoder,
            &mut reassembler,
            &mut buf,
            dropping,
            context,
        ) {
            return CloseReason::Protocol(error);
        }
        // Flow control: stop reading while handlers are behind.
        while conn.unprocessed() > conn.limits.receive_unprocessed_bytes_max {
            tokio::select! {
                _ = conn.reader_resumed() => {}
                _ = closed.changed() => return CloseReason::Closed,
            }
        }
    }
}

async fn read_some(stream: &NetStream, buf: &mut impl BufMut) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read_buf(buf) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

/// What an incoming delay holds: bytes read from the socket and not yet due, and how the
/// stream ended if it did (handed on once every byte before it was).
#[derive(Default)]
struct IncomingDelay {
    line: DelayLine,
    end: Option<std::io::Result<usize>>,
}

impl IncomingDelay {
    /// Holds `bytes` for the connection's incoming delay (behind what is held already).
    fn hold(&mut self, conn: &Conn, bytes: Bytes) {
        self.line
            .push(Instant::now() + conn.filter.delay_incoming(), bytes);
    }

    /// Whether the delay is off and nothing is held: the plain path may take over.
    fn drained(&self, filter: u8) -> bool {
        filter & DELAY_INCOMING == 0 && self.line.is_empty() && self.end.is_none()
    }

    /// [`read_some`] through the delay: copies due bytes into `buf`, reading the socket
    /// into the line meanwhile (while it holds less than the connection's unprocessed
    /// limit; beyond, TCP back-pressures the sender). `Ok(0)` or an error only once every
    /// byte read before it was handed on.
    async fn read(
        &mut self,
        conn: &Conn,
        stream: &NetStream,
        buf: &mut impl BufMut,
    ) -> std::io::Result<usize> {
        let held_max = conn
            .limits
            .receive_unprocessed_bytes_max
            .max(READ_BUFFER_BYTES);
        loop {
            let copied = self.line.take_due_into(Instant::now(), buf);
            if copied > 0 {
                return Ok(copied);
            }
            if self.line.is_empty() {
                if let Some(end) = self.end.take() {
                    return end;
                }
            }
            // One of the two branches is always enabled: with the end seen or the line
            // full, the line holds bytes and has a next due time.
            let room = self.end.is_none() && self.line.bytes() < held_max;
            let next_due = self.line.next_due();
            tokio::select! {
                readable = stream.readable(), if room => {
                    if let Err(error) = readable {
                        self.end = Some(Err(error));
                        continue;
                    }
                    let mut piece = BytesMut::with_capacity(READ_BUFFER_BYTES);
                    match stream.try_read_buf(&mut piece) {
                        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                        Ok(0) => self.end = Some(Ok(0)),
                        Ok(_) => self.hold(conn, piece.freeze()),
                        Err(error) => self.end = Some(Err(error)),
                    }
                }
                _ = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {}
            }
        }
    }
}

/// Cuts every complete frame out of `buf` and dispatches the messages they complete.
fn cut_and_dispatch(
    conn: &Arc<Conn>,
    decoder: &FrameDecoder,
    reassembler: &mut Reassembler,
    buf: &mut BytesMut,
    drop_incoming: bool,
    context: &impl ReaderContext,
) -> Result<(), FrameError> {
    let handlers = context.handlers();
    let mut ordered = Vec::new();
    let mut ordered_bytes = 0;
    let mut unordered = Vec::new();
    let mut unordered_bytes = 0;
    let dropping = drop_incoming || conn.fenced.load(Ordering::Relaxed);
    let mut cached: Option<(u16, Registered)> = None;
    while let Some(frame) = decoder.decode(buf)? {
        conn.count_frame();
        let header = frame.header;
        if conn.lane && (header.kind != Kind::Request || header.ordered) {
            return Err(FrameError::NotALaneRequest {
                type_id: header.type_id,
                subtype: header.subtype,
            });
        }
        let handler = if header.kind == Kind::Response {
            None
        } else {
            let key = type_key(header.type_id, header.subtype);
            let entry = match &cached {
                Some((cached_key, entry)) if *cached_key == key => entry.clone(),
                _ => {
                    let entry = handlers.get(&key).cloned().ok_or(FrameError::UnknownType {
                        type_id: header.type_id,
                        subtype: header.subtype,
                    })?;
                    cached = Some((key, entry.clone()));
                    entry
                }
            };
            if entry.ordered != header.ordered {
                return Err(FrameError::OrderingMismatch {
                    type_id: header.type_id,
                    subtype: header.subtype,
                });
            }
            if let Some(allowed) = &entry.senders {
                if !allowed(conn.peer) {
                    return Err(FrameError::SenderRefused {
                        from: conn.peer,
                        type_id: header.type_id,
                        subtype: header.subtype,
                    });
                }
            }
            Some(entry)
        };
        let Some(message) = reassembler.push(frame)? else {
            continue;
        };
        if dropping {
            continue;
        }
        let Some(entry) = handler else {
            conn.complete_request(message.message_id, message.payload);
            continue;
        };
        let bytes = HEADER_BYTES + message.payload.len();
        let delivery = Delivery {
            kind: message.kind,
            type_id: message.type_id,
            subtype: message.subtype,
            ordered: message.ordered,
            message_id: message.message_id,
            payload: message.payload,
            handler: entry.handler,
        };
        if entry.inline {
            // An ordered type is inline only by `register_inline_ordered`: handled here, in
            // stream order, like every inline type.
            // The last complete frame of this read may answer straight to the socket.
            let direct = if buf.len() < HEADER_BYTES {
                Direct::Yes
            } else {
                Direct::Never
            };
            handler::run(conn, delivery, direct);
            continue;
        }
        if message.ordered {
            ordered.push(delivery);
            ordered_bytes += bytes;
        } else {
            unordered.push(delivery);
            unordered_bytes += bytes;
        }
    }
    for (deliveries, bytes, is_ordered) in [
        (ordered, ordered_bytes, true),
        (unordered, unordered_bytes, false),
    ] {
        if deliveries.is_empty() {
            continue;
        }
        conn.add_unprocessed(bytes);
        context.dispatch(
            Batch {
                conn: conn.clone(),
                deliveries,
                bytes,
            },
            is_ordered,
        );
    }
    Ok(())
}

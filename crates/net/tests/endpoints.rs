//! Endpoints talking over real loopback sockets (127.0.0.1, ephemeral ports): ordering,
//! requests and timeouts, reconnects, flow control, large messages, authentication,
//! malformed input, duplicate dials, the connection limit, fencing and the fault switch.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use myriad_net::wire::{self, FrameHeader, Greeting, Kind, GREETING_BYTES, PROOF_BYTES};
use myriad_net::{
    Bytes, CloseReason, Config, Endpoint, Fault, Handlers, Incoming, MessageType, NetError, NodeId,
    READ_BUFFER_BYTES,
};

const SECRET: &str = "test cluster secret";
const ECHO: MessageType = MessageType::unordered(1, 1);
const COUNT: MessageType = MessageType::unordered(1, 2);
const SEQUENCE: MessageType = MessageType::ordered(1, 3);
const SLOW: MessageType = MessageType::unordered(1, 4);
const LARGE: MessageType = MessageType::unordered(1, 5);
const TIMEOUT: Duration = Duration::from_secs(5);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}

fn config(id: u16) -> Config {
    init_tracing();
    let mut config = Config::new(NodeId(id), loopback(), SECRET);
    config.connect_timeout = Duration::from_secs(2);
    config
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Handlers for ECHO (answers with the payload) and COUNT (counts messages).
fn echo_and_count(counter: &Arc<AtomicUsize>) -> Handlers {
    let mut handlers = Handlers::new();
    handlers
        .register(ECHO, |request: Incoming| {
            let payload = request.payload.clone();
            let _ = request.respond(payload);
        })
        .expect("register echo");
    let counter = counter.clone();
    handlers
        .register(COUNT, move |_message: Incoming| {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .expect("register count");
    handlers
}

fn start(config: Config, handlers: Handlers) -> Endpoint {
    Endpoint::start(config, handlers).expect("endpoint starts")
}

fn link(a: &Endpoint, b: &Endpoint) {
    a.set_address(b.node_id(), b.local_addr());
    b.set_address(a.node_id(), a.local_addr());
}

/// Nodes 1 and 2 with ECHO and COUNT handlers (both counting into `counter`), each
/// knowing the other's address.
fn linked_pair(counter: &Arc<AtomicUsize>) -> (Endpoint, Endpoint) {
    let a = start(config(1), echo_and_count(counter));
    let b = start(config(2), echo_and_count(counter));
    link(&a, &b);
    (a, b)
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn request_response_and_send_many_reach_their_handlers() {
    let counter = Arc::new(AtomicUsize::new(0));
    let a = start(config(1), echo_and_count(&counter));
    let b = start(config(2), echo_and_count(&counter));
    let c = start(config(3), echo_and_count(&counter));
    link(&a, &b);
    link(&a, &c);
    let answer = a
        .request_blocking(NodeId(2), ECHO, Bytes::from_static(b"ping"), TIMEOUT)
        .expect("echo");
    assert_eq!(&answer[..], b"ping");
    let results = a.send_many_blocking(&[NodeId(2), NodeId(3)], COUNT, Bytes::from_static(b"x"));
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    wait_until("both counted", || counter.load(Ordering::SeqCst) == 2);
    assert_eq!(
        a.send_blocking(NodeId(9), COUNT, Bytes::new())
            .err()
            .map(|e| e.to_string()),
        Some(NetError::UnknownNode(NodeId(9)).to_string())
    );
}

#[test]
fn ordered_messages_are_handled_one_at_a_time_in_send_order_under_concurrency() {
    const THREADS: usize = 4;
    const PER_THREAD: u32 = 5_000;
    let seen: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(vec![Vec::new(); THREADS]));
    let in_handler = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let mut handlers = Handlers::new();
    {
        let (seen, in_handler, overlapped) = (seen.clone(), in_handler.clone(), overlapped.clone());
        handlers
            .register(SEQUENCE, move |message: Incoming| {
                if in_handler.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlapped.store(true, Ordering::SeqCst);
                }
                let thread = message.payload[0] as usize;
                let sequence = u32::from_le_bytes([
                    message.payload[1],
                    message.payload[2],
                    message.payload[3],
                    message.payload[4],
                ]);
                if sequence.is_multiple_of(1000) {
                    // Give a concurrent handler the chance to overtake, if one could.
                    std::thread::sleep(Duration::from_millis(1));
                }
                seen.lock().expect("lock")[thread].push(sequence);
                in_handler.fetch_sub(1, Ordering::SeqCst);
            })
            .expect("register");
    }
    let mut receiver_config = config(2);
    receiver_config.handler_threads = 4;
    let receiver = start(receiver_config, handlers);
    let sender = start(config(1), Handlers::new());
    link(&sender, &receiver);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let handle = sender.handle();
            scope.spawn(move || {
                for sequence in 0..PER_THREAD {
                    let mut payload = vec![thread as u8];
                    payload.extend_from_slice(&sequence.to_le_bytes());
                    payload.extend_from_slice(&[0u8; 40]);
                    handle
                        .send_blocking(NodeId(2), SEQUENCE, Bytes::from(payload))
                        .expect("send");
                }
            });
        }
    });
    wait_until("all ordered messages", || {
        seen.lock()
            .expect("lock")
            .iter()
            .map(Vec::len)
            .sum::<usize>()
            == THREADS * PER_THREAD as usize
    });
    let seen = seen.lock().expect("lock");
    for (thread, sequences) in seen.iter().enumerate() {
        let expected: Vec<u32> = (0..PER_THREAD).collect();
        assert_eq!(sequences, &expected, "thread {thread} out of order");
    }
    assert!(
        !overlapped.load(Ordering::SeqCst),
        "ordered handler ran concurrently"
    );
}

/// Registers SLOW: answers after `delay` from another thread (the responder moves there).
fn slow_responder(delay: Duration) -> Handlers {
    let counter = Arc::new(AtomicUsize::new(0));
    let mut handlers = echo_and_count(&counter);
    handlers
        .register(SLOW, move |mut request: Incoming| {
            let responder = request.take_responder().expect("a request");
            let payload = request.payload.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let _ = responder.respond(payload);
            });
        })
        .expect("register");
    handlers
}

#[test]
fn request_times_out_and_its_late_response_is_dropped() {
    let a = start(config(1), Handlers::new());
    let b = start(config(2), slow_responder(Duration::from_millis(1000)));
    link(&a, &b);
    let started = Instant::now();
    let outcome = a.request_blocking(
        NodeId(2),
        SLOW,
        Bytes::from_static(b"late"),
        Duration::from_millis(100),
    );
    assert!(
        matches!(outcome, Err(NetError::Timeout(NodeId(2)))),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "timed out late"
    );
    let stats = a.connection_stats(NodeId(2)).expect("connected");
    assert_eq!(stats.pending_requests, 0, "timed-out request forgotten");
    // The first request's late response arrives (at ~1 s) while this one is outstanding
    // (answered at ~1.1 s); it must not be taken for this one's answer.
    let pending = a
        .request_later_blocking(NodeId(2), SLOW, Bytes::from_static(b"second"), TIMEOUT)
        .expect("sent");
    assert_eq!(&pending.wait_blocking().expect("answer")[..], b"second");
    assert!(started.elapsed() >= Duration::from_millis(1000));
    assert_eq!(a.connected_nodes(), vec![NodeId(2)], "connection survived");
}

#[test]
fn thousands_of_outstanding_requests_are_collected_later_in_any_order() {
    const REQUESTS: u32 = 5_000;
    // The server holds every responder until all requests are outstanding, then answers
    // them in reverse order.
    let held: Arc<Mutex<Vec<(u32, myriad_net::Responder)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut handlers = Handlers::new();
    {
        let held = held.clone();
        handlers
            .register(ECHO, move |mut request: Incoming| {
                let index = u32::from_le_bytes(request.payload[..4].try_into().expect("4 bytes"));
                let responder = request.take_responder().expect("request");
                held.lock().expect("lock").push((index, responder));
            })
            .expect("register");
    }
    let a = start(config(1), Handlers::new());
    let b = start(config(2), handlers);
    link(&a, &b);
    let pending: Vec<_> = (0..REQUESTS)
        .map(|index| {
            a.request_later_blocking(
                NodeId(2),
                ECHO,
                Bytes::copy_from_slice(&index.to_le_bytes()),
                Duration::from_secs(20),
            )
            .expect("sent")
        })
        .collect();
    wait_until("all requests held", || {
        held.lock().expect("lock").len() == REQUESTS as usize
    });
    assert_eq!(
        a.connection_stats(NodeId(2)).expect("up").pending_requests,
        REQUESTS as usize
    );
    let mut responders = std::mem::take(&mut *held.lock().expect("lock"));
    responders.sort_by_key(|(index, _)| std::cmp::Reverse(*index));
    for (index, responder) in responders {
        responder
            .respond(Bytes::copy_from_slice(&index.to_le_bytes()))
            .expect("respond");
    }
    for (index, response) in (0u32..).zip(pending) {
        assert_eq!(
            &response.wait_blocking().expect("answer")[..],
            &index.to_le_bytes()
        );
    }
    assert_eq!(
        a.connection_stats(NodeId(2)).expect("up").pending_requests,
        0
    );
}

#[test]
fn reconnects_after_the_peer_restarts_on_a_new_address() {
    let counter = Arc::new(AtomicUsize::new(0));
    let a = start(config(1), echo_and_count(&counter));
    let mut events = a.subscribe();
    let b = start(config(2), echo_and_count(&counter));
    link(&a, &b);
    a.request_blocking(NodeId(2), ECHO, Bytes::from_static(b"1"), TIMEOUT)
        .expect("first");
    let old_addr = b.local_addr();
    drop(b);
    let event = events
        .recv_blocking(TIMEOUT)
        .expect("blocking allowed")
        .expect("a connection-lost event");
    assert_eq!(event.node, NodeId(2));
    assert_eq!(event.reason, CloseReason::PeerClosed);
    let b = start(config(2), echo_and_count(&counter));
    assert_ne!(b.local_addr(), old_addr);
    link(&a, &b);
    a.connect_blocking(NodeId(2))
        .expect("connects to the new address");
    assert_eq!(
        &a.request_blocking(NodeId(2), ECHO, Bytes::from_static(b"2"), TIMEOUT)
            .expect("after restart")[..],
        b"2"
    );
    assert_eq!(
        &b.request_blocking(NodeId(1), ECHO, Bytes::from_static(b"3"), TIMEOUT)
            .expect("other direction")[..],
        b"3"
    );
    assert_eq!(a.connected_nodes(), vec![NodeId(2)]);
    assert_eq!(b.connected_nodes(), vec![NodeId(1)]);
}

/// A node whose SLOW-type message handler sleeps 2 ms, with small flow-control limits.
fn slow_node(id: u16, handled: &Arc<AtomicUsize>) -> Endpoint {
    let mut config = config(id);
    config.receive_unprocessed_bytes_max = 64 * 1024;
    config.send_queue_bytes_max = 64 * 1024;
    let mut handlers = Handlers::new();
    let handled = handled.clone();
    handlers
        .register(MessageType::unordered(1, 6), move |_m: Incoming| {
            std::thread::sleep(Duration::from_millis(2));
            handled.fetch_add(1, Ordering::SeqCst);
        })
        .expect("register");
    start(config, handlers)
}

#[test]
fn slow_handlers_back_pressure_senders_with_bounded_memory_and_no_deadlock() {
    const MESSAGES: usize = 300;
    const PAYLOAD_BYTES: usize = 8 * 1024;
    let handled_a = Arc::new(AtomicUsize::new(0));
    let handled_b = Arc::new(AtomicUsize::new(0));
    let a = slow_node(1, &handled_a);
    let b = slow_node(2, &handled_b);
    link(&a, &b);
    let done = AtomicBool::new(false);
    let (peak_queued, peak_unprocessed) = std::thread::scope(|scope| {
        // Both directions at once, each receiver slow: the classic deadlock shape.
        for (from, to) in [(&a, NodeId(2)), (&b, NodeId(1))] {
            let handle = from.handle();
            scope.spawn(move || {
                for _ in 0..MESSAGES {
                    handle
                        .send_blocking(
                            to,
                            MessageType::unordered(1, 6),
                            Bytes::from(vec![7u8; PAYLOAD_BYTES]),
                        )
                        .expect("send under back-pressure");
                }
            });
        }
        let monitor = scope.spawn(|| {
            let (mut queued, mut unprocessed) = (0, 0);
            while !done.load(Ordering::SeqCst) {
                for (endpoint, peer) in [(&a, NodeId(2)), (&b, NodeId(1))] {
                    if let Some(stats) = endpoint.connection_stats(peer) {
                        queued = queued.max(stats.queued_bytes);
                        unprocessed = unprocessed.max(stats.unprocessed_bytes_peak);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (queued, unprocessed)
        });
        wait_until("all slow messages handled", || {
            handled_a.load(Ordering::SeqCst) == MESSAGES
                && handled_b.load(Ordering::SeqCst) == MESSAGES
        });
        done.store(true, Ordering::SeqCst);
        monitor.join().expect("monitor")
    });
    let frame = PAYLOAD_BYTES + wire::HEADER_BYTES;
    assert!(
        peak_queued <= 64 * 1024 + frame,
        "send queue grew to {peak_queued}"
    );
    assert!(
        peak_unprocessed <= 64 * 1024 + READ_BUFFER_BYTES + frame,
        "unprocessed grew to {peak_unprocessed}"
    );
    assert!(peak_unprocessed > 0);
}

#[test]
fn a_64_mib_message_streams_while_small_messages_keep_flowing() {
    const LARGE_BYTES: usize = 64 << 20;
    let small_before_large = Arc::new(AtomicUsize::new(0));
    let small_total = Arc::new(AtomicUsize::new(0));
    let large_seen: Arc<Mutex<Option<(usize, u64, usize)>>> = Arc::new(Mutex::new(None));
    let mut handlers = Handlers::new();
    {
        let (before, total) = (small_before_large.clone(), small_total.clone());
        handlers
            .register(COUNT, move |message: Incoming| {
                total.fetch_add(1, Ordering::SeqCst);
                if message.payload.first() == Some(&1) {
                    // Sent while the large message was being queued.
                    before.fetch_add(1, Ordering::SeqCst);
                }
            })
            .expect("register");
        let (seen, before) = (large_seen.clone(), small_before_large.clone());
        handlers
            .register(LARGE, move |message: Incoming| {
                let sum = message.payload.iter().map(|b| u64::from(*b)).sum::<u64>();
                *seen.lock().expect("lock") =
                    Some((message.payload.len(), sum, before.load(Ordering::SeqCst)));
            })
            .expect("register");
    }
    let receiver = start(config(2), handlers);
    let sender = start(config(1), Handlers::new());
    link(&sender, &receiver);
    let payload: Vec<u8> = (0..LARGE_BYTES).map(|i| (i % 251) as u8).collect();
    let expected_sum: u64 = payload.iter().map(|b| u64::from(*b)).sum();
    let large_in_flight = AtomicBool::new(false);
    let large_done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let handle = sender.handle();
        let (in_flight, done) = (&large_in_flight, &large_done);
        scope.spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let flag = u8::from(in_flight.load(Ordering::SeqCst));
                handle
                    .send_blocking(NodeId(2), COUNT, Bytes::from(vec![flag; 64]))
                    .expect("small");
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        large_in_flight.store(true, Ordering::SeqCst);
        sender
            .send_blocking(NodeId(2), LARGE, Bytes::from(payload))
            .expect("large");
        large_in_flight.store(false, Ordering::SeqCst);
        wait_until("large message", || {
            large_seen.lock().expect("lock").is_some()
        });
        large_done.store(true, Ordering::SeqCst);
    });
    let (length, sum, small_first) = large_seen.lock().expect("lock").expect("seen");
    assert_eq!(length, LARGE_BYTES);
    assert_eq!(sum, expected_sum);
    assert!(
        small_first > 0,
        "no small message sent during the large one was handled before it"
    );
}

#[test]
fn a_wrong_secret_is_refused_and_no_handler_runs() {
    let counter = Arc::new(AtomicUsize::new(0));
    let a = start(config(1), echo_and_count(&counter));
    let mut other = config(2);
    other.secret = b"another secret".to_vec();
    let b = start(other, echo_and_count(&counter));
    link(&a, &b);
    for (from, to) in [(&a, NodeId(2)), (&b, NodeId(1))] {
        let outcome = from.send_blocking(to, COUNT, Bytes::from_static(b"x"));
        assert!(
            matches!(outcome, Err(NetError::AuthenticationFailed(_))),
            "{outcome:?}"
        );
    }
    // A raw dialer that answers the challenge with a bad proof gets no verdict.
    let mut raw = TcpStream::connect(a.local_addr()).expect("connect");
    raw.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let greeting = Greeting {
        node: 77,
        instance: 1,
        nonce: [1; 16],
        lane: false,
    };
    raw.write_all(&greeting.encode()).expect("greeting");
    let mut challenge = [0u8; GREETING_BYTES + PROOF_BYTES];
    raw.read_exact(&mut challenge).expect("challenge");
    raw.write_all(&[0u8; PROOF_BYTES]).expect("bad proof");
    let mut rest = Vec::new();
    let read = raw.read_to_end(&mut rest);
    assert!(matches!(read, Ok(0)) || read.is_err(), "{read:?} {rest:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(counter.load(Ordering::SeqCst), 0);
    assert!(a.connected_nodes().is_empty());
}

/// Dials `addr` as node `id`, completes the handshake with the right secret, and returns
/// the stream ready for frames.
fn raw_authenticated(addr: SocketAddr, id: u16, acceptor: u16) -> TcpStream {
    let mut raw = TcpStream::connect(addr).expect("connect");
    raw.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let ours = Greeting {
        node: id,
        instance: u64::from(id),
        nonce: [id as u8; 16],
        lane: false,
    }
    .encode();
    raw.write_all(&ours).expect("greeting");
    let mut theirs = [0u8; GREETING_BYTES];
    raw.read_exact(&mut theirs).expect("greeting back");
    let mut proof = [0u8; PROOF_BYTES];
    raw.read_exact(&mut proof).expect("proof");
    assert_eq!(Greeting::decode(&theirs).expect("valid").node, acceptor);
    wire::verify_acceptor_proof(SECRET.as_bytes(), &ours, &theirs, &proof)
        .expect("acceptor knows secret");
    raw.write_all(&wire::connector_proof(SECRET.as_bytes(), &ours, &theirs))
        .expect("our proof");
    let mut verdict = [0u8; 1];
    raw.read_exact(&mut verdict).expect("verdict");
    assert_eq!(
        wire::Verdict::decode(verdict[0]),
        Ok(wire::Verdict::Accepted)
    );
    raw
}

fn assert_closed_by_peer(raw: &mut TcpStream, case: &str) {
    let mut buf = [0u8; 64];
    loop {
        match raw.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(error)
                if error.kind() == std::io::ErrorKind::WouldBlock
                    || error.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("{case}: connection still open")
            }
            Err(_) => return,
        }
    }
}

fn header(
    kind: Kind,
    ordered: bool,
    fragment: wire::Fragment,
    type_id: u8,
    subtype: u8,
    length: u32,
) -> [u8; 12] {
    FrameHeader {
        kind,
        ordered,
        fragment,
        type_id,
        subtype,
        message_id: 0,
        payload_bytes: length,
    }
    .encode()
}

#[test]
fn malformed_input_closes_only_the_offending_connection() {
    let counter = Arc::new(AtomicUsize::new(0));
    let server = start(config(1), echo_and_count(&counter));
    let whole = wire::Fragment::Whole;
    let mut impossible = header(Kind::Message, false, whole, 1, 2, 0);
    impossible[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("garbage header", b"GET / HTTP/1.1\r\n\r\n".to_vec(), false),
        ("impossible length", impossible.to_vec(), false),
        (
            "unknown type",
            [&header(Kind::Message, false, whole, 9, 9, 3)[..], b"abc"].concat(),
            false,
        ),
        (
            "ordering mismatch",
            [&header(Kind::Message, true, whole, 1, 2, 1)[..], b"a"].concat(),
            false,
        ),
        (
            "orphan fragment",
            [
                &header(Kind::Message, false, wire::Fragment::Last, 1, 2, 1)[..],
                b"a",
            ]
            .concat(),
            false,
        ),
        (
            "truncated frame",
            [
                &header(Kind::Message, false, whole, 1, 2, 100)[..],
                &[0u8; 10][..],
            ]
            .concat(),
            true,
        ),
    ];
    for (index, (case, bytes, then_half_close)) in cases.into_iter().enumerate() {
        let mut raw = raw_authenticated(server.local_addr(), 100 + index as u16, 1);
        raw.write_all(&bytes).expect("write");
        if then_half_close {
            raw.shutdown(std::net::Shutdown::Write).expect("half close");
        }
        assert_closed_by_peer(&mut raw, case);
    }
    // Garbage instead of a handshake.
    let mut raw = TcpStream::connect(server.local_addr()).expect("connect");
    raw.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    raw.write_all(&[0xAB; 64]).expect("write");
    assert_closed_by_peer(&mut raw, "garbage handshake");
    assert_eq!(
        counter.load(Ordering::SeqCst),
        0,
        "no handler ran for bad input"
    );
    // The endpoint still serves a well-behaved peer.
    let client = start(config(2), Handlers::new());
    link(&client, &server);
    assert_eq!(
        &client
            .request_blocking(NodeId(1), ECHO, Bytes::from_static(b"ok"), TIMEOUT)
            .expect("served")[..],
        b"ok"
    );
    client
        .send_blocking(NodeId(1), COUNT, Bytes::new())
        .expect("send");
    wait_until("counted", || counter.load(Ordering::SeqCst) == 1);
}

#[test]
fn simultaneous_dials_end_with_one_shared_connection() {
    for round in 0..5u16 {
        let counter = Arc::new(AtomicUsize::new(0));
        let a = start(config(10 + round), echo_and_count(&counter));
        let b = start(config(20 + round), echo_and_count(&counter));
        link(&a, &b);
        std::thread::scope(|scope| {
            for (from, to) in [(&a, b.node_id()), (&b, a.node_id())] {
                let handle = from.handle();
                scope.spawn(move || {
                    for _ in 0..100 {
                        handle
                            .send_blocking(to, COUNT, Bytes::from_static(b"d"))
                            .expect("send");
                    }
                });
            }
        });
        wait_until("all delivered", || counter.load(Ordering::SeqCst) == 200);
        assert_eq!(a.connected_nodes(), vec![b.node_id()]);
        assert_eq!(b.connected_nodes(), vec![a.node_id()]);
        let a_side = a.connection_stats(b.node_id()).expect("a has it");
        let b_side = b.connection_stats(a.node_id()).expect("b has it");
        assert_ne!(
            a_side.initiated_locally, b_side.initiated_locally,
            "same TCP connection"
        );
    }
}

/// A connection closed right after it was installed, before its reader and writer tasks
/// started, must still close its socket: otherwise the peer keeps it as live, answers every
/// later dial from this node `Duplicate`, and the node can never reach it again (sends fail
/// with `ConnectTimeout`). Messages queued on a connection that is closed may be lost (that
/// is what `disconnect` does); the sends themselves must all succeed, and the link work
/// afterwards.
#[test]
fn a_connection_closed_right_after_it_opened_releases_its_socket() {
    let counter = Arc::new(AtomicUsize::new(0));
    let (a, b) = linked_pair(&counter);
    for round in 0..200usize {
        a.disconnect(b.node_id());
        a.send_blocking(b.node_id(), COUNT, Bytes::from_static(b"c"))
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
    }
    let before = counter.load(Ordering::SeqCst);
    a.send_blocking(b.node_id(), COUNT, Bytes::from_static(b"c"))
        .expect("send after the churn");
    wait_until("the last message", || {
        counter.load(Ordering::SeqCst) > before
    });
    assert_eq!(b.connected_nodes(), vec![a.node_id()]);
}

#[test]
fn the_connection_limit_closes_the_least_recently_used() {
    let counter = Arc::new(AtomicUsize::new(0));
    let mut hub_config = config(1);
    hub_config.connections_max = 2;
    let hub = start(hub_config, echo_and_count(&counter));
    let peers: Vec<Endpoint> = (2..=4)
        .map(|id| start(config(id), echo_and_count(&counter)))
        .collect();
    for peer in &peers {
        link(&hub, peer);
    }
    for peer in &peers {
        hub.request_blocking(peer.node_id(), ECHO, Bytes::from_static(b"x"), TIMEOUT)
            .expect("echo");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_until("eviction", || hub.connected_nodes().len() == 2);
    assert_eq!(hub.connected_nodes(), vec![NodeId(3), NodeId(4)]);
    hub.request_blocking(NodeId(2), ECHO, Bytes::from_static(b"y"), TIMEOUT)
        .expect("reconnects");
    wait_until("limit kept", || hub.connected_nodes().len() == 2);
}

#[test]
fn a_fenced_node_is_rejected_from_then_on() {
    let counter = Arc::new(AtomicUsize::new(0));
    let (a, b) = linked_pair(&counter);
    b.send_blocking(NodeId(1), COUNT, Bytes::new())
        .expect("before");
    wait_until("counted", || counter.load(Ordering::SeqCst) == 1);
    a.fence(NodeId(2));
    assert!(a.is_fenced(NodeId(2)));
    wait_until("b sees the close", || b.connected_nodes().is_empty());
    let outcome = b.send_blocking(NodeId(1), COUNT, Bytes::new());
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(matches!(
        a.send_blocking(NodeId(2), COUNT, Bytes::new()),
        Err(NetError::Fenced(NodeId(2)))
    ));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        counter.load(Ordering::SeqCst),
        1,
        "nothing from the fenced node"
    );
    a.unfence(NodeId(2));
    b.send_blocking(NodeId(1), COUNT, Bytes::new())
        .expect("after unfence");
    wait_until("counted again", || counter.load(Ordering::SeqCst) == 2);
}

#[test]
fn the_fault_switch_partitions_and_heals() {
    let counter = Arc::new(AtomicUsize::new(0));
    let (a, b) = linked_pair(&counter);
    a.request_blocking(NodeId(2), ECHO, Bytes::new(), TIMEOUT)
        .expect("healthy");
    a.set_fault(NodeId(2), Fault::Partition);
    let outcome = a.request_blocking(NodeId(2), ECHO, Bytes::new(), Duration::from_millis(100));
    assert!(matches!(outcome, Err(NetError::Timeout(_))), "{outcome:?}");
    b.send_blocking(NodeId(1), COUNT, Bytes::new())
        .expect("b sends");
    let outcome = b.request_blocking(NodeId(1), ECHO, Bytes::new(), Duration::from_millis(100));
    assert!(matches!(outcome, Err(NetError::Timeout(_))), "{outcome:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        counter.load(Ordering::SeqCst),
        0,
        "partitioned traffic not handled"
    );
    a.clear_fault(NodeId(2));
    a.request_blocking(NodeId(2), ECHO, Bytes::new(), TIMEOUT)
        .expect("healed");
    b.send_blocking(NodeId(1), COUNT, Bytes::new())
        .expect("b sends");
    wait_until("counted after healing", || {
        counter.load(Ordering::SeqCst) == 1
    });
}

#[test]
fn async_api_runs_on_a_caller_runtime_and_blocking_calls_there_are_refused() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let counter = Arc::new(AtomicUsize::new(0));
    let a = Endpoint::start_on(runtime.handle().clone(), config(1), Handlers::new()).expect("a");
    let b = Endpoint::start_on(
        runtime.handle().clone(),
        config(2),
        echo_and_count(&counter),
    )
    .expect("b");
    link(&a, &b);
    let handle = a.handle();
    runtime.block_on(async move {
        let answer = handle
            .request(NodeId(2), ECHO, Bytes::from_static(b"async"), TIMEOUT)
            .await
            .expect("async echo");
        assert_eq!(&answer[..], b"async");
        handle
            .send(NodeId(2), COUNT, Bytes::new())
            .await
            .expect("async send");
        assert!(matches!(
            handle.send_blocking(NodeId(2), COUNT, Bytes::new()),
            Err(NetError::BlockingInAsyncContext)
        ));
    });
    wait_until("counted", || counter.load(Ordering::SeqCst) == 1);
    drop(a);
    drop(b);
}

#[test]
fn inline_handlers_answer_from_the_io_thread_and_ordered_types_cannot_be_inline() {
    let mut handlers = Handlers::new();
    handlers
        .register_inline(ECHO, |request: Incoming| {
            let name = std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string();
            let _ = request.respond(Bytes::from(name));
        })
        .expect("register inline");
    assert!(matches!(
        handlers.register_inline(SEQUENCE, |_m: Incoming| {}),
        Err(NetError::OrderedInline { .. })
    ));
    let server = start(config(2), handlers);
    let client = start(config(1), Handlers::new());
    link(&client, &server);
    let handle = client.handle();
    let thread_name = client
        .runtime()
        .block_on(async move { handle.request(NodeId(2), ECHO, Bytes::new(), TIMEOUT).await })
        .expect("inline echo");
    let thread_name = String::from_utf8_lossy(&thread_name).to_string();
    assert!(
        thread_name.starts_with("myriad-net-io"),
        "ran on {thread_name}"
    );
}

#[test]
fn large_requests_and_responses_are_fragmented_both_ways() {
    let counter = Arc::new(AtomicUsize::new(0));
    let a = start(config(1), Handlers::new());
    let b = start(config(2), echo_and_count(&counter));
    link(&a, &b);
    let payload: Vec<u8> = (0..3 * (1 << 20) + 12_345)
        .map(|i| (i % 253) as u8)
        .collect();
    let answer = a
        .request_blocking(NodeId(2), ECHO, Bytes::from(payload.clone()), TIMEOUT)
        .expect("large echo");
    assert_eq!(answer.len(), payload.len());
    assert!(answer[..] == payload[..], "echoed bytes differ");
}

#[test]
fn outstanding_requests_fail_fast_when_the_peer_dies() {
    let a = start(config(1), Handlers::new());
    let b = start(config(2), slow_responder(Duration::from_secs(30)));
    link(&a, &b);
    let pending = a
        .request_later_blocking(
            NodeId(2),
            SLOW,
            Bytes::from_static(b"never"),
            Duration::from_secs(20),
        )
        .expect("sent");
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    drop(b);
    let outcome = pending.wait_blocking();
    assert!(
        matches!(outcome, Err(NetError::ConnectionLost(NodeId(2)))),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed fast, not by timeout"
    );
}

#[test]
fn protocol_violations_raise_events_with_their_reason() {
    let counter = Arc::new(AtomicUsize::new(0));
    let server = start(config(1), echo_and_count(&counter));
    let mut events = server.subscribe();
    let mut raw = raw_authenticated(server.local_addr(), 50, 1);
    let mut bad = header(Kind::Message, false, wire::Fragment::Whole, 1, 2, 0);
    bad[3] = 0x00;
    raw.write_all(&bad).expect("write");
    assert_closed_by_peer(&mut raw, "bad marker");
    let event = events
        .recv_blocking(TIMEOUT)
        .expect("blocking allowed")
        .expect("an event");
    assert_eq!(event.node, NodeId(50));
    assert_eq!(
        event.reason,
        CloseReason::Protocol(myriad_net::FrameError::BadMarker(0))
    );
}

#[test]
fn limits_and_registrations_are_checked_before_sending() {
    let counter = Arc::new(AtomicUsize::new(0));
    let mut small = config(1);
    small.message_bytes_max = 1000;
    let a = start(small, Handlers::new());
    let b = start(config(2), echo_and_count(&counter));
    link(&a, &b);
    assert!(matches!(
        a.send_blocking(NodeId(2), COUNT, Bytes::from(vec![0u8; 1001])),
        Err(NetError::MessageTooLarge {
            size_bytes: 1001,
            max_bytes: 1000
        })
    ));
    assert!(matches!(
        b.register(ECHO, |_m: Incoming| {}),
        Err(NetError::DuplicateHandler {
            type_id: 1,
            subtype: 1
        })
    ));
    b.register(MessageType::unordered(7, 7), |_m: Incoming| {})
        .expect("new type at runtime");
    a.send_blocking(NodeId(2), MessageType::unordered(7, 7), Bytes::new())
        .expect("send to the new type");
    a.send_blocking(NodeId(2), COUNT, Bytes::new())
        .expect("connection still up");
    wait_until("counted", || counter.load(Ordering::SeqCst) == 1);
}

#[test]
fn many_small_messages_from_many_threads_share_writes_and_reads() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 5_000;
    let counter = Arc::new(AtomicUsize::new(0));
    let a = start(config(1), Handlers::new());
    let b = start(config(2), echo_and_count(&counter));
    link(&a, &b);
    a.connect_blocking(NodeId(2)).expect("connect");
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let handle = a.handle();
            scope.spawn(move || {
                for _ in 0..PER_THREAD {
                    handle
                        .send_blocking(NodeId(2), COUNT, Bytes::from_static(&[9u8; 32]))
                        .expect("send");
                }
            });
        }
    });
    wait_until("all counted", || {
        counter.load(Ordering::SeqCst) == THREADS * PER_THREAD
    });
    let sent = a.connection_stats(NodeId(2)).expect("up");
    let received = b.connection_stats(NodeId(1)).expect("up");
    assert_eq!(sent.frames_sent, (THREADS * PER_THREAD) as u64);
    assert_eq!(received.frames_received, (THREADS * PER_THREAD) as u64);
    assert!(
        sent.write_calls * 5 <= sent.frames_sent,
        "{} frames took {} writes",
        sent.frames_sent,
        sent.write_calls
    );
    assert!(
        received.read_calls * 5 <= received.frames_received,
        "{} frames took {} reads",
        received.frames_received,
        received.read_calls
    );
}

/// A node whose address has no listener (its process is gone) is reported as
/// `ConnectRefused`, both through the connection and through a lane: the superpeers'
/// failure detector takes only that as proof of death for an immediate verdict.
#[test]
fn an_address_without_a_listener_is_refused_not_just_failed() {
    let counter = Arc::new(AtomicUsize::new(0));
    let a = start(config(1), echo_and_count(&counter));
    // A port that was just free: bound, read, closed.
    let port = std::net::TcpListener::bind(loopback())
        .expect("bind")
        .local_addr()
        .expect("address")
        .port();
    a.set_address(NodeId(7), SocketAddr::from(([127, 0, 0, 1], port)));
    for _ in 0..2 {
        match a.request_blocking(NodeId(7), ECHO, Bytes::from_static(b"ping"), TIMEOUT) {
            Err(NetError::ConnectRefused(node)) => assert_eq!(node, NodeId(7)),
            other => panic!("expected ConnectRefused, got {other:?}"),
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let through_connection =
        runtime.block_on(
            a.handle()
                .request(NodeId(7), ECHO, Bytes::from_static(b"ping"), TIMEOUT),
        );
    assert!(
        matches!(through_connection, Err(NetError::ConnectRefused(NodeId(7)))),
        "{through_connection:?}"
    );
}

#[test]
fn ordered_inline_handlers_run_in_send_order_on_the_io_thread_and_answer_detached() {
    // Node 2 handles SEQUENCE inline (opted in) and acknowledges each message with a
    // detached COUNT message back to node 1, from the I/O thread.
    let seen: Arc<parking_lot::Mutex<Vec<(u32, String)>>> = Arc::default();
    let counter = Arc::new(AtomicUsize::new(0));
    let mut handlers = Handlers::new();
    let record = seen.clone();
    let acks = Arc::new(std::sync::OnceLock::<myriad_net::NetHandle>::new());
    let ack_net = acks.clone();
    handlers
        .register_inline_ordered(SEQUENCE, move |message: Incoming| {
            let number = u32::from_le_bytes(message.payload[..4].try_into().expect("4 bytes"));
            let thread = std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string();
            record.lock().push((number, thread));
            if let Some(net) = ack_net.get() {
                net.send_detached(message.from, COUNT, Bytes::new())
                    .expect("detached send queued");
            }
        })
        .expect("ordered inline allowed by the explicit opt-in");
    let server = start(config(2), handlers);
    let _ = acks.set(server.handle());
    let client = start(config(1), echo_and_count(&counter));
    link(&client, &server);
    const MESSAGES: u32 = 2_000;
    for number in 0..MESSAGES {
        client
            .send_blocking(
                NodeId(2),
                SEQUENCE,
                Bytes::from(number.to_le_bytes().to_vec()),
            )
            .expect("sent");
    }
    wait_until("every message handled", || {
        seen.lock().len() == MESSAGES as usize
    });
    wait_until("every detached acknowledgement back", || {
        counter.load(Ordering::SeqCst) == MESSAGES as usize
    });
    let seen = seen.lock();
    for (expected, (number, thread)) in seen.iter().enumerate() {
        assert_eq!(
            *number, expected as u32,
            "messages handled out of send order"
        );
        assert!(thread.starts_with("myriad-net-io"), "ran on {thread}");
    }
}

#[test]
fn a_second_joiner_under_the_same_provisional_id_is_refused_and_the_first_is_answered() {
    // Two joining nodes drew the same provisional ID: the second must not replace the
    // first's connection (its pending answer would be lost, and its retry join twice).
    let server = start(config(2), slow_responder(Duration::from_millis(500)));
    let first = start(config(0xff05), Handlers::new());
    let second = start(config(0xff05), Handlers::new());
    link(&first, &server);
    second.set_address(server.node_id(), server.local_addr());
    let pending = first
        .request_later_blocking(NodeId(2), SLOW, Bytes::from_static(b"join"), TIMEOUT)
        .expect("first request sent");
    std::thread::sleep(Duration::from_millis(100));
    let refused = second.request_blocking(NodeId(2), ECHO, Bytes::from_static(b"x"), TIMEOUT);
    assert!(
        refused.is_err(),
        "the second joiner was served: {refused:?}"
    );
    let answer = pending
        .wait_blocking()
        .expect("the first joiner's answer arrives");
    assert_eq!(&answer[..], b"join");
}

/// A receive buffer grows while a burst of messages fills it, and after a quiet second
/// with nothing buffered the connection goes back to a fresh 16 KiB buffer; messages
/// after that arrive whole, and a new burst grows it again.
#[test]
fn a_receive_buffer_grown_by_a_burst_shrinks_once_the_connection_is_quiet() {
    const MIN: usize = 16 * 1024;
    const BURST: usize = 2_000;
    let counter = Arc::new(AtomicUsize::new(0));
    let (a, b) = linked_pair(&counter);
    let burst = |expected: usize| {
        let message = Bytes::from(vec![7u8; 8 * 1024]);
        for _ in 0..BURST {
            a.send_blocking(b.node_id(), COUNT, message.clone())
                .expect("send");
        }
        wait_until("the burst to arrive", || {
            counter.load(Ordering::SeqCst) == expected
        });
        b.connection_stats(a.node_id())
            .expect("b has the connection")
            .receive_buffer_bytes
    };
    let grown = burst(BURST);
    assert!(grown > MIN, "the burst grew the buffer ({grown} bytes)");
    let quiet_since = Instant::now();
    wait_until("the receive buffer to shrink", || {
        b.connection_stats(a.node_id())
            .is_some_and(|stats| stats.receive_buffer_bytes == MIN)
    });
    assert!(
        quiet_since.elapsed() >= Duration::from_millis(900),
        "shrank after {:?}, before a quiet second",
        quiet_since.elapsed()
    );
    let small = a
        .request_blocking(b.node_id(), ECHO, Bytes::from_static(b"small"), TIMEOUT)
        .expect("echo after the shrink");
    assert_eq!(&small[..], b"small");
    let regrown = burst(2 * BURST);
    assert!(
        regrown > MIN,
        "a new burst grows it again ({regrown} bytes)"
    );
}

//! Direct request lanes (`NetHandle::request_blocking`'s fast path) over real loopback
//! sockets: concurrent callers, a slow handler on one lane, a caller that spins, timeouts,
//! fencing, the lane handshake, the limits, idle closing, and a peer restarting on the
//! same address.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use myriad_net::wire::{self, Fragment, FrameHeader, Greeting, Kind, Verdict};
use myriad_net::wire::{GREETING_BYTES, HEADER_BYTES, PROOF_BYTES};
use myriad_net::{Bytes, Config, Endpoint, Handlers, Incoming, MessageType, NetError, NodeId};

const SECRET: &str = "lane test secret";
const ECHO: MessageType = MessageType::unordered(2, 1);
/// Answers only once the test opens the gate (the handler runs on a pool thread).
const GATED: MessageType = MessageType::unordered(2, 2);
const NOTE: MessageType = MessageType::unordered(2, 3);
const TIMEOUT: Duration = Duration::from_secs(5);

fn config(id: u16) -> Config {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    Config::new(NodeId(id), SocketAddr::from(([127, 0, 0, 1], 0)), SECRET)
}

/// A gate the GATED handler waits on (bounded: it gives up after 10 s), counting the
/// handlers waiting.
#[derive(Clone, Default)]
struct Gate(Arc<(AtomicBool, AtomicUsize)>);

impl Gate {
    fn open(&self) {
        self.0 .0.store(true, Ordering::SeqCst);
    }

    fn wait(&self) {
        self.0 .1.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.0 .0.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn waiting(&self) -> usize {
        self.0 .1.load(Ordering::SeqCst)
    }
}

/// ECHO (inline, on the I/O thread), GATED (pool), NOTE (one-way, ignored).
fn handlers(gate: &Gate) -> Handlers {
    let mut handlers = Handlers::new();
    handlers
        .register_inline(ECHO, |request: Incoming| {
            let payload = request.payload.clone();
            let _ = request.respond(payload);
        })
        .expect("echo");
    let gate = gate.clone();
    handlers
        .register(GATED, move |request: Incoming| {
            gate.wait();
            let payload = request.payload.clone();
            let _ = request.respond(payload);
        })
        .expect("gated");
    handlers
        .register(NOTE, |_message: Incoming| {})
        .expect("note");
    handlers
}

fn pair(client: Config, server: Config, gate: &Gate) -> (Endpoint, Endpoint) {
    let a = Endpoint::start(client, Handlers::new()).expect("client starts");
    let b = Endpoint::start(server, handlers(gate)).expect("server starts");
    a.set_address(b.node_id(), b.local_addr());
    b.set_address(a.node_id(), a.local_addr());
    (a, b)
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn echo(a: &Endpoint, payload: &[u8]) -> Result<Bytes, NetError> {
    a.request_blocking(NodeId(2), ECHO, Bytes::copy_from_slice(payload), TIMEOUT)
}

#[test]
fn requests_from_many_threads_get_their_own_responses_over_lanes() {
    let gate = Gate::default();
    let (a, b) = pair(config(1), config(2), &gate);
    let threads = 6;
    let barrier = Arc::new(Barrier::new(threads));
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (a, barrier) = (&a, barrier.clone());
            scope.spawn(move || {
                barrier.wait();
                for index in 0..300u32 {
                    let payload = format!("{thread}/{index}");
                    let answer = echo(a, payload.as_bytes()).expect("answer");
                    assert_eq!(&answer[..], payload.as_bytes());
                }
            });
        }
    });
    let lanes = a.lane_stats(NodeId(2));
    assert!((1..=threads).contains(&lanes.outgoing_open), "{lanes:?}");
    assert_eq!(lanes.outgoing_idle, lanes.outgoing_open, "all handed back");
    assert_eq!(lanes.outgoing_opened_total as usize, lanes.outgoing_open);
    wait_until("the server sees the lanes", || {
        b.lane_stats(NodeId(1)).incoming == lanes.outgoing_open
    });
    // The requests did not travel on the node's connection (opened first, as ever).
    let conn = a.connection_stats(NodeId(2)).expect("connection opened");
    assert!(conn.frames_sent < 10, "{conn:?}");
    // A large request (over one frame) takes the connection and still works.
    let large = vec![7u8; (1 << 20) + 1];
    assert_eq!(echo(&a, &large).expect("large").len(), large.len());
}

#[test]
fn a_slow_handler_on_one_lane_does_not_block_another() {
    let gate = Gate::default();
    let (a, _b) = pair(config(1), config(2), &gate);
    echo(&a, b"warm").expect("warm-up");
    std::thread::scope(|scope| {
        let waiting = scope
            .spawn(|| a.request_blocking(NodeId(2), GATED, Bytes::from_static(b"gated"), TIMEOUT));
        wait_until("the gated request is being handled", || gate.waiting() == 1);
        assert_eq!(
            a.lane_stats(NodeId(2)).outgoing_idle,
            0,
            "its lane is taken"
        );
        // The gated request's lane is busy: this one opens its own and is answered
        // while the other still waits (were it queued behind it, it would time out).
        let answer = a.request_blocking(
            NodeId(2),
            ECHO,
            Bytes::from_static(b"meanwhile"),
            Duration::from_secs(2),
        );
        assert_eq!(&answer.expect("not blocked")[..], b"meanwhile");
        assert!(!waiting.is_finished(), "the gated request is still waiting");
        assert_eq!(a.lane_stats(NodeId(2)).outgoing_open, 2, "a lane each");
        gate.open();
        let gated = waiting.join().expect("thread");
        assert_eq!(&gated.expect("gated answer")[..], b"gated");
    });
}

#[test]
fn a_lone_spinning_caller_reads_quick_large_slow_and_timed_out_answers() {
    let gate = Gate::default();
    let mut spinning = config(1);
    spinning.lane_spin = Duration::from_millis(20);
    let (a, _b) = pair(spinning, config(2), &gate);
    // Only a lone caller of the process spins: the other tests of this binary run
    // concurrently for a moment, so echo until one answer was read while spinning.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut round = 0u32;
    while a.lane_stats(NodeId(2)).outgoing_spin_reads_total == 0 {
        assert!(Instant::now() < deadline, "no answer read while spinning");
        let answer = echo(&a, &round.to_le_bytes()).expect("answer");
        assert_eq!(&answer[..], &round.to_le_bytes());
        round += 1;
    }
    let quick = a.lane_stats(NodeId(2));
    assert_eq!(
        quick.outgoing_opened_total, 1,
        "one lane, reused: {quick:?}"
    );
    // A request of a whole frame on a socket a spin left non-blocking (its write may fill
    // the send buffer), its answer read in many reads.
    let large: Vec<u8> = (0..myriad_net::wire::FRAME_PAYLOAD_BYTES_MAX)
        .map(|index| (index % 251) as u8)
        .collect();
    assert!(echo(&a, &large).expect("large answer")[..] == large[..]);
    // The deadline bounds a spin: the gated request times out after 10 ms, not 20.
    let began = Instant::now();
    let outcome = a.request_blocking(
        NodeId(2),
        GATED,
        Bytes::from_static(b"late"),
        Duration::from_millis(10),
    );
    assert!(
        matches!(outcome, Err(NetError::Timeout(NodeId(2)))),
        "{outcome:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(2), "bounded");
    // An answer later than the spin: the caller blocks and still gets it.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            gate.open();
        });
        let slow = a.request_blocking(NodeId(2), GATED, Bytes::from_static(b"slow"), TIMEOUT);
        assert_eq!(&slow.expect("slow answer")[..], b"slow");
    });
    let after = a.lane_stats(NodeId(2));
    assert_eq!(
        after.outgoing_opened_total, 2,
        "only the timed-out lane was replaced: {after:?}"
    );
    // Without `lane_spin` (the default), nothing spins.
    let (c, _d) = pair(config(1), config(2), &gate);
    for round in 0..20u8 {
        assert_eq!(&echo(&c, &[round]).expect("answer")[..], &[round]);
    }
    assert_eq!(c.lane_stats(NodeId(2)).outgoing_spin_reads_total, 0);
}

#[test]
fn a_timed_out_lane_is_closed_and_its_late_response_never_read() {
    let gate = Gate::default();
    let (a, b) = pair(config(1), config(2), &gate);
    echo(&a, b"warm").expect("warm-up");
    assert_eq!(a.lane_stats(NodeId(2)).outgoing_open, 1);
    let outcome = a.request_blocking(
        NodeId(2),
        GATED,
        Bytes::from_static(b"late"),
        Duration::from_millis(100),
    );
    assert!(
        matches!(outcome, Err(NetError::Timeout(NodeId(2)))),
        "{outcome:?}"
    );
    assert_eq!(
        a.lane_stats(NodeId(2)).outgoing_open,
        0,
        "the timed-out lane was closed, not pooled"
    );
    gate.open();
    // The late response is written to a closed lane; this request gets its own answer.
    for round in 0..20u8 {
        assert_eq!(&echo(&a, &[round]).expect("answer")[..], &[round]);
    }
    assert_eq!(a.lane_stats(NodeId(2)).outgoing_open, 1);
    wait_until("the server drops the closed lane", || {
        b.lane_stats(NodeId(1)).incoming == 1
    });
}

#[test]
fn fencing_closes_lanes_both_ways_and_refuses_new_ones() {
    let gate = Gate::default();
    let (a, b) = pair(config(1), config(2), &gate);
    echo(&a, b"before").expect("before");
    wait_until("lane served", || b.lane_stats(NodeId(1)).incoming == 1);
    // The serving side fences the caller: its lanes close, new ones are refused.
    b.fence(NodeId(1));
    assert_eq!(b.lane_stats(NodeId(1)).incoming, 0);
    let outcome = echo(&a, b"after");
    assert!(outcome.is_err(), "{outcome:?}");
    let outcome = echo(&a, b"again");
    assert!(
        matches!(outcome, Err(NetError::Fenced(NodeId(2)))),
        "{outcome:?}"
    );
    assert_eq!(b.lane_stats(NodeId(1)).incoming, 0);
    b.unfence(NodeId(1));
    // The caller's refused attempt may still be settling: the next calls succeed soon.
    wait_until("a call succeeds after unfence", || {
        echo(&a, b"unfenced").is_ok()
    });

    // The calling side fences: a request waiting on a lane fails at once, idle lanes close.
    std::thread::scope(|scope| {
        let waiting =
            scope.spawn(|| a.request_blocking(NodeId(2), GATED, Bytes::from_static(b"g"), TIMEOUT));
        wait_until("the gated request is being handled", || gate.waiting() == 1);
        a.fence(NodeId(2));
        let outcome = waiting.join().expect("thread");
        assert!(
            matches!(outcome, Err(NetError::Fenced(NodeId(2)))),
            "{outcome:?}"
        );
    });
    gate.open();
    assert_eq!(a.lane_stats(NodeId(2)).outgoing_open, 0);
    assert!(matches!(echo(&a, b"x"), Err(NetError::Fenced(NodeId(2)))));
    wait_until("the server drops the lanes", || {
        b.lane_stats(NodeId(1)).incoming == 0
    });
}

/// Dials `addr` as node 9 with the lane flag set, proving `secret`; returns the stream
/// and the verdict byte (`None` if the acceptor closed without one).
fn raw_lane(addr: SocketAddr, secret: &str) -> (TcpStream, Option<u8>) {
    let mut raw = TcpStream::connect(addr).expect("connect");
    raw.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let ours = Greeting {
        node: 9,
        instance: 9,
        nonce: [9; 16],
        lane: true,
    }
    .encode();
    raw.write_all(&ours).expect("greeting");
    let mut reply = [0u8; GREETING_BYTES + PROOF_BYTES];
    raw.read_exact(&mut reply).expect("challenge");
    let mut theirs = [0u8; GREETING_BYTES];
    theirs.copy_from_slice(&reply[..GREETING_BYTES]);
    let greeting = Greeting::decode(&theirs).expect("valid greeting");
    assert!(!greeting.lane, "an acceptor never sets the lane flag");
    raw.write_all(&wire::connector_proof(secret.as_bytes(), &ours, &theirs))
        .expect("proof");
    let mut verdict = [0u8; 1];
    let verdict = raw.read_exact(&mut verdict).ok().map(|()| verdict[0]);
    (raw, verdict)
}

fn frame(kind: Kind, message_type: MessageType, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = FrameHeader {
        kind,
        ordered: message_type.ordered,
        fragment: Fragment::Whole,
        type_id: message_type.type_id,
        subtype: message_type.subtype,
        message_id: id,
        payload_bytes: payload.len() as u32,
    }
    .encode()
    .to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn the_lane_handshake_refuses_a_wrong_secret_and_a_lane_carries_only_requests() {
    let gate = Gate::default();
    let b = Endpoint::start(config(2), handlers(&gate)).expect("starts");
    let (mut refused, verdict) = raw_lane(b.local_addr(), "not the secret");
    assert_eq!(verdict, None, "no verdict for a wrong proof");
    let mut rest = Vec::new();
    assert!(matches!(refused.read_to_end(&mut rest), Ok(0) | Err(_)));
    assert_eq!(b.lane_stats(NodeId(9)).incoming, 0);
    assert!(b.connected_nodes().is_empty());

    // An endpoint with another secret gets the connection's typed error.
    let mut other = config(1);
    other.secret = b"another secret".to_vec();
    let a = Endpoint::start(other, Handlers::new()).expect("starts");
    a.set_address(NodeId(2), b.local_addr());
    let outcome = echo(&a, b"x");
    assert!(
        matches!(outcome, Err(NetError::AuthenticationFailed(NodeId(2)))),
        "{outcome:?}"
    );
    assert_eq!(a.lane_stats(NodeId(2)).outgoing_open, 0);

    // The right secret: a lane, not the node's connection; requests are answered on it.
    let (mut lane, verdict) = raw_lane(b.local_addr(), SECRET);
    assert_eq!(verdict, Some(Verdict::Accepted.encode()));
    assert_eq!(b.lane_stats(NodeId(9)).incoming, 1);
    assert!(
        b.connected_nodes().is_empty(),
        "a lane is not the connection"
    );
    lane.write_all(&frame(Kind::Request, ECHO, 77, b"hi"))
        .expect("request");
    let mut answer = [0u8; HEADER_BYTES + 2];
    lane.read_exact(&mut answer).expect("response");
    let mut head = [0u8; HEADER_BYTES];
    head.copy_from_slice(&answer[..HEADER_BYTES]);
    let head = FrameHeader::decode(&head, 1024).expect("header");
    assert_eq!((head.kind, head.message_id), (Kind::Response, 77));
    assert_eq!(&answer[HEADER_BYTES..], b"hi");
    // A one-way message has no place on a lane: the lane closes, without an event.
    let mut events = b.subscribe();
    lane.write_all(&frame(Kind::Message, NOTE, 0, b""))
        .expect("message");
    let mut rest = Vec::new();
    assert!(matches!(lane.read_to_end(&mut rest), Ok(0) | Err(_)));
    wait_until("lane dropped", || b.lane_stats(NodeId(9)).incoming == 0);
    assert_eq!(events.try_recv(), None, "lanes raise no connection events");
}

#[test]
fn lanes_are_bounded_on_both_sides_and_idle_ones_close() {
    let gate = Gate::default();
    let mut client = config(1);
    client.lanes_per_node_max = 3;
    client.lane_idle_timeout = Duration::from_millis(100);
    let mut server = config(2);
    server.lanes_per_node_max = 2;
    let (a, b) = pair(client, server, &gate);
    let threads = 6;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let a = &a;
            scope.spawn(move || {
                for index in 0..200u32 {
                    let payload = format!("{thread}:{index}");
                    let answer = echo(a, payload.as_bytes()).expect("answer");
                    assert_eq!(&answer[..], payload.as_bytes());
                    let lanes = a.lane_stats(NodeId(2));
                    assert!(lanes.outgoing_open <= 3, "{lanes:?}");
                }
            });
        }
    });
    assert!(b.lane_stats(NodeId(1)).incoming <= 2);
    assert!(a.lane_stats(NodeId(2)).outgoing_open <= 2);
    // The sweeper closes idle lanes; the server follows.
    wait_until("idle lanes closed", || {
        a.lane_stats(NodeId(2)).outgoing_open == 0
    });
    wait_until("the server drops them", || {
        b.lane_stats(NodeId(1)).incoming == 0
    });
    // Lanes off: blocking requests still work, over the connection.
    let mut off = config(3);
    off.lanes_per_node_max = 0;
    let c = Endpoint::start(off, Handlers::new()).expect("starts");
    c.set_address(NodeId(2), b.local_addr());
    let answer = c.request_blocking(NodeId(2), ECHO, Bytes::from_static(b"c"), TIMEOUT);
    assert_eq!(&answer.expect("answer")[..], b"c");
    assert_eq!(c.lane_stats(NodeId(2)).outgoing_open, 0);
}

#[test]
fn a_lane_reopens_after_the_peer_restarts_on_the_same_address() {
    let gate = Gate::default();
    let (a, b) = pair(config(1), config(2), &gate);
    echo(&a, b"first").expect("first");
    let addr = b.local_addr();
    drop(b);
    // Rebind the same port (the old listener closes as its runtime stops).
    let deadline = Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => break listener,
            Err(error) => {
                assert!(Instant::now() < deadline, "rebinding {addr}: {error}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let b = Endpoint::start_with_listener(config(2), handlers(&gate), listener).expect("restarted");
    assert_eq!(b.local_addr(), addr);
    wait_until("the old connection is gone", || {
        a.connected_nodes().is_empty()
    });
    // The idle lane to the old instance is found closed and replaced.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(&echo(&a, b"second").expect("after restart")[..], b"second");
    let lanes = a.lane_stats(NodeId(2));
    assert_eq!((lanes.outgoing_open, lanes.outgoing_opened_total), (1, 2));
    assert_eq!(b.lane_stats(NodeId(1)).incoming, 1);
}

/// An idle lane to an older instance of the peer is never reused, even while that
/// instance still runs and its lane is open: once the node's connection goes to a new
/// instance (here on another address), requests reach the new one. (An endpoint being
/// dropped closes its lanes in the background, so a lane to it can look open for a while
/// after its node restarted.)
#[test]
fn a_lane_to_an_older_instance_is_not_reused_after_the_peer_restarted() {
    let gate = Gate::default();
    let (a, old) = pair(config(1), config(2), &gate);
    assert_eq!(&echo(&a, b"first").expect("first")[..], b"first");
    assert_eq!(
        a.lane_stats(NodeId(2)).outgoing_idle,
        1,
        "the lane is pooled"
    );
    // The new instance answers every ECHO with a tag, so a reply shows who sent it.
    let mut tagged = Handlers::new();
    tagged
        .register_inline(ECHO, |request: Incoming| {
            let _ = request.respond(Bytes::from_static(b"new"));
        })
        .expect("tagged echo");
    let new = Endpoint::start(config(2), tagged).expect("new instance starts");
    a.disconnect(NodeId(2));
    a.set_address(NodeId(2), new.local_addr());
    new.set_address(NodeId(1), a.local_addr());
    a.connect_blocking(NodeId(2))
        .expect("connects to the new instance");
    assert_eq!(
        &echo(&a, b"second").expect("after the restart")[..],
        b"new",
        "the request reached the new instance"
    );
    assert_eq!(a.lane_stats(NodeId(2)).outgoing_opened_total, 2);
    // The old lane was closed, not left open.
    wait_until("the old instance's lane is closed", || {
        old.lane_stats(NodeId(1)).incoming == 0
    });
}

/// Starts servers 2..=1+count sharing `gate`, each known to `a`.
fn servers(a: &Endpoint, count: u16, gate: &Gate) -> Vec<Endpoint> {
    (2..2 + count)
        .map(|id| {
            let server = Endpoint::start(config(id), handlers(gate)).expect("server starts");
            a.set_address(server.node_id(), server.local_addr());
            server.set_address(a.node_id(), a.local_addr());
            server
        })
        .collect()
}

#[test]
fn requests_blocking_sends_to_every_node_before_awaiting_any_response() {
    let gate = Gate::default();
    let a = Endpoint::start(config(1), Handlers::new()).expect("client starts");
    let _servers = servers(&a, 3, &gate);
    let requests: Vec<(NodeId, MessageType, Bytes)> = (2..5u16)
        .map(|id| (NodeId(id), GATED, Bytes::from(format!("to {id}"))))
        .collect();
    std::thread::scope(|scope| {
        let caller = scope.spawn(|| a.requests_blocking(requests, TIMEOUT));
        // All three handlers must be waiting at once: a caller that awaited each
        // response before sending the next request would leave two unsent, and the
        // gate would never open (the wait fails after 10 s).
        wait_until("all three requests are being handled", || {
            gate.waiting() == 3
        });
        gate.open();
        let results = caller.join().expect("caller");
        for (id, result) in (2..5u16).zip(results) {
            assert_eq!(&result.expect("answer")[..], format!("to {id}").as_bytes());
        }
    });
    for id in 2..5u16 {
        let lanes = a.lane_stats(NodeId(id));
        assert_eq!(lanes.outgoing_open, 1, "node {id}: one lane, {lanes:?}");
        assert_eq!(lanes.outgoing_idle, 1, "node {id}: handed back");
    }
}

#[test]
fn requests_blocking_keeps_order_across_lanes_connections_and_errors() {
    let gate = Gate::default();
    gate.open();
    let a = Endpoint::start(config(1), Handlers::new()).expect("client starts");
    let _servers = servers(&a, 2, &gate);
    // Over one frame: goes through the connection, not a lane.
    let big = Bytes::from(vec![7u8; myriad_net::wire::FRAME_PAYLOAD_BYTES_MAX + 10]);
    let requests = vec![
        (NodeId(2), ECHO, Bytes::from_static(b"first")),
        (NodeId(9), ECHO, Bytes::from_static(b"unknown node")),
        (NodeId(3), ECHO, big.clone()),
        (NodeId(2), ECHO, Bytes::from_static(b"second to 2")),
        (NodeId(3), GATED, Bytes::from_static(b"pooled handler")),
    ];
    let results = a.requests_blocking(requests, TIMEOUT);
    assert_eq!(results.len(), 5);
    assert_eq!(&results[0].as_ref().expect("first")[..], b"first");
    assert!(
        matches!(results[1], Err(NetError::UnknownNode(NodeId(9)))),
        "{:?}",
        results[1]
    );
    assert_eq!(results[2].as_ref().expect("big").len(), big.len());
    assert_eq!(&results[3].as_ref().expect("second")[..], b"second to 2");
    assert_eq!(&results[4].as_ref().expect("gated")[..], b"pooled handler");
    // Two requests to node 2 were in flight at once: two lanes.
    assert_eq!(a.lane_stats(NodeId(2)).outgoing_open, 2);
}

#[test]
fn requests_blocking_refuses_async_callers_for_every_request() {
    let gate = Gate::default();
    let a = Endpoint::start(config(1), Handlers::new()).expect("client starts");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let results = runtime.block_on(async {
        a.requests_blocking(
            vec![
                (NodeId(2), ECHO, Bytes::from_static(b"x")),
                (NodeId(3), ECHO, Bytes::from_static(b"y")),
            ],
            TIMEOUT,
        )
    });
    drop(gate);
    assert_eq!(results.len(), 2);
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(NetError::BlockingInAsyncContext))));
}

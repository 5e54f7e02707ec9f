//! The per-link network filters (`Fault`, `NetHandle::set_fault` / `add_fault` /
//! `clear_fault`) between two endpoints on loopback: a partition, a drop in one direction
//! only, a delay in one direction (latency at least the delay, order kept, the other
//! direction not slowed), delays combined with drops, and healing with messages in flight.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use myriad_net::{
    Bytes, Config, Endpoint, Fault, Handlers, Incoming, MessageType, NetError, NodeId,
};

const SECRET: &str = "fault test secret";
const ECHO: MessageType = MessageType::unordered(2, 1);
/// Ordered, so that the handler sees messages in arrival order.
const STAMP: MessageType = MessageType::ordered(2, 2);
const SHORT: Duration = Duration::from_millis(150);
const TIMEOUT: Duration = Duration::from_secs(5);
const DELAY_MS: u64 = 300;

/// Sequence numbers as they reached a node's STAMP handler, with the time.
type Arrivals = Arc<Mutex<Vec<(u64, Instant)>>>;

struct Node {
    endpoint: Endpoint,
    arrivals: Arrivals,
    echoed: Arc<AtomicUsize>,
}

fn node(id: u16) -> Node {
    let arrivals: Arrivals = Arc::default();
    let echoed = Arc::new(AtomicUsize::new(0));
    let mut handlers = Handlers::new();
    let count = echoed.clone();
    handlers
        .register(ECHO, move |request: Incoming| {
            count.fetch_add(1, Ordering::SeqCst);
            let payload = request.payload.clone();
            let _ = request.respond(payload);
        })
        .expect("register echo");
    let seen = arrivals.clone();
    handlers
        .register(STAMP, move |message: Incoming| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&message.payload[..8]);
            let seq = u64::from_le_bytes(bytes);
            seen.lock().unwrap().push((seq, Instant::now()));
        })
        .expect("register stamp");
    let config = Config::new(NodeId(id), SocketAddr::from(([127, 0, 0, 1], 0)), SECRET);
    Node {
        endpoint: Endpoint::start(config, handlers).expect("endpoint starts"),
        arrivals,
        echoed,
    }
}

fn pair() -> (Node, Node) {
    let (a, b) = (node(1), node(2));
    a.endpoint.set_address(NodeId(2), b.endpoint.local_addr());
    b.endpoint.set_address(NodeId(1), a.endpoint.local_addr());
    // Connected and healthy both ways before any filter is set.
    a.endpoint
        .request_blocking(NodeId(2), ECHO, Bytes::new(), TIMEOUT)
        .expect("a reaches b");
    b.endpoint
        .request_blocking(NodeId(1), ECHO, Bytes::new(), TIMEOUT)
        .expect("b reaches a");
    (a, b)
}

/// Sends STAMP messages `seqs` from `from` to `to`; returns when each was sent.
fn stamp(from: &Node, to: u16, seqs: std::ops::Range<u64>) -> Vec<(u64, Instant)> {
    seqs.map(|seq| {
        let sent = Instant::now();
        from.endpoint
            .send_blocking(NodeId(to), STAMP, Bytes::from(seq.to_le_bytes().to_vec()))
            .expect("send");
        (seq, sent)
    })
    .collect()
}

fn wait_for(arrivals: &Arrivals, count: usize) -> Vec<(u64, Instant)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = arrivals.lock().unwrap().clone();
        if seen.len() >= count {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {count} arrived",
            seen.len()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The sequence numbers arrived in send order, each at least `min` after it was sent
/// (and, with `max`, less than that).
fn check_latency(
    sent: &[(u64, Instant)],
    arrived: &[(u64, Instant)],
    min: Duration,
    max: Option<Duration>,
) {
    let order: Vec<u64> = arrived.iter().map(|(seq, _)| *seq).collect();
    let expected: Vec<u64> = sent.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(order, expected, "arrival order");
    for ((seq, sent), (_, arrived)) in sent.iter().zip(arrived) {
        let latency = arrived.duration_since(*sent);
        assert!(latency >= min, "message {seq} took {latency:?} < {min:?}");
        if let Some(max) = max {
            assert!(latency < max, "message {seq} took {latency:?} >= {max:?}");
        }
    }
}

fn is_timeout<T: std::fmt::Debug>(outcome: Result<T, NetError>) -> bool {
    matches!(outcome, Err(NetError::Timeout(_)))
}

#[test]
fn a_partition_cuts_both_directions_and_heals() {
    let (a, b) = pair();
    a.endpoint.set_fault(NodeId(2), Fault::Partition);
    assert_eq!(a.endpoint.faults(NodeId(2)), vec![Fault::Partition]);
    assert!(is_timeout(a.endpoint.request_blocking(
        NodeId(2),
        ECHO,
        Bytes::new(),
        SHORT
    )));
    assert!(is_timeout(b.endpoint.request_blocking(
        NodeId(1),
        ECHO,
        Bytes::new(),
        SHORT
    )));
    stamp(&b, 1, 0..3);
    stamp(&a, 2, 0..3);
    std::thread::sleep(Duration::from_millis(50));
    assert!(a.arrivals.lock().unwrap().is_empty());
    assert!(b.arrivals.lock().unwrap().is_empty());
    // Healed: both directions work on the same connection.
    a.endpoint.clear_fault(NodeId(2));
    assert!(a.endpoint.faults(NodeId(2)).is_empty());
    a.endpoint
        .request_blocking(NodeId(2), ECHO, Bytes::new(), TIMEOUT)
        .expect("a reaches b after healing");
    b.endpoint
        .request_blocking(NodeId(1), ECHO, Bytes::new(), TIMEOUT)
        .expect("b reaches a after healing");
    let sent = stamp(&b, 1, 10..13);
    check_latency(&sent, &wait_for(&a.arrivals, 3), Duration::ZERO, None);
}

#[test]
fn a_drop_in_one_direction_leaves_the_other_working() {
    let (a, b) = pair();
    // Outgoing only: a's messages to b are lost, b's reach a.
    a.endpoint.set_fault(NodeId(2), Fault::DropOutgoing);
    stamp(&a, 2, 0..3);
    let sent = stamp(&b, 1, 0..3);
    check_latency(&sent, &wait_for(&a.arrivals, 3), Duration::ZERO, None);
    assert!(
        b.arrivals.lock().unwrap().is_empty(),
        "a's messages dropped"
    );
    // A request from b is handled by a, but its response is lost on the way back.
    let handled = a.echoed.load(Ordering::SeqCst);
    assert!(is_timeout(b.endpoint.request_blocking(
        NodeId(1),
        ECHO,
        Bytes::new(),
        SHORT
    )));
    assert_eq!(a.echoed.load(Ordering::SeqCst), handled + 1);

    // Incoming only: b's messages to a are discarded, a's reach b.
    a.endpoint.set_fault(NodeId(2), Fault::DropIncoming);
    assert_eq!(a.endpoint.faults(NodeId(2)), vec![Fault::DropIncoming]);
    stamp(&b, 1, 3..6);
    let sent = stamp(&a, 2, 3..6);
    check_latency(&sent, &wait_for(&b.arrivals, 3), Duration::ZERO, None);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        a.arrivals.lock().unwrap().len(),
        3,
        "b's messages discarded"
    );
    // A request from a reaches b, but the response is discarded on arrival.
    let handled = b.echoed.load(Ordering::SeqCst);
    assert!(is_timeout(a.endpoint.request_blocking(
        NodeId(2),
        ECHO,
        Bytes::new(),
        SHORT
    )));
    assert_eq!(b.echoed.load(Ordering::SeqCst), handled + 1);

    a.endpoint.clear_fault(NodeId(2));
    let sent = stamp(&b, 1, 6..9);
    let arrived = wait_for(&a.arrivals, 6);
    check_latency(&sent, &arrived[3..], Duration::ZERO, None);
}

#[test]
fn an_outgoing_delay_holds_every_message_in_order_and_only_that_way() {
    let (a, b) = pair();
    let delay = Duration::from_millis(DELAY_MS);
    a.endpoint
        .set_fault(NodeId(2), Fault::DelayOutgoing { ms: DELAY_MS });
    let sent = stamp(&a, 2, 0..50);
    // The other direction is not slowed.
    let back = stamp(&b, 1, 0..5);
    check_latency(
        &back,
        &wait_for(&a.arrivals, 5),
        Duration::ZERO,
        Some(delay),
    );
    check_latency(&sent, &wait_for(&b.arrivals, 50), delay, None);
    // A request's round trip includes the delay once (the response is not delayed).
    let start = Instant::now();
    a.endpoint
        .request_blocking(NodeId(2), ECHO, Bytes::from_static(b"x"), TIMEOUT)
        .expect("delayed request answered");
    assert!(start.elapsed() >= delay, "round trip {:?}", start.elapsed());
}

#[test]
fn an_incoming_delay_holds_every_message_in_order_and_only_that_way() {
    let (a, b) = pair();
    let delay = Duration::from_millis(DELAY_MS);
    a.endpoint
        .set_fault(NodeId(2), Fault::DelayIncoming { ms: DELAY_MS });
    let sent = stamp(&b, 1, 0..50);
    let out = stamp(&a, 2, 0..5);
    check_latency(&out, &wait_for(&b.arrivals, 5), Duration::ZERO, Some(delay));
    check_latency(&sent, &wait_for(&a.arrivals, 50), delay, None);
    // A request from a: its response comes back through the delay.
    let start = Instant::now();
    a.endpoint
        .request_blocking(NodeId(2), ECHO, Bytes::from_static(b"x"), TIMEOUT)
        .expect("request answered through the delay");
    assert!(start.elapsed() >= delay, "round trip {:?}", start.elapsed());
}

#[test]
fn healing_a_delay_keeps_the_order_of_what_it_still_holds() {
    let (a, b) = pair();
    a.endpoint
        .set_fault(NodeId(2), Fault::DelayOutgoing { ms: DELAY_MS });
    b.endpoint
        .set_fault(NodeId(1), Fault::DelayIncoming { ms: DELAY_MS });
    let mut sent = stamp(&a, 2, 0..20);
    a.endpoint.clear_fault(NodeId(2));
    b.endpoint.clear_fault(NodeId(1));
    // Sent after healing, but queued behind the held messages: they arrive after them.
    sent.extend(stamp(&a, 2, 20..40));
    let arrived = wait_for(&b.arrivals, 40);
    check_latency(&sent, &arrived, Duration::ZERO, None);
    let last_held = arrived[19].1;
    assert!(arrived[20].1 >= last_held);
    // Once drained, the link is fast again.
    std::thread::sleep(Duration::from_millis(50));
    let fresh = stamp(&a, 2, 40..45);
    let arrived = wait_for(&b.arrivals, 45);
    check_latency(
        &fresh,
        &arrived[40..],
        Duration::ZERO,
        Some(Duration::from_millis(DELAY_MS)),
    );
}

#[test]
fn filters_combine_a_delay_one_way_with_a_drop_the_other() {
    let (a, b) = pair();
    a.endpoint
        .set_fault(NodeId(2), Fault::DelayOutgoing { ms: DELAY_MS });
    a.endpoint.add_fault(NodeId(2), Fault::DropIncoming);
    assert_eq!(
        a.endpoint.faults(NodeId(2)),
        vec![Fault::DropIncoming, Fault::DelayOutgoing { ms: DELAY_MS }]
    );
    let sent = stamp(&a, 2, 0..5);
    stamp(&b, 1, 0..5);
    check_latency(
        &sent,
        &wait_for(&b.arrivals, 5),
        Duration::from_millis(DELAY_MS),
        None,
    );
    assert!(
        a.arrivals.lock().unwrap().is_empty(),
        "b's messages dropped"
    );
    // A fault set on a connection opened later applies too.
    a.endpoint.disconnect(NodeId(2));
    let sent = stamp(&a, 2, 5..8);
    let arrived = wait_for(&b.arrivals, 8);
    check_latency(&sent, &arrived[5..], Duration::from_millis(DELAY_MS), None);
}

/// A peer that has not yet read the close of a connection (here: its incoming delay still
/// holds a message sent just before the close, and the close comes after it) answers a new
/// dial from the same instance with `Duplicate`. The dialer dials again until the peer has
/// retired the old connection, instead of failing with `ConnectTimeout` (CI saw this under
/// load, without any filter).
#[test]
fn a_dial_while_the_peer_still_holds_the_closed_connection_gets_through() {
    let (a, b) = pair();
    b.endpoint
        .set_fault(NodeId(1), Fault::DelayIncoming { ms: DELAY_MS });
    let mut sent = stamp(&a, 2, 0..1);
    a.endpoint.disconnect(NodeId(2));
    // Dials while b's reader still holds message 0 and, behind it, the close.
    sent.extend(stamp(&a, 2, 1..3));
    let arrived = wait_for(&b.arrivals, 3);
    check_latency(&sent, &arrived, Duration::from_millis(DELAY_MS), None);
}

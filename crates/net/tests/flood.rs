//! Unauthenticated load on one endpoint: half-open, garbage and wrong-secret connections.
//! At most `pending_handshakes_max` handshakes are pending at once (the rest are closed
//! unread and counted); an established connection keeps carrying requests throughout;
//! once the flood ends the slots free and new nodes connect again; the sender-role check
//! of `Handlers::restrict` closes a refused sender's connection and only that one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_net::wire::{self, Greeting, GREETING_BYTES};
use myriad_net::{Config, Endpoint, Handlers, Incoming, MessageType, NetError, NodeId};

const SECRET: &str = "flood test secret";
const ECHO: MessageType = MessageType::unordered(1, 1);
const INTERNAL: MessageType = MessageType::unordered(1, 2);
const TIMEOUT: Duration = Duration::from_secs(5);
const PENDING_MAX: usize = 8;

fn config(id: u16) -> Config {
    let mut config = Config::new(NodeId(id), SocketAddr::from(([127, 0, 0, 1], 0)), SECRET);
    config.handshake_timeout = Duration::from_secs(2);
    config
}

fn server() -> Endpoint {
    let mut handlers = Handlers::new();
    for message_type in [ECHO, INTERNAL] {
        handlers
            .register(message_type, |request: Incoming| {
                let payload = request.payload.clone();
                let _ = request.respond(payload);
            })
            .expect("register");
    }
    // Only node 2 may send INTERNAL.
    handlers
        .restrict(INTERNAL, |from| from == NodeId(2))
        .expect("restrict");
    let mut config = config(1);
    config.pending_handshakes_max = PENDING_MAX;
    Endpoint::start(config, handlers).expect("server starts")
}

fn client(id: u16, server: &Endpoint) -> Endpoint {
    let endpoint = Endpoint::start(config(id), Handlers::new()).expect("client starts");
    endpoint.set_address(NodeId(1), server.local_addr());
    endpoint
}

fn echo(client: &Endpoint, round: usize) {
    let payload = Bytes::from(format!("round {round}"));
    let answer = client
        .request_blocking(NodeId(1), ECHO, payload.clone(), TIMEOUT)
        .expect("echo during the flood");
    assert_eq!(answer, payload);
}

/// Polls `done` every 10 ms for up to `limit`.
fn wait(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_flood_of_unauthenticated_connections_is_bounded_and_the_served_connection_goes_on() {
    let server = server();
    let addr = server.local_addr();
    let worker = client(2, &server);
    echo(&worker, 0);
    let handle = server.handle();

    // Half-open: connect and say nothing (held open), many more than the cap.
    let mut held: Vec<TcpStream> = (0..PENDING_MAX * 6)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    wait(TIMEOUT, "the cap to be reached", || {
        let (pending, refused, _) = handle.handshake_counts();
        pending == PENDING_MAX && refused > 0
    });
    for round in 1..=20 {
        echo(&worker, round);
        let (pending, _, _) = handle.handshake_counts();
        assert!(pending <= PENDING_MAX, "{pending} pending handshakes");
    }
    // Connections beyond the cap were closed unread: their reads end.
    let mut closed = 0;
    for stream in &mut held {
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        // Closed by the server: end of stream or a reset (a held one times out instead).
        match stream.read(&mut [0u8; 1]) {
            Ok(0) => closed += 1,
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            _ => {}
        }
    }
    assert!(closed >= PENDING_MAX * 5, "only {closed} closed");

    // Garbage, and a greeting followed by a wrong proof: failed handshakes.
    for index in 0..PENDING_MAX * 2 {
        if let Ok(mut stream) = TcpStream::connect(addr) {
            let _ = stream.write_all(&[0xA5u8; 97][..(index % 90) + 7]);
        }
        if let Ok(mut stream) = TcpStream::connect(addr) {
            let greeting = Greeting {
                node: 900 + index as u16,
                instance: index as u64,
                nonce: [7u8; wire::NONCE_BYTES],
                lane: false,
            };
            if stream.write_all(&greeting.encode()).is_ok() {
                let mut reply = [0u8; GREETING_BYTES + wire::PROOF_BYTES];
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = stream.read_exact(&mut reply);
                let _ = stream.write_all(&[0u8; wire::PROOF_BYTES]);
            }
        }
        echo(&worker, 100 + index);
    }
    drop(held);
    wait(TIMEOUT, "the pending handshakes to drain", || {
        handle.handshake_counts().0 == 0
    });
    let (_, refused, failed) = handle.handshake_counts();
    assert!(refused >= (PENDING_MAX * 5) as u64, "refused {refused}");
    assert!(failed > 0, "no failed handshake counted");

    // Slots are free again: a new node connects and is served.
    let late = client(3, &server);
    echo(&late, 1000);
    echo(&worker, 1001);
}

#[test]
fn a_refused_sender_loses_its_connection_and_no_one_else_does() {
    let server = server();
    let allowed = client(2, &server);
    let other = client(3, &server);
    let payload = Bytes::from_static(b"internal");
    assert_eq!(
        allowed
            .request_blocking(NodeId(1), INTERNAL, payload.clone(), TIMEOUT)
            .expect("node 2 may send it"),
        payload
    );
    let refused = other.request_blocking(NodeId(1), INTERNAL, payload.clone(), TIMEOUT);
    assert!(
        matches!(refused, Err(NetError::ConnectionLost(NodeId(1)))),
        "{refused:?}"
    );
    // Both go on: the refused node over a new connection, for the types it may send.
    echo(&other, 1);
    echo(&allowed, 2);
    assert!(allowed
        .request_blocking(NodeId(1), INTERNAL, payload, TIMEOUT)
        .is_ok());
}

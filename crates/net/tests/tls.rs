//! TLS between endpoints over real loopback sockets: requests small and large (many TLS
//! records, many frames) and one-way messages arrive; a certificate from another CA and a
//! plaintext connector are refused, in either direction; client certificates serve both
//! directions (superpeers dial clients).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_net::tls::{create_ca, issue};
use myriad_net::{
    Bytes, CertRole, Config, Endpoint, Handlers, Incoming, MessageType, NetError, NodeId, TlsConfig,
};

const SECRET: &str = "test cluster secret";
const ECHO: MessageType = MessageType::unordered(1, 1);
const COUNT: MessageType = MessageType::ordered(1, 2);
const TIMEOUT: Duration = Duration::from_secs(5);

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn handlers(counter: &Arc<AtomicUsize>) -> Handlers {
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

fn tls_endpoint(id: u16, tls: Option<TlsConfig>, counter: &Arc<AtomicUsize>) -> Endpoint {
    let mut config = Config::new(NodeId(id), loopback(), SECRET);
    config.tls = tls;
    config.connect_timeout = Duration::from_secs(2);
    Endpoint::start(config, handlers(counter)).expect("endpoint starts")
}

fn link(a: &Endpoint, b: &Endpoint) {
    a.set_address(b.node_id(), b.local_addr());
    b.set_address(a.node_id(), a.local_addr());
}

fn ca_with(dir: &Path, names: &[(&str, CertRole)]) {
    create_ca(dir).expect("CA");
    for (name, role) in names {
        issue(dir, name, *role, &["127.0.0.1".to_owned()]).expect("issue");
    }
}

#[test]
fn tls_endpoints_carry_requests_and_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    ca_with(
        dir.path(),
        &[("p1", CertRole::Peer), ("p2", CertRole::Superpeer)],
    );
    let counter = Arc::new(AtomicUsize::new(0));
    let a = tls_endpoint(
        1,
        Some(TlsConfig::from_dir(dir.path(), "p1").unwrap()),
        &counter,
    );
    let b = tls_endpoint(
        2,
        Some(TlsConfig::from_dir(dir.path(), "p2").unwrap()),
        &counter,
    );
    link(&a, &b);
    let answer = a
        .request_blocking(NodeId(2), ECHO, Bytes::from_static(b"hello"), TIMEOUT)
        .expect("echo over TLS");
    assert_eq!(&answer[..], b"hello");
    // Large: many records and frames each way.
    let large: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let answer = b
        .request_blocking(NodeId(1), ECHO, Bytes::from(large.clone()), TIMEOUT)
        .expect("large echo over TLS");
    assert_eq!(&answer[..], &large[..]);
    for i in 0..10_000u32 {
        a.send_blocking(NodeId(2), COUNT, Bytes::from(i.to_le_bytes().to_vec()))
            .expect("send");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while counter.load(Ordering::SeqCst) < 10_000 {
        assert!(Instant::now() < deadline, "messages did not all arrive");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Many concurrent requests from several threads.
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let a = &a;
            scope.spawn(move || {
                for i in 0..500u32 {
                    let payload = Bytes::from(vec![t; (i % 300) as usize + 1]);
                    let answer = a
                        .request_blocking(NodeId(2), ECHO, payload.clone(), TIMEOUT)
                        .expect("echo");
                    assert_eq!(answer, payload);
                }
            });
        }
    });
}

fn refused(result: Result<Bytes, NetError>, what: &str) {
    match result {
        Err(
            NetError::ConnectFailed { .. }
            | NetError::AuthenticationFailed(_)
            | NetError::ConnectionLost(_)
            | NetError::ConnectTimeout(_),
        ) => {}
        other => panic!("{what}: expected a refused connection, got {other:?}"),
    }
}

#[test]
fn foreign_ca_and_plaintext_are_refused_client_certificates_accepted() {
    let ours = tempfile::tempdir().expect("tempdir");
    let theirs = tempfile::tempdir().expect("tempdir");
    ca_with(
        ours.path(),
        &[
            ("n1", CertRole::Peer),
            ("n2", CertRole::Peer),
            ("c1", CertRole::Client),
        ],
    );
    ca_with(theirs.path(), &[("x", CertRole::Peer)]);
    let counter = Arc::new(AtomicUsize::new(0));
    let server = tls_endpoint(
        1,
        Some(TlsConfig::from_dir(ours.path(), "n1").unwrap()),
        &counter,
    );
    // A node whose certificate another CA signed (same HMAC secret): refused.
    let foreign = tls_endpoint(
        2,
        Some(TlsConfig::from_dir(theirs.path(), "x").unwrap()),
        &counter,
    );
    link(&foreign, &server);
    refused(
        foreign.request_blocking(NodeId(1), ECHO, Bytes::from_static(b"x"), TIMEOUT),
        "foreign CA",
    );
    // A plaintext connector (same secret, no TLS): refused.
    let plain = tls_endpoint(3, None, &counter);
    link(&plain, &server);
    refused(
        plain.request_blocking(NodeId(1), ECHO, Bytes::from_static(b"x"), TIMEOUT),
        "plaintext",
    );
    // A client certificate dials a node and accepts a node's connection.
    let client = tls_endpoint(
        4,
        Some(TlsConfig::from_dir(ours.path(), "c1").unwrap()),
        &counter,
    );
    link(&client, &server);
    let answer = client
        .request_blocking(NodeId(1), ECHO, Bytes::from_static(b"ok"), TIMEOUT)
        .expect("a client certificate dials a node");
    assert_eq!(&answer[..], b"ok");
    let node2 = tls_endpoint(
        5,
        Some(TlsConfig::from_dir(ours.path(), "n2").unwrap()),
        &counter,
    );
    link(&node2, &client);
    let answer = node2
        .request_blocking(NodeId(4), ECHO, Bytes::from_static(b"back"), TIMEOUT)
        .expect("a node dials a client");
    assert_eq!(&answer[..], b"back");
    // The server dialing the foreign node: refused too (its certificate fails ours).
    link(&server, &foreign);
    refused(
        server.request_blocking(NodeId(2), ECHO, Bytes::from_static(b"x"), TIMEOUT),
        "dialing a foreign CA",
    );
    // The server still serves its own after all that.
    link(&node2, &server);
    let answer = node2
        .request_blocking(NodeId(1), ECHO, Bytes::from_static(b"still"), TIMEOUT)
        .expect("server still serves");
    assert_eq!(&answer[..], b"still");
}

#[test]
fn blocking_requests_take_tls_lanes_small_and_whole_frame_spinning_or_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    ca_with(
        dir.path(),
        &[("p1", CertRole::Peer), ("p2", CertRole::Peer)],
    );
    let counter = Arc::new(AtomicUsize::new(0));
    let mut config = Config::new(NodeId(1), loopback(), SECRET);
    config.tls = Some(TlsConfig::from_dir(dir.path(), "p1").expect("p1"));
    config.lane_spin = Duration::from_millis(20);
    let a = Endpoint::start(config, handlers(&counter)).expect("endpoint starts");
    let b = tls_endpoint(
        2,
        Some(TlsConfig::from_dir(dir.path(), "p2").expect("p2")),
        &counter,
    );
    link(&a, &b);
    let threads = 3;
    std::thread::scope(|scope| {
        for t in 0..threads as u8 {
            let a = &a;
            scope.spawn(move || {
                for i in 0..300u32 {
                    let payload = Bytes::from(vec![t; (i % 300) as usize + 1]);
                    let answer = a
                        .request_blocking(NodeId(2), ECHO, payload.clone(), TIMEOUT)
                        .expect("echo");
                    assert_eq!(answer, payload);
                }
            });
        }
    });
    let lanes = a.lane_stats(NodeId(2));
    assert!((1..=threads).contains(&lanes.outgoing_open), "{lanes:?}");
    assert_eq!(lanes.outgoing_idle, lanes.outgoing_open, "all handed back");
    assert_eq!(lanes.outgoing_opened_total as usize, lanes.outgoing_open);
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.lane_stats(NodeId(1)).incoming != lanes.outgoing_open {
        assert!(
            Instant::now() < deadline,
            "the server does not see the lanes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The requests did not travel on the node's (TLS) connection.
    let conn = a.connection_stats(NodeId(2)).expect("connection opened");
    assert!(conn.frames_sent < 10, "{conn:?}");
    // A whole frame (many TLS records, more than the session buffers per write) each way.
    let large: Vec<u8> = (0..myriad_net::wire::FRAME_PAYLOAD_BYTES_MAX)
        .map(|index| (index % 251) as u8)
        .collect();
    let answer = a
        .request_blocking(NodeId(2), ECHO, Bytes::from(large.clone()), TIMEOUT)
        .expect("whole-frame echo on a lane");
    assert!(answer[..] == large[..]);
    // A lone caller spins on its lane's TLS session (other tests of this binary may run
    // for a moment: echo until one answer was read while spinning).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut round = 0u32;
    while a.lane_stats(NodeId(2)).outgoing_spin_reads_total == 0 {
        assert!(Instant::now() < deadline, "no answer read while spinning");
        let payload = Bytes::from(round.to_le_bytes().to_vec());
        let answer = a
            .request_blocking(NodeId(2), ECHO, payload.clone(), TIMEOUT)
            .expect("echo");
        assert_eq!(answer, payload);
        round += 1;
    }
    assert_eq!(
        a.lane_stats(NodeId(2)).outgoing_opened_total as usize,
        lanes.outgoing_open,
        "the lanes were reused"
    );
}

#[test]
fn role_checks_refuse_certificates_of_the_wrong_role_both_ways_and_after_a_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    ca_with(
        dir.path(),
        &[
            ("peer", CertRole::Peer),
            ("client", CertRole::Client),
            ("superpeer", CertRole::Superpeer),
        ],
    );
    let tls = |name: &str| Some(TlsConfig::from_dir(dir.path(), name).expect("certificate"));
    let counter = Arc::new(AtomicUsize::new(0));
    // Node 2 is a peer: it must present a peer certificate. Node 1 says it is a client.
    let peer_only =
        |node: NodeId, role: Option<CertRole>| node != NodeId(2) || role == Some(CertRole::Peer);
    let client_only =
        |node: NodeId, role: Option<CertRole>| node != NodeId(1) || role == Some(CertRole::Client);
    let echo = |from: &Endpoint, to: u16| {
        from.request_blocking(NodeId(to), ECHO, Bytes::from_static(b"role"), TIMEOUT)
    };

    // Node 2 holds a client certificate: its own connections and lanes to node 1 are
    // refused by node 1 (acceptor), and node 1's connections to it by node 1 (connector).
    let one = tls_endpoint(1, tls("client"), &counter);
    let two = tls_endpoint(2, tls("client"), &counter);
    link(&one, &two);
    one.check_roles(peer_only);
    refused(
        echo(&two, 1),
        "a client certificate as peer 2 (accepted by 1)",
    );
    refused(
        echo(&one, 2),
        "a client certificate as peer 2 (dialed by 1)",
    );
    assert!(
        one.handshake_counts().2 >= 1,
        "counted as a failed handshake"
    );
    drop((one, two));

    // A superpeer's certificate is no peer's either; a peer certificate for node 1
    // (a client) is refused by node 2.
    let one = tls_endpoint(1, tls("peer"), &counter);
    let two = tls_endpoint(2, tls("superpeer"), &counter);
    link(&one, &two);
    one.check_roles(peer_only);
    two.check_roles(client_only);
    refused(echo(&two, 1), "a superpeer certificate as peer 2");
    refused(echo(&one, 2), "a peer certificate as client 1");
    drop((one, two));

    // The right roles pass; a check installed later refuses the next handshake (the
    // connection up stays until it closes).
    let one = tls_endpoint(1, tls("client"), &counter);
    let two = tls_endpoint(2, tls("peer"), &counter);
    link(&one, &two);
    one.check_roles(peer_only);
    two.check_roles(client_only);
    assert_eq!(&echo(&one, 2).expect("right roles")[..], b"role");
    assert_eq!(&echo(&two, 1).expect("right roles")[..], b"role");
    two.check_roles(|_, _| false);
    one.disconnect(NodeId(2));
    two.disconnect(NodeId(1));
    refused(echo(&one, 2), "a handshake after the check changed");
}

//! TLS end to end with real processes on 127.0.0.1: `myriad cert` writes a CA and
//! certificates (keys `0600`); a cluster started with TLS (`LaunchSpec::tls`, as
//! `myriad cluster start --tls`) serves the terminal (which finds `DIR/tls` through
//! `--cluster`, or takes `--tls-dir/--tls-name`) and a library client with the client
//! certificate; a client without TLS, or with a certificate of another CA, is refused
//! while the cluster keeps serving.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::{Client, ClientConfig};
use myriad_testing::process::{Cluster, Myriad};

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");
const RUN_TIMEOUT: Duration = Duration::from_secs(40);

/// `myriad term <args> -c script --json`: exit code and output lines as JSON.
fn term(args: &[&str], script: &str) -> (Option<i32>, Vec<serde_json::Value>) {
    let output = Myriad::new(BINARY, ["term", "--json"])
        .args(args)
        .arg("-c")
        .arg(script)
        .env_remove("MYRIAD_SECRET_FILE")
        .timeout(RUN_TIMEOUT)
        .run();
    let values = output
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    (output.code(), values)
}

#[test]
fn myriad_cert_writes_a_ca_and_private_keys() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("certs");
    let dir_arg = dir.display().to_string();
    Myriad::new(BINARY, ["cert", "ca", &dir_arg])
        .timeout(RUN_TIMEOUT)
        .run()
        .assert_success("myriad cert ca");
    Myriad::new(
        BINARY,
        [
            "cert",
            "issue",
            &dir_arg,
            "sp1",
            "--role",
            "superpeer",
            "--host",
            "10.1.0.1",
        ],
    )
    .timeout(RUN_TIMEOUT)
    .run()
    .assert_success("myriad cert issue");
    for (file, mode) in [
        ("ca.pem", 0o644),
        ("ca.key", 0o600),
        ("sp1.pem", 0o644),
        ("sp1.key", 0o600),
    ] {
        let meta = std::fs::metadata(dir.join(file)).expect(file);
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
    }
    myriad_net::TlsConfig::from_dir(&dir, "sp1").expect("the issued certificate loads");
    // A second CA over the first, an unknown role: refused, nonzero exit.
    let again = Myriad::new(BINARY, ["cert", "ca", &dir_arg])
        .timeout(RUN_TIMEOUT)
        .run();
    assert!(!again.success(), "a CA was overwritten");
    let bad = Myriad::new(BINARY, ["cert", "issue", &dir_arg, "x", "--role", "king"])
        .timeout(RUN_TIMEOUT)
        .run();
    assert!(
        !bad.success() && bad.stderr.contains("unknown role"),
        "{}",
        bad.stderr
    );
}

fn client_with(cluster: &mut Cluster, tls: Option<(&Path, &str)>) -> Result<Client, String> {
    let launcher_dir = cluster.launcher_mut().dir().to_path_buf();
    let mut config = ClientConfig::new(cluster.launcher_mut().superpeers())
        .with_secret_file(&launcher_dir.join("secret"))
        .map_err(|e| e.to_string())?;
    config.join.request_timeout = Duration::from_secs(3);
    if let Some((dir, name)) = tls {
        config = config.with_tls_dir(dir, name).map_err(|e| e.to_string())?;
    }
    Client::connect_with(config).map_err(|e| e.to_string())
}

#[test]
fn a_tls_cluster_serves_tls_clients_and_refuses_others() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::builder(BINARY, root.path())
        .superpeers(1)
        .peers(2)
        .peer_memory_mb(64)
        .tls(true)
        .keep_logs_on_panic()
        .start();
    let dir = cluster.launcher_mut().dir().to_path_buf();
    let tls_dir = dir.join("tls");
    for node in cluster.launcher_mut().nodes() {
        assert!(
            node.args.iter().any(|arg| arg == "--tls-dir"),
            "{} runs without TLS: {:?}",
            node.name,
            node.args
        );
    }
    let peer = cluster.peer_entries()[0].node_id;
    let peer = format!("0x{peer:04x}");
    let dir_arg = dir.display().to_string();

    // The terminal finds DIR/tls through --cluster.
    let (code, values) = term(&["--cluster", &dir_arg], &format!("chunkcreate 8 {peer} 1"));
    assert_eq!(code, Some(0), "{values:?}");
    let cid = values[0][0]["cid"].as_str().expect("a CID").to_owned();
    // ... and takes --tls-dir/--tls-name with a superpeer list.
    let superpeers = cluster.launcher_mut().superpeer_list().to_owned();
    let secret = dir.join("secret").display().to_string();
    let tls_arg = tls_dir.display().to_string();
    let (code, values) = term(
        &[
            "--superpeers",
            &superpeers,
            "--secret-file",
            &secret,
            "--tls-dir",
            &tls_arg,
            "--tls-name",
            "client",
        ],
        &format!("chunkput {cid} abcdefgh; chunkget {cid}"),
    );
    assert_eq!(code, Some(0), "{values:?}");
    assert_eq!(values[1]["data"], "abcdefgh", "{values:?}");
    // Without TLS the terminal cannot reach it.
    let (code, values) = term(
        &["--superpeers", &superpeers, "--secret-file", &secret],
        &format!("chunkget {cid}"),
    );
    assert_eq!(code, Some(1), "{values:?}");

    // A library client with the client certificate reads what the terminal wrote (on the
    // peer, over the peers' TLS connections too).
    let client = client_with(&mut cluster, Some((&tls_dir, "client"))).expect("TLS client joins");
    let cid: myriad_types::ChunkId = cid.parse().expect("CID");
    assert_eq!(
        client.blocking().chunks().get(cid).expect("get"),
        Bytes::from_static(b"abcdefgh")
    );
    // Refused: no TLS; a certificate of another CA.
    assert!(
        client_with(&mut cluster, None).is_err(),
        "a plaintext client joined"
    );
    let foreign = root.path().join("foreign");
    myriad_net::tls::create_ca(&foreign).expect("CA");
    myriad_net::tls::issue(&foreign, "client", myriad_net::CertRole::Client, &[]).expect("cert");
    assert!(
        client_with(&mut cluster, Some((&foreign, "client"))).is_err(),
        "a client of another CA joined"
    );
    // Still serving.
    let chunks = client.blocking();
    chunks
        .chunks()
        .put(cid, Bytes::from_static(b"12345678"))
        .expect("put after the refusals");
    assert_eq!(
        chunks.chunks().get(cid).expect("get"),
        Bytes::from_static(b"12345678")
    );
    client.shutdown();
}

/// An endpoint of node `id` with the certificate `name` of `tls_dir` and the cluster's
/// secret, knowing `nodes`' addresses.
fn impostor(
    id: u16,
    tls_dir: &Path,
    name: &str,
    secret: Vec<u8>,
    nodes: &[(u16, String)],
) -> myriad_net::Endpoint {
    let mut config = myriad_net::Config::new(
        myriad_types::NodeId(id),
        "127.0.0.1:0".parse().expect("address"),
        secret,
    );
    config.tls = Some(myriad_net::TlsConfig::from_dir(tls_dir, name).expect("certificate"));
    config.connect_timeout = Duration::from_secs(2);
    let endpoint =
        myriad_net::Endpoint::start(config, myriad_net::Handlers::new()).expect("endpoint");
    for (node, address) in nodes {
        endpoint.set_address(
            myriad_types::NodeId(*node),
            address.parse().expect("node address"),
        );
    }
    endpoint
}

#[test]
fn certificate_roles_must_match_the_claimed_and_recorded_roles() {
    use myriad_proto::meta::{JoinReply, JoinRequest};
    use myriad_types::NodeId;
    let root = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::builder(BINARY, root.path())
        .superpeers(1)
        .peers(2)
        .peer_memory_mb(64)
        .tls(true)
        .keep_logs_on_panic()
        .start();
    let dir = cluster.launcher_mut().dir().to_path_buf();
    let tls_dir = dir.join("tls");
    let secret = myriad_net::secret::read_file(&dir.join("secret")).expect("secret");
    let nodes: Vec<(u16, String)> = cluster
        .launcher_mut()
        .nodes()
        .iter()
        .map(|node| (node.node_id, node.address.clone()))
        .collect();
    let superpeer = cluster.launcher_mut().superpeers()[0].0;
    let peers: Vec<u16> = cluster
        .peer_entries()
        .iter()
        .map(|peer| peer.node_id)
        .collect();

    // Joining as a client takes a client certificate: a peer's or a superpeer's is
    // refused, the client's is accepted.
    for name in ["peer", "superpeer"] {
        let error = client_with(&mut cluster, Some((&tls_dir, name)))
            .expect_err("joined as a client with another role's certificate");
        assert!(
            error.contains(&format!("a {name} certificate cannot join as a client")),
            "{name}: {error}"
        );
    }
    let client = client_with(&mut cluster, Some((&tls_dir, "client"))).expect("client joins");

    // Joining as a peer takes a peer certificate (a raw join from a provisional ID).
    let join = |name: &str| {
        let endpoint = impostor(0xff01, &tls_dir, name, secret.clone(), &nodes);
        let request = JoinRequest {
            role: myriad_meta::Role::Peer,
            address: "127.0.0.1:1".to_owned(),
            capabilities: myriad_meta::Capabilities::default(),
            rack: 0,
            switch: 0,
            reclaim: None,
        };
        let reply = endpoint
            .request_blocking(
                superpeer,
                myriad_proto::types::JOIN,
                request.encode(),
                Duration::from_secs(5),
            )
            .expect("the superpeer answers");
        JoinReply::decode(reply).expect("a join reply")
    };
    for name in ["client", "superpeer"] {
        match join(name) {
            JoinReply::Refused(error) => assert!(
                error
                    .to_string()
                    .contains(&format!("a {name} certificate cannot join as a peer")),
                "{name}: {error}"
            ),
            other => panic!("a {name} certificate joined as a peer: {other:?}"),
        }
    }

    // Connections under recorded IDs need the recorded role's certificate: a peer
    // certificate cannot act as the superpeer, a client certificate not as a peer, a peer
    // certificate not as the client; each refused by every node that knows the role.
    let ping = |endpoint: &myriad_net::Endpoint, to: NodeId| {
        endpoint.request_blocking(
            to,
            myriad_proto::types::LOG_INFO,
            Bytes::new(),
            Duration::from_secs(3),
        )
    };
    // A node learns of the client's join from the superpeers' event, a moment after the
    // join (longer on a loaded machine); until then the client's ID is unknown to it and
    // a connection under it is not checked against a role. So each claim is tried on a
    // fresh connection until it is refused, for at most 10 s.
    let client_id = client.membership().node_id().0;
    for (claimed, name, targets) in [
        (superpeer.0, "peer", vec![peers[0], peers[1]]),
        (peers[0], "client", vec![superpeer.0, peers[1]]),
        (client_id, "peer", vec![superpeer.0, peers[0]]),
    ] {
        for target in targets {
            let started = std::time::Instant::now();
            loop {
                let endpoint = impostor(claimed, &tls_dir, name, secret.clone(), &nodes);
                let outcome = ping(&endpoint, NodeId(target));
                if matches!(
                    outcome,
                    Err(myriad_net::NetError::AuthenticationFailed(_)
                        | myriad_net::NetError::ConnectFailed { .. }
                        | myriad_net::NetError::ConnectionLost(_))
                ) {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "node {claimed:#06x} with a {name} certificate reached {target:#06x}: {outcome:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // The cluster still serves its client (its own nodes, with the right certificates,
    // passed the same checks all along).
    let chunks = client.blocking();
    let cid = chunks
        .chunks()
        .create_with_data(NodeId(peers[1]), vec![Bytes::from_static(b"roles")])
        .expect("create")[0];
    assert_eq!(
        chunks.chunks().get(cid).expect("get"),
        Bytes::from_static(b"roles")
    );
    client.shutdown();
}

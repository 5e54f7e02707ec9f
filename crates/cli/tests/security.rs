//! The cluster secret end to end, with real processes on 127.0.0.1: `myriad cluster start`
//! without a secret writes a random one to `DIR/secret` (mode 0600) and hands every node
//! its path, never the secret; the terminal (`--cluster`, `--secret-file`,
//! `MYRIAD_SECRET_FILE`) and a library client reach the cluster with it; a wrong secret is
//! refused while the cluster keeps serving; nodes without a secret refuse to start.
//!
//! The cluster started through the command line outlives that command (its nodes run on
//! in the background): a guard SIGKILLs every node of `cluster.json` when the test ends,
//! also when it panics.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::{Client, ClientConfig};
use myriad_launcher::{LocalCluster, NodeRole};
use myriad_testing::process::Myriad;

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");
const RUN_TIMEOUT: Duration = Duration::from_secs(40);

/// SIGKILLs the nodes of the cluster in its directory when dropped.
struct ClusterGuard(PathBuf);

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if let Ok(mut cluster) = LocalCluster::open(&self.0) {
            let ids: Vec<u16> = cluster.nodes().iter().map(|node| node.node_id).collect();
            for id in ids {
                let _ = cluster.kill(id);
            }
        }
    }
}

/// `myriad term <args> -c script --json`; its exit code and output lines as JSON.
fn term(args: &[&str], env: Option<&Path>, script: &str) -> (Option<i32>, Vec<serde_json::Value>) {
    let mut command = Myriad::new(BINARY, ["term", "--json"])
        .args(args)
        .arg("-c")
        .arg(script)
        .env_remove("MYRIAD_SECRET_FILE")
        .timeout(RUN_TIMEOUT);
    if let Some(path) = env {
        command = command.env("MYRIAD_SECRET_FILE", path);
    }
    let output = command.run();
    let values = output
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    (output.code(), values)
}

#[test]
fn a_cluster_started_without_a_secret_gets_a_private_random_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("cluster");
    let _guard = ClusterGuard(dir.clone());
    let started = Myriad::new(BINARY, ["cluster", "start", "--dir"])
        .arg(&dir)
        .args([
            "--superpeers",
            "1",
            "--peers",
            "1",
            "--peer-memory-mb",
            "64",
        ])
        .env_remove("MYRIAD_SECRET_FILE")
        .cluster_dir(&dir)
        .timeout(RUN_TIMEOUT)
        .run();
    started.assert_success("myriad cluster start");

    // DIR/secret: 32 random bytes as hex, readable by its owner only.
    let secret_path = dir.join("secret");
    let metadata = std::fs::metadata(&secret_path).expect("DIR/secret exists");
    assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
    let secret = std::fs::read_to_string(&secret_path).expect("secret");
    let secret = secret.trim_end();
    assert_eq!(secret.len(), 64, "32 bytes in hex");
    assert!(secret.bytes().all(|byte| byte.is_ascii_hexdigit()));
    assert!(
        started.stdout.contains(&secret_path.display().to_string()),
        "{}",
        started.stdout
    );

    // Nowhere else: not in the command's output, cluster.json, a node's command line or
    // environment, or a log.
    assert!(!started.stdout.contains(secret) && !started.stderr.contains(secret));
    let cluster = LocalCluster::open(&dir).expect("cluster.json");
    let json = std::fs::read_to_string(dir.join("cluster.json")).expect("cluster.json");
    assert!(!json.contains(secret), "cluster.json holds the secret");
    assert_eq!(cluster.nodes().len(), 2);
    for node in cluster.nodes() {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", node.pid)).expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains("--secret-file"), "{cmdline}");
        assert!(
            !cmdline.contains(secret),
            "{}'s command line: {cmdline}",
            node.name
        );
        let environ = std::fs::read(format!("/proc/{}/environ", node.pid)).expect("environ");
        assert!(!String::from_utf8_lossy(&environ).contains(secret));
    }
    let peer = cluster
        .nodes()
        .iter()
        .find(|node| node.role == NodeRole::Peer)
        .expect("a peer")
        .node_id;
    let peer = format!("0x{peer:04x}");

    // The terminal finds the secret through --cluster.
    let (code, values) = term(
        &["--cluster", &dir.display().to_string()],
        None,
        &format!("chunkcreate 8 {peer} 1"),
    );
    assert_eq!(code, Some(0), "{values:?}");
    let cid = values[0][0]["cid"]
        .as_str()
        .expect("a created CID")
        .to_owned();
    // ... through --secret-file and through MYRIAD_SECRET_FILE with a superpeer list.
    let superpeers = cluster.superpeer_list().to_owned();
    let secret_arg = secret_path.display().to_string();
    let (code, values) = term(
        &["--superpeers", &superpeers, "--secret-file", &secret_arg],
        None,
        &format!("chunkput {cid} abcdefgh"),
    );
    assert_eq!(code, Some(0), "{values:?}");
    let (code, values) = term(
        &["--superpeers", &superpeers],
        Some(&secret_path),
        &format!("chunkget {cid}"),
    );
    assert_eq!(code, Some(0), "{values:?}");
    assert_eq!(values[0]["data"], "abcdefgh");

    // A library client reads the same file.
    let config = ClientConfig::new(cluster.superpeers())
        .with_secret_file(&secret_path)
        .expect("the secret file reads");
    let client = Client::connect_with(config).expect("client joins");
    let cid: myriad_types::ChunkId = cid.parse().expect("CID");
    assert_eq!(
        client.blocking().chunks().get(cid).expect("get"),
        Bytes::from_static(b"abcdefgh")
    );

    // A wrong secret is refused: by the library and by the terminal.
    let mut wrong = ClientConfig::new(cluster.superpeers());
    wrong.join.secret = myriad_net::secret::generate().into_bytes();
    wrong.join.request_timeout = Duration::from_secs(2);
    let refused = Client::connect_with(wrong);
    assert!(refused.is_err(), "a client with a wrong secret joined");
    let wrong_file = root.path().join("wrong-secret");
    myriad_net::secret::create_file(&wrong_file).expect("another secret");
    let (code, values) = term(
        &["--superpeers", &superpeers],
        Some(&wrong_file),
        &format!("chunkget {cid}"),
    );
    assert_eq!(code, Some(1), "{values:?}");
    assert!(values[0]["error"].as_str().is_some(), "{values:?}");
    // The cluster kept serving the right secret.
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

    for log in std::fs::read_dir(dir.join("logs")).expect("logs") {
        let text = std::fs::read_to_string(log.expect("log").path()).expect("log text");
        assert!(!text.contains(secret), "a log holds the secret");
    }
    Myriad::new(BINARY, ["cluster", "stop", "--dir"])
        .arg(&dir)
        .timeout(RUN_TIMEOUT)
        .run()
        .assert_success("myriad cluster stop");
}

/// `myriad <args>` without any secret configured: its exit status and stderr.
fn run_without_secret(args: &[&str], data_dir: &Path) -> (bool, String) {
    let output = Myriad::new(BINARY, args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("MYRIAD_SECRET_FILE")
        .env_remove("RUST_BACKTRACE")
        .timeout(Duration::from_secs(20))
        .run();
    (output.success(), output.stderr)
}

#[test]
fn nodes_without_a_secret_refuse_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Non-loopback: refused with the reason, before any port is bound.
    let (ok, stderr) = run_without_secret(
        &[
            "superpeer",
            "--id",
            "1",
            "--listen",
            "0.0.0.0:7",
            "--superpeers",
            "1=0.0.0.0:7",
        ],
        &dir.path().join("sp"),
    );
    assert!(!ok);
    assert!(
        stderr.contains("refusing to listen on the non-loopback address 0.0.0.0:7"),
        "{stderr}"
    );
    assert!(stderr.contains("--secret-file"), "{stderr}");
    let (ok, stderr) = run_without_secret(
        &[
            "peer",
            "--listen",
            "0.0.0.0:0",
            "--superpeers",
            "1=127.0.0.1:1",
        ],
        &dir.path().join("peer"),
    );
    assert!(!ok);
    assert!(stderr.contains("non-loopback"), "{stderr}");
    // Loopback: refused too (there is no default secret).
    let (ok, stderr) = run_without_secret(
        &["peer", "--superpeers", "1=127.0.0.1:1"],
        &dir.path().join("peer"),
    );
    assert!(!ok);
    assert!(stderr.contains("no cluster secret configured"), "{stderr}");
    // A secret file that other users may read is refused.
    let loose = dir.path().join("loose");
    std::fs::write(&loose, "not so secret\n").expect("write");
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let output = Myriad::new(BINARY, ["peer", "--superpeers", "1=127.0.0.1:1"])
        .arg("--secret-file")
        .arg(&loose)
        .env_remove("RUST_BACKTRACE")
        .timeout(Duration::from_secs(20))
        .run();
    assert!(!output.success());
    assert!(output.stderr.contains("chmod 600"), "{}", output.stderr);
}

/// Opens `count` connections to `address` and holds them without a word.
fn half_open(address: &str, count: usize) -> Vec<std::net::TcpStream> {
    (0..count)
        .filter_map(|_| std::net::TcpStream::connect(address).ok())
        .collect()
}

/// Opens `count` connections to `address`, writes garbage of varying length to each and
/// closes it.
fn garbage(address: &str, count: usize) {
    use std::io::Write;
    for index in 0..count {
        if let Ok(mut stream) = std::net::TcpStream::connect(address) {
            let bytes: Vec<u8> = (0..(index % 200) + 1)
                .map(|i| (i * 131 + index) as u8)
                .collect();
            let _ = stream.write_all(&bytes);
        }
    }
}

#[test]
fn a_flood_of_unauthenticated_connections_does_not_stop_the_cluster() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = myriad_testing::process::Cluster::builder(BINARY, dir.path())
        .superpeers(1)
        .peers(2)
        .peer_memory_mb(64)
        .start();
    let secret = cluster.secret().expect("secret");
    let peer = cluster.peer_ids()[0];
    let peer_address = cluster.node(peer.0).address.clone();
    let superpeer_address = cluster.superpeer_addresses()[0].1.clone();
    let client = Client::connect(cluster.superpeers(), secret.clone()).expect("client joins");

    // A writer: create, put and read back one chunk after another, remembering every
    // acknowledged value; its connections are open before the flood starts.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let written: Arc<Mutex<Vec<(myriad_types::ChunkId, Bytes)>>> = Arc::default();
    let writer = {
        let (client, stop, failures, written) = (
            client.clone(),
            stop.clone(),
            failures.clone(),
            written.clone(),
        );
        std::thread::spawn(move || {
            let blocking = client.blocking();
            let chunks = blocking.chunks();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) && round < 100_000 {
                let value = Bytes::from(format!("value {round:08}"));
                let result = chunks
                    .create_with_data(peer, vec![value.clone()])
                    .and_then(|cids| {
                        let read = chunks.get(cids[0])?;
                        Ok((cids[0], read))
                    });
                match result {
                    Ok((cid, read)) if read == value => written.lock().unwrap().push((cid, value)),
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                round += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    myriad_testing::process::wait_until(Duration::from_secs(10), "writes before the flood", || {
        written.lock().unwrap().len() >= 20
    });

    // The flood: more half-open connections than a node keeps pending handshakes for
    // (myriad_net::PENDING_HANDSHAKES_MAX), held for seconds, and garbage, to the peer
    // and the superpeer.
    let before = written.lock().unwrap().len();
    let flood_start = std::time::Instant::now();
    let mut held = half_open(&peer_address, myriad_net::PENDING_HANDSHAKES_MAX * 2);
    held.extend(half_open(
        &superpeer_address,
        myriad_net::PENDING_HANDSHAKES_MAX * 2,
    ));
    while flood_start.elapsed() < Duration::from_secs(3) {
        garbage(&peer_address, 50);
        garbage(&superpeer_address, 50);
    }
    let during = written.lock().unwrap().len() - before;
    drop(held);
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    assert!(
        during >= 10,
        "only {during} writes went through during the flood"
    );
    assert_eq!(failures.load(Ordering::Relaxed), 0, "operations failed");

    // Nothing lost; new connections are accepted again (a new client joins and reads).
    let reader = Client::connect(cluster.superpeers(), secret).expect("a new client joins");
    let written = written.lock().unwrap().clone();
    for (cid, value) in &written {
        assert_eq!(
            &reader.blocking().chunks().get(*cid).expect("read back"),
            value
        );
    }
    reader.shutdown();
    client.shutdown();
    let log = std::fs::read_to_string(&cluster.node(peer.0).log).expect("peer log");
    assert!(
        log.contains("too many pending handshakes"),
        "the peer never hit its handshake cap"
    );
}

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

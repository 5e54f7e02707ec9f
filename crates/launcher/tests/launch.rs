//! The local cluster launcher against a fake node: a shell script that parses the node
//! command-line contract's flags, writes its ready file atomically and sleeps. Modes (an
//! extra `--fake-mode M` argument, applied to the role given by `--fake-role`): `exit`
//! (prints to its log and exits 3 at once), `hang` (never ready), `stubborn` (ignores
//! SIGTERM). Every cluster is started owned, so its processes die with the test.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use myriad_launcher::{LaunchError, LaunchSpec, LocalCluster, NodeRole};

const FAKE_NODE: &str = r#"#!/bin/sh
role="$1"; shift
id=0; listen=""; ready=""; mode=""; mode_role=""
while [ $# -gt 0 ]; do
  case "$1" in
    --id) id="$2"; shift 2 ;;
    --listen) listen="$2"; shift 2 ;;
    --ready-file) ready="$2"; shift 2 ;;
    --fake-mode) mode="$2"; shift 2 ;;
    --fake-role) mode_role="$2"; shift 2 ;;
    *) shift ;;
  esac
done
[ "$mode_role" = "$role" ] || mode=""
echo "fake $role starting id=$id listen=$listen pid=$$"
if [ "$mode" = "exit" ]; then echo "fatal: cannot bind (fake)"; exit 3; fi
if [ "$mode" = "hang" ]; then while :; do sleep 1; done; fi
if [ "$role" = "peer" ]; then
  id=$((100 + $$ % 30000)); listen="127.0.0.1:$((20000 + $$ % 30000))"
fi
if [ "$mode" = "stubborn" ]; then trap '' TERM; else trap 'echo "fake $role got TERM"; exit 0' TERM; fi
printf '{"role":"%s","node_id":%s,"address":"%s","pid":%s}\n' "$role" "$id" "$listen" "$$" > "$ready.tmp"
mv "$ready.tmp" "$ready"
while :; do sleep 1 & wait $!; done
"#;

fn fake_binary(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("fake-myriad");
    fs::write(&path, FAKE_NODE).expect("write fake node");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn spec(root: &Path, superpeers: usize, peers: usize) -> LaunchSpec {
    let mut spec = LaunchSpec::new(root.join("cluster"), fake_binary(root));
    spec.superpeers = superpeers;
    spec.peers = peers;
    spec.peer_memory_mb = Some(64);
    spec.ready_timeout = Duration::from_secs(10);
    spec
}

fn alive_count(cluster: &mut LocalCluster) -> usize {
    cluster.status().iter().filter(|node| node.alive).count()
}

#[test]
fn start_writes_cluster_file_and_all_nodes_serve() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut cluster = LocalCluster::start_owned(spec(root.path(), 3, 2)).expect("start");
    assert_eq!(cluster.nodes().len(), 5);
    assert_eq!(alive_count(&mut cluster), 5);

    let superpeers = cluster.superpeer_addresses();
    assert_eq!(
        superpeers.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let list = cluster.superpeer_list().to_string();
    for (id, address) in &superpeers {
        assert!(list.contains(&format!("{id}={address}")), "{list}");
    }
    // The same, parsed for a client's configuration; and the peers' IDs.
    let parsed = cluster.superpeers();
    assert_eq!(parsed.len(), 3);
    for ((id, address), (node, socket)) in superpeers.iter().zip(&parsed) {
        assert_eq!(node.0, *id);
        assert_eq!(socket.to_string(), *address);
    }
    let peer_ids: Vec<u16> = cluster.peer_ids().iter().map(|id| id.0).collect();
    let expected: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Peer)
        .map(|node| node.node_id)
        .collect();
    assert_eq!(peer_ids.len(), 2);
    assert_eq!(peer_ids, expected);
    // Peers got the memory flag and the superpeer list; their IDs come from ready files.
    let peer = cluster.find("peer-1").expect("peer-1").clone();
    assert_eq!(peer.role, NodeRole::Peer);
    assert!(peer.node_id >= 100, "{peer:?}");
    assert!(peer.args.windows(2).any(|w| w == ["--memory-mb", "64"]));
    assert!(peer
        .args
        .windows(2)
        .any(|w| w[0] == "--superpeers" && w[1] == list));
    assert!(peer.log.is_file());
    // With a memory size and no configuration of the caller's, peers get backup logs
    // scaled to it; superpeers have no backup logs.
    let sized = cluster
        .dir()
        .join(myriad_launcher::sizing::PEER_BACKUP_CONFIG);
    assert!(peer
        .args
        .windows(2)
        .any(|w| w[0] == "--config" && Path::new(&w[1]) == sized));
    let text = fs::read_to_string(&sized).expect("sized config");
    assert!(text.contains("zone_mb = 16\n"), "{text}");
    let superpeer = cluster.find("superpeer-1").expect("superpeer-1");
    assert!(!superpeer.args.iter().any(|arg| arg == "--config"));

    // A second handle (as `myriad cluster status` would be) sees the same live nodes.
    let mut reopened = LocalCluster::open(cluster.dir()).expect("open");
    assert_eq!(reopened.nodes(), cluster.nodes());
    assert_eq!(alive_count(&mut reopened), 5);

    // Starting again in the same directory is refused while nodes live.
    let again = LocalCluster::start_owned(spec(root.path(), 1, 0));
    assert!(
        matches!(again, Err(LaunchError::AlreadyRunning(_))),
        "{again:?}"
    );

    let killed = cluster.stop().expect("stop");
    assert!(killed.is_empty(), "needed SIGKILL: {killed:?}");
    assert_eq!(alive_count(&mut cluster), 0);
    assert_eq!(alive_count(&mut reopened), 0);
    let log = fs::read_to_string(&peer.log).expect("log");
    assert!(log.contains("got TERM"), "{log}");
}

#[test]
fn kill_then_restart_brings_node_back_with_same_args() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut cluster = LocalCluster::start_owned(spec(root.path(), 1, 2)).expect("start");
    let before = cluster.find("superpeer-1").expect("sp").clone();

    cluster.kill(before.node_id).expect("kill");
    let status = cluster.status();
    let dead: Vec<_> = status
        .iter()
        .filter(|n| !n.alive)
        .map(|n| &n.node.name)
        .collect();
    assert_eq!(dead, ["superpeer-1"]);

    let after = cluster.restart("superpeer-1").expect("restart");
    assert_eq!(after.args, before.args);
    assert_eq!(after.data_dir, before.data_dir);
    assert_eq!(after.address, before.address);
    assert_ne!(after.pid, before.pid);
    assert_eq!(alive_count(&mut cluster), 3);
    // The cluster file was updated with the new pid.
    let reopened = LocalCluster::open(cluster.dir()).expect("open");
    assert_eq!(reopened.find("superpeer-1").expect("sp").pid, after.pid);

    // A restart of a live node (by node ID) replaces its process.
    let peer = cluster.find("peer-2").expect("peer").clone();
    let restarted = cluster
        .restart(&peer.node_id.to_string())
        .expect("restart peer");
    assert_eq!(restarted.name, "peer-2");
    assert_ne!(restarted.pid, peer.pid);
    assert_eq!(alive_count(&mut cluster), 3);
    cluster.stop().expect("stop");
}

#[test]
fn node_that_exits_at_once_fails_start_with_its_log_tail() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut spec = spec(root.path(), 1, 2);
    spec.extra_args = ["--fake-mode", "exit", "--fake-role", "peer"]
        .map(String::from)
        .to_vec();
    let error = LocalCluster::start_owned(spec).expect_err("must fail");
    match &error {
        LaunchError::NodeExited { name, log_tail, .. } => {
            assert!(name.starts_with("peer-"), "{name}");
            assert!(log_tail.contains("fatal: cannot bind (fake)"), "{log_tail}");
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(error.to_string().contains("fatal: cannot bind"));
    // The superpeer that had started was killed, and no cluster file was written.
    assert!(LocalCluster::open(root.path().join("cluster")).is_err());
    let run = root.path().join("cluster/run/superpeer-1.ready");
    let ready = myriad_launcher::read_ready(&run)
        .expect("ready")
        .expect("present");
    assert!(
        !Path::new(&format!("/proc/{}", ready.pid)).exists() || {
            let stat = fs::read_to_string(format!("/proc/{}/stat", ready.pid)).unwrap_or_default();
            stat.contains(") Z")
        }
    );
}

#[test]
fn node_that_never_gets_ready_times_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut spec = spec(root.path(), 1, 0);
    spec.ready_timeout = Duration::from_millis(600);
    spec.extra_args = ["--fake-mode", "hang", "--fake-role", "superpeer"]
        .map(String::from)
        .to_vec();
    let error = LocalCluster::start_owned(spec).expect_err("must time out");
    match &error {
        LaunchError::ReadyTimeout { name, log_tail, .. } => {
            assert_eq!(name, "superpeer-1");
            assert!(log_tail.contains("fake superpeer starting"), "{log_tail}");
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[test]
fn stop_escalates_to_sigkill_for_a_node_ignoring_sigterm() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut spec = spec(root.path(), 1, 1);
    spec.extra_args = ["--fake-mode", "stubborn", "--fake-role", "peer"]
        .map(String::from)
        .to_vec();
    let mut cluster = LocalCluster::start_owned(spec).expect("start");
    cluster.set_stop_timeout(Duration::from_millis(500));
    let killed = cluster.stop().expect("stop");
    assert_eq!(killed, ["peer-1"]);
    assert_eq!(alive_count(&mut cluster), 0);
}

#[test]
fn invalid_specs_are_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let error = LocalCluster::start_owned(spec(root.path(), 2, 1)).expect_err("2 superpeers");
    assert!(matches!(error, LaunchError::InvalidSpec(_)), "{error}");
    let missing = LaunchSpec::new(root.path().join("c2"), root.path().join("no-such-binary"));
    let error = LocalCluster::start_owned(missing).expect_err("missing binary");
    assert!(matches!(error, LaunchError::Io { .. }), "{error}");
    assert!(matches!(
        LocalCluster::open(root.path().join("nothing")),
        Err(LaunchError::ClusterFile { .. })
    ));
}

#[test]
fn the_cluster_secret_file_is_created_reused_or_given_and_only_its_path_is_passed() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    // No secret file given: DIR/secret is created (0600) and every node gets its path.
    let mut cluster = LocalCluster::start_owned(spec(root.path(), 1, 1)).expect("start");
    let path = cluster.secret_file();
    assert_eq!(path, cluster.dir().join("secret"));
    assert_eq!(
        fs::metadata(&path)
            .expect("secret file")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let secret = cluster.secret().expect("secret");
    let text = String::from_utf8(secret.clone()).expect("hex text");
    for node in cluster.nodes() {
        let at = node.args.iter().position(|arg| arg == "--secret-file");
        let given = at.and_then(|at| node.args.get(at + 1));
        assert_eq!(given, Some(&path.display().to_string()), "{:?}", node.args);
        assert!(!node.args.iter().any(|arg| arg.contains(&text)));
    }
    let json = fs::read_to_string(cluster.dir().join("cluster.json")).expect("cluster.json");
    assert!(!json.contains(&text), "cluster.json holds the secret");
    cluster.stop().expect("stop");
    drop(cluster);

    // A second start in the same directory keeps the secret (restarts keep working).
    let cluster = LocalCluster::start_owned(spec(root.path(), 1, 0)).expect("restart");
    assert_eq!(cluster.secret().expect("secret"), secret);
    drop(cluster);

    // A given file is used as it is; one that others may read is refused before any
    // node starts.
    let given = root.path().join("given-secret");
    let given_secret = myriad_net::secret::create_file(&given).expect("given secret");
    let mut other = spec(root.path(), 1, 0);
    other.dir = root.path().join("other");
    other.secret_file = Some(given.clone());
    let cluster = LocalCluster::start_owned(other.clone()).expect("start with a given file");
    assert_eq!(cluster.secret().expect("secret"), given_secret);
    assert!(!cluster.dir().join("secret").exists());
    drop(cluster);
    fs::set_permissions(&given, fs::Permissions::from_mode(0o644)).expect("chmod");
    other.dir = root.path().join("third");
    let refused = LocalCluster::start_owned(other).expect_err("a loose secret file");
    assert!(refused.to_string().contains("chmod 600"), "{refused}");
    assert!(!root.path().join("third").join("cluster.json").exists());
}

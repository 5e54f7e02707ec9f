//! The compute platform with real `myriad` processes (1 superpeer, 4 peers configured as
//! slaves of group 1, one of them made master from the terminal):
//! - a task script of three tasks with conditions runs on the three slaves
//!   (`comptaskscript`), one whose condition fails is aborted;
//! - a slave SIGKILLed in the middle of a task fails the run with an error naming it, the
//!   jobs queued on it fail their handles, and the group takes the next submission;
//! - jobs delegated to chunk owners run where the data is (they read it through the local
//!   chunk API, which works only on the owner).
//!
//! Every process is SIGKILLed by the harness when the test ends, also on failure.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_compute::builtin::{ReadLocal, SleepJob, WhoAmI};
use myriad_compute::client::{group_status, submit};
use myriad_compute::wire::ScriptEnd;
use myriad_compute::{JobError, Jobs, TaskScript};
use myriad_launcher::NodeRole;
use myriad_testing::process::{wait_until, Cluster, Myriad};
use myriad_types::NodeId;
use serde_json::Value;

const CONFIG: &str = "
[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = 800

[backup]
replication = 0

[compute]
workers = 2
group = 1
role = \"slave\"
";

const SCRIPT: &str = r#"
name = "value-exchange-value"
slaves_min = 3
task_timeout_ms = 20000

[[task]]
name = "builtin.value"
params = { values = [1, 2, 3] }

[[task]]
name = "builtin.exchange"
params = { messages = 20 }
when = { value = "sum", op = "==", than = 6 }

[[task]]
name = "builtin.value"
params = { value = 7 }
when = { value = "min", op = ">=", than = 60 }
"#;

const WAIT: Duration = Duration::from_secs(15);

/// Runs `myriad term --cluster dir --json -c line`; its JSON values (the command must
/// succeed).
fn term(dir: &Path, line: &str) -> Vec<Value> {
    let output = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["term", "--cluster"])
        .arg(dir)
        .arg("--json")
        .arg("-c")
        .arg(line)
        .timeout(Duration::from_secs(40))
        .run();
    assert_eq!(output.code(), Some(0), "term {line:?}: {output:#?}");
    output
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect()
}

fn ints(task: &Value) -> Vec<i64> {
    task["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|value| value.as_i64().expect("integer value"))
        .collect()
}

#[test]
fn compute_group_scripts_slave_failure_and_delegated_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir.path())
        .superpeers(1)
        .peers(4)
        .peer_memory_mb(64)
        .config(CONFIG)
        .keep_logs_on_panic()
        .start();
    let cluster_dir = cluster.dir().to_path_buf();
    let mut peers: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Peer)
        .map(|node| node.node_id)
        .collect();
    peers.sort_unstable();
    let secret = cluster.secret().expect("the cluster's secret file");
    let client = Client::connect(cluster.superpeers(), secret).expect("client joins");

    // Peer 0 becomes the master at run time; the other three are slaves by configuration.
    term(&cluster_dir, &format!("compgrpjoin {} 1 master", peers[0]));
    wait_until(WAIT, "three slaves in group 1", || {
        group_status(&client, 1).is_ok_and(|status| status.slaves.len() == 3)
    });
    let roles = term(&cluster_dir, "compgrpls");
    let roles = roles[0].as_array().expect("rows");
    assert_eq!(
        roles.iter().filter(|row| row["role"] == "slave").count(),
        3,
        "{roles:?}"
    );
    assert_eq!(
        roles.iter().filter(|row| row["role"] == "master").count(),
        1,
        "{roles:?}"
    );

    // A script of three tasks; both conditions hold (1+2+3 = 6; every slave received
    // 20 messages from each of the three slaves before its barrier returned).
    let script = dir.path().join("script.toml");
    std::fs::write(&script, SCRIPT).expect("write the script");
    let outcome = term(
        &cluster_dir,
        &format!("comptaskscript 1 {}", script.display()),
    );
    let outcome = &outcome[0];
    assert_eq!(outcome["state"], "finished", "{outcome:#}");
    let tasks = outcome["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 3);
    assert_eq!(ints(&tasks[0]), vec![1, 2, 3]);
    assert_eq!(ints(&tasks[1]), vec![60, 60, 60]);
    assert_eq!(ints(&tasks[2]), vec![7, 7, 7]);
    // The same script with a condition that fails stops after the first task.
    let failing = TaskScript::parse(&SCRIPT.replace("than = 6", "than = 7")).expect("script");
    let reply = submit(&client, &failing.to_request(1), WAIT).expect("submitted");
    assert!(
        matches!(&reply.end, ScriptEnd::Aborted(text) if text.contains("sum == 7")),
        "{reply:?}"
    );
    assert_eq!(reply.tasks.len(), 1);

    // A slave SIGKILLed during a task, with jobs queued on it.
    let status = group_status(&client, 1).expect("status");
    let victim = status.slaves[2];
    let jobs = Jobs::new(client.clone());
    let mut queued: Vec<_> = (0..6)
        .map(|_| jobs.submit_to(victim, SleepJob(10_000)))
        .collect();
    let sleep = TaskScript::parse(
        "slaves_min = 3\ntask_timeout_ms = 30000\n[[task]]\nname = \"builtin.sleep\"\nparams = { ms = 8000 }",
    )
    .expect("script")
    .to_request(1);
    let submitter = {
        let client = client.clone();
        std::thread::spawn(move || submit(&client, &sleep, Duration::from_secs(40)))
    };
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = Instant::now();
    cluster.kill(victim.0);
    let reply = submitter.join().expect("submitter").expect("answered");
    let failed_after = killed_at.elapsed();
    let ScriptEnd::Failed(text) = &reply.end else {
        panic!("the run did not fail: {reply:?}")
    };
    assert!(text.contains(&format!("node {victim}")), "{text}");
    assert!(
        failed_after < Duration::from_secs(5),
        "failed only after {failed_after:?}"
    );
    for handle in &mut queued {
        let error = handle.wait(WAIT).expect_err("the peer died");
        assert!(
            matches!(error, JobError::Unreachable { node, .. } if node == victim),
            "{error}"
        );
    }
    // The group goes on with the two slaves left.
    let next = TaskScript::parse(
        "slaves_min = 2\n[[task]]\nname = \"builtin.value\"\nparams = { value = 3 }",
    )
    .expect("script")
    .to_request(1);
    let reply = submit(&client, &next, WAIT).expect("submitted");
    assert_eq!(reply.end, ScriptEnd::Finished, "{reply:?}");
    assert_eq!(reply.tasks[0].slaves.len(), 2);
    assert!(!reply.tasks[0].slaves.contains(&victim));
    let status = term(&cluster_dir, "compgrpstatus 1");
    let states: Vec<&str> = status[0]["submissions"]
        .as_array()
        .expect("submissions")
        .iter()
        .map(|entry| entry["state"].as_str().expect("state"))
        .collect();
    assert_eq!(
        states,
        vec!["finished", "failed", "aborted", "finished"],
        "{status:?}"
    );

    // Delegated jobs run on the owner of their chunk.
    let alive: Vec<NodeId> = peers
        .iter()
        .map(|id| NodeId(*id))
        .filter(|id| *id != victim)
        .collect();
    for owner in &alive {
        let data = Bytes::from(format!("data of {owner}"));
        let cid = client
            .blocking()
            .chunks()
            .create_with_data(*owner, vec![data.clone()])
            .expect("created")[0];
        let (ran_on, read) = jobs
            .submit_to_owner(cid, ReadLocal(cid))
            .wait(WAIT)
            .expect("delegated job");
        assert_eq!((ran_on, read), (*owner, data));
        assert_eq!(
            jobs.submit_to(*owner, WhoAmI).wait(WAIT).expect("job"),
            *owner
        );
    }
    client.shutdown();
}

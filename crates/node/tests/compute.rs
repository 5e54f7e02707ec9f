//! The compute platform inside real peers (in-process cluster, real sockets): jobs run
//! locally, on a named peer and on a chunk's owner (also after a migration, through the
//! `NotOwner` redirection); a panicking job fails its handle only; a group of three slaves
//! runs a script with a condition, messages and barriers; a crashed slave fails the run
//! with a clear error and the group takes the next submission; the built-in bulk load and
//! scan.

use std::time::Duration;

use bytes::Bytes;
use myriad_compute::builtin::{ReadLocal, WhoAmI};
use myriad_compute::client::{group_status, set_role, submit};
use myriad_compute::wire::ScriptEnd;
use myriad_compute::{read_int, Job, JobContext, JobError, Jobs, Role, TaskScript, Wire};
use myriad_testing::cluster::TestCluster;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::NodeId;

const WAIT: Duration = Duration::from_secs(10);

/// A job that panics.
struct Boom;

impl Wire for Boom {
    fn put(&self, _out: &mut Encoder) {}
    fn get(_input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(Boom)
    }
}

impl Job for Boom {
    const NAME: &'static str = "test.boom";
    type Output = ();
    fn run(self, _ctx: &JobContext) -> Result<(), String> {
        panic!("boom on purpose")
    }
}

fn cluster(peers: usize) -> TestCluster {
    TestCluster::builder()
        .peers(peers)
        .configure_peers(|_, options| {
            options.compute.registry = std::mem::take(&mut options.compute.registry).job::<Boom>();
            options.compute.config.workers = 2;
        })
        .start()
}

#[test]
fn jobs_run_locally_remotely_and_where_the_data_is() {
    let cluster = cluster(3);
    let ids = cluster.peer_ids();
    let client = cluster.client();
    let jobs = Jobs::new(client.clone());

    // Local: on the peer's own pool.
    let mut local = cluster.peer(0).compute().submit(WhoAmI);
    assert_eq!(local.wait(WAIT).unwrap(), ids[0]);
    // Remote: on a named peer.
    for id in &ids {
        assert_eq!(jobs.submit_to(*id, WhoAmI).wait(WAIT).unwrap(), *id);
    }
    // Delegated: each chunk's job runs on its owner and reads it there without the network
    // (ReadLocal uses only the local chunk API, which fails on any other peer).
    for (index, id) in ids.iter().enumerate() {
        let data = Bytes::from(format!("chunk on peer {index}"));
        let cid = client
            .blocking()
            .chunks()
            .create_with_data(*id, vec![data.clone()])
            .unwrap()[0];
        let (ran_on, read) = jobs
            .submit_to_owner(cid, ReadLocal(cid))
            .wait(WAIT)
            .unwrap();
        assert_eq!((ran_on, read), (*id, data));
        // Sent to the wrong peer on purpose, the local read fails there.
        let other = ids[(index + 1) % ids.len()];
        let error = jobs
            .submit_to(other, ReadLocal(cid))
            .wait(WAIT)
            .unwrap_err();
        assert!(
            error.to_string().contains("not owned by this peer"),
            "{error}"
        );
    }
    // A panicking job fails its handle; the peer goes on.
    let error = jobs.submit_to(ids[1], Boom).wait(WAIT).unwrap_err();
    assert!(
        matches!(&error, JobError::Panicked(text) if text.contains("boom on purpose")),
        "{error}"
    );
    assert_eq!(jobs.submit_to(ids[1], WhoAmI).wait(WAIT).unwrap(), ids[1]);
}

#[test]
fn a_delegated_job_follows_a_migrated_chunk() {
    let cluster = cluster(2);
    let ids = cluster.peer_ids();
    let writer = cluster.client();
    let cid = writer
        .blocking()
        .chunks()
        .create_with_data(ids[0], vec![Bytes::from_static(b"moving")])
        .unwrap()[0];
    writer.blocking().migrate(cid, cid, ids[1]).unwrap();
    // A fresh client presumes the creator owns it: the creator answers NotOwner, the
    // lookup finds the new owner, the job runs there.
    let client = cluster.new_client(|_| {});
    let jobs = Jobs::new(client.clone());
    let mut handle = jobs.submit_to_owner(cid, ReadLocal(cid));
    assert_eq!(handle.node(), ids[0], "first sent to the creator");
    let (ran_on, read) = handle.wait(WAIT).unwrap();
    assert_eq!((ran_on, read), (ids[1], Bytes::from_static(b"moving")));
}

const SCRIPT: &str = r#"
name = "three-steps"
slaves_min = 3
task_timeout_ms = 20000
[[task]]
name = "builtin.value"
params = { values = [1, 2, 3] }
[[task]]
name = "builtin.exchange"
params = { messages = 50 }
when = { value = "sum", op = "==", than = 6 }
[[task]]
name = "builtin.value"
params = { value = 9 }
when = { value = "min", op = ">", than = 1000 }
"#;

fn form_group(cluster: &TestCluster, group: u16) -> (NodeId, Vec<NodeId>) {
    let ids = cluster.peer_ids();
    let client = cluster.client();
    set_role(&client, ids[0], group, Role::Master).unwrap();
    for id in &ids[1..] {
        set_role(&client, *id, group, Role::Slave).unwrap();
    }
    cluster.wait_until(WAIT, "three slaves joined", || {
        group_status(&client, group).is_ok_and(|status| status.slaves.len() == ids.len() - 1)
    });
    (ids[0], ids[1..].to_vec())
}

#[test]
fn a_group_of_three_slaves_runs_a_script_with_conditions() {
    let cluster = cluster(4);
    let (_, slaves) = form_group(&cluster, 1);
    let client = cluster.client();
    let script = TaskScript::parse(SCRIPT).unwrap();
    let reply = submit(&client, &script.to_request(1), Duration::from_secs(30)).unwrap();
    // Task 0 returned 1+2+3 = 6, so task 1 ran: 50 messages from each of 3 slaves reached
    // every slave before its barrier returned (150 each). Task 2's condition
    // (min > 1000) failed: the script is aborted after two tasks.
    assert!(
        matches!(&reply.end, ScriptEnd::Aborted(text) if text.contains("min > 1000")),
        "{:?}",
        reply.end
    );
    assert_eq!(reply.tasks.len(), 2);
    assert_eq!(reply.tasks[0].slaves, slaves);
    let values = |task: usize| -> Vec<i64> {
        reply.tasks[task]
            .values
            .iter()
            .map(|v| read_int(v).unwrap())
            .collect()
    };
    assert_eq!(values(0), vec![1, 2, 3]);
    assert_eq!(values(1), vec![150, 150, 150]);
    let status = group_status(&client, 1).unwrap();
    assert_eq!(status.entries[0].state, "aborted");
}

#[test]
fn a_crashed_slave_fails_the_run_and_the_group_goes_on() {
    let mut cluster = cluster(4);
    let (_, slaves) = form_group(&cluster, 2);
    let client = cluster.client();
    let sleep = TaskScript::parse(
        "slaves_min = 3\ntask_timeout_ms = 20000\n[[task]]\nname = \"builtin.sleep\"\nparams = { ms = 4000 }",
    )
    .unwrap()
    .to_request(2);
    let submitter = {
        let client = client.clone();
        std::thread::spawn(move || submit(&client, &sleep, Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(800));
    let killed = cluster.kill_peer(3);
    assert_eq!(killed, slaves[2]);
    let reply = submitter.join().unwrap().unwrap();
    let ScriptEnd::Failed(text) = &reply.end else {
        panic!("the run did not fail: {:?}", reply.end)
    };
    assert!(text.contains(&format!("node {killed}")), "{text}");
    // The group goes on with the two slaves left.
    let next = TaskScript::parse(
        "slaves_min = 2\n[[task]]\nname = \"builtin.value\"\nparams = { value = 4 }",
    )
    .unwrap()
    .to_request(2);
    let reply = submit(&client, &next, Duration::from_secs(30)).unwrap();
    assert_eq!(reply.end, ScriptEnd::Finished, "{reply:?}");
    assert_eq!(reply.tasks[0].slaves, slaves[..2].to_vec());
}

#[test]
fn builtins_load_a_file_in_parallel_and_scan_what_was_loaded() {
    let cluster = cluster(4);
    let (_, slaves) = form_group(&cluster, 3);
    let client = cluster.client();
    let file = cluster.dir().join("lines.txt");
    // 1000 lines of 8 digits; the loader stores each line's bytes as a chunk.
    let lines: Vec<String> = (0..1000).map(|i| format!("{i:08}")).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let script = format!(
        "slaves_min = 3\n[[task]]\nname = \"builtin.load\"\nparams = {{ path = {:?} }}\n\
         [[task]]\nname = \"builtin.scan\"\nparams = {{ aggregate = \"count\", min_size = 8 }}\n\
         when = {{ value = \"sum\", op = \"==\", than = 1000 }}",
        file.display().to_string()
    );
    let request = TaskScript::parse(&script).unwrap().to_request(3);
    let reply = submit(&client, &request, Duration::from_secs(30)).unwrap();
    assert_eq!(reply.end, ScriptEnd::Finished, "{reply:?}");
    let loaded: Vec<i64> = reply.tasks[0]
        .values
        .iter()
        .map(|v| read_int(v).unwrap())
        .collect();
    // Slave i of 3 took lines i, i+3, ...: 334, 333, 333.
    assert_eq!(loaded, vec![334, 333, 333]);
    let counted: Vec<i64> = reply.tasks[1]
        .values
        .iter()
        .map(|v| read_int(v).unwrap())
        .collect();
    assert_eq!(counted, loaded, "each slave scans exactly what it loaded");
    // The chunks are where the scan says: a slave's own chunks hold its lines.
    let jobs = Jobs::new(client.clone());
    let (count, (_, cids)) = jobs
        .submit_to(
            slaves[1],
            myriad_compute::builtin::ScanJob(myriad_compute::builtin::ScanSpec {
                aggregate: myriad_compute::builtin::ScanAggregate::Cids,
                ..Default::default()
            }),
        )
        .wait(WAIT)
        .unwrap();
    assert_eq!(count, 333);
    let first = client.blocking().chunks().get(cids[0]).unwrap();
    assert_eq!(first, Bytes::from("00000001"));
    assert!(cids.iter().all(|cid| cid.creator() == slaves[1]));
}

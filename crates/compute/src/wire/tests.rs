//! Round trips and refusals of the compute messages' encodings.

use super::*;
use proptest::prelude::*;

fn bytes() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
}

fn name() -> impl Strategy<Value = String> {
    "[a-z.]{0,20}"
}

proptest! {
    #[test]
    fn job_request_round_trips(name in name(), params in bytes(), cid in proptest::option::of(any::<u64>())) {
        let request = JobRequest { name, params, owner_of: cid.map(ChunkId::from_raw) };
        prop_assert_eq!(JobRequest::decode(request.encode()), Ok(request));
    }

    #[test]
    fn job_reply_round_trips(value in bytes(), tag in 0u8..7, text in "[a-z ]{0,30}") {
        let reply: JobReply = match tag {
            0 => Ok(value),
            1 => Err(JobFailure::Failed(text)),
            2 => Err(JobFailure::Panicked(text)),
            3 => Err(JobFailure::UnknownJob(text)),
            4 => Err(JobFailure::BadParams(text)),
            5 => Err(JobFailure::NotOwner),
            _ => Err(JobFailure::NoCompute(text)),
        };
        prop_assert_eq!(decode_job_reply(encode_job_reply(&reply)), Ok(reply));
    }

    #[test]
    fn submit_round_trips(group in any::<u16>(), name in name(), steps in proptest::collection::vec(
        (name(), bytes(), any::<u32>(), any::<u32>(), proptest::option::of((0u8..4, 0u8..6, any::<i64>(), any::<bool>()))), 0..5)) {
        let request = SubmitRequest {
            group, name, task_timeout_ms: 7, slaves_wait_ms: 9,
            steps: steps.into_iter().map(|(task, params, slaves_min, slaves_max, condition)| StepWire {
                task, params, slaves_min, slaves_max, condition }).collect(),
        };
        prop_assert_eq!(SubmitRequest::decode(request.encode()), Ok(request));
    }

    #[test]
    fn task_run_and_sync_round_trip(run in any::<u64>(), slaves in proptest::collection::vec(any::<u16>(), 1..6),
                                    params in bytes(), sent in proptest::collection::vec(any::<u64>(), 0..6)) {
        let slaves: Vec<NodeId> = slaves.into_iter().map(NodeId).collect();
        let task = TaskRun { group: 3, run, index: (slaves.len() - 1) as u32, slaves: slaves.clone(),
            task: "t".into(), params: params.clone(), timeout_ms: 5 };
        prop_assert_eq!(TaskRun::decode(task.encode()), Ok(task));
        for sync in [
            Sync::Arrive { run, round: 2, index: 1, sent: sent.clone(), value: params.clone() },
            Sync::Release { run, round: 3, expected: 11, values: vec![params.clone(); 3] },
            Sync::Abort { run, reason: "gone".into() },
        ] {
            prop_assert_eq!(Sync::decode(sync.encode()), Ok(sync));
        }
        let data = DataMessage { master: NodeId(4), run, from: 2, payload: params };
        prop_assert_eq!(DataMessage::decode(data.encode()), Ok(data));
    }

    #[test]
    fn decoders_never_panic(input in proptest::collection::vec(any::<u8>(), 0..200)) {
        fuzz_decode(&input);
    }
}

#[test]
fn submit_reply_and_group_messages_round_trip() {
    let reply = Ok(SubmitReply {
        id: 5,
        end: ScriptEnd::Aborted("condition".into()),
        tasks: vec![TaskOutcome {
            task: "a".into(),
            slaves: vec![NodeId(1), NodeId(2)],
            values: vec![Bytes::from_static(b"x"), Bytes::new()],
            micros: 77,
            skipped: false,
        }],
    });
    assert_eq!(decode_submit_reply(encode_submit_reply(&reply)), Ok(reply));
    let refused: Result<SubmitReply, String> = Err("no".into());
    assert_eq!(
        decode_submit_reply(encode_submit_reply(&refused)),
        Ok(refused)
    );
    for request in [
        GroupRequest::Join(1),
        GroupRequest::Leave(2),
        GroupRequest::Status(3),
        GroupRequest::Info,
        GroupRequest::SetRole(4, Role::Master),
        GroupRequest::StartApp("app".into()),
    ] {
        assert_eq!(GroupRequest::decode(request.encode()), Ok(request));
    }
    let status = GroupReply::Status(GroupStatus {
        group: 1,
        master: NodeId(9),
        slaves: vec![NodeId(3)],
        entries: vec![StatusEntry {
            id: 1,
            name: "s".into(),
            state: "finished".into(),
            queued_micros: 3,
            run_micros: 4,
            detail: String::new(),
        }],
    });
    for reply in [
        GroupReply::Ok,
        GroupReply::Info(Role::Slave, 2),
        status,
        GroupReply::Refused("x".into()),
    ] {
        assert_eq!(GroupReply::decode(reply.encode()), Ok(reply));
    }
}

#[test]
fn bad_input_gives_typed_errors() {
    // A slave index outside the slaves.
    let mut task = TaskRun {
        group: 1,
        run: 1,
        index: 0,
        slaves: vec![NodeId(1)],
        task: "t".into(),
        params: Bytes::new(),
        timeout_ms: 1,
    };
    task.index = 1;
    assert_eq!(
        TaskRun::decode(task.encode()),
        Err(DecodeError::Invalid("slave index outside the slaves"))
    );
    // A count larger than the bytes left.
    let mut out = Encoder::new();
    out.put_u16_le(1)
        .put_str("n")
        .put_varint(1)
        .put_varint(1)
        .put_varint(1000);
    assert_eq!(
        SubmitRequest::decode(out.finish()),
        Err(DecodeError::Truncated("steps"))
    );
    // Unknown tags and trailing bytes.
    assert!(matches!(
        GroupRequest::decode(Bytes::from_static(&[9])),
        Err(DecodeError::UnknownTag { .. })
    ));
    assert!(matches!(
        GroupRequest::decode(Bytes::from_static(&[3, 0])),
        Err(DecodeError::TrailingBytes { .. })
    ));
    // Names longer than the limit.
    let long = JobRequest {
        name: "x".repeat(NAME_BYTES_MAX + 1),
        params: Bytes::new(),
        owner_of: None,
    };
    assert!(matches!(
        JobRequest::decode(long.encode()),
        Err(DecodeError::TooLarge { .. })
    ));
}

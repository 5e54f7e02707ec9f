//! The shell against a fake backend: parsing, one-shot scripts, JSON and text output, errors.

use std::collections::BTreeMap;

use myriad_types::{ChunkId, NodeId};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::commands::{parse_command, parse_line, DataFormat, RoleFilter, TermCommand};
use super::{Outcome, Shell, TermBackend};

/// Stores chunks in a map; records every command it ran.
#[derive(Default)]
struct FakeBackend {
    chunks: BTreeMap<u64, Vec<u8>>,
    next_local: u64,
    ran: Vec<TermCommand>,
}

impl TermBackend for FakeBackend {
    fn run(&mut self, command: &TermCommand) -> Result<Value, String> {
        self.ran.push(command.clone());
        match command {
            TermCommand::NodeList { .. } => Ok(json!([
                {"nid": "0x0001", "role": "superpeer", "address": "127.0.0.1:4000"},
                {"nid": "0x0102", "role": "peer", "address": "127.0.0.1:41234"},
            ])),
            TermCommand::ChunkCreate { size, node, count } => {
                let mut cids = Vec::new();
                for _ in 0..*count {
                    self.next_local += 1;
                    let cid = ChunkId::new(*node, self.next_local).ok_or("full")?;
                    self.chunks.insert(cid.raw(), vec![0; *size as usize]);
                    cids.push(json!(cid.to_string()));
                }
                Ok(Value::Array(cids))
            }
            TermCommand::ChunkPut { cid, data, offset } => {
                let chunk = self.chunks.get_mut(&cid.raw()).ok_or("no such chunk")?;
                let start = *offset as usize;
                let end = start + data.len();
                if end > chunk.len() {
                    return Err(format!("write past the end ({} bytes)", chunk.len()));
                }
                chunk[start..end].copy_from_slice(data);
                Ok(Value::Null)
            }
            TermCommand::ChunkGet {
                cid,
                format,
                offset,
                length,
            } => {
                let chunk = self.chunks.get(&cid.raw()).ok_or("no such chunk")?;
                let start = (*offset as usize).min(chunk.len());
                let end = length.map_or(chunk.len(), |l| (start + l as usize).min(chunk.len()));
                Ok(
                    json!({"cid": cid.to_string(), "size": chunk.len(), "data": format.show(&chunk[start..end])}),
                )
            }
            TermCommand::ChunkRemove { cid } => self
                .chunks
                .remove(&cid.raw())
                .map(|_| Value::Null)
                .ok_or_else(|| format!("chunk {cid} does not exist")),
            _ => Err("not supported by the fake".into()),
        }
    }
}

fn run(shell: &mut Shell<FakeBackend>, line: &str) -> (String, String, Outcome) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let outcome = shell
        .run_line(line, &mut out, &mut err)
        .expect("write to memory");
    (
        String::from_utf8(out).expect("utf-8"),
        String::from_utf8(err).expect("utf-8"),
        outcome,
    )
}

#[test]
fn one_shot_runs_several_commands_in_order() {
    let mut shell = Shell::new(FakeBackend::default(), false);
    let (out, err, outcome) = run(
        &mut shell,
        "chunkcreate 16 0x2; chunkput 2:1 \"hi; there\"; chunkget 0x0002000000000001 str --length 9",
    );
    assert_eq!(err, "");
    assert_eq!(
        outcome,
        Outcome {
            succeeded: 3,
            failed: 0
        }
    );
    assert_eq!(
        out,
        "0x0002000000000001\nok\ncid   0x0002000000000001\nsize  16\ndata  hi; there\n"
    );
    assert_eq!(shell.backend.ran.len(), 3);
}

#[test]
fn json_mode_prints_one_value_per_command_including_errors() {
    let mut shell = Shell::new(FakeBackend::default(), true);
    let (out, err, outcome) = run(
        &mut shell,
        "chunkcreate 8 1; chunkput 1:1 0102 hex; chunkget 1:1 u16; chunkremove 1:9",
    );
    assert_eq!(err, "");
    assert_eq!(outcome.succeeded, 3);
    assert_eq!(outcome.failed, 1);
    let values: Vec<Value> = out
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON value per line"))
        .collect();
    assert_eq!(values.len(), 4);
    assert_eq!(values[0], json!(["0x0001000000000001"]));
    assert_eq!(values[1], Value::Null);
    assert_eq!(values[2]["data"], json!([0x0201, 0, 0, 0]));
    assert_eq!(values[3]["command"], "chunkremove");
    assert!(values[3]["error"]
        .as_str()
        .is_some_and(|e| e.contains("does not exist")));
}

#[test]
fn list_results_render_as_a_table() {
    let mut shell = Shell::new(FakeBackend::default(), false);
    let (out, _, _) = run(&mut shell, "nodelist");
    assert_eq!(
        out,
        "NID     ROLE       ADDRESS\n\
         0x0001  superpeer  127.0.0.1:4000\n\
         0x0102  peer       127.0.0.1:41234\n"
    );
}

#[test]
fn a_parse_error_runs_nothing_and_reports_usage() {
    let mut shell = Shell::new(FakeBackend::default(), false);
    let (out, err, outcome) = run(&mut shell, "chunkcreate 8 1; chunkget; nodelist");
    assert_eq!(out, "");
    assert!(
        err.starts_with("error: chunkget: missing argument"),
        "{err}"
    );
    assert!(err.contains("usage: chunkget <cid>"), "{err}");
    assert_eq!(outcome.failed, 1);
    assert!(shell.backend.ran.is_empty());
}

#[test]
fn backend_errors_go_to_stderr_and_count_as_failures() {
    let mut shell = Shell::new(FakeBackend::default(), false);
    let (out, err, outcome) = run(&mut shell, "chunkremove 1:1; nodelist");
    assert_eq!(
        err,
        "error: chunkremove: chunk 0x0001000000000001 does not exist\n"
    );
    assert!(out.starts_with("NID"));
    assert_eq!(
        outcome,
        Outcome {
            succeeded: 1,
            failed: 1
        }
    );
}

#[test]
fn help_is_answered_without_the_backend() {
    let mut shell = Shell::new(FakeBackend::default(), false);
    let (out, _, outcome) = run(&mut shell, "help; help chunkmigrate");
    assert_eq!(outcome.failed, 0);
    assert!(out.contains("chunkmigrate <cid> [last-cid] <to-nid>"));
    assert!(shell.backend.ran.is_empty());
    let (_, err, outcome) = run(&mut shell, "help nosuch");
    assert_eq!(outcome.failed, 1);
    assert!(err.contains("unknown command"), "{err}");
}

#[test]
fn piped_lines_run_in_order_and_skip_comments() {
    let mut shell = Shell::new(FakeBackend::default(), false);
    let mut input = "# setup\nchunkcreate 4 1\n\nchunkput 1:1 abcd\nchunkget 1:1\n".as_bytes();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let outcome = shell
        .run_lines(&mut input, &mut out, &mut err)
        .expect("run");
    assert_eq!(outcome.succeeded, 3);
    assert!(String::from_utf8_lossy(&out).contains("data  abcd"));
}

#[test]
fn typed_arguments_parse() {
    let cid = ChunkId::new(NodeId(0x12), 7).expect("cid");
    assert_eq!(
        parse_command("chunkget 0x12:7 u64 --offset 8 --length 16"),
        Ok(TermCommand::ChunkGet {
            cid,
            format: DataFormat::Unsigned(8),
            offset: 8,
            length: Some(16)
        })
    );
    assert_eq!(
        parse_command("CHUNKPUT 0x0012000000000007 ff00 hex --offset 0x10"),
        Ok(TermCommand::ChunkPut {
            cid,
            data: vec![0xff, 0],
            offset: 16
        })
    );
    assert_eq!(
        parse_command("chunkput 18:7 -2 i16"),
        Ok(TermCommand::ChunkPut {
            cid,
            data: vec![0xfe, 0xff],
            offset: 0
        })
    );
    // A quoted word is data, never an option.
    assert_eq!(
        parse_command("chunkput 18:7 '--offset'"),
        Ok(TermCommand::ChunkPut {
            cid,
            data: b"--offset".to_vec(),
            offset: 0
        })
    );
    assert_eq!(
        parse_command("chunkcreate 64 0x0102 100"),
        Ok(TermCommand::ChunkCreate {
            size: 64,
            node: NodeId(0x102),
            count: 100
        })
    );
    assert_eq!(
        parse_command("chunkmigrate 1:5 1:9 3"),
        Ok(TermCommand::ChunkMigrate {
            first: ChunkId::new(NodeId(1), 5).expect("cid"),
            last: ChunkId::new(NodeId(1), 9).expect("cid"),
            to: NodeId(3)
        })
    );
    assert_eq!(
        parse_command("nodelist peers"),
        Ok(TermCommand::NodeList {
            role: Some(RoleFilter::Peer)
        })
    );
    assert_eq!(
        parse_command("nodeshutdown 0x2 --kill"),
        Ok(TermCommand::NodeShutdown {
            node: NodeId(2),
            kill: true
        })
    );
    assert_eq!(
        parse_command("tmpput 3 \"a\\x41\\n\""),
        Ok(TermCommand::TmpPut {
            id: 3,
            data: b"aA\n".to_vec()
        })
    );
    assert_eq!(
        parse_command("nodedrain 2 --to 3,0x4 --piece 64"),
        Ok(TermCommand::NodeDrain {
            node: NodeId(2),
            targets: vec![NodeId(3), NodeId(4)],
            piece: 64
        })
    );
    assert_eq!(
        parse_command("nodedrain 2"),
        Ok(TermCommand::NodeDrain {
            node: NodeId(2),
            targets: vec![],
            piece: myriad_client::client::DRAIN_PIECE_CHUNKS
        })
    );
    assert_eq!(
        parse_command("nodewait --peers 3 --timeout 5"),
        Ok(TermCommand::NodeWait {
            peers: 3,
            superpeers: 1,
            timeout_secs: 5
        })
    );
    assert_eq!(
        parse_command("chunkremoverange 1:5 1:9"),
        Ok(TermCommand::ChunkRemoveRange {
            first: ChunkId::new(NodeId(1), 5).expect("cid"),
            last: ChunkId::new(NodeId(1), 9).expect("cid"),
        })
    );
    assert_eq!(
        parse_command("monitoring 2 --history 10"),
        Ok(TermCommand::Monitoring {
            node: Some(NodeId(2)),
            history: 10
        })
    );
    assert_eq!(
        parse_command("balance --rounds 3 --imbalance 1.25"),
        Ok(TermCommand::Balance {
            rounds: 3,
            window_ms: 1_000,
            imbalance_percent: 125,
            max_chunks: 100_000
        })
    );
    assert_eq!(
        parse_command("loggerlevel 2 info,myriad_node=debug"),
        Ok(TermCommand::LoggerLevel {
            node: NodeId(2),
            filter: Some("info,myriad_node=debug".into())
        })
    );
    assert_eq!(
        parse_command("loginfo 0x3"),
        Ok(TermCommand::LogInfo { node: NodeId(3) })
    );
    assert_eq!(
        parse_command("recoverywait --timeout 9"),
        Ok(TermCommand::RecoveryWait { timeout_secs: 9 })
    );
    assert_eq!(parse_line(" ; ;"), Ok(vec![]));
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    let cases = [
        ("chunkget 1:0x1000000000000", "invalid chunk ID"),
        ("nodeinfo 70000", "invalid node ID"),
        ("chunkcreate 0 1", "size must be"),
        ("chunkcreate 8 1 0", "count must be"),
        ("chunkput 1:1 abc hex", "odd number of hex digits"),
        ("chunkput 1:1 300 u8", "does not fit in 8 bits"),
        ("chunkput 1:1 x u9", "unknown format"),
        ("chunkget 1:1 --offset", "--offset needs a value"),
        ("chunkget 1:1 --bogus", "unknown option --bogus"),
        ("chunkmigrate 1:9 1:5 2", "first <= last"),
        ("chunkmigrate 1:5 2:9 2", "within one creator"),
        ("namelist extra", "too many arguments"),
        ("chunkput 1:1 \"open", "unterminated"),
        ("frobnicate", "unknown command"),
        ("barrieralloc 0", "at least one peer"),
        ("chunklock 1:1 maybe", "lock mode"),
        ("nodedrain 2 --to 2", "cannot take its own chunks"),
        ("nodedrain 2 --piece 0", "invalid --piece"),
        ("nodedrain 2 --to 3,x", "invalid node ID"),
        ("nodewait --timeout 0", "--timeout must be"),
        ("nodewait 3", "too many arguments"),
        ("chunkremoverange 1:9 1:5", "first <= last"),
        ("chunkremoverange 1:5 2:9", "within one creator"),
        ("balance --rounds 0", "--rounds must be"),
        ("balance --imbalance x", "invalid --imbalance"),
        ("monitoring --history 0", "--history must be"),
        ("loggerlevel", "missing argument"),
        ("loginfo 2 3", "too many arguments"),
        ("chunkdump 1:1", "missing argument"),
        ("memdump x f", "invalid node ID"),
        ("chunklocklist", "missing argument"),
        ("recoverywait --timeout 0", "--timeout must be"),
    ];
    for (line, expected) in cases {
        let error = parse_line(line).expect_err(line).to_string();
        assert!(error.contains(expected), "{line}: {error}");
    }
}

#[test]
fn superpeer_lists_parse() {
    assert_eq!(
        super::parse_superpeers("1=127.0.0.1:4000,0x2=127.0.0.1:4001"),
        Ok(vec![
            (1, "127.0.0.1:4000".into()),
            (2, "127.0.0.1:4001".into())
        ])
    );
    assert!(super::parse_superpeers("1=nohost").is_err());
    assert!(super::parse_superpeers("127.0.0.1:4000").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_lines_never_panic_the_parser(line in ".{0,200}") {
        let _ = parse_line(&line);
    }

    #[test]
    fn command_like_lines_never_panic_the_parser(
        name in prop::sample::select(super::commands::COMMANDS.iter().map(|c| c.name).collect::<Vec<_>>()),
        words in prop::collection::vec(
            prop_oneof![
                "[0-9a-fx:_-]{0,24}",
                "--(offset|length|kill|bogus)",
                "\"[^\"]{0,10}\"?",
                "'[^']{0,10}'?",
                "(str|hex|u8|u16|u32|u64|i8|i16|i32|i64|read|write|peer)",
                Just(";".to_string()),
            ],
            0..6,
        ),
    ) {
        let line = format!("{name} {}", words.join(" "));
        let _ = parse_line(&line);
    }
}

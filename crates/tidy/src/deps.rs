//! Crate dependency arrows: the allowed list, its copy in `docs/ARCHITECTURE.md`, cycles
//! and layer rules.
//!
//! An arrow `a → b` means that workspace crate `a` has `b` among its normal dependencies
//! (`[dependencies]`, `[build-dependencies]` and their `[target.'cfg(..)'.*]` forms).
//! Dev-dependencies are no arrows: tests may use any crate. Renamed dependencies
//! (`package = ".."`, here or in `[workspace.dependencies]`) count under their package name.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use crate::source::{self, Crate};
use crate::{Result, Violation};

/// The line of `docs/ARCHITECTURE.md` that opens the block of arrows.
pub const DOC_BEGIN: &str = "<!-- tidy:dependency-arrows:begin -->";
/// The line of `docs/ARCHITECTURE.md` that closes the block of arrows.
pub const DOC_END: &str = "<!-- tidy:dependency-arrows:end -->";
/// Where the arrows are documented, relative to the workspace root.
pub const DOC_PATH: &str = "docs/ARCHITECTURE.md";

/// The dependency sections that make arrows.
const NORMAL_SECTIONS: [&str; 2] = ["dependencies", "build-dependencies"];

/// One workspace crate and what it depends on.
#[derive(Debug, Clone)]
pub struct Node {
    /// The crate.
    pub krate: Crate,
    /// The package names of its normal and build dependencies, workspace or not.
    pub deps: BTreeSet<String>,
}

/// The dependency graph of the workspace crates.
#[derive(Debug, Clone)]
pub struct Graph {
    /// The crates by package name.
    pub nodes: BTreeMap<String, Node>,
}

impl Graph {
    /// Reads every `crates/*/Cargo.toml` under `root` (and the root manifest's
    /// `[workspace.dependencies]`, for renames).
    pub fn load(root: &Path) -> Result<Graph> {
        let root_manifest = root.join("Cargo.toml");
        let workspace_deps = if root_manifest.is_file() {
            let text = source::read(&root_manifest)?;
            let table: toml::Table = text
                .parse()
                .map_err(|error| crate::Error::new(&root_manifest, error))?;
            table
                .get("workspace")
                .and_then(|workspace| workspace.get("dependencies"))
                .and_then(toml::Value::as_table)
                .cloned()
                .unwrap_or_default()
        } else {
            toml::Table::new()
        };
        let mut nodes = BTreeMap::new();
        for krate in source::workspace_crates(root)? {
            let deps = normal_deps(&krate.manifest, &workspace_deps);
            nodes.insert(krate.name.clone(), Node { krate, deps });
        }
        Ok(Graph { nodes })
    }

    /// The arrows between workspace crates, sorted.
    pub fn arrows(&self) -> BTreeSet<(String, String)> {
        let mut arrows = BTreeSet::new();
        for (name, node) in &self.nodes {
            for dep in self.workspace_deps(node) {
                arrows.insert((name.clone(), dep.to_string()));
            }
        }
        arrows
    }

    /// The workspace crates that `node` depends on.
    fn workspace_deps<'a>(&'a self, node: &'a Node) -> impl Iterator<Item = &'a str> + 'a {
        node.deps
            .iter()
            .filter(|dep| self.nodes.contains_key(*dep))
            .map(String::as_str)
    }

    /// The violation for the arrow `from → to` (or for `from` depending on the outside
    /// crate `to`), pointed at the line of the dependency in `from`'s manifest.
    fn violation_at(&self, from: &str, to: &str, message: String) -> Violation {
        match self.nodes.get(from) {
            Some(node) => Violation::new(
                &node.krate.manifest_path,
                dep_line(&node.krate.manifest_text, to),
                message,
            ),
            None => Violation::new(PathBuf::from("crates"), None, message),
        }
    }
}

/// The package names of the normal and build dependencies in `manifest`.
fn normal_deps(manifest: &toml::Table, workspace_deps: &toml::Table) -> BTreeSet<String> {
    let mut tables: Vec<&toml::Table> = Vec::new();
    for section in NORMAL_SECTIONS {
        tables.extend(manifest.get(section).and_then(toml::Value::as_table));
    }
    if let Some(targets) = manifest.get("target").and_then(toml::Value::as_table) {
        for target in targets.values() {
            for section in NORMAL_SECTIONS {
                tables.extend(target.get(section).and_then(toml::Value::as_table));
            }
        }
    }
    let mut deps = BTreeSet::new();
    for table in tables {
        for (key, value) in table {
            deps.insert(package_name(key, value, workspace_deps));
        }
    }
    deps
}

/// The package that the dependency `key = value` names.
fn package_name(key: &str, value: &toml::Value, workspace_deps: &toml::Table) -> String {
    let renamed = |value: &toml::Value| {
        value
            .get("package")
            .and_then(toml::Value::as_str)
            .map(str::to_string)
    };
    if let Some(package) = renamed(value) {
        return package;
    }
    let inherited = value
        .get("workspace")
        .and_then(toml::Value::as_bool)
        .unwrap_or(false);
    if inherited {
        if let Some(package) = workspace_deps.get(key).and_then(renamed) {
            return package;
        }
    }
    key.to_string()
}

/// The 1-based line of `manifest_text` that declares the normal or build dependency `name`.
fn dep_line(manifest_text: &str, name: &str) -> Option<usize> {
    let mut in_deps = false;
    for (index, line) in manifest_text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let header = header.trim();
            let section = header.rsplit('.').next().unwrap_or(header);
            in_deps = NORMAL_SECTIONS.contains(&section);
            let named = NORMAL_SECTIONS
                .iter()
                .any(|section| header.ends_with(&format!("{section}.{name}")));
            if named {
                return Some(index + 1);
            }
            continue;
        }
        if in_deps {
            let key = line
                .split(['=', '.', ' '])
                .next()
                .unwrap_or_default()
                .trim_matches('"');
            if key == name {
                return Some(index + 1);
            }
        }
    }
    None
}

/// Formats the arrows of one crate as they appear in `docs/ARCHITECTURE.md`:
/// `- a → b, c` (one line per crate that depends on others).
pub fn doc_line(from: &str, to: &[&str]) -> String {
    format!("- {from} → {}", to.join(", "))
}

/// The doc lines of `arrows`, one per depending crate, in name order.
fn doc_lines(arrows: &BTreeSet<(String, String)>) -> Vec<String> {
    let mut grouped: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in arrows {
        grouped.entry(from.as_str()).or_default().push(to.as_str());
    }
    grouped
        .into_iter()
        .map(|(from, to)| doc_line(from, &to))
        .collect()
}

/// The arrows of the tree, written both as the `const` list of `tests/tidy.rs` and as the
/// `docs/ARCHITECTURE.md` block: what to paste when an arrow is meant to change.
pub fn render_arrows(arrows: &BTreeSet<(String, String)>) -> String {
    let mut out = String::from("the tree's arrows, as the list in crates/tidy/tests/tidy.rs:\n");
    for (from, to) in arrows {
        out.push_str(&format!("    (\"{from}\", \"{to}\"),\n"));
    }
    out.push_str(&format!("and as the block in {DOC_PATH}:\n{DOC_BEGIN}\n"));
    for line in doc_lines(arrows) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(DOC_END);
    out.push('\n');
    out
}

fn expected_set(expected: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    expected
        .iter()
        .map(|(from, to)| (from.to_string(), to.to_string()))
        .collect()
}

/// The arrows of the tree against `expected`: one violation per arrow that is new (in the
/// tree, not in the list) or gone (in the list, not in the tree).
pub fn check_arrows(graph: &Graph, expected: &[(&str, &str)]) -> Vec<Violation> {
    let expected = expected_set(expected);
    let actual = graph.arrows();
    let mut violations = Vec::new();
    for (from, to) in actual.difference(&expected) {
        let message = format!("new dependency arrow `{from} → {to}` is not in the allowed list");
        violations.push(graph.violation_at(from, to, message));
    }
    for (from, to) in expected.difference(&actual) {
        let message = format!("allowed arrow `{from} → {to}` no longer exists in the tree");
        let path = graph
            .nodes
            .get(from)
            .map(|node| node.krate.manifest_path.clone())
            .unwrap_or_else(|| PathBuf::from("crates"));
        violations.push(Violation::new(path, None, message));
    }
    violations
}

/// The block of arrows in `root/docs/ARCHITECTURE.md` against `expected`: the block must
/// exist once and list exactly the same arrows, as lines `- a → b, c`.
pub fn check_architecture_doc(root: &Path, expected: &[(&str, &str)]) -> Result<Vec<Violation>> {
    let doc = Path::new(DOC_PATH);
    let text = source::read(&root.join(doc))?;
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines.iter().position(|line| line.trim() == DOC_BEGIN);
    let end = lines.iter().position(|line| line.trim() == DOC_END);
    let (Some(begin), Some(end)) = (begin, end) else {
        let message = format!("no block of arrows between `{DOC_BEGIN}` and `{DOC_END}`");
        return Ok(vec![Violation::new(doc, None, message)]);
    };
    if end < begin {
        let message = format!("`{DOC_END}` comes before `{DOC_BEGIN}`");
        return Ok(vec![Violation::new(doc, Some(end + 1), message)]);
    }
    let mut violations = Vec::new();
    let mut documented = BTreeMap::new();
    for (index, line) in lines.iter().enumerate().take(end).skip(begin + 1) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match parse_doc_line(line) {
            Some(arrows) => {
                for arrow in arrows {
                    documented.insert(arrow, index + 1);
                }
            }
            None => violations.push(Violation::new(
                doc,
                Some(index + 1),
                format!("not a line of arrows of the form `- a → b, c`: `{line}`"),
            )),
        }
    }
    let expected = expected_set(expected);
    for ((from, to), line) in &documented {
        if !expected.contains(&(from.clone(), to.clone())) {
            violations.push(Violation::new(
                doc,
                Some(*line),
                format!("documents `{from} → {to}`, which the list in the test does not allow"),
            ));
        }
    }
    for (from, to) in &expected {
        if !documented.contains_key(&(from.clone(), to.clone())) {
            violations.push(Violation::new(
                doc,
                Some(begin + 1),
                format!("the block lacks the allowed arrow `{from} → {to}`"),
            ));
        }
    }
    Ok(violations)
}

/// `- a → b, c` (or `->`) as `[(a, b), (a, c)]`.
fn parse_doc_line(line: &str) -> Option<Vec<(String, String)>> {
    let arrow = line.strip_prefix("- ")?;
    let (from, targets) = arrow.split_once('→').or_else(|| arrow.split_once("->"))?;
    let is_name = |name: &str| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let from = from.trim();
    if !is_name(from) {
        return None;
    }
    targets
        .split(',')
        .map(|to| {
            let to = to.trim();
            is_name(to).then(|| (from.to_string(), to.to_string()))
        })
        .collect()
}

/// One violation per dependency cycle between workspace crates, naming the cycle.
pub fn check_no_cycle(graph: &Graph) -> Vec<Violation> {
    let mut cycles = BTreeSet::new();
    let mut done = BTreeSet::new();
    for name in graph.nodes.keys() {
        let mut stack = Vec::new();
        find_cycles(graph, name, &mut stack, &mut done, &mut cycles);
    }
    cycles
        .into_iter()
        .map(|cycle: Vec<String>| {
            let from = &cycle[0];
            let to = &cycle[1 % cycle.len()];
            let mut path = cycle.clone();
            path.push(from.clone());
            let message = format!("dependency cycle: {}", path.join(" → "));
            graph.violation_at(from, to, message)
        })
        .collect()
}

/// Depth-first search from `name`; adds each cycle met (rotated to start at its smallest
/// crate) to `cycles`.
fn find_cycles(
    graph: &Graph,
    name: &str,
    stack: &mut Vec<String>,
    done: &mut BTreeSet<String>,
    cycles: &mut BTreeSet<Vec<String>>,
) {
    if let Some(position) = stack.iter().position(|on_stack| on_stack == name) {
        let mut cycle = stack[position..].to_vec();
        let smallest = (0..cycle.len())
            .min_by_key(|&index| &cycle[index])
            .unwrap_or(0);
        cycle.rotate_left(smallest);
        cycles.insert(cycle);
        return;
    }
    if done.contains(name) {
        return;
    }
    let Some(node) = graph.nodes.get(name) else {
        return;
    };
    stack.push(name.to_string());
    for dep in graph.workspace_deps(node) {
        find_cycles(graph, dep, stack, done, cycles);
    }
    stack.pop();
    done.insert(name.to_string());
}

/// Layer rule: none of `crates` reaches any of `forbidden` (workspace crates or outside
/// packages such as `tokio`), directly or through other workspace crates.
pub fn check_never_reaches(graph: &Graph, crates: &[&str], forbidden: &[&str]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for &start in crates {
        if !graph.nodes.contains_key(start) {
            continue;
        }
        // Breadth-first over workspace crates, remembering how each was reached.
        let mut reached_from: BTreeMap<String, Option<String>> = BTreeMap::new();
        reached_from.insert(start.to_string(), None);
        let mut queue = VecDeque::from([start.to_string()]);
        while let Some(name) = queue.pop_front() {
            let Some(node) = graph.nodes.get(&name) else {
                continue;
            };
            for dep in &node.deps {
                if forbidden.contains(&dep.as_str()) {
                    let mut path = vec![dep.clone(), name.clone()];
                    let mut at = name.clone();
                    while let Some(Some(previous)) = reached_from.get(&at) {
                        path.push(previous.clone());
                        at = previous.clone();
                    }
                    path.reverse();
                    let message = format!(
                        "layer rule: {start} must not depend on {dep}, but does: {}",
                        path.join(" → ")
                    );
                    violations.push(graph.violation_at(&name, dep, message));
                }
                if graph.nodes.contains_key(dep) && !reached_from.contains_key(dep) {
                    reached_from.insert(dep.clone(), Some(name.clone()));
                    queue.push_back(dep.clone());
                }
            }
        }
    }
    violations
}

/// Layer rule: no workspace crate depends on `target` except those in `allowed`.
pub fn check_dependents(graph: &Graph, target: &str, allowed: &[&str]) -> Vec<Violation> {
    graph
        .nodes
        .iter()
        .filter(|(name, node)| node.deps.contains(target) && !allowed.contains(&name.as_str()))
        .map(|(name, _)| {
            let message = if allowed.is_empty() {
                format!("layer rule: nothing may depend on {target}, but {name} does")
            } else {
                format!(
                    "layer rule: only {} may depend on {target}, but {name} does",
                    allowed.join(", ")
                )
            };
            graph.violation_at(name, target, message)
        })
        .collect()
}

/// Layer rule: `name` depends on no workspace crate (holds trivially while it does not
/// exist).
pub fn check_leaf(graph: &Graph, name: &str) -> Vec<Violation> {
    let Some(node) = graph.nodes.get(name) else {
        return Vec::new();
    };
    graph
        .workspace_deps(node)
        .map(|dep| {
            let message = format!("layer rule: {name} depends on no workspace crate, not {dep}");
            graph.violation_at(name, dep, message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::{manifest, tree};

    const ALLOWED: &[(&str, &str)] = &[
        ("myriad-mem", "myriad-types"),
        ("myriad-net", "myriad-types"),
    ];

    fn doc(arrows: &[(&str, &str)]) -> String {
        let mut text = format!("# Architecture\n\n## Crate dependencies\n\n{DOC_BEGIN}\n");
        for (from, to) in arrows {
            text.push_str(&doc_line(from, &[to]));
            text.push('\n');
        }
        text.push_str(DOC_END);
        text.push('\n');
        text
    }

    fn clean_tree(extra: &[(&str, String)]) -> tempfile::TempDir {
        let mut files = vec![
            (
                "crates/types/Cargo.toml",
                manifest("myriad-types", &["thiserror"]),
            ),
            (
                "crates/mem/Cargo.toml",
                manifest("myriad-mem", &["myriad-types", "libc"]),
            ),
            (
                "crates/net/Cargo.toml",
                manifest("myriad-net", &["myriad-types", "tokio"])
                    + "\n[dev-dependencies]\nmyriad-mem.workspace = true\n",
            ),
            ("docs/ARCHITECTURE.md", doc(ALLOWED)),
        ];
        files.extend(extra.iter().cloned());
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(path, text)| (*path, text.as_str()))
            .collect();
        tree(&files)
    }

    fn graph_of(dir: &tempfile::TempDir) -> Graph {
        Graph::load(dir.path()).expect("synthetic tree loads")
    }

    #[test]
    fn a_clean_tree_passes_every_dependency_check() {
        let dir = clean_tree(&[]);
        let graph = graph_of(&dir);
        assert!(check_arrows(&graph, ALLOWED).is_empty());
        let doc = check_architecture_doc(dir.path(), ALLOWED).expect("doc is readable");
        assert!(doc.is_empty(), "{doc:?}");
        assert!(check_no_cycle(&graph).is_empty());
        assert!(check_never_reaches(&graph, &["myriad-mem"], &["myriad-net", "tokio"]).is_empty());
        assert!(check_dependents(&graph, "myriad-bench", &["myriad"]).is_empty());
        assert!(check_leaf(&graph, "myriad-types").is_empty());
    }

    #[test]
    fn a_new_arrow_fails_with_its_manifest_line() {
        let mem = manifest("myriad-mem", &["myriad-types", "myriad-net"]);
        let dir = clean_tree(&[("crates/mem/Cargo.toml", mem)]);
        let violations = check_arrows(&graph_of(&dir), ALLOWED);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].path, Path::new("crates/mem/Cargo.toml"));
        assert_eq!(violations[0].line, Some(6));
        assert!(violations[0]
            .message
            .contains("new dependency arrow `myriad-mem → myriad-net`"));
    }

    #[test]
    fn a_vanished_arrow_fails() {
        let dir = clean_tree(&[("crates/mem/Cargo.toml", manifest("myriad-mem", &[]))]);
        let violations = check_arrows(&graph_of(&dir), ALLOWED);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0]
            .message
            .contains("`myriad-mem → myriad-types` no longer exists"));
    }

    #[test]
    fn renamed_build_and_target_dependencies_are_arrows() {
        let mem = "[package]\nname = \"myriad-mem\"\n[dependencies]\ntypes = { package = \"myriad-types\", path = \"../types\" }\n[build-dependencies]\nmyriad-net.workspace = true\n[target.'cfg(unix)'.dependencies]\nmyriad-placement = { path = \"../placement\" }\n";
        let dir = clean_tree(&[
            ("crates/mem/Cargo.toml", mem.to_string()),
            (
                "crates/placement/Cargo.toml",
                manifest("myriad-placement", &[]),
            ),
        ]);
        let graph = graph_of(&dir);
        let arrows: Vec<(String, String)> = graph
            .arrows()
            .into_iter()
            .filter(|(from, _)| from == "myriad-mem")
            .collect();
        let pair = |to: &str| ("myriad-mem".to_string(), to.to_string());
        assert_eq!(
            arrows,
            vec![
                pair("myriad-net"),
                pair("myriad-placement"),
                pair("myriad-types")
            ]
        );
    }

    #[test]
    fn the_doc_block_must_match_the_list() {
        let dir = clean_tree(&[(
            "docs/ARCHITECTURE.md",
            doc(&[("myriad-mem", "myriad-types"), ("myriad-mem", "myriad-net")]),
        )]);
        let violations = check_architecture_doc(dir.path(), ALLOWED).expect("doc is readable");
        let messages: Vec<&str> = violations.iter().map(|v| v.message.as_str()).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains("documents `myriad-mem → myriad-net`"));
        assert!(messages[1].contains("lacks the allowed arrow `myriad-net → myriad-types`"));
    }

    #[test]
    fn a_missing_or_garbled_doc_block_fails() {
        let dir = clean_tree(&[("docs/ARCHITECTURE.md", "# Architecture\n".to_string())]);
        let violations = check_architecture_doc(dir.path(), ALLOWED).expect("doc is readable");
        assert_eq!(violations.len(), 1);
        assert!(violations[0].message.contains("no block of arrows"));

        let garbled = doc(ALLOWED).replace("- myriad-net → myriad-types", "myriad-net uses types");
        let dir = clean_tree(&[("docs/ARCHITECTURE.md", garbled)]);
        let violations = check_architecture_doc(dir.path(), ALLOWED).expect("doc is readable");
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].message.contains("not a line of arrows"));
    }

    #[test]
    fn a_doc_line_lists_several_targets() {
        let allowed = &[("myriad-node", "myriad-mem"), ("myriad-node", "myriad-net")];
        let text = format!("{DOC_BEGIN}\n- myriad-node → myriad-mem, myriad-net\n{DOC_END}\n");
        let dir = clean_tree(&[("docs/ARCHITECTURE.md", text)]);
        let violations = check_architecture_doc(dir.path(), allowed).expect("doc is readable");
        assert!(violations.is_empty(), "{violations:?}");
        let text = format!("{DOC_BEGIN}\n- myriad-node → myriad-mem, , myriad-net\n{DOC_END}\n");
        let dir = clean_tree(&[("docs/ARCHITECTURE.md", text)]);
        let violations = check_architecture_doc(dir.path(), allowed).expect("doc is readable");
        assert!(
            violations[0].message.contains("not a line of arrows"),
            "{violations:?}"
        );
    }

    #[test]
    fn a_cycle_fails() {
        let dir = clean_tree(&[(
            "crates/types/Cargo.toml",
            manifest("myriad-types", &["myriad-net"]),
        )]);
        let violations = check_no_cycle(&graph_of(&dir));
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(
            violations[0].message,
            "dependency cycle: myriad-net → myriad-types → myriad-net"
        );
    }

    #[test]
    fn reaching_the_network_fails_even_through_another_crate() {
        let dir = clean_tree(&[(
            "crates/types/Cargo.toml",
            manifest("myriad-types", &["tokio"]),
        )]);
        let violations =
            check_never_reaches(&graph_of(&dir), &["myriad-mem"], &["myriad-net", "tokio"]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].path, Path::new("crates/types/Cargo.toml"));
        assert!(violations[0].message.contains(
            "myriad-mem must not depend on tokio, but does: myriad-mem → myriad-types → tokio"
        ));
    }

    #[test]
    fn depending_on_a_top_crate_fails() {
        let dir = clean_tree(&[
            ("crates/bench/Cargo.toml", manifest("myriad-bench", &[])),
            (
                "crates/cli/Cargo.toml",
                manifest("myriad", &["myriad-bench"]),
            ),
            (
                "crates/node/Cargo.toml",
                manifest("myriad-node", &["myriad-bench", "myriad"]),
            ),
        ]);
        let graph = graph_of(&dir);
        let bench = check_dependents(&graph, "myriad-bench", &["myriad"]);
        assert_eq!(bench.len(), 1, "{bench:?}");
        assert!(bench[0]
            .message
            .contains("only myriad may depend on myriad-bench, but myriad-node does"));
        let cli = check_dependents(&graph, "myriad", &[]);
        assert_eq!(cli.len(), 1, "{cli:?}");
        assert!(cli[0]
            .message
            .contains("nothing may depend on myriad, but myriad-node does"));
    }

    #[test]
    fn a_leaf_with_a_workspace_dependency_fails() {
        let dir = clean_tree(&[(
            "crates/types/Cargo.toml",
            manifest("myriad-types", &["myriad-mem"]),
        )]);
        let violations = check_leaf(&graph_of(&dir), "myriad-types");
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0]
            .message
            .contains("myriad-types depends on no workspace crate, not myriad-mem"));
    }

    #[test]
    fn render_arrows_gives_both_forms() {
        let arrows = BTreeSet::from([("myriad-a".to_string(), "myriad-b".to_string())]);
        let text = render_arrows(&arrows);
        assert!(text.contains("(\"myriad-a\", \"myriad-b\"),"));
        assert!(text.contains(&format!("{DOC_BEGIN}\n- myriad-a → myriad-b\n{DOC_END}")));
    }
}

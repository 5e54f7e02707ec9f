//! The crate's module dependency order, checked on its sources: every `crate::<module>`
//! path in a module names a module listed before it in the crate doc's "Module dependency
//! order" (so `use crate::` never forms a cycle), and the endpoint's submodules use each
//! other only in the order of the endpoint's module doc.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The crate doc's order: a module may use those of earlier levels (and its own).
const CRATE_LEVELS: &[&[&str]] = &[
    &["tls"],
    &["error", "config", "fault"],
    &["wire", "secret", "stream"],
    &["conn", "lane"],
    &["handler"],
    &["pool"],
    &["reader"],
    &["endpoint"],
];

/// The endpoint module doc's order of its submodules.
const ENDPOINT_ORDER: &[&str] = &[
    "events", "shared", "dial", "table", "accept", "pending", "handle", "lanes", "send", "setup",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The source without comments and without its `#[cfg(test)]` part.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("source readable");
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers that follow `prefix` (`crate::x`, and the names in `crate::{x, y::z}`).
fn used_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut used = BTreeSet::new();
    for (index, _) in code.match_indices(prefix) {
        let rest = &code[index + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            for item in group.split(',') {
                used.insert(ident(item.trim()));
            }
        } else {
            used.insert(ident(rest));
        }
    }
    used
}

fn level(module: &str) -> Option<usize> {
    CRATE_LEVELS
        .iter()
        .position(|level| level.contains(&module))
}

#[test]
fn crate_modules_use_only_earlier_modules() {
    let mut violations = Vec::new();
    for entry in std::fs::read_dir(src()).expect("src readable") {
        let path = entry.expect("entry").path();
        let module = match path.file_stem().and_then(|s| s.to_str()) {
            Some("lib") | None => continue,
            Some(name) => name.to_string(),
        };
        let files: Vec<PathBuf> = if path.is_dir() {
            std::fs::read_dir(&path)
                .expect("dir readable")
                .map(|entry| entry.expect("entry").path())
                .collect()
        } else {
            vec![path.clone()]
        };
        let own = level(&module).unwrap_or_else(|| panic!("module {module} not in CRATE_LEVELS"));
        for file in files {
            for used in used_after(&code(&file), "crate::") {
                match level(&used) {
                    Some(other) if other > own || (other == own && used != module) => {
                        violations.push(format!("{}: uses crate::{used}", file.display()))
                    }
                    _ => {}
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "against the module order: {violations:#?}"
    );
}

#[test]
fn endpoint_submodules_use_only_earlier_submodules() {
    let mut violations = Vec::new();
    for (own, module) in ENDPOINT_ORDER.iter().enumerate() {
        let file = src().join("endpoint").join(format!("{module}.rs"));
        for used in used_after(&code(&file), "super::") {
            if let Some(other) = ENDPOINT_ORDER.iter().position(|m| *m == used) {
                if other >= own {
                    violations.push(format!("endpoint::{module} uses super::{used}"));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "against the endpoint order: {violations:#?}"
    );
}

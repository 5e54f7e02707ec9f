//! Architecture and hygiene rules of the Myriad workspace, checked as ordinary tests.
//!
//! Modelled on rust-analyzer's tidy tests: the rules that reviewers would otherwise have to
//! remember are code here, and `cargo test --workspace` fails as soon as the tree breaks
//! one. Every check is a function that takes the root of a workspace and returns the
//! [`Violation`]s it found, so the same code runs on the real tree (`tests/tidy.rs`) and on
//! small synthetic trees (the unit tests, which show that each check does fail).
//!
//! The checks:
//! - [`deps`]: the crate dependency arrows (normal and build dependencies between
//!   workspace crates) against an allowed list that `docs/ARCHITECTURE.md` repeats, no
//!   cycles, and layer rules that hold whatever the list says;
//! - [`headers`]: every module starts with a `//!` doc comment;
//! - [`length`]: limits on the length of source files and functions outside tests;
//! - [`unwrap`]: no `.unwrap()` outside tests;
//! - [`unsafe_code`]: `unsafe` only in the crates allowed to have it, each block and impl
//!   with a `// SAFETY:` comment.
//!
//! What counts as a workspace crate is every `crates/*/Cargo.toml` with a `[package]`;
//! nested projects (the `crates/*/fuzz` cargo-fuzz projects) are not part of it.

pub mod deps;
pub mod headers;
pub mod length;
pub mod unsafe_code;
pub mod unwrap;

mod source;
mod syntax;
#[cfg(test)]
mod test_tree;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use source::{workspace_crates, Crate};

/// One broken rule at one place of the tree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The file, relative to the checked root.
    pub path: PathBuf,
    /// The 1-based line in `path`, when the rule is broken at one line.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Violation {
    /// A violation at `line` of `path` (`None`: the whole file).
    pub fn new(path: impl Into<PathBuf>, line: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.path.display(), self.message),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

/// Why a check could not run at all (as opposed to a [`Violation`] it found).
#[derive(Debug)]
pub struct Error {
    /// The file or directory that could not be read or understood.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

impl Error {
    pub(crate) fn new(path: &Path, message: impl fmt::Display) -> Self {
        Self {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for Error {}

/// The result of a check that reads the tree.
pub type Result<T> = std::result::Result<T, Error>;

/// The report of a failed check: its name, every violation on its own line, the count of
/// violations per file when several files have some and one has more than one, and `fix`
/// (what to do).
pub fn render(check: &str, violations: &[Violation], fix: &str) -> String {
    let mut out = format!("tidy: {check}: {} violation(s)\n", violations.len());
    for violation in violations {
        out.push_str(&format!("  {violation}\n"));
    }
    let per_file = count_by_file(violations);
    if per_file.len() > 1 && violations.len() > per_file.len() {
        out.push_str("per file:\n");
        for (path, count) in per_file {
            out.push_str(&format!("  {} ({count})\n", path.display()));
        }
    }
    if !fix.is_empty() {
        out.push_str(&format!("to fix: {fix}\n"));
    }
    out
}

/// The number of violations in each file, by path.
pub fn count_by_file(violations: &[Violation]) -> BTreeMap<PathBuf, usize> {
    let mut counts = BTreeMap::new();
    for violation in violations {
        *counts.entry(violation.path.clone()).or_insert(0) += 1;
    }
    counts
}

/// Panics with [`render`]'s report unless `violations` is empty.
#[track_caller]
pub fn assert_clean(check: &str, violations: &[Violation], fix: &str) {
    if !violations.is_empty() {
        panic!("\n{}", render(check, violations, fix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_violations_and_counts_per_file() {
        let violations = vec![
            Violation::new("a.rs", Some(3), "bad"),
            Violation::new("a.rs", Some(9), "bad again"),
            Violation::new("b/Cargo.toml", None, "worse"),
        ];
        let report = render("demo", &violations, "do better");
        assert!(report.contains("tidy: demo: 3 violation(s)"));
        assert!(report.contains("  a.rs:3: bad\n"));
        assert!(report.contains("  b/Cargo.toml: worse\n"));
        assert!(report.contains("  a.rs (2)\n"));
        assert!(report.contains("to fix: do better"));
        let one_each = [
            Violation::new("a.rs", Some(3), "bad"),
            Violation::new("b.rs", Some(3), "bad"),
        ];
        assert!(!render("demo", &one_each, "").contains("per file"));
    }

    #[test]
    #[should_panic(expected = "tidy: demo: 1 violation(s)")]
    fn assert_clean_panics_on_a_violation() {
        assert_clean("demo", &[Violation::new("a.rs", None, "bad")], "");
    }
}

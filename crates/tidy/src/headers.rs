//! Every module starts with its header doc: a `//!` comment that says what it is for.
//!
//! Blank lines and attributes (`#![...]`, `#[...]`, also spread over several lines) may
//! come first; anything else, a plain `//` comment included, must not.

use std::path::Path;

use crate::source::{self, Place, SourceFile};
use crate::{Result, Violation};

/// Every `.rs` file under `crates/*/src` (test modules included) starts with `//!`.
pub fn check_module_headers(root: &Path) -> Result<Vec<Violation>> {
    Ok(check(source::source_files(root)?, Place::Src))
}

/// Every `.rs` file under `crates/*/{tests,benches,examples}` starts with `//!` too.
pub fn check_target_headers(root: &Path) -> Result<Vec<Violation>> {
    Ok(check(source::source_files(root)?, Place::Target))
}

fn check(files: Vec<SourceFile>, place: Place) -> Vec<Violation> {
    files
        .into_iter()
        .filter(|file| file.place == place)
        .filter_map(|file| {
            let line = first_content_line(&file.text);
            let starts_with_doc = line.is_some_and(|(_, text)| text.starts_with("//!"));
            (!starts_with_doc).then(|| {
                Violation::new(
                    &file.path,
                    line.map(|(number, _)| number),
                    "the module does not start with a `//!` doc comment saying what it is for",
                )
            })
        })
        .collect()
}

/// The first line (1-based number, trimmed text) that is neither blank nor part of an
/// attribute.
pub(crate) fn first_content_line(text: &str) -> Option<(usize, &str)> {
    // Open brackets of the attribute being skipped; an attribute may span lines.
    let mut depth = 0usize;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if depth == 0 && !(line.starts_with("#[") || line.starts_with("#![")) {
            if line.is_empty() {
                continue;
            }
            return Some((index + 1, line));
        }
        for c in line.chars() {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::{manifest, tree};

    const CLEAN: &[(&str, &str)] = &[
        ("crates/a/src/lib.rs", "//! The crate.\nmod b;\n"),
        (
            "crates/a/src/b.rs",
            "\n#![allow(\n    dead_code,\n)]\n#[cfg(unix)]\n\n//! B.\nfn f() {}\n",
        ),
        ("crates/a/tests/it.rs", "//! An integration test.\n"),
    ];

    fn with_manifest(files: &[(&'static str, &'static str)]) -> tempfile::TempDir {
        let manifest = manifest("myriad-a", &[]);
        let mut all = vec![("crates/a/Cargo.toml", manifest.as_str())];
        all.extend_from_slice(files);
        tree(&all)
    }

    #[test]
    fn a_clean_tree_passes() {
        let dir = with_manifest(CLEAN);
        assert!(check_module_headers(dir.path())
            .expect("readable")
            .is_empty());
        assert!(check_target_headers(dir.path())
            .expect("readable")
            .is_empty());
    }

    #[test]
    fn a_module_without_header_fails() {
        let mut files = CLEAN.to_vec();
        files.push(("crates/a/src/c.rs", "// A plain comment.\nfn g() {}\n"));
        files.push(("crates/a/src/d.rs", ""));
        let dir = with_manifest(&files);
        let violations = check_module_headers(dir.path()).expect("readable");
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert_eq!(violations[0].path, Path::new("crates/a/src/c.rs"));
        assert_eq!(violations[0].line, Some(1));
        assert_eq!(violations[1].path, Path::new("crates/a/src/d.rs"));
    }

    #[test]
    fn a_test_file_without_header_fails() {
        let mut files = CLEAN.to_vec();
        files.push(("crates/a/tests/other.rs", "use a::b;\n"));
        let dir = with_manifest(&files);
        assert!(check_module_headers(dir.path())
            .expect("readable")
            .is_empty());
        let violations = check_target_headers(dir.path()).expect("readable");
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].path, Path::new("crates/a/tests/other.rs"));
    }
}

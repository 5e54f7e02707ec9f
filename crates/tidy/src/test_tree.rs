//! Synthetic workspaces for the unit tests: files written into a temporary directory.

use std::fs;

use tempfile::TempDir;

/// A temporary directory holding `files` (path relative to it, contents).
pub(crate) fn tree(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    for (path, text) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parent directory");
        }
        fs::write(&path, text).expect("write file");
    }
    dir
}

/// The manifest of a crate named `name` with `deps` as normal dependencies.
pub(crate) fn manifest(name: &str, deps: &[&str]) -> String {
    let mut text = format!("[package]\nname = \"{name}\"\n\n[dependencies]\n");
    for dep in deps {
        text.push_str(&format!("{dep}.workspace = true\n"));
    }
    text
}

//! The workspace's crates and their Rust files, as the checks see them.
//!
//! A workspace crate is a directory `crates/<dir>` with a `Cargo.toml` that has a
//! `[package]`. Its files are those of `src/` (plus a `build.rs`) and of the target
//! directories `tests/`, `benches/` and `examples/`; a directory with a `Cargo.toml` of its
//! own below them is another project and skipped, as are `crates/*/fuzz`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// One workspace crate.
#[derive(Debug, Clone)]
pub struct Crate {
    /// The package name (`myriad-mem`; the CLI's is `myriad`).
    pub name: String,
    /// Its directory, relative to the root (`crates/mem`).
    pub dir: PathBuf,
    /// Its manifest, relative to the root (`crates/mem/Cargo.toml`).
    pub manifest_path: PathBuf,
    /// The manifest's text.
    pub manifest_text: String,
    /// The parsed manifest.
    pub manifest: toml::Table,
}

/// Every workspace crate under `root/crates`, then under `root/examples` (the example
/// binaries, checked by the same rules), each sorted by directory.
pub fn workspace_crates(root: &Path) -> Result<Vec<Crate>> {
    let mut crates = Vec::new();
    for parent in CRATE_DIRS {
        let parent_abs = root.join(parent);
        // Only `crates` must exist; a tree without examples has none.
        if *parent != "crates" && !parent_abs.is_dir() {
            continue;
        }
        crates.extend(crates_in(&parent_abs, parent)?);
    }
    Ok(crates)
}

/// The directories that hold workspace crates.
const CRATE_DIRS: &[&str] = &["crates", "examples"];

fn crates_in(crates_dir: &Path, parent: &str) -> Result<Vec<Crate>> {
    let mut crates = Vec::new();
    for dir in sorted_entries(crates_dir)? {
        let dir_abs = crates_dir.join(&dir);
        let manifest_abs = dir_abs.join("Cargo.toml");
        if !dir_abs.is_dir() || !manifest_abs.is_file() {
            continue;
        }
        let manifest_text = read(&manifest_abs)?;
        let manifest: toml::Table = manifest_text
            .parse()
            .map_err(|error| Error::new(&manifest_abs, error))?;
        let Some(package) = manifest.get("package").and_then(toml::Value::as_table) else {
            continue;
        };
        let name = package
            .get("name")
            .and_then(toml::Value::as_str)
            .ok_or_else(|| Error::new(&manifest_abs, "[package] has no name"))?
            .to_string();
        let dir = Path::new(parent).join(&dir);
        crates.push(Crate {
            name,
            manifest_path: dir.join("Cargo.toml"),
            dir,
            manifest_text,
            manifest,
        });
    }
    Ok(crates)
}

/// Where a Rust file sits in its crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Under `src/` (or the crate's `build.rs`): the crate's own code.
    Src,
    /// Under `tests/`, `benches/` or `examples/`: a target of its own.
    Target,
}

/// One Rust file of a workspace crate.
#[derive(Debug, Clone)]
pub(crate) struct SourceFile {
    /// The package name of its crate.
    pub crate_name: String,
    /// The file, relative to the root.
    pub path: PathBuf,
    /// Where it sits in the crate.
    pub place: Place,
    /// Whether the whole file is test code: a `src/` file named `tests.rs` or
    /// `*_tests.rs`, under a `tests` directory of `src/`, or a module that a
    /// `#[cfg(test)] mod name;` declares (with its submodules). Target files are not.
    pub test_only: bool,
    /// Its text.
    pub text: String,
}

impl SourceFile {
    /// The file's lines (index 0 is line 1).
    pub fn lines(&self) -> Vec<&str> {
        self.text.lines().collect()
    }
}

/// Every Rust file of every workspace crate, sorted by path.
pub(crate) fn source_files(root: &Path) -> Result<Vec<SourceFile>> {
    let mut files = Vec::new();
    for krate in workspace_crates(root)? {
        let mut src = Vec::new();
        collect_rs(root, &krate.dir.join("src"), &mut src)?;
        let build = krate.dir.join("build.rs");
        if root.join(&build).is_file() {
            src.push(build);
        }
        let test_modules = cfg_test_modules(root, &src)?;
        for path in src {
            let test_only = is_test_file(&krate.dir.join("src"), &path, &test_modules);
            files.push(SourceFile {
                crate_name: krate.name.clone(),
                text: read(&root.join(&path))?,
                path,
                place: Place::Src,
                test_only,
            });
        }
        for target in ["tests", "benches", "examples"] {
            let mut paths = Vec::new();
            collect_rs(root, &krate.dir.join(target), &mut paths)?;
            for path in paths {
                files.push(SourceFile {
                    crate_name: krate.name.clone(),
                    text: read(&root.join(&path))?,
                    path,
                    place: Place::Target,
                    test_only: false,
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The `src/` files of every crate, without the test-only ones when `with_tests` is false.
pub(crate) fn src_files(root: &Path, with_tests: bool) -> Result<Vec<SourceFile>> {
    Ok(source_files(root)?
        .into_iter()
        .filter(|file| file.place == Place::Src && (with_tests || !file.test_only))
        .collect())
}

/// Adds the `.rs` files under `dir` (relative to `root`) to `out`, skipping nested
/// projects (directories with a `Cargo.toml`), `target` and hidden directories.
fn collect_rs(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let abs = root.join(dir);
    if !abs.is_dir() {
        return Ok(());
    }
    for name in sorted_entries(&abs)? {
        let path = dir.join(&name);
        let full = root.join(&path);
        if full.is_dir() {
            let hidden = name.to_string_lossy().starts_with('.');
            if hidden || name == "target" || full.join("Cargo.toml").is_file() {
                continue;
            }
            collect_rs(root, &path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The files of the modules that `#[cfg(test)] mod name;` declares in `files`, as the
/// directory each one's submodules live in (`a/b/tests.rs` → `a/b/tests`).
fn cfg_test_modules(root: &Path, files: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut modules = Vec::new();
    for path in files {
        let text = read(&root.join(path))?;
        let dir = module_dir(path);
        for name in cfg_test_mod_names(&text) {
            modules.push(dir.join(&name));
        }
    }
    Ok(modules)
}

/// The names `n` of the out-of-line modules declared `mod n;` right below an attribute
/// block that holds `#[cfg(test)]`. A line scan: enough for how modules are declared.
fn cfg_test_mod_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_test_attrs = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("#[") {
            in_test_attrs |= line.replace(' ', "").starts_with("#[cfg(test)]");
            continue;
        }
        if in_test_attrs {
            let declaration = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            if let Some(name) = declaration
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            {
                names.push(name.trim().to_string());
            }
        }
        in_test_attrs = false;
    }
    names
}

/// The directory that holds the submodules of the module in `path`.
fn module_dir(path: &Path) -> PathBuf {
    let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let stem = path
        .file_stem()
        .map(|stem| stem.to_string_lossy().to_string());
    let in_bin = parent.file_name().is_some_and(|name| name == "bin");
    match stem.as_deref() {
        Some("mod" | "lib" | "main") | None => parent,
        Some(_) if in_bin => parent,
        Some(stem) => parent.join(stem),
    }
}

/// Whether `path` (a file under `src_dir`) is test code as a whole.
fn is_test_file(src_dir: &Path, path: &Path, test_modules: &[PathBuf]) -> bool {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().to_string())
        .unwrap_or_default();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return true;
    }
    let inside = path.strip_prefix(src_dir).unwrap_or(path);
    if inside
        .parent()
        .is_some_and(|dir| dir.components().any(|part| part.as_os_str() == "tests"))
    {
        return true;
    }
    let as_module = path.with_extension("");
    let module = if name == "mod.rs" {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        as_module
    };
    test_modules
        .iter()
        .any(|test_module| module.starts_with(test_module))
}

fn sorted_entries(dir: &Path) -> Result<Vec<std::ffi::OsString>> {
    let entries = fs::read_dir(dir).map_err(|error| Error::new(dir, error))?;
    let mut names = Vec::new();
    for entry in entries {
        names.push(entry.map_err(|error| Error::new(dir, error))?.file_name());
    }
    names.sort();
    Ok(names)
}

pub(crate) fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|error| Error::new(path, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::tree;

    #[test]
    fn finds_crates_and_marks_test_files() {
        let dir = tree(&[
            ("crates/a/Cargo.toml", "[package]\nname = \"myriad-a\"\n"),
            (
                "crates/a/src/lib.rs",
                "//! A.\n#[cfg(test)]\nmod unit;\nmod x;\n",
            ),
            ("crates/a/src/unit.rs", "//! Tests.\n"),
            ("crates/a/src/unit/more.rs", "//! More tests.\n"),
            (
                "crates/a/src/x.rs",
                "//! X.\n#[cfg(test)]\npub(crate) mod checks;\n",
            ),
            ("crates/a/src/x/checks.rs", "//! X's tests.\n"),
            ("crates/a/src/x/y.rs", "//! Y.\n"),
            ("crates/a/src/io_tests.rs", "//! Tests.\n"),
            ("crates/a/tests/it.rs", "//! Integration.\n"),
            ("crates/a/fuzz/Cargo.toml", "[package]\nname = \"fuzz\"\n"),
            ("crates/a/fuzz/src/lib.rs", "fn f() {}\n"),
            ("crates/notes/README", "not a crate\n"),
        ]);
        let crates = workspace_crates(dir.path()).expect("tree is readable");
        assert_eq!(crates.len(), 1);
        assert_eq!(crates[0].name, "myriad-a");
        let files = source_files(dir.path()).expect("tree is readable");
        let summary: Vec<(String, bool, bool)> = files
            .iter()
            .map(|file| {
                let path = file.path.to_string_lossy().to_string();
                (path, file.place == Place::Src, file.test_only)
            })
            .collect();
        let expect = |path: &str, src: bool, test: bool| (path.to_string(), src, test);
        assert_eq!(
            summary,
            vec![
                expect("crates/a/src/io_tests.rs", true, true),
                expect("crates/a/src/lib.rs", true, false),
                expect("crates/a/src/unit/more.rs", true, true),
                expect("crates/a/src/unit.rs", true, true),
                expect("crates/a/src/x/checks.rs", true, true),
                expect("crates/a/src/x/y.rs", true, false),
                expect("crates/a/src/x.rs", true, false),
                expect("crates/a/tests/it.rs", false, false),
            ]
        );
    }
}

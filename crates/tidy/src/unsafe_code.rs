//! `unsafe` only where allowed, and every `unsafe` block or impl with a `// SAFETY:` note.
//!
//! Every Rust file of every workspace crate counts, test code included. A `// SAFETY:`
//! comment documents an `unsafe { .. }` block or `unsafe impl` when it is on the same line
//! or in the comments right above it; between the comments and the `unsafe` there may be
//! attributes and at most [`MAX_STATEMENT_LINES`] lines of the statement that holds the
//! block (`let x =` on the line before `unsafe { .. }`). `unsafe fn` and `unsafe trait`
//! document their contract in a `# Safety` doc section instead (clippy's
//! `missing_safety_doc`), so they only count for where `unsafe` may appear.

use std::collections::BTreeMap;
use std::path::Path;

use syn::visit::{self, Visit};
use syn::{ExprUnsafe, ImplItemFn, ItemFn, ItemImpl, ItemTrait, Macro, Signature, TraitItemFn};

use crate::source::{self, SourceFile};
use crate::syntax::{self, start_line};
use crate::{Result, Violation};

/// The most lines of code between a `// SAFETY:` comment and the `unsafe` it documents.
pub const MAX_STATEMENT_LINES: usize = 3;

/// What kind of `unsafe` a site is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `unsafe { .. }`.
    Block,
    /// `unsafe impl`.
    Impl,
    /// `unsafe fn`.
    Fn,
    /// `unsafe trait`.
    Trait,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Block => "`unsafe` block",
            Kind::Impl => "`unsafe impl`",
            Kind::Fn => "`unsafe fn`",
            Kind::Trait => "`unsafe trait`",
        }
    }
}

/// Every `unsafe` block or impl without a `// SAFETY:` comment.
pub fn check_unsafe_documented(root: &Path) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    for file in source::source_files(root)? {
        let sites = match sites(&file) {
            Ok(sites) => sites,
            Err(violation) => {
                violations.push(violation);
                continue;
            }
        };
        let lines = file.lines();
        for (line, kind) in sites {
            if matches!(kind, Kind::Block | Kind::Impl) && !has_safety_comment(&lines, line) {
                violations.push(Violation::new(
                    &file.path,
                    Some(line),
                    format!(
                        "{} without a `// SAFETY:` comment right above it",
                        kind.describe()
                    ),
                ));
            }
        }
    }
    Ok(violations)
}

/// Every `unsafe` in a crate that is not in `allowed`, and every crate in `allowed` that
/// has no `unsafe` left (its allowance is stale).
pub fn check_unsafe_allowed(root: &Path, allowed: &[&str]) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for file in source::source_files(root)? {
        let sites = match sites(&file) {
            Ok(sites) => sites,
            Err(violation) => {
                violations.push(violation);
                continue;
            }
        };
        *counts.entry(file.crate_name.clone()).or_insert(0) += sites.len();
        if allowed.contains(&file.crate_name.as_str()) {
            continue;
        }
        for (line, kind) in sites {
            violations.push(Violation::new(
                &file.path,
                Some(line),
                format!(
                    "{} in {}, which is not allowed to have `unsafe`",
                    kind.describe(),
                    file.crate_name
                ),
            ));
        }
    }
    for krate in source::workspace_crates(root)? {
        let count = counts.get(&krate.name).copied().unwrap_or(0);
        if allowed.contains(&krate.name.as_str()) && count == 0 {
            violations.push(Violation::new(
                &krate.manifest_path,
                None,
                format!(
                    "{} is allowed `unsafe` but has none: take it off the list",
                    krate.name
                ),
            ));
        }
    }
    Ok(violations)
}

/// The number of `unsafe` sites of each crate that has any, by package name.
pub fn unsafe_sites_by_crate(root: &Path) -> Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for file in source::source_files(root)? {
        let count = sites(&file).map(|sites| sites.len()).unwrap_or(0);
        if count > 0 {
            *counts.entry(file.crate_name.clone()).or_insert(0) += count;
        }
    }
    Ok(counts)
}

/// The `unsafe` sites of `file`: line of the `unsafe` keyword and kind.
fn sites(file: &SourceFile) -> std::result::Result<Vec<(usize, Kind)>, Violation> {
    let ast = syntax::parse(file)?;
    let mut visitor = UnsafeVisitor::default();
    visitor.visit_file(&ast);
    Ok(visitor.sites)
}

/// Whether the `unsafe` at 1-based `line` has a `// SAFETY:` comment on that line or
/// right above it.
fn has_safety_comment(lines: &[&str], line: usize) -> bool {
    let Some(at) = line.checked_sub(1).and_then(|index| lines.get(index)) else {
        return false;
    };
    if at.contains("// SAFETY:") || at.contains("/* SAFETY:") {
        return true;
    }
    let mut statement_lines = 0;
    for above in lines[..line - 1].iter().rev() {
        let above = above.trim();
        let comment = above.starts_with("//") || above.starts_with("/*") || above.starts_with('*');
        if comment {
            if above.contains("SAFETY:") {
                return true;
            }
            continue;
        }
        if above.starts_with("#[") {
            continue;
        }
        // Code: only the start of the statement that holds the block may stand between.
        let ends_statement = above.is_empty()
            || above.ends_with(';')
            || above.ends_with('{')
            || above.ends_with('}');
        statement_lines += 1;
        if ends_statement || statement_lines > MAX_STATEMENT_LINES {
            return false;
        }
    }
    false
}

/// Collects the `unsafe` sites of a file.
#[derive(Default)]
struct UnsafeVisitor {
    sites: Vec<(usize, Kind)>,
}

impl UnsafeVisitor {
    fn signature(&mut self, sig: &Signature) {
        if let Some(token) = &sig.unsafety {
            self.sites.push((start_line(token.span), Kind::Fn));
        }
    }
}

impl<'ast> Visit<'ast> for UnsafeVisitor {
    fn visit_expr_unsafe(&mut self, block: &'ast ExprUnsafe) {
        self.sites
            .push((start_line(block.unsafe_token.span), Kind::Block));
        visit::visit_expr_unsafe(self, block);
    }

    fn visit_item_impl(&mut self, item: &'ast ItemImpl) {
        if let Some(token) = &item.unsafety {
            self.sites.push((start_line(token.span), Kind::Impl));
        }
        visit::visit_item_impl(self, item);
    }

    fn visit_item_trait(&mut self, item: &'ast ItemTrait) {
        if let Some(token) = &item.unsafety {
            self.sites.push((start_line(token.span), Kind::Trait));
        }
        visit::visit_item_trait(self, item);
    }

    fn visit_item_fn(&mut self, item: &'ast ItemFn) {
        self.signature(&item.sig);
        visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast ImplItemFn) {
        self.signature(&item.sig);
        visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast TraitItemFn) {
        self.signature(&item.sig);
        visit::visit_trait_item_fn(self, item);
    }

    fn visit_macro(&mut self, mac: &'ast Macro) {
        syntax::visit_macro_exprs(self, mac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::{manifest, tree};

    const DOCUMENTED: &str = "//! Raw memory.
struct P(*mut u8);
// SAFETY: `P` owns its pointer.
unsafe impl Send for P {}
/// Reads.
///
/// # Safety
/// The pointer must be valid.
unsafe fn read(p: *const u8) -> u8 {
    // SAFETY: forwarded contract.
    unsafe { *p }
}
fn f(p: *const u8) -> u8 {
    // SAFETY: the caller of `f` passes a valid pointer; this comment may run over
    // several lines.
    let value =
        unsafe { read(p) };
    // SAFETY: as above.
    #[allow(unused_unsafe)]
    unsafe {
        read(p)
    };
    value + unsafe { read(p) } // SAFETY: as above.
}
";

    fn check_tree(files: &[(&str, &str)]) -> (Vec<Violation>, Vec<Violation>) {
        let a = manifest("myriad-a", &[]);
        let b = manifest("myriad-b", &[]);
        let mut all = vec![
            ("crates/a/Cargo.toml", a.as_str()),
            ("crates/b/Cargo.toml", b.as_str()),
        ];
        all.extend_from_slice(files);
        let dir = tree(&all);
        (
            check_unsafe_documented(dir.path()).expect("readable"),
            check_unsafe_allowed(dir.path(), &["myriad-a"]).expect("readable"),
        )
    }

    #[test]
    fn a_clean_tree_passes() {
        let (documented, allowed) = check_tree(&[
            ("crates/a/src/lib.rs", DOCUMENTED),
            (
                "crates/b/src/lib.rs",
                "//! Safe.\n#![forbid(unsafe_code)]\nfn f() {}\n",
            ),
        ]);
        assert!(documented.is_empty(), "{documented:?}");
        assert!(allowed.is_empty(), "{allowed:?}");
    }

    #[test]
    fn unsafe_without_safety_comment_fails() {
        let text = "//! Raw memory.
struct P(*mut u8);
unsafe impl Send for P {}
fn f(p: *const u8) -> u8 {
    // SAFETY: documents only the next statement.
    let a = 1;
    let b = unsafe { *p };
    let c = format!(\"{}\", unsafe { *p });
    a + b
}
";
        let (documented, _) = check_tree(&[("crates/a/src/lib.rs", text)]);
        let lines: Vec<Option<usize>> = documented.iter().map(|v| v.line).collect();
        assert_eq!(lines, vec![Some(3), Some(7), Some(8)], "{documented:?}");
        assert!(documented[0]
            .message
            .contains("`unsafe impl` without a `// SAFETY:` comment"));
        assert!(documented[1].message.contains("`unsafe` block without"));
    }

    #[test]
    fn unsafe_outside_the_allowed_crates_fails() {
        let (_, allowed) = check_tree(&[
            ("crates/a/src/lib.rs", DOCUMENTED),
            ("crates/b/src/lib.rs", "//! B.\nunsafe trait Zeroed {}\n"),
            ("crates/b/tests/it.rs", "//! Test.\nfn f(p: *const u8) -> u8 {\n    // SAFETY: test.\n    unsafe { *p }\n}\n"),
        ]);
        let found: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            vec![
                "crates/b/src/lib.rs:2: `unsafe trait` in myriad-b, which is not allowed to have `unsafe`",
                "crates/b/tests/it.rs:4: `unsafe` block in myriad-b, which is not allowed to have `unsafe`",
            ]
        );
    }

    #[test]
    fn a_stale_allowance_fails() {
        let (_, allowed) = check_tree(&[("crates/a/src/lib.rs", "//! Safe now.\nfn f() {}\n")]);
        assert_eq!(allowed.len(), 1, "{allowed:?}");
        assert!(allowed[0]
            .message
            .contains("myriad-a is allowed `unsafe` but has none"));
    }
}

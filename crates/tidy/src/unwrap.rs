//! No `.unwrap()` outside tests.
//!
//! A panic in non-test code must say which invariant broke: `expect("why this holds")`
//! does, `unwrap()` does not. Every `.unwrap()` method call in `crates/*/src` counts,
//! including those inside the arguments of macros such as `format!` or `assert!`, except
//! in test code: test files, items under `#[cfg(test)]` and `#[test]` functions.
//! `unwrap_or`, `unwrap_or_else` and friends are fine.

use std::path::Path;

use syn::visit::{self, Visit};
use syn::{ExprMethodCall, ImplItem, Item, Macro, TraitItem};

use crate::syntax::{self, start_line};
use crate::{Result, Violation};

/// Every `.unwrap()` call in non-test code under `crates/*/src`.
pub fn check_unwraps(root: &Path) -> Result<Vec<Violation>> {
    let (files, mut violations) = syntax::parsed_src_files(root)?;
    for (file, ast) in files {
        let mut visitor = UnwrapVisitor::default();
        visitor.visit_file(&ast);
        for line in visitor.lines {
            violations.push(Violation::new(
                &file.path,
                Some(line),
                "`.unwrap()` outside tests: use `expect(\"<why it cannot fail>\")` or handle the error",
            ));
        }
    }
    Ok(violations)
}

/// Collects the lines of `.unwrap()` calls outside test code.
#[derive(Default)]
struct UnwrapVisitor {
    lines: Vec<usize>,
}

impl<'ast> Visit<'ast> for UnwrapVisitor {
    fn visit_item(&mut self, item: &'ast Item) {
        if !syntax::is_test_code(syntax::item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if !syntax::is_test_code(syntax::impl_item_attrs(item)) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        if !syntax::is_test_code(syntax::trait_item_attrs(item)) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_expr_method_call(&mut self, call: &'ast ExprMethodCall) {
        if call.method == "unwrap" && call.args.is_empty() {
            self.lines.push(start_line(call.method.span()));
        }
        visit::visit_expr_method_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast Macro) {
        syntax::visit_macro_exprs(self, mac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::{manifest, tree};

    fn check_tree(files: &[(&str, &str)]) -> Vec<Violation> {
        let manifest = manifest("myriad-a", &[]);
        let mut all = vec![("crates/a/Cargo.toml", manifest.as_str())];
        all.extend_from_slice(files);
        check_unwraps(tree(&all).path()).expect("readable")
    }

    const CLEAN: &str = "//! Clean.
fn f(x: Option<u8>) -> u8 {
    x.expect(\"always set\") + x.unwrap_or(1) + x.unwrap_or_default()
}
#[test]
fn t() { Some(1).unwrap(); }
#[cfg(test)]
mod tests {
    fn helper() { Some(1).unwrap(); }
}
struct S;
impl S {
    #[cfg(test)]
    fn only_in_tests() { Some(1).unwrap(); }
}
";

    #[test]
    fn a_clean_tree_passes() {
        let violations = check_tree(&[
            ("crates/a/src/lib.rs", CLEAN),
            (
                "crates/a/src/codec_tests.rs",
                "//! Tests.\nfn g() { Some(1).unwrap(); }\n",
            ),
            (
                "crates/a/tests/it.rs",
                "//! Integration.\nfn g() { Some(1).unwrap(); }\n",
            ),
        ]);
        assert!(violations.is_empty(), "{violations:?}");
    }

    #[test]
    fn unwraps_outside_tests_fail() {
        let text = "//! Unwraps.
fn f(x: Option<u8>) -> u8 {
    let y = x
        .unwrap();
    println!(\"{}\", x.map(|v| v + 1).unwrap());
    y
}
";
        let violations = check_tree(&[("crates/a/src/lib.rs", text)]);
        let lines: Vec<Option<usize>> = violations.iter().map(|v| v.line).collect();
        assert_eq!(lines, vec![Some(4), Some(5)], "{violations:?}");
        assert!(violations[0].message.contains("`.unwrap()` outside tests"));
    }

    #[test]
    fn an_unparsable_file_is_reported() {
        let violations = check_tree(&[("crates/a/src/lib.rs", "//! Broken.\nfn f( {\n")]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0]
            .message
            .contains("tidy cannot parse this file"));
    }
}

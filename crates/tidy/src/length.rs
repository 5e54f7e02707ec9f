//! Length limits on source files and functions, outside tests.
//!
//! A file under `crates/*/src` may hold at most [`MAX_FILE_LINES`] lines of code that is not
//! test code, and a function (free, associated, trait default or nested) at most
//! [`MAX_FN_LINES`] lines from its `fn` to its closing brace. Test code does not count:
//! whole test files (`tests.rs`, `*_tests.rs`, modules declared `#[cfg(test)] mod x;`),
//! items under `#[cfg(test)]` and `#[test]` functions.
//!
//! Escape hatches, each with a reason that must not be empty:
//! - a file whose first `//!` block has a line `//! tidy: long-file: <reason>`;
//! - a function preceded (among its doc comments and attributes, or right above them) by a
//!   comment `// tidy: long-fn: <reason>`.

use std::path::Path;

use syn::visit::{self, Visit};
use syn::{ImplItem, ImplItemFn, Item, ItemFn, ItemImpl, ItemTrait, TraitItem, TraitItemFn};

use crate::headers::first_content_line;
use crate::source::SourceFile;
use crate::syntax::{self, end_line, start_line};
use crate::{Result, Violation};

/// The most lines of non-test code in one source file.
pub const MAX_FILE_LINES: usize = 1_500;
/// The most lines of one function outside tests.
pub const MAX_FN_LINES: usize = 150;

const LONG_FILE: &str = "tidy: long-file:";
const LONG_FN: &str = "// tidy: long-fn:";

/// Files under `crates/*/src` with more than `max_lines` lines outside test code.
pub fn check_file_lengths(root: &Path, max_lines: usize) -> Result<Vec<Violation>> {
    let (files, mut violations) = syntax::parsed_src_files(root)?;
    for (file, ast) in files {
        let mut visitor = FnVisitor::default();
        visitor.visit_file(&ast);
        let total = file.text.lines().count();
        let test_lines: usize = visitor
            .test_ranges
            .iter()
            .map(|(first, last)| last + 1 - first)
            .sum();
        let lines = total.saturating_sub(test_lines);
        match long_file_reason(&file) {
            Some((line, reason)) if reason.is_empty() => violations.push(Violation::new(
                &file.path,
                Some(line),
                format!("`{LONG_FILE}` escape hatch without a reason"),
            )),
            Some(_) => {}
            None if lines > max_lines => violations.push(Violation::new(
                &file.path,
                None,
                format!("{lines} lines outside tests (of {total}), over the limit of {max_lines}"),
            )),
            None => {}
        }
    }
    Ok(violations)
}

/// Functions under `crates/*/src` longer than `max_lines` lines, outside test code.
pub fn check_fn_lengths(root: &Path, max_lines: usize) -> Result<Vec<Violation>> {
    let (files, mut violations) = syntax::parsed_src_files(root)?;
    for (file, ast) in files {
        let mut visitor = FnVisitor::default();
        visitor.visit_file(&ast);
        let lines = file.lines();
        for function in visitor.fns {
            let length = function.last_line + 1 - function.fn_line;
            match long_fn_reason(&lines, function.first_line, function.fn_line) {
                Some((line, reason)) if reason.is_empty() => violations.push(Violation::new(
                    &file.path,
                    Some(line),
                    format!("`{LONG_FN}` escape hatch without a reason"),
                )),
                Some(_) => {}
                None if length > max_lines => violations.push(Violation::new(
                    &file.path,
                    Some(function.fn_line),
                    format!(
                        "fn `{}` is {length} lines, over the limit of {max_lines}",
                        function.name
                    ),
                )),
                None => {}
            }
        }
    }
    Ok(violations)
}

/// The line and reason of the file's `//! tidy: long-file: <reason>`, if its first `//!`
/// block has one.
fn long_file_reason(file: &SourceFile) -> Option<(usize, String)> {
    let (first, _) = first_content_line(&file.text)?;
    file.text
        .lines()
        .enumerate()
        .skip(first - 1)
        .map(|(index, line)| (index + 1, line.trim()))
        .take_while(|(_, line)| line.starts_with("//!"))
        .find_map(|(number, line)| {
            let content = line.trim_start_matches("//!").trim();
            let reason = content.strip_prefix(LONG_FILE)?;
            Some((number, reason.trim().to_string()))
        })
}

/// The line and reason of a `// tidy: long-fn: <reason>` comment among the lines from
/// `first_line` (the function's first attribute or doc line) to `fn_line`, or in the run
/// of comments and attributes right above them.
fn long_fn_reason(lines: &[&str], first_line: usize, fn_line: usize) -> Option<(usize, String)> {
    let mut start = first_line;
    while start > 1 {
        let above = lines.get(start - 2).map(|line| line.trim()).unwrap_or("");
        if above.starts_with("//") || above.starts_with("#[") {
            start -= 1;
        } else {
            break;
        }
    }
    (start..=fn_line).find_map(|number| {
        let line = lines.get(number.checked_sub(1)?)?.trim();
        let reason = line.strip_prefix(LONG_FN)?;
        Some((number, reason.trim().to_string()))
    })
}

/// A function's lines.
struct FnSpan {
    /// `Type::name` for associated functions, `outer::name` for nested ones.
    name: String,
    /// The line of its first attribute or doc comment, else of `fn`.
    first_line: usize,
    /// The line of `fn`.
    fn_line: usize,
    /// The line of the closing brace.
    last_line: usize,
}

/// Collects the functions outside test code and the line ranges of test items.
#[derive(Default)]
struct FnVisitor {
    fns: Vec<FnSpan>,
    test_ranges: Vec<(usize, usize)>,
    scope: Vec<String>,
}

impl FnVisitor {
    fn record(
        &mut self,
        attrs: &[syn::Attribute],
        sig: &syn::Signature,
        block: &syn::Block,
    ) -> String {
        let fn_line = start_line(sig.fn_token.span);
        let first_line = attrs
            .iter()
            .map(|attr| start_line(attr.pound_token.span))
            .chain([fn_line])
            .min()
            .unwrap_or(fn_line);
        let mut name = self.scope.join("::");
        if !name.is_empty() {
            name.push_str("::");
        }
        name.push_str(&sig.ident.to_string());
        self.fns.push(FnSpan {
            name,
            first_line,
            fn_line,
            last_line: end_line(block.brace_token.span.close()),
        });
        sig.ident.to_string()
    }

    fn skip_test(&mut self, attrs: &[syn::Attribute], span: proc_macro2::Span) -> bool {
        let test = syntax::is_test_code(attrs);
        if test {
            self.test_ranges.push((start_line(span), end_line(span)));
        }
        test
    }

    fn in_scope(&mut self, name: String, visit: impl FnOnce(&mut Self)) {
        self.scope.push(name);
        visit(self);
        self.scope.pop();
    }
}

fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(path) => path
            .path
            .segments
            .last()
            .map(|segment| segment.ident.to_string())
            .unwrap_or_default(),
        syn::Type::Reference(reference) => type_name(&reference.elem),
        _ => "_".to_string(),
    }
}

impl<'ast> Visit<'ast> for FnVisitor {
    fn visit_item(&mut self, item: &'ast Item) {
        if !self.skip_test(syntax::item_attrs(item), syn::spanned::Spanned::span(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if !self.skip_test(
            syntax::impl_item_attrs(item),
            syn::spanned::Spanned::span(item),
        ) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        if !self.skip_test(
            syntax::trait_item_attrs(item),
            syn::spanned::Spanned::span(item),
        ) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast ItemFn) {
        let name = self.record(&item.attrs, &item.sig, &item.block);
        self.in_scope(name, |this| visit::visit_item_fn(this, item));
    }

    fn visit_impl_item_fn(&mut self, item: &'ast ImplItemFn) {
        let name = self.record(&item.attrs, &item.sig, &item.block);
        self.in_scope(name, |this| visit::visit_impl_item_fn(this, item));
    }

    fn visit_trait_item_fn(&mut self, item: &'ast TraitItemFn) {
        match &item.default {
            Some(block) => {
                let name = self.record(&item.attrs, &item.sig, block);
                self.in_scope(name, |this| visit::visit_trait_item_fn(this, item));
            }
            None => visit::visit_trait_item_fn(self, item),
        }
    }

    fn visit_item_impl(&mut self, item: &'ast ItemImpl) {
        let name = type_name(&item.self_ty);
        self.in_scope(name, |this| visit::visit_item_impl(this, item));
    }

    fn visit_item_trait(&mut self, item: &'ast ItemTrait) {
        let name = item.ident.to_string();
        self.in_scope(name, |this| visit::visit_item_trait(this, item));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::{manifest, tree};

    /// A function `name` of `lines` lines in total (signature to closing brace).
    fn function(name: &str, lines: usize) -> String {
        let mut text = format!("fn {name}() {{\n");
        for index in 0..lines.saturating_sub(2) {
            text.push_str(&format!("    let _x{index} = {index};\n"));
        }
        text.push_str("}\n");
        text
    }

    fn check_tree(files: &[(&str, String)]) -> (Vec<Violation>, Vec<Violation>) {
        let mut all = vec![("crates/a/Cargo.toml", manifest("myriad-a", &[]))];
        all.extend(files.iter().cloned());
        let all: Vec<(&str, &str)> = all.iter().map(|(p, t)| (*p, t.as_str())).collect();
        let dir = tree(&all);
        (
            check_file_lengths(dir.path(), 20).expect("readable"),
            check_fn_lengths(dir.path(), 5).expect("readable"),
        )
    }

    #[test]
    fn a_clean_tree_passes() {
        let text = format!("//! Short.\n{}{}", function("a", 5), function("b", 3));
        let (files, fns) = check_tree(&[("crates/a/src/lib.rs", text)]);
        assert!(files.is_empty(), "{files:?}");
        assert!(fns.is_empty(), "{fns:?}");
    }

    #[test]
    fn a_long_file_fails_unless_its_extra_lines_are_tests() {
        let long = format!("//! Long.\n{}", function("a", 5).repeat(4));
        let (files, _) = check_tree(&[("crates/a/src/lib.rs", long.clone())]);
        assert_eq!(files.len(), 1, "{files:?}");
        assert!(files[0]
            .message
            .contains("21 lines outside tests (of 21), over the limit of 20"));

        let tests = format!(
            "//! Long.\n{}#[cfg(test)]\nmod tests {{\n{}}}\n",
            function("a", 5),
            function("t", 5).repeat(4)
        );
        let (files, _) = check_tree(&[
            ("crates/a/src/lib.rs", tests),
            ("crates/a/src/tests.rs", long.clone()),
            ("crates/a/src/io_tests.rs", long),
        ]);
        assert!(files.is_empty(), "{files:?}");
    }

    #[test]
    fn the_long_file_hatch_needs_a_reason() {
        let body = function("a", 5).repeat(4);
        let hatch = format!("//! Long.\n//!\n//! tidy: long-file: one state machine\n{body}");
        let (files, _) = check_tree(&[("crates/a/src/lib.rs", hatch)]);
        assert!(files.is_empty(), "{files:?}");
        let empty = format!("//! Long.\n//! tidy: long-file:  \n{body}");
        let (files, _) = check_tree(&[("crates/a/src/lib.rs", empty)]);
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].line, Some(2));
        assert!(files[0].message.contains("without a reason"));
    }

    #[test]
    fn long_fns_fail_wherever_they_are() {
        let text = format!(
            "//! Fns.\n{}struct S;\nimpl S {{\n    /// Doc.\n{}}}\ntrait T {{\n{}}}\nfn outer() {{\n{}}}\n",
            function("free", 6),
            function("method", 6),
            function("default", 7),
            function("nested", 6),
        );
        let (_, fns) = check_tree(&[("crates/a/src/lib.rs", text)]);
        let found: Vec<(Option<usize>, &str)> =
            fns.iter().map(|v| (v.line, v.message.as_str())).collect();
        assert_eq!(
            found,
            vec![
                (Some(2), "fn `free` is 6 lines, over the limit of 5"),
                (Some(11), "fn `S::method` is 6 lines, over the limit of 5"),
                (Some(19), "fn `T::default` is 7 lines, over the limit of 5"),
                (Some(27), "fn `outer` is 8 lines, over the limit of 5"),
                (
                    Some(28),
                    "fn `outer::nested` is 6 lines, over the limit of 5"
                ),
            ]
        );
    }

    #[test]
    fn test_fns_and_the_long_fn_hatch_are_exempt() {
        let text = format!(
            "//! Fns.\n#[test]\n{}#[cfg(test)]\nmod tests {{\n{}}}\n// tidy: long-fn: a flat table of cases\n/// Doc.\n#[inline]\n{}",
            function("a_test", 9),
            function("helper", 9),
            function("table", 9),
        );
        let (_, fns) = check_tree(&[("crates/a/src/lib.rs", text)]);
        assert!(fns.is_empty(), "{fns:?}");
        let empty = format!(
            "//! Fns.\n/// Doc.\n// tidy: long-fn:\n{}",
            function("table", 3)
        );
        let (_, fns) = check_tree(&[("crates/a/src/lib.rs", empty)]);
        assert_eq!(fns.len(), 1, "{fns:?}");
        assert_eq!(fns[0].line, Some(3));
        assert!(fns[0].message.contains("without a reason"));
    }
}

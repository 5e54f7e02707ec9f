//! Helpers over `syn` shared by the checks: parsing, lines of spans, test code, macros.

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{Attribute, Expr, ImplItem, Item, Macro, Meta, Token, TraitItem};

use crate::source::SourceFile;
use crate::Violation;

/// Parses `file`, or returns the violation that says it could not be parsed (a check
/// that cannot read a file must not pass silently).
pub(crate) fn parse(file: &SourceFile) -> Result<syn::File, Violation> {
    syn::parse_file(&file.text).map_err(|error| {
        let line = error.span().start().line;
        Violation::new(
            &file.path,
            Some(line),
            format!("tidy cannot parse this file: {error}"),
        )
    })
}

/// Parsed source files, each with its syntax tree.
pub(crate) type ParsedFiles = Vec<(SourceFile, syn::File)>;

/// Every non-test `src/` file under `root`, parsed; a file that does not parse is reported
/// in the returned violations instead (the checks that walk syntax trees share this).
pub(crate) fn parsed_src_files(
    root: &std::path::Path,
) -> crate::Result<(ParsedFiles, Vec<Violation>)> {
    let mut parsed = Vec::new();
    let mut violations = Vec::new();
    for file in crate::source::src_files(root, false)? {
        match parse(&file) {
            Ok(ast) => parsed.push((file, ast)),
            Err(violation) => violations.push(violation),
        }
    }
    Ok((parsed, violations))
}

/// The 1-based line where `span` starts.
pub(crate) fn start_line(span: Span) -> usize {
    span.start().line
}

/// The 1-based line where `span` ends.
pub(crate) fn end_line(span: Span) -> usize {
    span.end().line
}

/// Whether an item with these attributes is test code: `#[test]` (or `#[tokio::test]`
/// and the like), or a `#[cfg(..)]` that only holds under `test`.
pub(crate) fn is_test_code(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        if path.is_ident("cfg") {
            return attr
                .parse_args::<Meta>()
                .is_ok_and(|meta| cfg_requires_test(&meta));
        }
        path.segments
            .last()
            .is_some_and(|segment| segment.ident == "test")
    })
}

/// Whether the cfg predicate `meta` can only be true when `test` is.
fn cfg_requires_test(meta: &Meta) -> bool {
    match meta {
        Meta::Path(path) => path.is_ident("test"),
        Meta::List(list) if list.path.is_ident("all") || list.path.is_ident("any") => {
            let Ok(predicates) =
                list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            else {
                return false;
            };
            if list.path.is_ident("all") {
                predicates.iter().any(cfg_requires_test)
            } else {
                !predicates.is_empty() && predicates.iter().all(cfg_requires_test)
            }
        }
        _ => false,
    }
}

/// The attributes of an item.
pub(crate) fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(item) => &item.attrs,
        Item::Enum(item) => &item.attrs,
        Item::ExternCrate(item) => &item.attrs,
        Item::Fn(item) => &item.attrs,
        Item::ForeignMod(item) => &item.attrs,
        Item::Impl(item) => &item.attrs,
        Item::Macro(item) => &item.attrs,
        Item::Mod(item) => &item.attrs,
        Item::Static(item) => &item.attrs,
        Item::Struct(item) => &item.attrs,
        Item::Trait(item) => &item.attrs,
        Item::TraitAlias(item) => &item.attrs,
        Item::Type(item) => &item.attrs,
        Item::Union(item) => &item.attrs,
        Item::Use(item) => &item.attrs,
        _ => &[],
    }
}

/// The attributes of an item of an `impl` block.
pub(crate) fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(item) => &item.attrs,
        ImplItem::Fn(item) => &item.attrs,
        ImplItem::Type(item) => &item.attrs,
        ImplItem::Macro(item) => &item.attrs,
        _ => &[],
    }
}

/// The attributes of an item of a trait.
pub(crate) fn trait_item_attrs(item: &TraitItem) -> &[Attribute] {
    match item {
        TraitItem::Const(item) => &item.attrs,
        TraitItem::Fn(item) => &item.attrs,
        TraitItem::Type(item) => &item.attrs,
        TraitItem::Macro(item) => &item.attrs,
        _ => &[],
    }
}

/// Visits the body of a macro call as a comma-separated list of expressions when it is one
/// (`format!`, `assert!`, `vec!`, `write!`, ...), so that code inside those is checked too.
/// Bodies of any other shape are skipped.
pub(crate) fn visit_macro_exprs<V>(visitor: &mut V, mac: &Macro)
where
    V: for<'a> Visit<'a>,
{
    if let Ok(exprs) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
        for expr in &exprs {
            visitor.visit_expr(expr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(source: &str) -> Vec<Attribute> {
        let item: syn::ItemFn = syn::parse_str(source).expect("valid fn");
        item.attrs
    }

    #[test]
    fn test_code_is_recognised() {
        assert!(is_test_code(&attrs("#[test] fn f() {}")));
        assert!(is_test_code(&attrs("#[tokio::test] async fn f() {}")));
        assert!(is_test_code(&attrs("#[cfg(test)] fn f() {}")));
        assert!(is_test_code(&attrs("#[cfg(all(test, unix))] fn f() {}")));
        assert!(is_test_code(&attrs("#[cfg(any(test))] fn f() {}")));
        assert!(!is_test_code(&attrs(
            "#[cfg(any(test, feature = \"x\"))] fn f() {}"
        )));
        assert!(!is_test_code(&attrs("#[cfg(not(test))] fn f() {}")));
        assert!(!is_test_code(&attrs("#[inline] fn f() {}")));
    }
}

//! Renders a command's result (a `serde_json::Value`) as text for people.
//!
//! # Rules
//! - `null` → `ok`; a string → itself; other scalars → their JSON text.
//! - An array of objects → an aligned table, columns in order of first appearance; a
//!   missing cell shows `-`, a nested value its compact JSON.
//! - An array of scalars → one per line; an empty array → `(none)`.
//! - An object → `key  value` lines with aligned keys; a nested object or non-empty array
//!   → `key:` then the value rendered by these rules, indented two spaces.
//!
//! The renderer is generic on purpose: backends return plain JSON and never format text.
//! Output always ends with a newline.

use serde_json::{Map, Value};

/// Renders `value` as text (ends with a newline).
pub fn render(value: &Value) -> String {
    let mut out = String::new();
    render_into(value, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn render_into(value: &Value, indent: usize, out: &mut String) {
    match value {
        Value::Array(items) if items.is_empty() => line(out, indent, "(none)"),
        Value::Array(items) if items.iter().all(Value::is_object) => table(items, indent, out),
        Value::Array(items) => {
            for item in items {
                if is_scalar(item) {
                    line(out, indent, &scalar(item));
                } else {
                    render_into(item, indent, out);
                }
            }
        }
        Value::Object(map) => object(map, indent, out),
        scalar_value => line(out, indent, &scalar(scalar_value)),
    }
}

fn is_scalar(value: &Value) -> bool {
    !matches!(value, Value::Array(_) | Value::Object(_))
}

/// A scalar as shown in text (compact JSON for nested values).
fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "ok".into(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A table cell.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

fn line(out: &mut String, indent: usize, text: &str) {
    for part in text.split('\n') {
        out.push_str(&" ".repeat(indent));
        out.push_str(part);
        out.push('\n');
    }
}

fn object(map: &Map<String, Value>, indent: usize, out: &mut String) {
    if map.is_empty() {
        line(out, indent, "(empty)");
        return;
    }
    let width = map
        .iter()
        .filter(|(_, value)| is_scalar(value) || is_empty_container(value))
        .map(|(key, _)| key.chars().count())
        .max()
        .unwrap_or(0);
    for (key, value) in map {
        if is_scalar(value) || is_empty_container(value) {
            let shown = match value {
                Value::Array(_) => "(none)".to_string(),
                Value::Object(_) => "(empty)".to_string(),
                Value::Null => "-".to_string(),
                other => scalar(other),
            };
            let pad = width.saturating_sub(key.chars().count());
            line(out, indent, &format!("{key}{}  {shown}", " ".repeat(pad)));
        } else {
            line(out, indent, &format!("{key}:"));
            render_into(value, indent + 2, out);
        }
    }
}

fn is_empty_container(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

fn table(rows: &[Value], indent: usize, out: &mut String) {
    let mut columns: Vec<&str> = Vec::new();
    for row in rows {
        if let Value::Object(map) = row {
            for key in map.keys() {
                if !columns.contains(&key.as_str()) {
                    columns.push(key);
                }
            }
        }
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|column| cell(row.get(*column)).replace('\n', "\\n"))
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            cells
                .iter()
                .map(|row| row[index].chars().count())
                .chain([column.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let format_row = |row: &[String]| {
        let padded: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(text, width)| {
                let pad = width.saturating_sub(text.chars().count());
                format!("{text}{}", " ".repeat(pad))
            })
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let header: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
    line(out, indent, &format_row(&header));
    for row in &cells {
        line(out, indent, &format_row(row));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn array_of_objects_is_an_aligned_table() {
        let value = json!([
            {"nid": "0x0001", "role": "superpeer", "address": "127.0.0.1:4000"},
            {"nid": "0x00a2", "role": "peer", "memory_mb": 512},
        ]);
        assert_eq!(
            render(&value),
            "NID     ROLE       ADDRESS         MEMORY_MB\n\
             0x0001  superpeer  127.0.0.1:4000  -\n\
             0x00a2  peer       -               512\n"
        );
    }

    #[test]
    fn object_is_aligned_key_value_lines_with_nested_blocks() {
        let value = json!({"cid": "0x0001000000000001", "size": 64, "ranges": [{"first": 1, "last": 9}], "tags": []});
        assert_eq!(
            render(&value),
            "cid   0x0001000000000001\n\
             size  64\n\
             ranges:\n  FIRST  LAST\n  1      9\n\
             tags  (none)\n"
        );
    }

    #[test]
    fn scalars_render_plainly() {
        assert_eq!(render(&json!(null)), "ok\n");
        assert_eq!(render(&json!("hello")), "hello\n");
        assert_eq!(render(&json!(42)), "42\n");
        assert_eq!(render(&json!([1, "a"])), "1\na\n");
        assert_eq!(render(&json!([])), "(none)\n");
    }
}

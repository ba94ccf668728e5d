//! Making untrusted text safe to print on a terminal, and naming the kind of a value in
//! error messages.
//!
//! Step names, source names, template text, provider errors and tool output all come from
//! outside the process. Printed raw, an escape sequence among them can move the cursor,
//! rewrite earlier lines, retitle the window or hide text. Everything aplc prints for
//! people goes through [`escape_control`]; machine-readable output (JSON, bundles) keeps
//! its own escaping.

use std::borrow::Cow;

/// `text` with every control character except newline and tab written as a Rust escape
/// (`\u{1b}`), and bidirectional overrides too (they reorder what the reader sees).
/// Borrows when there is nothing to escape.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` cut to at most `max` characters, with `…` marking a cut.
pub fn truncate_chars(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}…", &text[..end])),
    }
}

/// Control characters (C0, DEL, C1) other than newline and tab, and the Unicode
/// bidirectional embedding, override and isolate characters.
fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// "a string", "an object", …: how errors name the JSON value they found.
pub fn json_kind(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// "a string", "a list", …: how errors name the template value they found; the
/// counterpart of [`json_kind`] for minijinja values.
pub fn value_kind(value: &minijinja::Value) -> &'static str {
    use minijinja::value::ValueKind;
    match value.kind() {
        ValueKind::Undefined => "undefined",
        ValueKind::None => "none",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "a string",
        ValueKind::Bytes => "bytes",
        ValueKind::Seq | ValueKind::Iterable => "a list",
        ValueKind::Map => "a map",
        _ => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_control_but_keeps_layout() {
        assert_eq!(escape_control("plain\ttext\n"), "plain\ttext\n");
        assert!(matches!(escape_control("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape_control("a\u{1b}[2Jb\rc\u{7f}\u{9b}\u{202e}"),
            "a\\u{1b}[2Jb\\u{d}c\\u{7f}\\u{9b}\\u{202e}"
        );
    }

    #[test]
    fn truncates_on_character_boundaries() {
        assert_eq!(truncate_chars("héllo", 10), "héllo");
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(truncate_chars("", 0), "");
    }

    #[test]
    fn names_kinds_of_values() {
        use minijinja::Value;
        assert_eq!(value_kind(&Value::from("x")), "a string");
        assert_eq!(value_kind(&Value::from(vec![1])), "a list");
        assert_eq!(value_kind(&Value::from(())), "none");
        assert_eq!(json_kind(&serde_json::json!([])), "an array");
    }
}

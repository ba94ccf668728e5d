//! Completion: phase and role headings at the start of a line, step names inside a
//! `next_step` string, variables, helpers and filters inside `{{ }}` and `{% %}`.
//!
//! Completion runs on half-typed text that often does not compile, so where the cursor
//! is (a heading, a `next_step` string, a Jinja tag) is read from the text around it;
//! what is offered (steps, variables, helpers, filters, roles) comes from the compiler's
//! outline and the VM's name tables.

use std::collections::BTreeSet;

use aplc_compiler::Options;
use aplc_vm::bundle::Role;
use lsp_types::{CompletionItem, CompletionItemKind, CompletionParams, CompletionResponse, Uri};

use super::{View, with_view};
use crate::docs;
use crate::document::Document;

pub(crate) fn completion(
    p: &CompletionParams,
    _: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<CompletionResponse>, String> {
    let position = p.text_document_position.position;
    Ok(with_view(doc, options, |v| {
        let offset = v.offset(position);
        let line_start = v.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let before = &v.text[line_start..offset];
        let items = if let Some(items) = headings(before) {
            items
        } else if in_next_step_string(before) {
            steps(&v)
        } else if let Some(tag) = open_tag(&v.text[..offset]) {
            jinja(&v, tag)
        } else {
            return None;
        };
        Some(CompletionResponse::Array(items))
    }))
}

/// `#`, `# pr`, `##`, `## sys` at the start of a line.
fn headings(before: &str) -> Option<Vec<CompletionItem>> {
    let hashes = before.len() - before.trim_start_matches('#').len();
    let rest = &before[hashes..];
    if !(1..=2).contains(&hashes) || !rest.chars().all(|c| c.is_ascii_alphabetic() || c == ' ') {
        return None;
    }
    let items = if hashes == 1 {
        ["pre", "prompt", "post"]
            .iter()
            .map(|phase| {
                item(
                    format!("# {phase}: "),
                    CompletionItemKind::KEYWORD,
                    "phase heading",
                )
            })
            .collect()
    } else {
        Role::ALL
            .iter()
            .map(|r| {
                item(
                    format!("## {}", r.as_str()),
                    CompletionItemKind::KEYWORD,
                    "role heading",
                )
            })
            .collect()
    };
    Some(items)
}

/// True when the cursor is inside the string of `set_context('next_step', '…` (or the
/// defuss dialect's `next('…`).
fn in_next_step_string(before: &str) -> bool {
    let word = before.trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
    let Some(open) = word.strip_suffix(['\'', '"']) else {
        return false;
    };
    let open = open.trim_end();
    if open.ends_with("next(") {
        return true;
    }
    let Some(key) = open.strip_suffix(',') else {
        return false;
    };
    let key = key.trim_end();
    key.ends_with("'next_step'") || key.ends_with("\"next_step\"")
}

/// The Jinja tag the cursor is in, if any: the text after its last unclosed `{{` or `{%`.
fn open_tag(before: &str) -> Option<&str> {
    let open = before
        .rfind("{{")
        .into_iter()
        .chain(before.rfind("{%"))
        .max()?;
    let tag = &before[open + 2..];
    (!tag.contains("}}") && !tag.contains("%}")).then_some(tag)
}

fn steps(v: &View<'_>) -> Vec<CompletionItem> {
    let names: BTreeSet<&str> = v
        .analysis
        .outline
        .steps
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    names
        .into_iter()
        .map(|n| item(n.to_string(), CompletionItemKind::FUNCTION, "step"))
        .chain([item(
            "return".to_string(),
            CompletionItemKind::KEYWORD,
            "end the run",
        )])
        .collect()
}

/// Filters after a `|`; otherwise variables, helpers and globals.
fn jinja(v: &View<'_>, tag: &str) -> Vec<CompletionItem> {
    let head = tag.trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
    if head.trim_end().ends_with('|') {
        return docs::filter_names()
            .map(|f| {
                item(
                    f.to_string(),
                    CompletionItemKind::METHOD,
                    docs::filter(f).unwrap_or(""),
                )
            })
            .collect();
    }
    let mut items: Vec<CompletionItem> = docs::variable_names()
        .map(|n| {
            let detail = docs::variable(n).map_or("", |(ty, _)| ty);
            item(n.to_string(), CompletionItemKind::VARIABLE, detail)
        })
        .collect();
    let outline = &v.analysis.outline;
    let user: BTreeSet<&str> = outline
        .templates
        .iter()
        .flat_map(|t| &t.writes)
        .map(|(n, _)| n.as_str())
        .chain(outline.inputs.iter().map(String::as_str))
        .filter(|n| docs::variable(n).is_none())
        .collect();
    items.extend(user.into_iter().map(|n| {
        item(
            n.to_string(),
            CompletionItemKind::VARIABLE,
            "set in this file",
        )
    }));
    items.extend(
        docs::helper_names()
            .chain(["range", "dict", "namespace"])
            .map(|h| {
                let (signature, _) = docs::helper(h).unwrap_or((h, ""));
                item(h.to_string(), CompletionItemKind::FUNCTION, signature)
            }),
    );
    items
}

fn item(label: String, kind: CompletionItemKind, detail: &str) -> CompletionItem {
    CompletionItem {
        label,
        kind: Some(kind),
        detail: (!detail.is_empty()).then(|| detail.to_string()),
        ..CompletionItem::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts() {
        assert!(in_next_step_string("{{ set_context('next_step', 'ab"));
        assert!(in_next_step_string("{{ set_context(\"next_step\", \""));
        assert!(!in_next_step_string("{{ set_context('x', 'ab"));
        assert_eq!(open_tag("a {{ x | "), Some(" x | "));
        assert_eq!(open_tag("a {{ x }} b"), None);
        assert!(headings("## us").is_some());
        assert!(headings("# prompt: x").is_none());
        assert!(headings("### x").is_none());
    }
}

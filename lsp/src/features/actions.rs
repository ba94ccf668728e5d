//! Code actions: the fix a diagnostic suggests (a did-you-mean), and "create step
//! `<name>`" for a `next_step` literal that names no step.

use std::collections::HashMap;

use aplc_compiler::{Options, Span};
use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams, TextEdit, Uri, WorkspaceEdit,
};

use super::{View, with_view};
use crate::document::Document;

pub(crate) fn code_actions(
    p: &CodeActionParams,
    uri: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<Vec<CodeActionOrCommand>>, String> {
    Ok(with_view(doc, options, |v| {
        let asked = v.lines.span(v.text, p.range);
        let mut actions = suggested_fixes(&v, uri, asked);
        actions.extend(create_steps(&v, uri, asked));
        Some(actions)
    }))
}

/// Whether `s` touches `asked` (an empty range at a span's edge counts).
fn overlaps(asked: Span, s: Span) -> bool {
    s.start <= asked.end && asked.start <= s.end
}

/// A quick fix with one edit, for `uri`.
fn quick_fix(uri: &Uri, title: String, edit: TextEdit) -> CodeAction {
    CodeAction {
        title,
        kind: Some(CodeActionKind::QUICKFIX),
        edit: Some(WorkspaceEdit {
            changes: Some(HashMap::from([(uri.clone(), vec![edit])])),
            ..WorkspaceEdit::default()
        }),
        ..CodeAction::default()
    }
}

/// The edit each diagnostic at `asked` suggests (`Diagnostic::suggestion`): preferred,
/// since it is the fix the diagnostic's own help names.
fn suggested_fixes(v: &View<'_>, uri: &Uri, asked: Span) -> Vec<CodeActionOrCommand> {
    v.analysis
        .diagnostics
        .iter()
        .filter_map(|d| {
            let s = d.suggestion.as_ref()?;
            if !overlaps(asked, d.span()) && !overlaps(asked, s.span) {
                return None;
            }
            // The compiler keeps only suggestions that slice its source cleanly.
            let old = v.text.get(s.span.range())?;
            let edit = TextEdit::new(v.range(s.span), s.replacement.clone());
            let title = format!("Replace `{old}` with `{}`", s.replacement);
            Some(CodeActionOrCommand::CodeAction(CodeAction {
                diagnostics: Some(vec![v.diagnostic(uri, d)]),
                is_preferred: Some(true),
                ..quick_fix(uri, title, edit)
            }))
        })
        .collect()
}

/// "Create step `<name>`" for each `next_step` literal at `asked` that names no step.
fn create_steps(v: &View<'_>, uri: &Uri, asked: Span) -> Vec<CodeActionOrCommand> {
    let mut seen = Vec::new();
    let mut actions = Vec::new();
    for jump in &v.analysis.outline.jumps {
        let (Some(target), Some(value)) = (&jump.target, jump.value) else {
            continue;
        };
        let creatable = target != "return"
            && aplc_vm::names::is_identifier(target)
            && v.analysis.step(target).is_none();
        if !creatable || !overlaps(asked, value) || seen.contains(target) {
            continue;
        }
        seen.push(target.clone());
        // Appended at the end of the file, after a blank line.
        let end = v.range(Span::new(v.text.len(), v.text.len())).end;
        let lead = if v.text.ends_with('\n') { "\n" } else { "\n\n" };
        let edit = TextEdit::new(
            lsp_types::Range::new(end, end),
            format!("{lead}# prompt: {target}\n\n"),
        );
        let title = format!("Create step `{target}`");
        actions.push(CodeActionOrCommand::CodeAction(quick_fix(uri, title, edit)));
    }
    actions
}

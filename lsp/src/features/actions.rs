//! Code actions: "create step `<name>`" for a `next_step` literal that names no step.

use std::collections::HashMap;

use aplc_compiler::{Options, Span};
use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams, TextEdit, Uri, WorkspaceEdit,
};

use super::with_view;
use crate::document::Document;

pub(crate) fn code_actions(
    p: &CodeActionParams,
    uri: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<Vec<CodeActionOrCommand>>, String> {
    Ok(with_view(doc, options, |v| {
        let asked = v.lines.span(v.text, p.range);
        let overlaps = |s: Span| s.start <= asked.end && asked.start <= s.end;
        let mut seen = Vec::new();
        let mut actions = Vec::new();
        for jump in &v.analysis.outline.jumps {
            let (Some(target), Some(value)) = (&jump.target, jump.value) else {
                continue;
            };
            let creatable = target != "return"
                && aplc_vm::names::is_identifier(target)
                && v.analysis.step(target).is_none();
            if !creatable || !overlaps(value) || seen.contains(target) {
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
            actions.push(CodeActionOrCommand::CodeAction(CodeAction {
                title: format!("Create step `{target}`"),
                kind: Some(CodeActionKind::QUICKFIX),
                edit: Some(WorkspaceEdit {
                    changes: Some(HashMap::from([(uri.clone(), vec![edit])])),
                    ..WorkspaceEdit::default()
                }),
                ..CodeAction::default()
            }));
        }
        Some(actions)
    }))
}

//! Go to definition, find references and rename.
//!
//! A step is defined by its first heading and referred to by every heading of its
//! phases and every `next_step` string literal naming it. A user variable is defined
//! by the first helper call that sets it.

use std::collections::HashMap;

use aplc_compiler::{Options, Span};
use lsp_types::{
    GotoDefinitionParams, GotoDefinitionResponse, Location, PrepareRenameResponse, ReferenceParams,
    RenameParams, TextDocumentPositionParams, TextEdit, Uri, WorkspaceEdit,
};

use super::{View, with_view};
use crate::document::{Document, Target};

pub(crate) fn definition(
    p: &GotoDefinitionParams,
    uri: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<GotoDefinitionResponse>, String> {
    let position = p.text_document_position_params.position;
    Ok(with_view(doc, options, |v| {
        let span = match v.analysis.at(v.text, v.offset(position))? {
            Target::Step(name, _) => v.analysis.step(&name)?.name_span,
            Target::Variable(name, _) => v.analysis.first_write(&name)?,
            Target::Function(..) | Target::Filter(..) => return None,
        };
        Some(GotoDefinitionResponse::Scalar(Location::new(
            uri.clone(),
            v.range(span),
        )))
    }))
}

pub(crate) fn references(
    p: &ReferenceParams,
    uri: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<Vec<Location>>, String> {
    let position = p.text_document_position.position;
    let declarations = p.context.include_declaration;
    Ok(with_view(doc, options, |v| {
        let Target::Step(name, _) = v.analysis.at(v.text, v.offset(position))? else {
            return None;
        };
        let spans = step_mentions(&v, &name, declarations);
        Some(
            spans
                .into_iter()
                .map(|s| Location::new(uri.clone(), v.range(s)))
                .collect(),
        )
    }))
}

pub(crate) fn prepare_rename(
    p: &TextDocumentPositionParams,
    _: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<PrepareRenameResponse>, String> {
    with_view(doc, options, |v| {
        match v.analysis.at(v.text, v.offset(p.position)) {
            Some(Target::Step(name, span)) => {
                Ok(Some(PrepareRenameResponse::RangeWithPlaceholder {
                    range: v.range(name_in(v.text, span)),
                    placeholder: name,
                }))
            }
            _ => Err("only a step name can be renamed".to_string()),
        }
    })
}

pub(crate) fn rename(
    p: &RenameParams,
    uri: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<WorkspaceEdit>, String> {
    let position = p.text_document_position.position;
    let new = p.new_name.as_str();
    with_view(doc, options, |v| {
        let Some(Target::Step(name, _)) = v.analysis.at(v.text, v.offset(position)) else {
            return Err("only a step name can be renamed".to_string());
        };
        if !aplc_vm::names::is_identifier(new) || new == "return" {
            return Err(format!(
                "`{new}` is not a valid step name here: use letters, digits and `_` (not `return`)"
            ));
        }
        if new != name && v.analysis.step(new).is_some() {
            return Err(format!("a step named `{new}` already exists"));
        }
        let edits = step_mentions(&v, &name, true)
            .into_iter()
            .map(|s| TextEdit::new(v.range(s), new.to_string()))
            .collect();
        Ok(Some(WorkspaceEdit {
            changes: Some(HashMap::from([(uri.clone(), edits)])),
            ..WorkspaceEdit::default()
        }))
    })
}

/// Every place that names step `name`: the identifier of each of its phase headings
/// (when `headings`), and the inside of each `next_step` string literal naming it.
fn step_mentions(v: &View<'_>, name: &str, headings: bool) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    if headings {
        let named = v.analysis.outline.steps.iter().filter(|s| s.name == name);
        spans.extend(
            named
                .flat_map(|s| &s.phases)
                .filter(|p| p.name_span != p.heading)
                .map(|p| p.name_span),
        );
    }
    spans.extend(
        v.analysis
            .jumps_to(name)
            .filter_map(|j| j.value)
            .map(|s| name_in(v.text, s)),
    );
    spans.sort();
    spans.dedup();
    spans
}

/// The inside of a string literal's span (its quotes dropped), or the span itself.
fn name_in(text: &str, span: Span) -> Span {
    let quoted = text.get(span.range()).is_some_and(|s| {
        s.len() >= 2 && (s.starts_with('\'') || s.starts_with('"')) && s.ends_with(&s[..1])
    });
    if quoted {
        Span::new(span.start + 1, span.end - 1)
    } else {
        span
    }
}

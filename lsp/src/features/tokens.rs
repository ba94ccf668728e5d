//! Semantic tokens: phase headings, step names, role headings, Jinja delimiters,
//! variables, helpers and filters, from the compiler's outline.

use aplc_compiler::{Options, Span};
use lsp_types::{
    SemanticToken, SemanticTokenType, SemanticTokens, SemanticTokensLegend, SemanticTokensParams,
    SemanticTokensResult, Uri,
};

use super::{View, with_view};
use crate::document::Document;

/// The token types, in legend order.
const TYPES: [SemanticTokenType; 6] = [
    SemanticTokenType::KEYWORD,
    SemanticTokenType::NAMESPACE,
    SemanticTokenType::TYPE,
    SemanticTokenType::OPERATOR,
    SemanticTokenType::VARIABLE,
    SemanticTokenType::FUNCTION,
];
const KEYWORD: u32 = 0;
const STEP: u32 = 1;
const ROLE: u32 = 2;
const DELIMITER: u32 = 3;
const VARIABLE: u32 = 4;
const FUNCTION: u32 = 5;

pub(crate) fn legend() -> SemanticTokensLegend {
    SemanticTokensLegend {
        token_types: TYPES.to_vec(),
        token_modifiers: Vec::new(),
    }
}

pub(crate) fn semantic_tokens(
    _: &SemanticTokensParams,
    _: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<SemanticTokensResult>, String> {
    Ok(with_view(doc, options, |v| {
        let mut found = Vec::new();
        collect(&v, &mut found);
        found.sort_by_key(|&(s, _)| (s.start, s.end));
        Some(SemanticTokensResult::Tokens(SemanticTokens {
            result_id: None,
            data: encode(&v, &found),
        }))
    }))
}

fn collect(v: &View<'_>, out: &mut Vec<(Span, u32)>) {
    let outline = &v.analysis.outline;
    for phase in outline.steps.iter().flat_map(|s| &s.phases) {
        if phase.name_span == phase.heading {
            out.push((phase.heading, KEYWORD));
        } else {
            out.push((
                Span::new(phase.heading.start, phase.name_span.start),
                KEYWORD,
            ));
            out.push((phase.name_span, STEP));
        }
        out.extend(
            phase
                .sections
                .iter()
                .filter(|s| s.role.is_some())
                .map(|s| (s.heading, ROLE)),
        );
    }
    for t in &outline.templates {
        let body = v.text.get(t.span.range()).unwrap_or("");
        for delimiter in ["{{", "}}", "{%", "%}"] {
            out.extend(
                body.match_indices(delimiter)
                    .map(|(i, _)| (Span::new(t.span.start + i, t.span.start + i + 2), DELIMITER)),
            );
        }
        out.extend(t.reads.iter().map(|(_, s)| (*s, VARIABLE)));
        out.extend(t.writes.iter().map(|(_, s)| (*s, VARIABLE)));
        out.extend(
            t.calls
                .iter()
                .chain(&t.filters)
                .filter_map(|(name, s)| name_within(v.text, *s, name))
                .map(|s| (s, FUNCTION)),
        );
    }
    for jump in &outline.jumps {
        if let (Some(_), Some(value)) = (&jump.target, jump.value) {
            out.push((value, STEP));
        }
    }
}

/// Where `name` is in `span`'s text: its first occurrence.
fn name_within(text: &str, span: Span, name: &str) -> Option<Span> {
    let at = text.get(span.range())?.find(name)?;
    Some(Span::new(span.start + at, span.start + at + name.len()))
}

/// Sorted spans to the protocol's relative encoding; overlapping and multi-line spans
/// are left out (clients need neither).
fn encode(v: &View<'_>, found: &[(Span, u32)]) -> Vec<SemanticToken> {
    let mut data = Vec::with_capacity(found.len());
    let (mut line, mut start, mut end) = (0u32, 0u32, 0usize);
    for &(span, kind) in found {
        if span.start < end || span.start >= span.end {
            continue;
        }
        let range = v.range(span);
        if range.start.line != range.end.line {
            continue;
        }
        let delta_line = range.start.line - line;
        let delta_start = if delta_line == 0 {
            range.start.character - start
        } else {
            range.start.character
        };
        data.push(SemanticToken {
            delta_line,
            delta_start,
            length: range.end.character - range.start.character,
            token_type: kind,
            token_modifiers_bitset: 0,
        });
        (line, start, end) = (range.start.line, range.start.character, span.end);
    }
    data
}

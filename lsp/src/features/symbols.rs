//! Document symbols (steps, their phases, their role sections) and folding ranges (one
//! per phase and per role section).

use aplc_compiler::outline::{PhaseOutline, SectionOutline, StepOutline};
use aplc_compiler::{Options, Span};
use lsp_types::{
    DocumentSymbol, DocumentSymbolParams, DocumentSymbolResponse, FoldingRange, FoldingRangeKind,
    FoldingRangeParams, SymbolKind, Uri,
};

use super::{View, with_view};
use crate::document::Document;

pub(crate) fn symbols(
    _: &DocumentSymbolParams,
    _: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<DocumentSymbolResponse>, String> {
    Ok(with_view(doc, options, |v| {
        let steps = v
            .analysis
            .outline
            .steps
            .iter()
            .map(|s| step(&v, s))
            .collect();
        Some(DocumentSymbolResponse::Nested(steps))
    }))
}

pub(crate) fn folding(
    _: &FoldingRangeParams,
    _: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<Vec<FoldingRange>>, String> {
    Ok(with_view(doc, options, |v| {
        let phases = v.analysis.outline.steps.iter().flat_map(|s| &s.phases);
        let spans =
            phases.flat_map(|p| std::iter::once(p.span).chain(p.sections.iter().map(|s| s.span)));
        Some(spans.filter_map(|s| fold(&v, s)).collect())
    }))
}

fn step(v: &View<'_>, s: &StepOutline) -> DocumentSymbol {
    let kinds: Vec<&str> = s.phases.iter().map(|p| p.kind).collect();
    symbol(
        v,
        s.name.clone(),
        Some(kinds.join(", ")),
        SymbolKind::FUNCTION,
        s.span,
        s.name_span,
        s.phases.iter().map(|p| phase(v, p)).collect(),
    )
}

fn phase(v: &View<'_>, p: &PhaseOutline) -> DocumentSymbol {
    let sections = p.sections.iter().map(|s| section(v, s)).collect();
    symbol(
        v,
        p.kind.to_string(),
        None,
        SymbolKind::METHOD,
        p.span,
        p.heading,
        sections,
    )
}

fn section(v: &View<'_>, s: &SectionOutline) -> DocumentSymbol {
    let name = match s.role {
        Some(role) => role.as_str().to_string(),
        None => s.text.clone(),
    };
    symbol(
        v,
        name,
        None,
        SymbolKind::FIELD,
        s.span,
        s.heading,
        Vec::new(),
    )
}

#[allow(deprecated)] // `deprecated` is a required field of the struct.
fn symbol(
    v: &View<'_>,
    name: String,
    detail: Option<String>,
    kind: SymbolKind,
    span: Span,
    selection: Span,
    children: Vec<DocumentSymbol>,
) -> DocumentSymbol {
    DocumentSymbol {
        // Clients refuse an empty name.
        name: if name.trim().is_empty() {
            "?".to_string()
        } else {
            name
        },
        detail,
        kind,
        tags: None,
        deprecated: None,
        range: v.range(span),
        selection_range: v.range(selection),
        children: (!children.is_empty()).then_some(children),
    }
}

/// The lines of `span` without its trailing blank lines, when there are two or more.
fn fold(v: &View<'_>, span: Span) -> Option<FoldingRange> {
    let text = v.text.get(span.range())?;
    let end = span.start + text.trim_end().len();
    let (start, end) = (
        v.range(Span::new(span.start, span.start)).start,
        v.range(Span::new(end, end)).end,
    );
    (end.line > start.line).then(|| FoldingRange {
        start_line: start.line,
        end_line: end.line,
        kind: Some(FoldingRangeKind::Region),
        ..FoldingRange::default()
    })
}

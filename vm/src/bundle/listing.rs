//! A readable listing of a bundle: what it will do, without its source.
//!
//! [`listing`] describes the bundle value (the compiler's fixture snapshots use it);
//! [`Bundle::listing_with_header`] adds the fields of the encoded header and the byte
//! ranges of template spans, for `aplc inspect`.

use std::fmt::Write;

use super::codec::HeaderFields;
use super::{Bundle, EdgeTarget, Instr, SourceSpan, TemplateKind};

/// Renders `bundle` as text: source, step table, code, messages, templates and graph.
pub fn listing(bundle: &Bundle) -> String {
    render(bundle, None)
}

impl Bundle {
    /// Renders the bundle like [`listing`], preceded by the fields of its encoded
    /// header (read with [`Bundle::read_header`]), and with the byte range of every
    /// template's source span.
    pub fn listing_with_header(&self, header: &HeaderFields) -> String {
        render(self, Some(header))
    }
}

fn render(bundle: &Bundle, header: Option<&HeaderFields>) -> String {
    let mut out = String::new();
    let hash = bundle.source_hash_hex();
    if let Some(h) = header {
        let _ = writeln!(
            out,
            "format    version {} (flags {:#06x})",
            h.version, h.flags
        );
        let _ = writeln!(
            out,
            "payload   {} bytes, xxh3-64 checksum {:#018x}",
            h.payload_len, h.checksum
        );
    }
    let _ = writeln!(out, "source    {}", bundle.source_name);
    let _ = writeln!(out, "sha256    {hash}");
    let _ = writeln!(out, "compiler  {}", bundle.compiler_version);
    if !bundle.inputs.is_empty() {
        let _ = writeln!(out, "inputs    {}", bundle.inputs.join(", "));
    }

    let _ = writeln!(out, "\nsteps:");
    for (i, step) in bundle.steps.iter().enumerate() {
        let entry = if i == 0 { "  (entry)" } else { "" };
        let _ = writeln!(
            out,
            "  s{i:<3} {:<24} pc {:<5} {}{entry}",
            step.name,
            step.entry,
            at(step.span)
        );
    }

    let _ = writeln!(out, "\ncode:");
    let step_name = |id: super::StepId| {
        bundle
            .steps
            .get(id.index())
            .map(|s| s.name.as_str())
            .unwrap_or("?")
    };
    for (pc, instr) in bundle.code.iter().enumerate() {
        let text = match instr {
            Instr::EnterStep(s) => format!("EnterStep       s{} ({})", s.0, step_name(*s)),
            Instr::RenderPre(t) => format!("RenderPre       t{}", t.0),
            Instr::BuildPrompts { first, count } => {
                format!("BuildPrompts    m{first}..m{}", first + count)
            }
            Instr::CallProvider => "CallProvider".to_string(),
            Instr::ProcessResponse => "ProcessResponse".to_string(),
            Instr::CallTools => "CallTools".to_string(),
            Instr::ClearNextStep => "ClearNextStep".to_string(),
            Instr::RenderPost(t) => format!("RenderPost      t{}", t.0),
            Instr::Snapshot => "Snapshot".to_string(),
            Instr::Branch => "Branch".to_string(),
        };
        let span = bundle.code_spans.get(pc).copied().unwrap_or_default();
        let _ = writeln!(out, "  {pc:04}  {text:<36} {}", at(span));
    }

    let _ = writeln!(out, "\nmessages:");
    for (i, m) in bundle.messages.iter().enumerate() {
        let _ = writeln!(out, "  m{i:<3} {:<12} t{}", m.role.as_str(), m.template.0);
    }

    let _ = writeln!(out, "\ntemplates:");
    for (i, t) in bundle.templates.iter().enumerate() {
        let kind = match t.kind {
            TemplateKind::Pre => "pre".to_string(),
            TemplateKind::Post => "post".to_string(),
            TemplateKind::Prompt(role) => format!("prompt/{}", role.as_str()),
        };
        let range = match header {
            Some(_) => format!(" [bytes {}..{}]", t.span.start, t.span.end),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  t{i:<3} s{} {kind} {}{range} ({} bytes)",
            t.step.0,
            at(t.span),
            t.source.len()
        );
        for line in t.source.lines() {
            let _ = writeln!(out, "        | {line}");
        }
    }

    let _ = writeln!(out, "\ngraph:");
    if bundle.edges.is_empty() {
        let _ = writeln!(out, "  (no next_step edges: every step returns)");
    }
    for e in &bundle.edges {
        let to = match &e.to {
            EdgeTarget::Step(s) => step_name(*s).to_string(),
            EdgeTarget::Return => "return".to_string(),
            EdgeTarget::Dynamic => "<dynamic>".to_string(),
        };
        let _ = writeln!(out, "  {} -> {to}  {}", step_name(e.from), at(e.span));
    }
    out
}

fn at(span: SourceSpan) -> String {
    format!("@{}:{}", span.line, span.col)
}

//! Stage 4: lay the IR out as machine instructions and build the [`Bundle`].
//!
//! Each step becomes one straight-line block, in step order:
//!
//! ```text
//! EnterStep  RenderPre?  BuildPrompts  CallProvider  ProcessResponse  CallTools
//! ClearNextStep  RenderPost?  Snapshot  Branch
//! ```
//!
//! Every instruction gets a source span in the side table `code_spans`.

use aplc_vm::bundle::{
    self, Bundle, Edge, EdgeTarget, Instr, MessageEntry, SourceSpan, StepEntry, StepId,
    TemplateEntry, TemplateId,
};
use sha2::{Digest, Sha256};

use crate::diagnostic::{LineIndex, Span};
use crate::ir::{EdgeTo, Ir};

/// Builds the bundle for a checked IR.
pub(crate) fn encode(ir: &Ir, source: &str, file_name: &str) -> Bundle {
    let lines = LineIndex::new(source);
    let span = |s: Span| {
        let (line, col) = lines.line_col(source, s.start);
        SourceSpan {
            start: s.start as u32,
            end: s.end as u32,
            line: line as u32,
            col: col as u32,
        }
    };

    let mut code = Vec::new();
    let mut code_spans = Vec::new();
    let mut steps = Vec::with_capacity(ir.steps.len());
    let mut messages = Vec::new();
    let mut emit = |code: &mut Vec<Instr>, i: Instr, s: Span| {
        code.push(i);
        code_spans.push(span(s));
    };
    for (id, step) in ir.steps.iter().enumerate() {
        steps.push(StepEntry {
            name: step.name.clone(),
            entry: code.len() as u32,
            span: span(step.span),
        });
        emit(&mut code, Instr::EnterStep(StepId(id as u32)), step.span);
        if let Some(t) = step.pre {
            emit(
                &mut code,
                Instr::RenderPre(TemplateId(t as u32)),
                ir.templates[t].span,
            );
        }
        let first = messages.len() as u32;
        messages.extend(step.messages.iter().map(|&(role, t)| MessageEntry {
            role,
            template: TemplateId(t as u32),
        }));
        let count = step.messages.len() as u32;
        emit(
            &mut code,
            Instr::BuildPrompts { first, count },
            step.prompt_span,
        );
        emit(&mut code, Instr::CallProvider, step.prompt_span);
        emit(&mut code, Instr::ProcessResponse, step.prompt_span);
        emit(&mut code, Instr::CallTools, step.prompt_span);
        emit(&mut code, Instr::ClearNextStep, step.span);
        if let Some(t) = step.post {
            emit(
                &mut code,
                Instr::RenderPost(TemplateId(t as u32)),
                ir.templates[t].span,
            );
        }
        emit(&mut code, Instr::Snapshot, step.span);
        emit(&mut code, Instr::Branch, step.span);
    }

    let templates = ir
        .templates
        .iter()
        .map(|t| TemplateEntry {
            source: t.source.clone(),
            step: StepId(t.step as u32),
            kind: t.kind,
            span: span(t.span),
        })
        .collect();
    let edges = ir
        .edges
        .iter()
        .map(|e| Edge {
            from: StepId(e.from as u32),
            to: match e.to {
                EdgeTo::Step(s) => EdgeTarget::Step(StepId(s as u32)),
                EdgeTo::Return => EdgeTarget::Return,
                EdgeTo::Dynamic => EdgeTarget::Dynamic,
            },
            span: span(e.span),
        })
        .collect();

    Bundle {
        compiler_version: env!("CARGO_PKG_VERSION").to_string(),
        source_name: file_name.to_string(),
        source_hash: Sha256::digest(source.as_bytes()).into(),
        inputs: ir.inputs.clone(),
        steps,
        templates,
        messages,
        code,
        code_spans,
        edges,
        // `compile` sets the dialect it compiled in.
        dialect: aplc_vm::Dialect::Spec,
        description: ir.description.clone(),
        // The linker (`aplc build`) adds the agents the program calls.
        agents: Vec::new(),
    }
}

/// Encodes a bundle to bytes; a bundle too large for the format is an error.
pub(crate) fn to_bytes(bundle: &Bundle) -> Result<Vec<u8>, bundle::BundleError> {
    bundle::encode(bundle)
}

//! One function per request kind, each from a document's text and the compiler's
//! analysis of it to protocol types.

mod actions;
mod completion;
mod hover;
mod navigation;
mod symbols;
mod tokens;

use aplc_compiler::{Options, Severity, Span};
use lsp_types::{
    CodeActionProviderCapability, CompletionOptions, DiagnosticRelatedInformation,
    DiagnosticSeverity, HoverProviderCapability, Location, NumberOrString, OneOf, RenameOptions,
    SemanticTokensFullOptions, SemanticTokensOptions, SemanticTokensServerCapabilities,
    ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, Uri,
    WorkDoneProgressOptions,
};

use crate::document::Document;
use crate::position::Lines;
use crate::server::DocumentRequest;

pub(crate) use actions::code_actions;
pub(crate) use completion::completion;
pub(crate) use hover::hover;
pub(crate) use navigation::{definition, prepare_rename, references, rename};
pub(crate) use symbols::{folding, symbols};
pub(crate) use tokens::semantic_tokens;

/// What the server can do.
pub(crate) fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(
            TextDocumentSyncKind::INCREMENTAL,
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        rename_provider: Some(OneOf::Right(RenameOptions {
            prepare_provider: Some(true),
            work_done_progress_options: WorkDoneProgressOptions::default(),
        })),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(
                ["{", "|", "'", "\"", "#", " ", "_"]
                    .map(String::from)
                    .to_vec(),
            ),
            ..CompletionOptions::default()
        }),
        document_symbol_provider: Some(OneOf::Left(true)),
        folding_range_provider: Some(lsp_types::FoldingRangeProviderCapability::Simple(true)),
        code_action_provider: Some(CodeActionProviderCapability::Simple(true)),
        semantic_tokens_provider: Some(SemanticTokensServerCapabilities::SemanticTokensOptions(
            SemanticTokensOptions {
                legend: tokens::legend(),
                full: Some(SemanticTokensFullOptions::Bool(true)),
                range: None,
                work_done_progress_options: WorkDoneProgressOptions::default(),
            },
        )),
        ..ServerCapabilities::default()
    }
}

/// The compiler's diagnostics as `aplc check` reports them: the same code, message,
/// severity and primary span. Secondary labels, notes and help become related
/// information, so clients that show it show what `aplc check` prints under a report.
pub(crate) fn diagnostics(
    uri: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Vec<lsp_types::Diagnostic> {
    with_view(doc, options, |v| {
        v.analysis
            .diagnostics
            .iter()
            .map(|d| v.diagnostic(uri, d))
            .collect()
    })
}

/// The text, its lines and its analysis, borrowed together.
pub(crate) struct View<'a> {
    pub text: &'a str,
    pub lines: &'a Lines,
    pub analysis: &'a crate::document::Analysis,
}

impl View<'_> {
    fn range(&self, span: Span) -> lsp_types::Range {
        self.lines.range(self.text, span)
    }

    fn offset(&self, position: lsp_types::Position) -> usize {
        self.lines.offset(self.text, position)
    }

    /// One compiler diagnostic as the protocol's (see [`diagnostics`]).
    fn diagnostic(&self, uri: &Uri, d: &aplc_compiler::Diagnostic) -> lsp_types::Diagnostic {
        let location = |span: Span| Location::new(uri.clone(), self.range(span));
        let primary = d.span();
        let mut related: Vec<DiagnosticRelatedInformation> = d
            .labels
            .iter()
            .filter(|l| !l.message.is_empty())
            .map(|l| DiagnosticRelatedInformation {
                location: location(l.span),
                message: l.message.clone(),
            })
            .collect();
        let extra = d
            .notes
            .iter()
            .map(|n| format!("note: {n}"))
            .chain(d.help.iter().map(|h| format!("help: {h}")));
        related.extend(extra.map(|message| DiagnosticRelatedInformation {
            location: location(primary),
            message,
        }));
        lsp_types::Diagnostic {
            range: self.range(primary),
            severity: Some(match d.severity {
                Severity::Error => DiagnosticSeverity::ERROR,
                Severity::Warning => DiagnosticSeverity::WARNING,
            }),
            code: Some(NumberOrString::String(d.code.as_str().to_string())),
            source: Some("aplc".to_string()),
            message: d.message.clone(),
            related_information: (!related.is_empty()).then_some(related),
            ..lsp_types::Diagnostic::default()
        }
    }
}

/// Runs `f` on a view of `doc`, analysed with `options`.
pub(crate) fn with_view<R>(
    doc: &mut Document,
    options: &Options,
    f: impl FnOnce(View<'_>) -> R,
) -> R {
    doc.analysis(options);
    let (text, lines, analysis) = doc.parts();
    f(View {
        text,
        lines,
        analysis,
    })
}

macro_rules! document_request {
    ($($ty:ty => |$p:ident| $uri:expr;)*) => {
        $(impl DocumentRequest for $ty {
            fn uri(&self) -> &Uri {
                let $p = self;
                $uri
            }
        })*
    };
}

document_request! {
    lsp_types::HoverParams => |p| &p.text_document_position_params.text_document.uri;
    lsp_types::GotoDefinitionParams => |p| &p.text_document_position_params.text_document.uri;
    lsp_types::ReferenceParams => |p| &p.text_document_position.text_document.uri;
    lsp_types::TextDocumentPositionParams => |p| &p.text_document.uri;
    lsp_types::RenameParams => |p| &p.text_document_position.text_document.uri;
    lsp_types::CompletionParams => |p| &p.text_document_position.text_document.uri;
    lsp_types::DocumentSymbolParams => |p| &p.text_document.uri;
    lsp_types::FoldingRangeParams => |p| &p.text_document.uri;
    lsp_types::CodeActionParams => |p| &p.text_document.uri;
    lsp_types::SemanticTokensParams => |p| &p.text_document.uri;
}

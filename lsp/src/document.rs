//! One open document: its text, the edits the client sends, and the compiler's view of
//! it (computed when first needed after a change, then kept).

use aplc_compiler::outline::{JumpSite, StepOutline};
use aplc_compiler::{Diagnostic, Options, Outline, Span, compile_with_outline};
use lsp_types::TextDocumentContentChangeEvent;

use crate::position::Lines;

/// An open document.
#[derive(Debug)]
pub(crate) struct Document {
    pub text: String,
    pub version: i32,
    lines: Lines,
    analysis: Option<Analysis>,
}

/// What the compiler says about one version of a document.
#[derive(Debug)]
pub(crate) struct Analysis {
    pub diagnostics: Vec<Diagnostic>,
    pub outline: Outline,
}

impl Document {
    pub(crate) fn new(text: String, version: i32) -> Document {
        Document {
            lines: Lines::new(&text),
            text,
            version,
            analysis: None,
        }
    }

    /// Applies the client's changes in order: a change with a range replaces that range
    /// (clamped to the text), one without replaces the whole text.
    pub(crate) fn change(&mut self, version: i32, changes: Vec<TextDocumentContentChangeEvent>) {
        for change in changes {
            match change.range {
                Some(range) => {
                    let span = self.lines.span(&self.text, range);
                    self.text.replace_range(span.range(), &change.text);
                }
                None => self.text = change.text,
            }
            self.lines = Lines::new(&self.text);
        }
        self.version = version;
        self.analysis = None;
    }

    /// The text, its lines and its analysis (`None` until [`Document::analysis`] ran).
    pub(crate) fn parts(&self) -> (&str, &Lines, &Analysis) {
        static EMPTY: std::sync::OnceLock<Analysis> = std::sync::OnceLock::new();
        let analysis = self.analysis.as_ref().unwrap_or_else(|| {
            EMPTY.get_or_init(|| Analysis {
                diagnostics: Vec::new(),
                outline: Outline::default(),
            })
        });
        (&self.text, &self.lines, analysis)
    }

    /// The compiler's view of the current text, compiled now if the text changed.
    pub(crate) fn analysis(&mut self, options: &Options) -> &Analysis {
        self.analysis.get_or_insert_with(|| {
            let (compilation, outline) = compile_with_outline(&self.text, "", options);
            Analysis {
                diagnostics: compilation.diagnostics,
                outline,
            }
        })
    }
}

impl Analysis {
    /// The step called `name`: its first group of headings.
    pub(crate) fn step(&self, name: &str) -> Option<&StepOutline> {
        self.outline.steps.iter().find(|s| s.name == name)
    }

    /// Every literal `next_step` write naming `name`.
    pub(crate) fn jumps_to<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a JumpSite> {
        self.outline
            .jumps
            .iter()
            .filter(move |j| j.target.as_deref() == Some(name))
    }

    /// What is at byte `offset` of `text`.
    pub(crate) fn at(&self, text: &str, offset: usize) -> Option<Target> {
        let inside = |span: Span| span.start <= offset && offset <= span.end;
        for j in &self.outline.jumps {
            if let (Some(target), Some(value)) = (&j.target, j.value)
                && inside(value)
            {
                return Some(Target::Step(target.clone(), value));
            }
        }
        for step in &self.outline.steps {
            for phase in &step.phases {
                if inside(phase.name_span) && phase.name_span != phase.heading {
                    return Some(Target::Step(step.name.clone(), phase.name_span));
                }
            }
        }
        let (word, span) = word_at(text, offset)?;
        for t in &self.outline.templates {
            if !inside(t.span) {
                continue;
            }
            let named = |list: &[(String, Span)]| {
                list.iter()
                    .any(|(name, s)| name == word && s.start <= span.start && span.end <= s.end)
            };
            if named(&t.calls) {
                return Some(Target::Function(word.to_string(), span));
            }
            if named(&t.filters) {
                return Some(Target::Filter(word.to_string(), span));
            }
            if named(&t.reads) {
                return Some(Target::Variable(word.to_string(), span));
            }
            for (name, s) in &t.writes {
                if inside(*s) {
                    return Some(Target::Variable(name.clone(), *s));
                }
            }
        }
        None
    }

    /// The literal that first sets variable `name`: the first write in template order.
    pub(crate) fn first_write(&self, name: &str) -> Option<Span> {
        self.outline
            .templates
            .iter()
            .flat_map(|t| &t.writes)
            .find(|(n, _)| n == name)
            .map(|&(_, s)| s)
    }
}

/// Something a position points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A step name (in a heading or a `next_step` literal) and the span under the cursor.
    Step(String, Span),
    /// A variable read or written by name.
    Variable(String, Span),
    /// A called function (helper or global).
    Function(String, Span),
    /// A filter.
    Filter(String, Span),
}

/// The identifier (ASCII letters, digits, `_`) around byte `offset`, and its span.
pub(crate) fn word_at(text: &str, offset: usize) -> Option<(&str, Span)> {
    let bytes = text.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let offset = offset.min(text.len());
    let mut start = offset;
    while start > 0 && is_word(bytes[start - 1]) {
        start -= 1;
    }
    let mut end = offset;
    while end < bytes.len() && is_word(bytes[end]) {
        end += 1;
    }
    // ASCII bytes are whole characters, so these are character boundaries.
    (start < end).then(|| (&text[start..end], Span::new(start, end)))
}

//! Diagnostics: the one `Span` type, the `Diagnostic` type every stage produces, and the
//! single function that renders diagnostics with ariadne.
//!
//! Chumsky and ariadne types stay at the edges: stages build [`Diagnostic`]s, and only
//! [`render`] knows about ariadne.

use std::fmt;
use std::ops::Range;

/// A byte range in the `.apl` source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Span {
    /// Offset of the first byte.
    pub start: usize,
    /// Offset one past the last byte.
    pub end: usize,
}

impl Span {
    /// Creates a span; `end` is clamped to be at least `start`.
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start,
            end: end.max(start),
        }
    }

    /// The span as a range, for slicing.
    pub fn range(self) -> Range<usize> {
        self.start..self.end
    }

    /// The smallest span covering both.
    pub fn cover(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }

    /// The span clamped to `text` and widened to whole characters: the start moves back
    /// and the end forward to the nearest UTF-8 character boundary. Positions reported by
    /// other parsers (minijinja's) may fall inside a multi-byte character, and slicing
    /// there panics.
    pub fn snap(self, text: &str) -> Span {
        let end = self.end.min(text.len());
        let mut start = self.start.min(end);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = end;
        while !text.is_char_boundary(end) {
            end += 1;
        }
        Span { start, end }
    }
}

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The file is still valid.
    Warning,
    /// The file cannot be built.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// A stable diagnostic code. `spec/diagnostics.md` lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// APL0001: a level-1 heading that is not a valid phase heading.
    InvalidStepHeading,
    /// APL0002: two steps with the same identifier.
    DuplicateStep,
    /// APL0003: a step named `return`.
    ReservedStep,
    /// APL0004: a step without a `prompt` phase.
    MissingPrompt,
    /// APL0005: phases not in `pre → prompt → post` order, or repeated.
    PhaseOrder,
    /// APL0006: a level-2 heading in a prompt phase that is not a role.
    InvalidRoleHeading,
    /// APL0007: text before the first phase heading.
    TextBeforeFirstStep,
    /// APL0008: a file without any step.
    NoSteps,
    /// APL0009: a Jinja syntax error.
    TemplateSyntax,
    /// APL0010: a template reads a reserved variable (§8).
    ReservedVariable,
    /// APL0011: a role heading outside a prompt phase, kept as text.
    RoleHeadingOutsidePrompt,
    /// APL0012: a code fence that is never closed.
    UnclosedFence,
    /// APL0013: the source is too large to compile.
    SourceTooLarge,
    /// APL0014: a literal `next_step` target that names no step.
    UnknownStep,
    /// APL0015: `next_step` set in a `pre` or `prompt` phase, where it has no effect.
    NextStepOutsidePost,
    /// APL0016: a step no jump from the entry step can reach.
    UnreachableStep,
    /// APL0017: a cycle of steps that every run entering it can only leave through
    /// `max_steps`, `max_runs` or the timeout.
    CycleWithoutExit,
    /// APL0018: a template reads a variable that nothing defines.
    UndefinedVariable,
    /// APL0019: a malformed `{# inputs: … #}` declaration.
    InvalidInputs,
    /// APL0020: a role heading (`## system`) before the first phase heading.
    RoleHeadingBeforePhase,
    /// APL0021: a phase heading indented by one to three spaces, which is text.
    IndentedHeading,
    /// APL0022: a call of a function the template environment does not have.
    UnknownFunction,
    /// APL0023: a filter or test the template environment does not have.
    UnknownFilter,
    /// APL0024: a template expression nested deeper than the VM loads.
    ExpressionTooDeep,
    /// APL0025: `human_input` read in a step that no step setting `await_input` can
    /// precede.
    HumanInputWithoutAwait,
    /// APL0026: a `call_agent` literal (or a manifest's `{"agent": …}`) that is no agent
    /// name.
    InvalidAgentName,
    /// APL0027: an agent named at build time that no `<name>.apl` or `<name>.aplb` is
    /// found for.
    UnknownAgent,
    /// APL0028: an agent that cannot be linked: it does not compile, cannot be read, or
    /// brings linked agents that disagree with the ones linked here.
    AgentNotLinked,
    /// APL0029: a `call_agent` whose literal context lacks inputs the agent declares.
    MissingAgentInputs,
    /// APL0030: agents that delegate to each other in a cycle of literal names.
    AgentCycle,
}

impl Code {
    /// The code as printed, e.g. `APL0001`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidStepHeading => "APL0001",
            Code::DuplicateStep => "APL0002",
            Code::ReservedStep => "APL0003",
            Code::MissingPrompt => "APL0004",
            Code::PhaseOrder => "APL0005",
            Code::InvalidRoleHeading => "APL0006",
            Code::TextBeforeFirstStep => "APL0007",
            Code::NoSteps => "APL0008",
            Code::TemplateSyntax => "APL0009",
            Code::ReservedVariable => "APL0010",
            Code::RoleHeadingOutsidePrompt => "APL0011",
            Code::UnclosedFence => "APL0012",
            Code::SourceTooLarge => "APL0013",
            Code::UnknownStep => "APL0014",
            Code::NextStepOutsidePost => "APL0015",
            Code::UnreachableStep => "APL0016",
            Code::CycleWithoutExit => "APL0017",
            Code::UndefinedVariable => "APL0018",
            Code::InvalidInputs => "APL0019",
            Code::RoleHeadingBeforePhase => "APL0020",
            Code::IndentedHeading => "APL0021",
            Code::UnknownFunction => "APL0022",
            Code::UnknownFilter => "APL0023",
            Code::ExpressionTooDeep => "APL0024",
            Code::HumanInputWithoutAwait => "APL0025",
            Code::InvalidAgentName => "APL0026",
            Code::UnknownAgent => "APL0027",
            Code::AgentNotLinked => "APL0028",
            Code::MissingAgentInputs => "APL0029",
            Code::AgentCycle => "APL0030",
        }
    }

    /// Every code, in numeric order.
    pub const ALL: [Code; 30] = [
        Code::InvalidStepHeading,
        Code::DuplicateStep,
        Code::ReservedStep,
        Code::MissingPrompt,
        Code::PhaseOrder,
        Code::InvalidRoleHeading,
        Code::TextBeforeFirstStep,
        Code::NoSteps,
        Code::TemplateSyntax,
        Code::ReservedVariable,
        Code::RoleHeadingOutsidePrompt,
        Code::UnclosedFence,
        Code::SourceTooLarge,
        Code::UnknownStep,
        Code::NextStepOutsidePost,
        Code::UnreachableStep,
        Code::CycleWithoutExit,
        Code::UndefinedVariable,
        Code::InvalidInputs,
        Code::RoleHeadingBeforePhase,
        Code::IndentedHeading,
        Code::UnknownFunction,
        Code::UnknownFilter,
        Code::ExpressionTooDeep,
        Code::HumanInputWithoutAwait,
        Code::InvalidAgentName,
        Code::UnknownAgent,
        Code::AgentNotLinked,
        Code::MissingAgentInputs,
        Code::AgentCycle,
    ];
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A labelled region of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// Where.
    pub span: Span,
    /// What about it; may be empty.
    pub message: String,
    /// The primary label is the one the diagnostic is *at*.
    pub primary: bool,
}

/// A message about the source, with a stable code and labelled spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Stable code.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// The headline, in the spec's words where the spec has them.
    pub message: String,
    /// The primary label first, then secondary ones.
    pub labels: Vec<Label>,
    /// Extra explanation.
    pub notes: Vec<String>,
    /// A suggested fix, in words.
    pub help: Option<String>,
    /// The fix `help` suggests, as an edit a tool can apply, where it is one: a
    /// did-you-mean replaces the misspelt name with the name meant.
    pub suggestion: Option<Suggestion>,
}

/// An edit that applies a diagnostic's fix: replace the text at `span` with
/// `replacement`. The span lies on one line, on character boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    /// What to replace, in the `.apl` source.
    pub span: Span,
    /// The text that replaces it.
    pub replacement: String,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn error(code: Code, message: impl Into<String>, span: Span) -> Diagnostic {
        Diagnostic::new(Severity::Error, code, message.into(), span)
    }

    /// A warning at `span`.
    pub fn warning(code: Code, message: impl Into<String>, span: Span) -> Diagnostic {
        Diagnostic::new(Severity::Warning, code, message.into(), span)
    }

    fn new(severity: Severity, code: Code, message: String, span: Span) -> Diagnostic {
        Diagnostic {
            code,
            severity,
            message,
            labels: vec![Label {
                span,
                message: String::new(),
                primary: true,
            }],
            notes: Vec::new(),
            help: None,
            suggestion: None,
        }
    }

    /// Sets the primary label's message.
    pub fn with_label_message(mut self, message: impl Into<String>) -> Diagnostic {
        if let Some(label) = self.labels.first_mut() {
            label.message = message.into();
        }
        self
    }

    /// Adds a secondary label.
    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label {
            span,
            message: message.into(),
            primary: false,
        });
        self
    }

    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// Sets the help text.
    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    /// "did you mean `{shown}`?", with the edit that replaces `span` by `replacement`.
    /// `shown` is what the help prints: the name meant, or the line as it would read.
    pub fn with_did_you_mean(
        self,
        shown: &str,
        span: Span,
        replacement: impl Into<String>,
    ) -> Diagnostic {
        let mut diag = self.with_help(format!("did you mean `{shown}`?"));
        diag.suggestion = Some(Suggestion {
            span,
            replacement: replacement.into(),
        });
        diag
    }

    /// The primary span.
    pub fn span(&self) -> Span {
        self.labels
            .iter()
            .find(|l| l.primary)
            .map(|l| l.span)
            .unwrap_or_default()
    }

    /// True for errors.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Renders diagnostics for `source` (named `file_name`) with ariadne.
///
/// This is the only place that knows about ariadne. Spans are byte offsets, as ariadne's
/// `IndexType::Byte` expects.
pub fn render(diagnostics: &[Diagnostic], file_name: &str, source: &str, color: bool) -> String {
    use ariadne::{Config, IndexType, Label as ALabel, Report, ReportKind, Source};

    let mut out = Vec::new();
    let mut cache = (file_name, Source::from(source));
    // Stages snap their spans already; snapping again here means no span, however it
    // was made, can make ariadne slice inside a character.
    let clamp = |span: Span| span.snap(source).range();
    for diag in diagnostics {
        let kind = match diag.severity {
            Severity::Error => ReportKind::Error,
            Severity::Warning => ReportKind::Warning,
        };
        let primary = clamp(diag.span());
        let mut report = Report::build(kind, (file_name, primary.clone()))
            .with_config(
                Config::default()
                    .with_color(color)
                    .with_index_type(IndexType::Byte),
            )
            .with_code(diag.code.as_str())
            .with_message(&diag.message);
        // ariadne starts a new source block whenever a label lies before the previous one,
        // so labels go in in source order: one block, lines in file order.
        let mut labels: Vec<&Label> = diag.labels.iter().collect();
        labels.sort_by_key(|l| l.span.start);
        for label in labels {
            let mut l = ALabel::new((file_name, clamp(label.span)));
            if !label.message.is_empty() {
                l = l.with_message(&label.message);
            }
            if color {
                let c = if label.primary {
                    match diag.severity {
                        Severity::Error => ariadne::Color::Red,
                        Severity::Warning => ariadne::Color::Yellow,
                    }
                } else {
                    ariadne::Color::Blue
                };
                l = l.with_color(c);
            }
            report = report.with_label(l);
        }
        for note in &diag.notes {
            report = report.with_note(note);
        }
        if let Some(help) = &diag.help {
            report = report.with_help(help);
        }
        // Writing into a Vec cannot fail; a failure here would only lose this report.
        let _ = report.finish().write(&mut cache, &mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Maps byte offsets to 1-based line and column numbers.
#[derive(Debug, Clone)]
pub struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    /// Indexes `source`.
    pub fn new(source: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    /// The 1-based line and 1-based column (in characters) of `offset` in `source`.
    pub fn line_col(&self, source: &str, offset: usize) -> (usize, usize) {
        let offset = offset.min(source.len());
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts[line - 1];
        let col = source
            .get(start..offset)
            .map(|s| s.chars().count())
            .unwrap_or(0);
        (line, col + 1)
    }

    /// Byte offset of the start of 1-based `line`, if it exists.
    pub fn line_start(&self, line: usize) -> Option<usize> {
        self.starts.get(line.checked_sub(1)?).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snap_widens_to_whole_characters_and_clamps() {
        let text = "a é b";
        // `é` is bytes 2..4; a span ending inside it grows to cover it.
        assert_eq!(Span::new(2, 3).snap(text), Span::new(2, 4));
        assert_eq!(Span::new(3, 3).snap(text), Span::new(2, 4));
        assert_eq!(Span::new(3, 99).snap(text), Span::new(2, 6));
        assert_eq!(Span::new(50, 99).snap(text), Span::new(6, 6));
    }

    #[test]
    fn render_survives_spans_inside_characters() {
        let source = "{{ café }}\n";
        for start in 0..source.len() + 2 {
            for end in start..source.len() + 2 {
                let d = Diagnostic::error(Code::TemplateSyntax, "x", Span { start, end })
                    .with_secondary(
                        Span {
                            start: end,
                            end: start,
                        },
                        "y",
                    );
                let _ = render(&[d], "t.apl", source, false);
            }
        }
    }
}

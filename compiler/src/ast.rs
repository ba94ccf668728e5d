//! The spanned syntax tree of an `.apl` file, as the parser produces it.
//!
//! The tree is close to the text: phases in file order, each split into sections at its
//! `##` lines. Grouping phases into steps, and every rule about steps, happens in
//! `lower.rs`. Nothing here derives `Serialize`: the bundle is the only serialized form.

use aplc_vm::bundle::Role;

use crate::diagnostic::Span;

/// A parsed file.
#[derive(Debug, Clone)]
pub(crate) struct File<'src> {
    /// Everything before the first phase heading.
    pub preamble: Span,
    /// The phases in file order.
    pub phases: Vec<Phase<'src>>,
}

/// One phase: a `# <phase>: <name>` heading and the lines up to the next one.
#[derive(Debug, Clone)]
pub(crate) struct Phase<'src> {
    /// The heading line.
    pub heading: Heading<'src>,
    /// The body: from the line after the heading to the next phase heading.
    pub body: Span,
    /// The body split at `##` lines. The first section has no heading and may be empty.
    pub sections: Vec<Section<'src>>,
}

/// A phase heading line.
#[derive(Debug, Clone)]
pub(crate) struct Heading<'src> {
    /// The line, without its line break.
    pub span: Span,
    /// What it says, or `None` when it is invalid (a diagnostic was reported).
    pub parsed: Option<PhaseHeader<'src>>,
}

/// A valid phase heading.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhaseHeader<'src> {
    /// The phase keyword.
    pub kind: PhaseKind,
    /// The trimmed step identifier and its span; `None` when it was left out.
    pub name: Option<(&'src str, Span)>,
}

/// The three phases, in their required order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PhaseKind {
    Pre,
    Prompt,
    Post,
}

impl PhaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Pre => "pre",
            PhaseKind::Prompt => "prompt",
            PhaseKind::Post => "post",
        }
    }
}

/// A run of body lines, opened by a `##` line or by the phase heading itself.
#[derive(Debug, Clone)]
pub(crate) struct Section<'src> {
    /// The `##` line that opens the section; `None` for the first section.
    pub heading: Option<RoleLine<'src>>,
    /// The lines after the heading, up to the next `##` or phase heading.
    pub body: Span,
}

/// A `##` line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoleLine<'src> {
    /// The line, without its line break.
    pub span: Span,
    /// The line's text.
    pub text: &'src str,
    /// The role it names, if it names one.
    pub role: Option<Role>,
}

//! The bundle: the versioned binary form of a compiled APL program.
//!
//! The VM owns the format because the format *is* the machine's instruction set: the
//! compiler builds a [`Bundle`] value and calls [`encode`]; the VM calls [`decode`] on
//! untrusted bytes. `spec/bundle-format.md` documents the layout byte by byte.
//!
//! These are the only types in the workspace that derive `Serialize`/`Deserialize`.

mod codec;
pub(crate) mod dialect;
mod instr;
mod listing;
mod validate;

use serde::{Deserialize, Serialize};

pub use codec::{
    BundleError, DESCRIBED, FORMAT_VERSION, HeaderFields, LINKED, MAGIC, MAX_LINKED_AGENTS,
    MAX_PAYLOAD_LEN, decode, encode, is_bundle,
};
pub use instr::{Instr, StepId, TemplateId};
pub use listing::listing;

/// A compiled APL program, ready to be encoded or loaded.
///
/// Every index in here (step ids, template ids, message ranges, instruction targets) is
/// checked by [`Bundle::validate`] before the VM trusts it, so a decoded bundle can be
/// executed without bounds panics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    /// Version of the compiler that produced the bundle (`CARGO_PKG_VERSION`).
    pub compiler_version: String,
    /// The file name the source was compiled from, for messages.
    pub source_name: String,
    /// SHA-256 of the `.apl` source text.
    pub source_hash: [u8; 32],
    /// The declared inputs (`{# inputs: a, b #}`), in declaration order: the variables
    /// every run must be given with `with_context`. A run missing one fails before its
    /// first step ([`RunErrorKind::MissingInput`](crate::RunErrorKind::MissingInput)).
    pub inputs: Vec<String>,
    /// Steps in source order; `StepId(0)` is the entry step.
    pub steps: Vec<StepEntry>,
    /// Every template of the program (phase bodies and role sections).
    pub templates: Vec<TemplateEntry>,
    /// Prompt messages: one entry per role section, referenced by [`Instr::BuildPrompts`].
    pub messages: Vec<MessageEntry>,
    /// The instructions of all steps, each step's code contiguous.
    pub code: Vec<Instr>,
    /// Side table: the source span of each instruction in `code` (same length).
    pub code_spans: Vec<SourceSpan>,
    /// The step graph's edges, as found by the compiler.
    pub edges: Vec<Edge>,
    /// The dialect the program was compiled in (`spec/dialects.md`): the helpers its
    /// templates may call. Not in the payload: the header's flags carry it, so a bundle
    /// of the spec dialect is byte for byte what earlier builds wrote, and one of
    /// another dialect is refused by them (`spec/bundle-format.md`).
    #[serde(skip)]
    pub dialect: crate::Dialect,
    /// What the agent does, for the people and programs that list agents (`aplc mcp`
    /// offers it as an MCP tool's description): the first `{# … #}` comment before the
    /// first heading that is not an `{# inputs: … #}` declaration, trimmed. Not in the
    /// bundle value: when present, it follows that value in the payload as one postcard
    /// string and the header's [`DESCRIBED`](crate::bundle::DESCRIBED) flag says so, so a
    /// bundle without one is byte for byte what earlier builds wrote
    /// (`spec/bundle-format.md`).
    #[serde(skip)]
    pub description: Option<String>,
    /// The agents linked into this bundle (`spec/agents.md`): every agent the program (or
    /// one of them) calls by a name known at build time, flat and sorted by name, so one
    /// bundle is one artifact to ship. A linked agent has no agents of its own: the root's
    /// table serves the whole tree. Not in the bundle value: when present, the list
    /// follows it (and the description) in the payload, each agent as its name and its
    /// own encoded bundle, and the header's [`LINKED`](crate::bundle::LINKED) flag says
    /// so (`spec/bundle-format.md`).
    #[serde(skip)]
    pub agents: Vec<LinkedAgent>,
}

/// An agent linked into a bundle: its name (the file stem it was found under) and its
/// program.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkedAgent {
    /// The name calls use (`call_agent`'s `agent`, a manifest's `{"agent": …}`).
    pub name: String,
    /// Its program; its own `agents` list is empty.
    pub bundle: Bundle,
}

/// One step in the step table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEntry {
    /// The step identifier as written (trimmed, case-sensitive).
    pub name: String,
    /// Index into [`Bundle::code`] of the step's first instruction.
    pub entry: u32,
    /// Span of the step's first heading.
    pub span: SourceSpan,
}

/// A template and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateEntry {
    /// The Jinja source, after relaxed-syntax desugaring where that applied.
    pub source: String,
    /// Which step the template belongs to.
    pub step: StepId,
    /// Which part of the step it is.
    pub kind: TemplateKind,
    /// Span of the template body in the `.apl` source.
    pub span: SourceSpan,
}

/// The part of a step a template implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TemplateKind {
    /// The `pre` phase.
    Pre,
    /// One role section of the `prompt` phase.
    Prompt(Role),
    /// The `post` phase.
    Post,
}

impl Bundle {
    /// This bundle with `agents` linked as well: each one whose name is not linked yet
    /// (the linked ones come first, as a run looks them up), with the agents it links
    /// itself, flat and sorted. For a durable run whose host gives it agents by name
    /// (`spec/agents.md` §2): its stored bundle holds them, so a resume runs the same.
    pub fn linking<'a>(&self, agents: impl IntoIterator<Item = (&'a str, &'a Bundle)>) -> Bundle {
        let mut linked = self.clone();
        let mut add = |name: &str, bundle: &Bundle| {
            if !linked.agents.iter().any(|a| a.name == name) {
                let mut bundle = bundle.clone();
                bundle.agents.clear();
                linked.agents.push(LinkedAgent {
                    name: name.to_owned(),
                    bundle,
                });
            }
        };
        for (name, bundle) in agents {
            add(name, bundle);
            for agent in &bundle.agents {
                add(&agent.name, &agent.bundle);
            }
        }
        linked.agents.sort_by(|a, b| a.name.cmp(&b.name));
        linked
    }

    /// [`Bundle::source_hash`] in lowercase hex, as listings and run events show it.
    pub fn source_hash_hex(&self) -> String {
        self.source_hash
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// A prompt message: a role and the template that renders its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageEntry {
    /// The message role.
    pub role: Role,
    /// The template rendering the message content.
    pub template: TemplateId,
}

/// A prompt role (§1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// `## system`
    System,
    /// `## user`, and text before the first role heading.
    User,
    /// `## assistant`
    Assistant,
    /// `## developer`
    Developer,
    /// `## tool_result`
    ToolResult,
}

impl Role {
    /// Every role, in the order the spec lists them.
    pub const ALL: [Role; 5] = [
        Role::System,
        Role::User,
        Role::Assistant,
        Role::Developer,
        Role::ToolResult,
    ];

    /// The role's name as it appears in headings and in `prompts`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Developer => "developer",
            Role::ToolResult => "tool_result",
        }
    }
}

/// An edge of the step graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// The step whose post phase sets `next_step`.
    pub from: StepId,
    /// Where it goes.
    pub to: EdgeTarget,
    /// The `set_context('next_step', …)` call.
    pub span: SourceSpan,
}

/// The target of a step-graph edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EdgeTarget {
    /// A literal step name that resolves to this step.
    Step(StepId),
    /// The literal `return`.
    Return,
    /// A computed target: may reach any step.
    Dynamic,
}

/// A region of the `.apl` source: byte offsets plus the 1-based line and column of the
/// start, so that messages can point at the source without having it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SourceSpan {
    /// Byte offset of the first byte.
    pub start: u32,
    /// Byte offset one past the last byte.
    pub end: u32,
    /// 1-based line of `start`.
    pub line: u32,
    /// 1-based column (in characters) of `start`.
    pub col: u32,
}

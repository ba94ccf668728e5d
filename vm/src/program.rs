//! A loaded program: a validated bundle with every template compiled once.
//!
//! `Program` is immutable and `Send + Sync`; any number of runs share one through an
//! `Arc`. No template is parsed or compiled after [`Program::from_bundle`] returns.

use std::collections::HashMap;
use std::fmt;

use minijinja::Environment;

use crate::Dialect;
use crate::bundle::{self, Bundle, BundleError, StepId, TemplateId, TemplateKind};
use crate::names::VARIABLES;
use crate::template::check::check_template;
use crate::template::env::{Limits, template_env_for};
use crate::template::store::Vars;

/// A decoded, validated bundle with its templates compiled.
///
/// Every template passes [`check_template`](crate::check_template) before minijinja
/// parses it.
pub struct Program {
    bundle: Bundle,
    env: Environment<'static>,
    /// Template `i` is registered in `env` under `names[i]`.
    names: Vec<String>,
    steps_by_name: HashMap<String, StepId>,
    limits: Limits,
    /// Every variable a run starts with, built once per program: a run starts from an
    /// O(1) copy, and the executor's resets (the `result_*` defaults before each call,
    /// `errors` after each post phase) clone these values instead of allocating new ones.
    initial_vars: Vars,
    /// The agents linked into the bundle ([`Bundle::agents`]), loaded: the root's table
    /// serves every run of the tree (`spec/agents.md`).
    agents: std::collections::BTreeMap<String, std::sync::Arc<Program>>,
    /// A template of the program or of an agent it links mentions `call_agent`.
    mentions_call_agent: bool,
}

/// The most templates a program may have. minijinja allocates about 12 KiB for every
/// compiled template however short (its instruction buffers start with room for 256
/// instructions), so a count limit, not the bundle's size, is what bounds the memory
/// of loading: at this limit, about 200 MiB. Real agents have tens of templates.
pub const MAX_TEMPLATES: usize = 16_384;

/// The most steps a program may have; each costs a few hundred bytes to load.
pub const MAX_STEPS: usize = 16_384;

/// The most template source a program may have, in bytes, all templates together.
/// Compiled, a template costs up to about 32 bytes per byte of source (measured on
/// `{{ x }}` repeated), so this bounds that part of loading to about 512 MiB. Source
/// files are at most 8 MiB, and only relaxed syntax on very short lines grows them.
pub const MAX_TEMPLATE_BYTES: usize = 16 * 1024 * 1024;

/// Why a program could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes are not a valid bundle.
    #[error("{0}")]
    Bundle(#[from] BundleError),
    /// The bundle has more templates or steps than a program may have.
    #[error("the bundle has {count} {what}; aplc loads at most {limit}")]
    TooLarge {
        /// `steps`, `templates` or `bytes of template source`.
        what: &'static str,
        /// How many the bundle has.
        count: usize,
        /// [`MAX_STEPS`], [`MAX_TEMPLATES`] or [`MAX_TEMPLATE_BYTES`].
        limit: usize,
    },
    /// A linked agent does not load.
    #[error("linked agent `{name}`: {message}")]
    Agent {
        /// The agent's name.
        name: String,
        /// Why it does not load.
        message: String,
    },
    /// A template in the bundle does not compile.
    #[error("template {index} ({what}) does not compile: {message}")]
    Template {
        /// Index in the template table.
        index: usize,
        /// Which phase of which step.
        what: String,
        /// minijinja's message.
        message: String,
    },
}

impl Program {
    /// Decodes untrusted bundle bytes and loads them with default limits.
    pub fn load(bytes: &[u8]) -> Result<Program, LoadError> {
        Program::from_bundle(bundle::decode(bytes)?, Limits::default())
    }

    /// Loads an in-memory bundle (validated again here: it may not come from `decode`),
    /// in the dialect it records.
    pub fn from_bundle(bundle: Bundle, limits: Limits) -> Result<Program, LoadError> {
        Program::from_bundle_in(bundle, limits, Dialect::Spec)
    }

    /// Decodes untrusted bundle bytes and loads them with default limits and `dialect`'s
    /// helpers (`spec/dialects.md`), or the bundle's own dialect if it records one.
    pub fn load_in(bytes: &[u8], dialect: Dialect) -> Result<Program, LoadError> {
        Program::from_bundle_in(bundle::decode(bytes)?, Limits::default(), dialect)
    }

    /// [`Program::from_bundle`] with `dialect`'s helpers. A bundle that records a
    /// dialect other than the spec's runs in it whatever `dialect` says; one that records
    /// the spec's (every bundle built before bundles recorded their dialect) runs in
    /// `dialect`, so a caller that names the dialect of an older bundle still runs it.
    pub fn from_bundle_in(
        mut bundle: Bundle,
        limits: Limits,
        dialect: Dialect,
    ) -> Result<Program, LoadError> {
        let dialect = match bundle.dialect {
            Dialect::Spec => dialect,
            recorded => recorded,
        };
        // What the program runs in is what it records from now on (a durable run's
        // stored bundle, `Program::bundle`).
        bundle.dialect = dialect;
        bundle.validate()?;
        // The limits bound the bundle as a whole: its linked agents count with it.
        let all = || std::iter::once(&bundle).chain(bundle.agents.iter().map(|a| &a.bundle));
        let templates: Vec<&str> = all()
            .flat_map(|b| b.templates.iter().map(|t| t.source.as_str()))
            .collect();
        check_size(all().map(|b| b.steps.len()).sum(), templates.into_iter())?;
        let mentions_call_agent = all()
            .any(|b| (b.templates.iter()).any(|t| t.source.contains(crate::names::CALL_AGENT)));
        let mut agents = std::collections::BTreeMap::new();
        for agent in &bundle.agents {
            // A linked agent runs in its own recorded dialect, as a bundle of its own.
            let program = Program::from_bundle_in(agent.bundle.clone(), limits, Dialect::Spec)
                .map_err(|e| LoadError::Agent {
                    name: agent.name.clone(),
                    message: e.to_string(),
                })?;
            agents.insert(agent.name.clone(), std::sync::Arc::new(program));
        }
        let mut env = template_env_for(&limits, dialect);
        let mut names = Vec::with_capacity(bundle.templates.len());
        for (index, template) in bundle.templates.iter().enumerate() {
            let refused = |message: String| LoadError::Template {
                index,
                what: describe(&bundle, TemplateId(index as u32)),
                message,
            };
            // Before minijinja sees it: its parser recurses on deep expressions, and
            // the compiler's rules on statements must hold for crafted bundles too.
            check_template(&template.source).map_err(|e| refused(e.to_string()))?;
            let name = index.to_string();
            env.add_template_owned(name.clone(), template.source.clone())
                .map_err(|e| refused(e.to_string()))?;
            names.push(name);
        }
        let steps_by_name = bundle
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), StepId(i as u32)))
            .collect();
        Ok(Program {
            bundle,
            env,
            names,
            steps_by_name,
            limits,
            initial_vars: initial_vars(),
            agents,
            mentions_call_agent,
        })
    }

    /// The dialect the program runs in (`spec/dialects.md`).
    pub fn dialect(&self) -> Dialect {
        self.bundle.dialect
    }

    /// The bundle the program was loaded from.
    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    /// Every variable a run starts with: executor-maintained (§2.4) and user-settable
    /// (§2.5), at their initial values.
    pub(crate) fn initial_vars(&self) -> &Vars {
        &self.initial_vars
    }

    /// The step with this identifier.
    pub fn step_by_name(&self, name: &str) -> Option<StepId> {
        self.steps_by_name.get(name).copied()
    }

    /// The identifier of a step.
    pub fn step_name(&self, step: StepId) -> &str {
        &self.bundle.steps[step.index()].name
    }

    /// The agent linked into this program's bundle under `name`.
    pub fn agent(&self, name: &str) -> Option<&std::sync::Arc<Program>> {
        self.agents.get(name)
    }

    /// False if no run of this program can call an agent by `call_agent`: no template of
    /// it or of an agent it links mentions the name. A host skips giving such a run its
    /// agents by name ([`RunOptions::agents`](crate::RunOptions::agents)); agent tools
    /// still need them.
    pub fn may_call_agents(&self) -> bool {
        self.mentions_call_agent
    }

    /// The agents linked into this program's bundle, by name.
    pub fn agents(&self) -> impl ExactSizeIterator<Item = (&str, &std::sync::Arc<Program>)> {
        self.agents
            .iter()
            .map(|(name, program)| (name.as_str(), program))
    }

    /// The limits every render of this program runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Describes a template for messages: "post phase of step `a`".
    pub fn describe_template(&self, template: TemplateId) -> String {
        describe(&self.bundle, template)
    }

    pub(crate) fn env(&self) -> &Environment<'static> {
        &self.env
    }

    pub(crate) fn template_name(&self, template: TemplateId) -> &str {
        &self.names[template.index()]
    }
}

/// Every variable a run starts with (see [`Program::initial_vars`]).
fn initial_vars() -> Vars {
    let mut vars = Vars::new();
    for variable in VARIABLES {
        vars.insert(variable.name, variable.initial());
    }
    vars
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("source_name", &self.bundle.source_name)
            .field("steps", &self.bundle.steps.len())
            .field("templates", &self.bundle.templates.len())
            .finish()
    }
}

/// `Program` is shared by concurrent runs: it must stay `Send + Sync`.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Program>();
};

/// Refuses more steps, templates or template source than [`MAX_STEPS`],
/// [`MAX_TEMPLATES`] and [`MAX_TEMPLATE_BYTES`] allow; the compiler runs the same check
/// so that it never builds a bundle this would refuse.
pub fn check_size<'a>(
    steps: usize,
    templates: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), LoadError> {
    let too_large = |what, count, limit| LoadError::TooLarge { what, count, limit };
    if steps > MAX_STEPS {
        return Err(too_large("steps", steps, MAX_STEPS));
    }
    if templates.len() > MAX_TEMPLATES {
        return Err(too_large("templates", templates.len(), MAX_TEMPLATES));
    }
    let bytes = templates.map(str::len).sum();
    if bytes > MAX_TEMPLATE_BYTES {
        return Err(too_large(
            "bytes of template source",
            bytes,
            MAX_TEMPLATE_BYTES,
        ));
    }
    Ok(())
}

fn describe(bundle: &Bundle, template: TemplateId) -> String {
    let Some(t) = bundle.templates.get(template.index()) else {
        return format!("template {}", template.0);
    };
    let step = bundle
        .steps
        .get(t.step.index())
        .map(|s| s.name.as_str())
        .unwrap_or("?");
    match t.kind {
        TemplateKind::Pre => format!("pre phase of step `{step}`"),
        TemplateKind::Post => format!("post phase of step `{step}`"),
        TemplateKind::Prompt(role) => format!("`{}` section of step `{step}`", role.as_str()),
    }
}

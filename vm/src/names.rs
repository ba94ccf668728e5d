//! The names APL gives meaning to, each spelled once: the variables of §2.4 and §2.5 with
//! their defaults and store slots, the executor's views, the template helpers, the rules
//! for a name a run may set, and the variables reserved for later (§8).
//!
//! The compiler (undefined-variable and helper checks) and the VM (the store's slots, a
//! run's initial context, the helpers it registers) both read these tables; nothing else
//! spells a variable's or a helper's name.

use minijinja::Value;

/// Variables reserved for future versions of APL (§8).
pub const RESERVED_VARIABLES: &[&str] = &[
    // Parallel execution & synchronization
    "next_steps",
    "await_steps",
    "parallel_results",
    "race_winner",
    "concurrent_limit",
    // Workflow management
    "step_graph",
    "workflow_state",
    "checkpoint",
    "rollback",
    "snapshot",
    "resume_from",
    // Advanced tool capabilities
    "tool_registry",
    "tool_dependencies",
    "tool_cache",
    "streaming_tools",
    "tool_timeout",
    // Memory & state management
    "memory",
    "shared_state",
    "session",
    "workspace",
    "vector_store",
    // Observability & debugging
    "trace",
    "metrics",
    "profiler",
    "debug_info",
    "audit_log",
    // Advanced flow control
    "conditions",
    "loops",
    "break_points",
    "event_triggers",
    "webhooks",
    // Provider & model management
    "model_fallbacks",
    "provider_pool",
    "cost_tracking",
    "rate_limits",
    "model_routing",
    // Security & validation
    "permissions",
    "sandbox",
    "input_validation",
    "output_sanitization",
    "security_context",
    // Integration & extensions
    "plugins",
    "extensions",
    "middleware",
    "interceptors",
    "transformers",
    // Workflow composition
    "sub_workflows",
    "workflow_imports",
    "macro_steps",
    "step_library",
    "template_inheritance",
    // Real-time & streaming
    "streaming_mode",
    "real_time_updates",
    "push_notifications",
    "websocket_handlers",
    "sse_streams",
];

/// Where the spec defines a variable, and so what the executor does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Section {
    /// §2.4: maintained by the executor (`prev_step`, `runs`, `errors`, ...).
    Executor,
    /// §2.4: a result of the last provider call, reset to its default before every call.
    Result,
    /// §2.5: set by the user and read by the executor itself (`model`, `allowed_tools`,
    /// `output_mode`, `output_structure`).
    Setting,
    /// §2.5: a sampling parameter, handed to the provider in the request field of the same
    /// name (`Sampling` in the typed request).
    Sampling,
}

/// One variable of §2.4 or §2.5.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// Where the spec defines it.
    pub section: Section,
    initial: Initial,
}

/// Builds a variable's initial value.
pub(crate) type Initial = fn() -> Value;

impl Variable {
    /// The value a run starts with; for [`Section::Result`], also the value before every
    /// provider call.
    pub fn initial(&self) -> Value {
        (self.initial)()
    }

    /// True for the user-settable variables of §2.5.
    pub fn is_user_settable(&self) -> bool {
        matches!(self.section, Section::Setting | Section::Sampling)
    }
}

/// Declares every variable once: a constant holding its name, its row in [`VARIABLES`]
/// (whose index is its store slot), and its arm in [`slot`].
macro_rules! variables {
    ($($konst:ident = $name:literal, $section:ident, $initial:expr;)*) => {
        $(
            #[doc = concat!("`", $name, "`.")]
            pub const $konst: &str = $name;
        )*

        /// Every variable of §2.4 and §2.5, in the spec's order. A variable's index here
        /// is its slot in the store.
        pub const VARIABLES: &[Variable] = &[
            $(Variable { name: $konst, section: Section::$section, initial: $initial },)*
        ];

        /// The store slot of `name` (its index in [`VARIABLES`]), if it is a variable of
        /// §2.4 or §2.5.
        ///
        /// A `match` rather than a search: the executor reads and writes its variables by
        /// constant name, and once this is inlined the compiler resolves those at build
        /// time (profiling showed a binary search at 17 % of a run).
        #[inline]
        pub(crate) fn slot(name: &str) -> Option<usize> {
            match name {
                $($name => Some(const { index_of($name) }),)*
                _ => None,
            }
        }
    };
}

variables! {
    PREV_STEP = "prev_step", Executor, || Value::from(());
    NEXT_STEP = "next_step", Executor, || Value::from(());
    RESULT_TEXT = "result_text", Result, || Value::from("");
    RESULT_JSON = "result_json", Result, || Value::from(());
    RESULT_TOOL_CALLS = "result_tool_calls", Result, || Value::from(Vec::<Value>::new());
    RESULT_IMAGE_URLS = "result_image_urls", Result, || Value::from(Vec::<Value>::new());
    RESULT_AUDIO_INPUTS = "result_audio_inputs", Result, || Value::from(Vec::<Value>::new());
    RESULT_FILES = "result_files", Result, || Value::from(Vec::<Value>::new());
    RESULT_ROLE = "result_role", Result, || Value::from("");
    USAGE = "usage", Result, || Value::from(());
    RUNS = "runs", Executor, || Value::from(0);
    GLOBAL_RUNS = "global_runs", Executor, || Value::from(0);
    TIME_ELAPSED = "time_elapsed", Executor, || Value::from(0.0);
    TIME_ELAPSED_GLOBAL = "time_elapsed_global", Executor, || Value::from(0.0);
    ERRORS = "errors", Executor, || Value::from(Vec::<Value>::new());
    PROMPTS = "prompts", Executor, || Value::from(Vec::<Value>::new());
    TOOLS = "tools", Executor, || Value::from(Vec::<Value>::new());
    MODEL = "model", Setting, || Value::from("gpt-4o");
    TEMPERATURE = "temperature", Sampling, || Value::from(());
    ALLOWED_TOOLS = "allowed_tools", Setting, || Value::from(Vec::<Value>::new());
    OUTPUT_MODE = "output_mode", Setting, || Value::from(());
    OUTPUT_STRUCTURE = "output_structure", Setting, || Value::from(());
    MAX_TOKENS = "max_tokens", Sampling, || Value::from(());
    TOP_P = "top_p", Sampling, || Value::from(());
    PRESENCE_PENALTY = "presence_penalty", Sampling, || Value::from(());
    FREQUENCY_PENALTY = "frequency_penalty", Sampling, || Value::from(());
    TOP_K = "top_k", Sampling, || Value::from(());
    REPETITION_PENALTY = "repetition_penalty", Sampling, || Value::from(());
    STOP_SEQUENCES = "stop_sequences", Sampling, || Value::from(Vec::<Value>::new());
    SEED = "seed", Sampling, || Value::from(());
    LOGIT_BIAS = "logit_bias", Sampling, || {
        Value::from(std::collections::BTreeMap::<String, Value>::new())
    };
}

/// `await_input`: a post phase sets it to ask a person for input; the run pauses after
/// the phase and resets it to none (`spec/human.md`). Not a store slot: a run that never
/// asks has no such variable, so contexts and histories stay as they were.
pub const AWAIT_INPUT: &str = "await_input";
/// `human_input`: the answer to the last `await_input` (`spec/human.md`).
pub const HUMAN_INPUT: &str = "human_input";
/// The variables of people in the loop: known to the compiler (no unknown-variable
/// warning) and read by the machine by name, but absent from a run until it uses them.
pub const PAUSE_VARIABLES: [&str; 2] = [AWAIT_INPUT, HUMAN_INPUT];

/// `call_agent`: a phase sets it to `{'agent': name, 'context': {…}}` to run that agent
/// when the step ends; the run resets it to none (`spec/agents.md`). Not a store slot,
/// as [`AWAIT_INPUT`] is not.
pub const CALL_AGENT: &str = "call_agent";
/// `agent_result`: the final context of the last agent `call_agent` ran, with its
/// `status` and `error` (`spec/agents.md`).
pub const AGENT_RESULT: &str = "agent_result";
/// The variables of sub-agents: known to the compiler, absent from a run until it uses
/// them.
pub const AGENT_VARIABLES: [&str; 2] = [CALL_AGENT, AGENT_RESULT];

/// True if `name` can name an agent: 1 to 128 ASCII letters, digits, `-`, `_` and `.`,
/// so that it is a file stem (`<name>.apl`) and a URL path segment as it is.
pub fn is_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The number of variables kept in store slots.
pub(crate) const SLOTS: usize = VARIABLES.len();

/// The slots in name order, so the store can list its variables sorted without sorting.
pub(crate) const SLOTS_BY_NAME: [usize; SLOTS] = by_name();

/// The view holding the union of every variable (§2.4).
pub const CONTEXT: &str = "context";
/// The view holding the snapshots of finished steps (§2.4.2).
pub const CONTEXT_HISTORY: &str = "context_history";
/// The executor's read-only views: variables no template or option can set.
pub const VIEWS: [&str; 2] = [CONTEXT, CONTEXT_HISTORY];

/// The variables of §2.5 with their defaults, in the spec's order.
pub fn user_defaults() -> impl Iterator<Item = (&'static str, Value)> {
    VARIABLES
        .iter()
        .filter(|v| v.is_user_settable())
        .map(|v| (v.name, v.initial()))
}

/// The variables of one section, in the spec's order.
pub fn section(section: Section) -> impl Iterator<Item = &'static Variable> {
    VARIABLES.iter().filter(move |v| v.section == section)
}

/// The store slots of the `N` variables of `section`, in the spec's order, for a table
/// built at compile time; a build error if `N` is not their number.
pub(crate) const fn slots_of<const N: usize>(section: Section) -> [usize; N] {
    let mut out = [0; N];
    let (mut i, mut n) = (0, 0);
    while i < VARIABLES.len() {
        if VARIABLES[i].section as u8 == section as u8 {
            assert!(n < N, "more variables in the section than the table holds");
            out[n] = i;
            n += 1;
        }
        i += 1;
    }
    assert!(
        n == N,
        "fewer variables in the section than the table holds"
    );
    out
}

/// What a helper does with the variable its first argument names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Its first argument is not a variable name.
    None,
    /// It reads the variable.
    Reads,
    /// It writes the variable.
    Writes,
}

/// One template helper of §6.3 and §7.4.
#[derive(Clone, Copy, Debug)]
pub struct Helper {
    /// The name templates call it by.
    pub name: &'static str,
    /// What it does with the variable its first argument names.
    pub access: Access,
}

/// `set_context(name, value)`.
pub const SET_CONTEXT: &str = "set_context";
/// `get_context(name, default)`.
pub const GET_CONTEXT: &str = "get_context";
/// `add_context(name, value)`.
pub const ADD_CONTEXT: &str = "add_context";
/// `inc_context(name, amount)`.
pub const INC_CONTEXT: &str = "inc_context";
/// `get_json_path(value, path)`.
pub const GET_JSON_PATH: &str = "get_json_path";

/// The helper functions every template can call.
pub const HELPERS: &[Helper] = &[
    Helper {
        name: SET_CONTEXT,
        access: Access::Writes,
    },
    Helper {
        name: GET_CONTEXT,
        access: Access::Reads,
    },
    Helper {
        name: ADD_CONTEXT,
        access: Access::Writes,
    },
    Helper {
        name: INC_CONTEXT,
        access: Access::Writes,
    },
    Helper {
        name: GET_JSON_PATH,
        access: Access::None,
    },
];

/// The helper called `name`, if there is one.
pub fn helper(name: &str) -> Option<&'static Helper> {
    HELPERS.iter().find(|h| h.name == name)
}

/// Why a name cannot be given a value from outside the executor (by a helper, a
/// `with_context` option or an input declaration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsettable {
    /// The name is empty.
    Empty,
    /// It is one of the executor's views, [`CONTEXT`] or [`CONTEXT_HISTORY`].
    View,
    /// It is reserved for a future version of APL (§8).
    Reserved,
    /// It is a helper's name: the root context is looked up before globals, so a variable
    /// of that name would hide the helper.
    Helper,
}

impl Unsettable {
    /// Why a name of this kind cannot be set, in words for an error message.
    pub fn reason(self) -> &'static str {
        match self {
            Unsettable::View => "it is a view maintained by the executor",
            Unsettable::Reserved => "it is a reserved variable (§8)",
            Unsettable::Helper => "it is a built-in helper",
            Unsettable::Empty => "the name is empty",
        }
    }
}

/// Checks that `name` may be set by a helper or an option; the rule every side applies.
pub fn check_settable(name: &str) -> Result<(), Unsettable> {
    if name.is_empty() {
        Err(Unsettable::Empty)
    } else if VIEWS.contains(&name) {
        Err(Unsettable::View)
    } else if RESERVED_VARIABLES.contains(&name) {
        Err(Unsettable::Reserved)
    } else if helper(name).is_some() {
        Err(Unsettable::Helper)
    } else {
        Ok(())
    }
}

/// True when `s` can be written as a bare variable in a template: ASCII letters, digits
/// and `_`, not starting with a digit.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The store slot of the variable whose name constant is `$name` (`slot_of!(RUNS)`),
/// resolved at build time: the executor's hot paths write by slot
/// ([`Vars::set_slot`](crate::template::store::Vars::set_slot)) and skip matching the name.
macro_rules! slot_of {
    ($name:ident) => {
        const { $crate::names::index_of($crate::names::$name) }
    };
}
pub(crate) use slot_of;

/// The index of `name` in [`VARIABLES`]; a build error if it is missing.
pub(crate) const fn index_of(name: &str) -> usize {
    let mut i = 0;
    while i < VARIABLES.len() {
        if str_eq(VARIABLES[i].name, name) {
            return i;
        }
        i += 1;
    }
    panic!("not a variable")
}

/// The slots sorted by their variables' names (an insertion sort, run at build time).
const fn by_name() -> [usize; SLOTS] {
    let mut order = [0; SLOTS];
    let mut i = 0;
    while i < SLOTS {
        order[i] = i;
        i += 1;
    }
    let mut i = 1;
    while i < SLOTS {
        let mut j = i;
        while j > 0 && str_lt(VARIABLES[order[j]].name, VARIABLES[order[j - 1]].name) {
            let t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
            j -= 1;
        }
        i += 1;
    }
    order
}

const fn str_eq(a: &str, b: &str) -> bool {
    !str_lt(a, b) && !str_lt(b, a)
}

/// `a < b` in byte order, which is `str`'s order.
const fn str_lt(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut i = 0;
    while i < a.len() && i < b.len() {
        if a[i] != b[i] {
            return a[i] < b[i];
        }
        i += 1;
    }
    a.len() < b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_has_its_own_slot() {
        for (i, variable) in VARIABLES.iter().enumerate() {
            assert_eq!(slot(variable.name), Some(i), "{}", variable.name);
            assert!(is_identifier(variable.name));
        }
        assert_eq!(slot("custom"), None);
        assert_eq!(slot(CONTEXT), None, "the views are not stored");
    }

    #[test]
    fn slots_by_name_are_sorted_and_complete() {
        let names: Vec<&str> = SLOTS_BY_NAME.iter().map(|&i| VARIABLES[i].name).collect();
        let mut sorted: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }

    #[test]
    fn the_spec_tables_are_all_here() {
        // §2.4 lists 17 stored variables (and the two views), §2.5 fourteen.
        let count = |s| section(s).count();
        assert_eq!(count(Section::Executor) + count(Section::Result), 17);
        assert_eq!(user_defaults().count(), 14);
        assert_eq!(count(Section::Sampling), 10);
        let (name, model) = user_defaults().next().unwrap();
        assert_eq!((name, model), (MODEL, Value::from("gpt-4o")));
    }

    #[test]
    fn name_sets_are_disjoint() {
        for name in VARIABLES
            .iter()
            .map(|v| v.name)
            .chain(HELPERS.iter().map(|h| h.name))
            .chain(VIEWS)
        {
            assert!(!RESERVED_VARIABLES.contains(&name), "{name}");
        }
        for v in VARIABLES {
            assert_eq!(check_settable(v.name), Ok(()), "{}", v.name);
            assert!(helper(v.name).is_none() && !VIEWS.contains(&v.name));
        }
        assert_eq!(check_settable(""), Err(Unsettable::Empty));
        assert_eq!(check_settable(CONTEXT_HISTORY), Err(Unsettable::View));
        assert_eq!(check_settable("memory"), Err(Unsettable::Reserved));
        assert_eq!(check_settable(SET_CONTEXT), Err(Unsettable::Helper));
        assert_eq!(check_settable("x"), Ok(()));
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("_a1"));
        assert!(!is_identifier("1a"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier("é"));
    }
}

//! One-line docs of the names APL gives meaning to, for hover and completion: the
//! variables of §2.4 and §2.5 (spec/language.md §5), the helpers (§6.3, §7.4) and the
//! common filters.
//!
//! Names are the VM's constants (`aplc_vm::names`), never spelled again here; the tests
//! check that every variable and helper the VM knows has a line.

use aplc_vm::names::{self, *};

/// A built-in variable's type and meaning.
pub(crate) fn variable(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        PREV_STEP => ("string | none", "the step that ran before this one"),
        NEXT_STEP => (
            "string | none",
            "the step to run next; set it in a post phase (`return` ends the run)",
        ),
        RESULT_TEXT => ("string", "the text of the last provider answer"),
        RESULT_JSON => (
            "any | none",
            "the last answer parsed as JSON (with `output_mode` `json`)",
        ),
        RESULT_TOOL_CALLS => ("list", "the tool calls of the last answer"),
        RESULT_IMAGE_URLS => ("list", "the image URLs of the last answer"),
        RESULT_AUDIO_INPUTS => ("list", "the audio inputs of the last answer"),
        RESULT_FILES => ("list", "the files of the last answer"),
        RESULT_ROLE => ("string", "the role of the last answer"),
        USAGE => ("map | none", "the token usage of the last provider call"),
        RUNS => ("int", "how many times this step has run"),
        GLOBAL_RUNS => ("int", "how many steps the run has run in all"),
        TIME_ELAPSED => ("float", "seconds since this step started"),
        TIME_ELAPSED_GLOBAL => ("float", "seconds since the run started"),
        ERRORS => ("list", "the errors of the run so far"),
        PROMPTS => ("list", "the messages of the last provider call"),
        TOOLS => ("list", "the tools the run can call"),
        MODEL => ("string", "the model to call (default `gpt-4o`)"),
        TEMPERATURE => ("float | none", "sampling temperature for the provider"),
        ALLOWED_TOOLS => ("list", "the tools the next provider call may use"),
        OUTPUT_MODE => ("string | none", "`json` to ask for a JSON answer"),
        OUTPUT_STRUCTURE => ("map | none", "the JSON schema the answer must follow"),
        MAX_TOKENS => ("int | none", "the most tokens the answer may have"),
        TOP_P => ("float | none", "nucleus sampling for the provider"),
        PRESENCE_PENALTY => ("float | none", "presence penalty for the provider"),
        FREQUENCY_PENALTY => ("float | none", "frequency penalty for the provider"),
        TOP_K => ("int | none", "top-k sampling for the provider"),
        REPETITION_PENALTY => ("float | none", "repetition penalty for the provider"),
        STOP_SEQUENCES => ("list", "sequences that end the answer"),
        SEED => ("int | none", "sampling seed for the provider"),
        LOGIT_BIAS => ("map", "token biases for the provider"),
        CONTEXT => ("map", "a read-only view of every variable"),
        CONTEXT_HISTORY => ("list", "the context of every finished step"),
        AWAIT_INPUT => (
            "any | none",
            "set it in a post phase to ask a person for input",
        ),
        HUMAN_INPUT => ("any", "the answer to the last `await_input`"),
        CALL_AGENT => (
            "map | none",
            "set it to `{'agent': name, 'context': {…}}` to run that agent after the step",
        ),
        AGENT_RESULT => (
            "map",
            "the final context of the last agent `call_agent` ran",
        ),
        aplc_vm::dialect_names::CURRENT_STEP => {
            ("string", "the step running now (defuss-1.1 dialect)")
        }
        _ => return None,
    })
}

/// Every built-in variable name, for completion.
pub(crate) fn variable_names() -> impl Iterator<Item = &'static str> {
    names::VARIABLES
        .iter()
        .map(|v| v.name)
        .chain(names::VIEWS)
        .chain(names::PAUSE_VARIABLES)
        .chain(names::AGENT_VARIABLES)
}

/// A helper's signature and one line of doc (spec/language.md §4).
pub(crate) fn helper(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        SET_CONTEXT => ("set_context(name, value)", "writes the variable `name`"),
        GET_CONTEXT => (
            "get_context(name, default=None)",
            "the variable `name`, or `default` when it is unset",
        ),
        ADD_CONTEXT => (
            "add_context(name, value, default=0)",
            "adds `value` to the variable (numbers add, strings and lists concatenate)",
        ),
        INC_CONTEXT => ("inc_context(name, default=0)", "adds 1 to the variable"),
        GET_JSON_PATH => (
            "get_json_path(obj, path, default=None)",
            "the value at a dotted path (`items.0.title`) of `obj` (JSON text is parsed)",
        ),
        "range" => ("range([start,] stop[, step])", "a list of integers"),
        "dict" => ("dict(**kwargs)", "a map of the keyword arguments"),
        "namespace" => (
            "namespace(**kwargs)",
            "an object whose attributes `{% set %}` can change",
        ),
        _ => return None,
    })
}

/// Every helper name, for completion.
pub(crate) fn helper_names() -> impl Iterator<Item = &'static str> {
    names::HELPERS.iter().map(|h| h.name)
}

/// A filter's one line of doc; every filter of the environment is listed, the common
/// ones with a line of their own.
pub(crate) fn filter(name: &str) -> Option<&'static str> {
    if !aplc_vm::JINJA2_FILTERS.contains(&name) {
        return None;
    }
    Some(match name {
        "tojson" => "`value | tojson`: the value as JSON text (keys in insertion order)",
        "default" | "d" => "`value | default(other)`: `other` when the value is undefined",
        "length" | "count" => "`value | length`: the number of items or characters",
        "join" => "`list | join(sep)`: the items as text, separated by `sep`",
        "upper" => "`text | upper`: upper case",
        "lower" => "`text | lower`: lower case",
        "trim" => "`text | trim`: without leading and trailing white space",
        "first" => "`list | first`: the first item",
        "last" => "`list | last`: the last item",
        "replace" => "`text | replace(old, new)`: every `old` replaced by `new`",
        "int" => "`value | int`: the value as an integer",
        "float" => "`value | float`: the value as a float",
        "string" => "`value | string`: the value as text",
        "list" => "`value | list`: the value as a list",
        "map" => "`list | map(attribute=name)`: each item's attribute",
        "select" => "`list | select(test)`: the items that pass the test",
        "sort" => "`list | sort`: the items sorted",
        "truncate" => "`text | truncate(length)`: cut to `length` characters",
        _ => "a Jinja2 filter (see the Jinja2 documentation)",
    })
}

/// Every filter name, for completion.
pub(crate) fn filter_names() -> impl Iterator<Item = &'static str> {
    aplc_vm::JINJA2_FILTERS
        .iter()
        .copied()
        .filter(|f| f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_and_helper_has_a_line() {
        for name in variable_names() {
            assert!(variable(name).is_some(), "{name}");
        }
        for name in helper_names() {
            assert!(helper(name).is_some(), "{name}");
        }
        for name in filter_names() {
            assert!(filter(name).is_some(), "{name}");
        }
    }
}

#[cfg(test)]
mod grammar {
    /// The VS Code grammar highlights the built-in variables by name: it must list
    /// exactly the VM's (a variable added to the VM without it fails here).
    #[test]
    fn the_vscode_grammar_lists_every_built_in_variable() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../editors/vscode/syntaxes/jinja.tmLanguage.json"
        );
        let text = std::fs::read_to_string(path).expect("the grammar");
        let start = text
            .find("\\\\b(prev_step")
            .expect("the variables' pattern")
            + 4;
        let end = start + text[start..].find(")\\\\b").expect("its end");
        let mut listed: Vec<&str> = text[start..end].split('|').collect();
        let mut known: Vec<&str> = super::variable_names().collect();
        listed.sort_unstable();
        known.sort_unstable();
        assert_eq!(listed, known);
    }
}

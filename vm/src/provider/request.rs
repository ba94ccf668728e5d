//! The provider request, built from the context: the one place where §2.5's variables,
//! `output_mode` and `output_structure` become request fields.
//!
//! Providers read the typed [`ProviderRequest`] and never a context variable by name.
//! The messages and tool definitions come in already typed: the machine builds the
//! messages from the rendered role sections and the tool definitions from its registry.

use std::sync::Arc;

use minijinja::Value;
use minijinja::value::ValueKind;
use serde_json::Value as Json;

use crate::names::{self, slot_of};
use crate::provider::exchange::{
    Message, OutputFormat, ProviderError, ProviderErrorKind, ProviderRequest, Sampling,
    ToolDefinition,
};
use crate::template::store::Vars;
use crate::text::{json_kind as kind, value_kind};

/// Picks one field of a [`Sampling`].
type Field = fn(&mut Sampling) -> &mut Option<Json>;

/// The §2.5 variables that become [`Sampling`] fields, each with its store slot (read
/// on every provider call, so without matching the name) and its field.
const SAMPLING: [(&str, usize, Field); 10] = [
    (names::TEMPERATURE, slot_of!(TEMPERATURE), |s| {
        &mut s.temperature
    }),
    (names::MAX_TOKENS, slot_of!(MAX_TOKENS), |s| {
        &mut s.max_tokens
    }),
    (names::TOP_P, slot_of!(TOP_P), |s| &mut s.top_p),
    (names::PRESENCE_PENALTY, slot_of!(PRESENCE_PENALTY), |s| {
        &mut s.presence_penalty
    }),
    (names::FREQUENCY_PENALTY, slot_of!(FREQUENCY_PENALTY), |s| {
        &mut s.frequency_penalty
    }),
    (names::SEED, slot_of!(SEED), |s| &mut s.seed),
    (names::STOP_SEQUENCES, slot_of!(STOP_SEQUENCES), |s| {
        &mut s.stop_sequences
    }),
    (names::LOGIT_BIAS, slot_of!(LOGIT_BIAS), |s| {
        &mut s.logit_bias
    }),
    (names::TOP_K, slot_of!(TOP_K), |s| &mut s.top_k),
    (
        names::REPETITION_PENALTY,
        slot_of!(REPETITION_PENALTY),
        |s| &mut s.repetition_penalty,
    ),
];

/// Builds the request for `model` from the context (which the request keeps, read-only),
/// with the step's messages and the tools offered.
///
/// Fails (kind `invalid_request`) when no provider could encode the request: an
/// `output_structure` that is neither a map nor a string holding a JSON object, or a
/// sampling value that has no JSON form.
pub fn build_request(
    model: String,
    context: Vars,
    messages: Arc<[Message]>,
    tools: Arc<[ToolDefinition]>,
) -> Result<ProviderRequest, ProviderError> {
    Ok(ProviderRequest {
        model,
        messages,
        tools,
        sampling: sampling(&context)?,
        output: output_format(&context)?,
        context,
    })
}

/// Every sampling variable that is set.
fn sampling(context: &Vars) -> Result<Sampling, ProviderError> {
    let mut sampling = Sampling::default();
    for (name, slot, field) in SAMPLING {
        // An unset slot holds undefined, which `is_set` refuses like `Vars::get` would.
        let value = context.slot(slot);
        if is_set(value) {
            let json = serde_json::to_value(value)
                .map_err(|e| invalid_request(format!("`{name}` has no JSON form: {e}")))?;
            *field(&mut sampling) = Some(json);
        }
    }
    Ok(sampling)
}

/// `output_mode` `json` asks for a JSON object; `structured_output` for the schema in
/// `output_structure` (or, without one, for any JSON object). Other modes ask nothing:
/// the machine reports an unknown mode when the response comes.
fn output_format(context: &Vars) -> Result<OutputFormat, ProviderError> {
    match context.get(names::OUTPUT_MODE).and_then(|m| m.as_str()) {
        Some("json") => Ok(OutputFormat::JsonObject),
        Some("structured_output") => {
            let Some(structure) = context.get(names::OUTPUT_STRUCTURE).filter(|s| is_set(s)) else {
                return Ok(OutputFormat::JsonObject);
            };
            let schema = schema(structure)?;
            let name = schema
                .get("title")
                .and_then(Json::as_str)
                .filter(|t| is_schema_name(t))
                .unwrap_or("output")
                .to_owned();
            Ok(OutputFormat::JsonSchema { name, schema })
        }
        _ => Ok(OutputFormat::Text),
    }
}

/// The schema in `output_structure`: a map, or a string holding a JSON object.
fn schema(structure: &Value) -> Result<Json, ProviderError> {
    match structure.kind() {
        ValueKind::Map => serde_json::to_value(structure)
            .map_err(|e| invalid_request(format!("`output_structure` has no JSON form: {e}"))),
        ValueKind::String => {
            let text = structure.as_str().unwrap_or_default();
            let parsed: Json = serde_json::from_str(text).map_err(|e| {
                invalid_request(format!("`output_structure` is not valid JSON: {e}"))
            })?;
            if !parsed.is_object() {
                return Err(invalid_request(format!(
                    "`output_structure` must hold a JSON schema object, found {}",
                    kind(&parsed)
                )));
            }
            Ok(parsed)
        }
        _ => Err(invalid_request(format!(
            "`output_structure` must be a JSON schema object or a string holding one, found {}",
            value_kind(structure)
        ))),
    }
}

/// Whether `name` is a valid `json_schema.name` (`^[a-zA-Z0-9_-]{1,64}$`).
fn is_schema_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A variable counts as set unless it is none, undefined, or an empty string, list or
/// map (the "empty defaults" of §2.5: `stop_sequences = []`, `logit_bias = {}`).
fn is_set(value: &Value) -> bool {
    !(value.is_none() || value.is_undefined() || value.len() == Some(0))
}

#[cold]
fn invalid_request(message: String) -> ProviderError {
    ProviderError::new(ProviderErrorKind::InvalidRequest, message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::template::store::value_from_json;

    fn context(vars: Json) -> Vars {
        let mut context = Vars::new();
        for (name, value) in vars.as_object().unwrap() {
            context.insert(name.as_str(), value_from_json(value));
        }
        context
    }

    fn build(vars: Json) -> Result<ProviderRequest, ProviderError> {
        build_request("m".into(), context(vars), Arc::new([]), Arc::new([]))
    }

    /// The mapping covers exactly the name table's §2.5 sampling rows.
    #[test]
    fn every_sampling_variable_of_the_table_is_mapped_once() {
        let mut table: Vec<&str> = names::section(names::Section::Sampling)
            .map(|v| v.name)
            .collect();
        let mut mapped: Vec<&str> = SAMPLING.iter().map(|(name, _, _)| *name).collect();
        for (name, slot, _) in SAMPLING {
            assert_eq!(names::VARIABLES[slot].name, name, "the slot is the name's");
        }
        table.sort_unstable();
        mapped.sort_unstable();
        assert_eq!(mapped, table);
    }

    #[test]
    fn sampling_maps_every_variable_that_is_set() {
        let request = build(json!({
            "temperature": 0.2, "max_tokens": 50, "top_p": 0.9, "presence_penalty": 0.5,
            "frequency_penalty": -0.5, "seed": 0, "stop_sequences": ["END"],
            "logit_bias": {"1": -100}, "top_k": 40, "repetition_penalty": 1.1,
        }))
        .unwrap();
        let s = &request.sampling;
        assert_eq!(s.temperature, Some(json!(0.2)));
        assert_eq!(s.max_tokens, Some(json!(50)));
        assert_eq!(s.top_p, Some(json!(0.9)));
        assert_eq!(s.presence_penalty, Some(json!(0.5)));
        assert_eq!(s.frequency_penalty, Some(json!(-0.5)));
        assert_eq!(s.seed, Some(json!(0)));
        assert_eq!(s.stop_sequences, Some(json!(["END"])));
        assert_eq!(s.logit_bias, Some(json!({"1": -100})));
        assert_eq!(s.top_k, Some(json!(40)));
        assert_eq!(s.repetition_penalty, Some(json!(1.1)));
    }

    #[test]
    fn empty_and_none_values_are_unset() {
        let request = build(json!({
            "temperature": null, "stop_sequences": [], "logit_bias": {}, "seed": "",
        }))
        .unwrap();
        assert_eq!(request.sampling, Sampling::default());
        assert_eq!(request.output, OutputFormat::Text);
    }

    #[test]
    fn output_formats() {
        let schema = json!({"type": "object", "title": "Person"});
        let cases = [
            (json!({"output_mode": "text"}), OutputFormat::Text),
            (json!({"output_mode": "json"}), OutputFormat::JsonObject),
            (
                json!({"output_mode": "structured_output"}),
                OutputFormat::JsonObject,
            ),
            (
                json!({"output_mode": "structured_output", "output_structure": schema}),
                OutputFormat::JsonSchema {
                    name: "Person".into(),
                    schema: schema.clone(),
                },
            ),
            (
                json!({"output_mode": "structured_output",
                       "output_structure": "{\"title\": \"not a name!\"}"}),
                OutputFormat::JsonSchema {
                    name: "output".into(),
                    schema: json!({"title": "not a name!"}),
                },
            ),
            (json!({"output_mode": "other"}), OutputFormat::Text),
        ];
        for (vars, expected) in cases {
            assert_eq!(build(vars.clone()).unwrap().output, expected, "{vars}");
        }
    }

    #[test]
    fn unusable_output_structures_are_invalid_requests() {
        let cases = [
            (
                json!("{not json"),
                "`output_structure` is not valid JSON: key must be a string at line 1 column 2",
            ),
            (
                json!("[1]"),
                "`output_structure` must hold a JSON schema object, found an array",
            ),
            (
                json!(5),
                "`output_structure` must be a JSON schema object or a string holding one, \
                 found a number",
            ),
        ];
        for (structure, message) in cases {
            let error = build(json!({"output_mode": "structured_output",
                                     "output_structure": structure}))
            .unwrap_err();
            assert_eq!(error.kind, ProviderErrorKind::InvalidRequest);
            assert_eq!(error.message, message);
        }
    }
}

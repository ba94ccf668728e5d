//! An agent as an MCP tool: its name, description and `inputSchema`.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};

use crate::agents::Agent;

/// The tool that runs `agent`: named as `aplc serve` names the agent (its file name
/// without the extension), described by its bundle's description, or, without one, by
/// what it needs.
pub(super) fn tool_of(agent: &Agent) -> Tool {
    let description = agent
        .description
        .clone()
        .unwrap_or_else(|| default_description(agent));
    Tool::new(
        agent.name.clone(),
        description,
        Arc::new(input_schema(&agent.inputs)),
    )
}

/// The JSON Schema of a call's arguments: an object with every declared input required
/// and nothing else; any object when the agent declares no inputs (it reads whatever
/// variables its templates read, which the compiler cannot list for sure).
///
/// A declared input may be any JSON value (`null` included: only its absence fails a
/// run, spec/language.md §5), so each property is the empty schema.
pub(super) fn input_schema(inputs: &[String]) -> JsonObject {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), json!("object"));
    if inputs.is_empty() {
        return schema;
    }
    let properties: JsonObject = inputs
        .iter()
        .map(|input| (input.clone(), json!({})))
        .collect();
    schema.insert("properties".into(), Value::Object(properties));
    schema.insert("required".into(), json!(inputs));
    schema.insert("additionalProperties".into(), json!(false));
    schema
}

/// A description for an agent without one: what it is and what it takes.
fn default_description(agent: &Agent) -> String {
    if agent.inputs.is_empty() {
        format!("Runs the APL agent `{}`.", agent.name)
    } else {
        format!(
            "Runs the APL agent `{}` with its inputs: {}.",
            agent.name,
            agent.inputs.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_inputs_are_required_and_closed() {
        let schema = input_schema(&["topic".to_string(), "lines".to_string()]);
        assert_eq!(
            Value::Object(schema),
            json!({
                "type": "object",
                "properties": {"topic": {}, "lines": {}},
                "required": ["topic", "lines"],
                "additionalProperties": false,
            })
        );
    }

    #[test]
    fn without_a_declaration_any_object_goes() {
        assert_eq!(Value::Object(input_schema(&[])), json!({"type": "object"}));
    }
}

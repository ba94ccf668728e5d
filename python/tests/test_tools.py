"""Native tools: descriptor inference (§5.1.1), tool failures (§2.2.2) and the §6
helpers."""

import asyncio
import json
from typing import Dict, List, Optional

import pytest

import aplc
from conftest import response, tool_call

AGENT = """
# pre: go
{{ set_context('allowed_tools', allowed) }}

# prompt: go
## user
Use the tools.
"""


def add(x: int, y: int) -> int:
    """Add two integers and return the sum."""
    return x + y


def test_inference_matches_the_spec_example():
    assert aplc.infer_descriptor(add) == {
        "name": "add",
        "description": "Add two integers and return the sum.",
        "parameters": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "description": "x parameter"},
                "y": {"type": "integer", "description": "y parameter"},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    }


def test_inference_of_optional_defaults_containers_and_context():
    async def search(query: str, limit: int = 10, tags: Optional[List[str]] = None,
                     filters: Dict[str, str] = None, ratio: float = 0.5, exact: bool = False,
                     anything=None, context=None):
        """Search things.

        More words."""

    d = aplc.infer_descriptor(search)
    props = d["parameters"]["properties"]
    assert d["description"] == "Search things.\n\nMore words."
    assert d["parameters"]["required"] == ["query"]
    assert props["query"]["type"] == "string"
    assert props["limit"]["type"] == "integer"
    assert props["tags"]["type"] == ["array", "null"]
    assert props["filters"]["type"] == "object"
    assert props["ratio"]["type"] == "number"
    assert props["exact"]["type"] == "boolean"
    assert "type" not in props["anything"]
    assert "context" not in props


def run(tools, calls, allowed=("add",), **options):
    async def provider(context):
        return response("done", calls)

    return aplc.start_sync(AGENT, {
        "with_providers": {"gpt-4o": provider},
        "with_tools": tools,
        "with_context": {"allowed": list(allowed)},
        **options,
    })


def test_sync_and_async_tools_run_and_their_results_land():
    async def mul(a: int, b: int) -> int:
        """Multiply."""
        return a * b

    status = run(
        {"add": {"fn": add}, "mul": {"fn": mul}},
        [tool_call("1", "add", {"x": 1, "y": 2}), tool_call("2", "mul", {"a": 3, "b": 4})],
        allowed=("add", "mul"),
    )
    assert [(r["tool_call_id"], r["content"], r["with_error"]) for r in status["result_tool_calls"]] == [
        ("1", 3, False), ("2", 12, False),
    ]
    assert status["errors"] == []


def test_a_tool_exception_lands_in_errors_and_the_run_goes_on():
    def broken(x: int):
        """Fails."""
        raise KeyError("no such thing")

    status = run({"add": {"fn": add}, "broken": {"fn": broken}},
                 [tool_call("1", "broken", {"x": 1}), tool_call("2", "add", {"x": 1, "y": 1})],
                 allowed=("add", "broken"))
    first, second = status["result_tool_calls"]
    assert first["with_error"] is True and "KeyError" in json.dumps(first["content"])
    assert second == {"role": "tool", "tool_call_id": "2", "content": 2, "with_error": False}
    assert len(status["errors"]) == 1 and "no such thing" in status["errors"][0]
    assert status["result_text"] == "done"


def test_a_tool_result_that_is_not_json_is_a_clear_tool_error():
    def weird(x: int):
        """Returns a set."""
        return {object()}

    status = run({"weird": {"fn": weird}}, [tool_call("1", "weird", {"x": 1})], allowed=("weird",))
    [result] = status["result_tool_calls"]
    assert result["with_error"] is True
    assert "not JSON-serialisable" in json.dumps(result["content"])
    assert "not JSON-serialisable" in status["errors"][0]


def test_arguments_are_checked_against_the_descriptor_before_the_tool_runs():
    calls = []

    def record(x: int):
        """Records."""
        calls.append(x)
        return x

    status = run({"record": {"fn": record}}, [tool_call("1", "record", {"x": "not an int"})], allowed=("record",))
    assert calls == []
    assert status["result_tool_calls"][0]["with_error"] is True


def test_an_explicit_descriptor_is_used_as_given():
    def lookup(**kwargs):
        return kwargs

    descriptor = {
        "name": "lookup",
        "description": "Looks up.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    }
    seen = []

    async def provider(context):
        seen.append(aplc.describe_tools(context))
        return response("", [tool_call("1", "lookup", {"key": "k"})])

    status = aplc.start_sync(AGENT, {
        "with_providers": {"gpt-4o": provider},
        "with_tools": {"lookup": {"fn": lookup, "descriptor": descriptor}},
        "with_context": {"allowed": ["lookup"]},
    })
    assert status["result_tool_calls"][0]["content"] == {"key": "k"}
    assert seen == [[{"type": "function", "function": descriptor}]]


def test_bad_tool_configs_are_refused_before_the_run():
    with pytest.raises(TypeError):
        run({"add": add}, [])
    with pytest.raises(TypeError):
        run({"add": {"fn": 3}}, [])
    with pytest.raises(ValueError):
        run({"add": {"fn": add, "descriptor": {"name": "other", "parameters": {"type": "object"}}}}, [])


def test_helpers_describe_call_and_validate():
    async def calc(num1: int, num2: int, context=None):
        """Return the arithmetic sum of two numbers."""
        return num1 + num2

    context = {"with_tools": {"calc": {"fn": calc, "with_context": True}, "add": {"fn": add}},
               "allowed_tools": ["calc"], "errors": []}
    tools = aplc.describe_tools(context)
    assert [t["function"]["name"] for t in tools] == ["calc"]
    assert context["tools"] == tools

    async def calls():
        ok = await aplc.call_tool(tool_call("c1", "calc", {"num1": 40, "num2": 2}), context)
        unknown = await aplc.call_tool(tool_call("c2", "nope", {}), context)
        both = await aplc.call_tools([tool_call("c3", "calc", {"num1": 1, "num2": 1}),
                                      tool_call("c4", "add", {"x": 1, "y": 1})], context)
        return ok, unknown, both

    ok, unknown, both = asyncio.run(calls())
    assert ok == {"role": "tool", "tool_call_id": "c1", "content": 42, "with_error": False}
    assert unknown["with_error"] is True and unknown["content"] == "Unknown tool: nope"
    assert both[0]["content"] == 2 and both[1]["with_error"] is True  # add is not allowed

    context["output_structure"] = json.dumps({"type": "object", "required": ["a"],
                                              "properties": {"a": {"type": "integer"}}})
    assert aplc.validate_schema({"a": 1}, context) is True
    with pytest.raises(aplc.SchemaValidationError):
        aplc.validate_schema({"a": "x"}, context)
    assert len(context["errors"]) == 1 and "schema validation failed" in context["errors"][0]
    assert aplc.validate_schema({"anything": 1}, {"output_structure": None}) is True

"""Agents that call agents from Python (spec/agents.md): ``agents`` gives a run the
programs it may call by name, for ``call_agent`` and for agent tools of a manifest;
``max_agent_depth`` bounds recursion; a durable run keeps its agents in its store."""

import json
from pathlib import Path

import pytest

import aplc
from conftest import response, tool_call

TREE = Path(__file__).resolve().parents[2] / "fixtures" / "agents" / "tree"


def program(name):
    source = (TREE / f"{name}.apl").read_text()
    inputs = ("topic",)
    return aplc.Program.from_source(source, inputs=inputs)


def echo(seen):
    """A provider that answers each prompt with "answer to: PROMPT" and logs it."""

    def provider(context):
        prompt = context["prompts"][-1]["content"].strip()
        seen.append(prompt)
        return response(f"answer to: {prompt}")

    return provider


def tree_options(seen, **more):
    return {
        "with_providers": {"*": echo(seen)},
        "with_context": {"topic": "refunds"},
        "agents": {"mid": program("mid"), "leaf": program("leaf")},
        **more,
    }


def test_a_tree_of_agents_runs_in_call_order():
    seen = []
    events = []
    context = aplc.start_sync(
        program_source("root"), tree_options(seen, on_event=events.append)
    )
    assert seen == [
        "Root asks about refunds",
        "Mid asks about refunds",
        "Leaf turn 0 on refunds (detail)",
        "Leaf turn 1 on refunds (detail)",
        "Leaf turn 2 on refunds (detail)",
        "Mid done: answer to: Leaf turn 2 on refunds (detail)",
        "Root done: answer to: Mid done: answer to: Leaf turn 2 on refunds (detail) (completed)",
    ]
    assert context["agent_result"]["status"] == "completed"
    assert context["agent_result"]["agent_result"]["result_text"] == (
        "answer to: Leaf turn 2 on refunds (detail)"
    )
    paths = [e.get("path") for e in events if e["type"] == "provider_call"]
    assert paths == [None, "mid", "mid/leaf", "mid/leaf", "mid/leaf", "mid", None]


def program_source(name):
    return (TREE / f"{name}.apl").read_text()


def test_an_unknown_agent_and_the_depth_limit_fail_the_call_not_the_run():
    seen = []
    options = tree_options(seen)
    del options["agents"]["leaf"]
    context = aplc.start_sync(program_source("root"), options)
    inner = context["agent_result"]["agent_result"]
    assert inner["status"] == "failed"
    assert "unknown agent `leaf`" in inner["error"]

    context = aplc.start_sync(program_source("root"), tree_options([], max_agent_depth=1))
    inner = context["agent_result"]["agent_result"]
    assert inner["status"] == "failed"
    assert "past the limit of 1" in inner["error"]


def test_agents_must_be_programs():
    with pytest.raises(TypeError, match="agents"):
        aplc.start_sync(program_source("root"), {"agents": {"mid": "mid.apl"}})


def test_a_manifest_agent_tool_takes_the_agents_inputs(tmp_path):
    manifest = tmp_path / "tools.json"
    manifest.write_text(json.dumps({"research": {"agent": "leaf"}}))
    offered = []
    answers = [
        response("", [tool_call("c1", "research", {"topic": "tea"})]),
        response("leaf 0"),
        response("leaf 1"),
        response("leaf 2"),
        response("done"),
    ]

    def provider(context):
        offered.append(context["tools"])
        return answers.pop(0)

    context = aplc.start_sync(
        "# prompt: ask\n## user\nResearch tea.\n",
        {
            "with_providers": {"*": provider},
            "with_tools": str(manifest),
            "agents": {"leaf": program("leaf")},
        },
    )
    tool = offered[0][0]["function"]
    assert tool["name"] == "research"
    assert tool["parameters"]["required"] == ["topic"]
    assert tool["description"] == "The leaf: three turns on the topic."
    assert context["result_tool_calls"][0]["content"] == "leaf 2", context["result_tool_calls"]


ASKER = """{# inputs: topic #}
# prompt: ask
## user
Ask about {{ topic }}

# post: ask
{{ set_context('await_input', {'prompt': 'Go on with ' ~ topic ~ '?'}) }}
"""

PARENT = """{# inputs: topic #}
# prompt: start
## user
Start {{ topic }}

# post: start
{{ set_context('call_agent', {'agent': 'asker', 'context': {'topic': topic}}) }}
{{ set_context('next_step', 'end') }}

# prompt: end
## user
The person said {{ agent_result.human_input }}
"""


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'runs.db'}"
    return request.getfixturevalue("postgres").database("agents")


def test_a_child_that_asks_pauses_a_durable_run_which_resumes_without_its_agents(store):
    seen = []
    asked = []

    def later(request):
        asked.append(request)
        return aplc.LATER

    options = {
        "with_providers": {"*": echo(seen)},
        "with_context": {"topic": "tea"},
        "agents": {"asker": aplc.Program.from_source(ASKER, inputs=("topic",))},
        "on_input": later,
        "store": store,
        "run_id": "paused-in-child",
    }
    with pytest.raises(aplc.RunWaiting):
        aplc.start_sync(PARENT, options)
    assert [r["id"] for r in asked] == ["asker/1-0"]
    assert asked[0]["agent"] == "asker"
    aplc.answer(store, "paused-in-child", "asker/1-0", "yes please")
    # No `agents`: the store's bundle links the agents the run started with.
    context = aplc.resume_sync(store, "paused-in-child", {"with_providers": {"*": echo(seen)}})
    assert context["agent_result"]["human_input"] == "yes please"
    assert context["result_text"] == "answer to: The person said yes please"
    # Each call once: the pause repeated none.
    assert seen == ["Start tea", "Ask about tea", "The person said yes please"]

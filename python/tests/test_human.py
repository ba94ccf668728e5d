"""People in the loop (spec/human.md §4.3): ``on_input`` answers approvals, human tools
and ``await_input``, sync or async; a bad answer is a ValueError naming the request;
without ``on_input`` a run that asks fails."""

import asyncio
import json
import time
from pathlib import Path

import pytest

import aplc
from conftest import response, tool_call

HUMAN = Path(__file__).resolve().parents[2] / "fixtures" / "human"

AGENT = """
# pre: act
{% if get_context('transcript') is none %}{{ set_context('transcript', []) }}{% endif %}

# prompt: act
## user
Refund the orders.
## tool_result
{% for call in transcript %}{{ call.tool_call_id }}: {{ call.content }}
{% endfor %}

# post: act
{{ set_context('transcript', transcript + result_tool_calls) }}
{% if runs < 2 %}{{ set_context('next_step', 'act') }}{% else %}
{{ set_context('await_input', {'prompt': 'Send the summary?', 'schema': {'type': 'boolean'}}) }}
{{ set_context('next_step', 'report') }}{% endif %}

# prompt: report
## user
Confirmed: {{ human_input }}
"""


def scripted(answers, seen=None):
    answers = list(answers)

    def provider(context):
        if seen is not None:
            seen.append(context["prompts"])
        return answers.pop(0)

    return provider


def first_turn():
    return response(
        "refunding",
        [
            tool_call("c1", "refund", {"order": "A-17", "amount": 20}),
            tool_call("c2", "refund", {"order": "B-2", "amount": 500}),
            tool_call("c3", "ask_user", {"question": "Why 500?"}),
        ],
    )


@pytest.fixture(autouse=True)
def tool_log(tmp_path, monkeypatch):
    """fixtures/human/tool.py appends each call it runs to this file."""
    log = tmp_path / "tools.log"
    monkeypatch.setenv("APLC_TOOL_LOG", str(log))
    return log


def options(on_input, seen=None):
    return {
        "with_providers": {"*": scripted([first_turn(), response("done"), response("sent")], seen)},
        "with_tools": str(HUMAN / "tools.json"),
        "on_input": on_input,
    }


def test_on_input_answers_every_kind(tool_log):
    asked = []

    def person(request):
        asked.append(request)
        if request["kind"] == "approval":
            return request["arguments"]["amount"] < 100 or {"approve": False, "reason": "too much"}
        if request["kind"] == "tool":
            return "the customer said so"
        return True

    seen = []
    context = aplc.start_sync(AGENT, options(person, seen))
    kinds = [(r["id"], r["kind"]) for r in asked]
    assert kinds == [("1-1", "approval"), ("1-2", "approval"), ("1-3", "tool"), ("2-0", "input")]
    assert asked[0]["tool"] == "refund" and asked[0]["arguments"] == {"order": "A-17", "amount": 20}
    assert asked[3]["prompt"] == "Send the summary?" and asked[3]["schema"] == {"type": "boolean"}
    first = context["context_history"][0]["result_tool_calls"]
    assert first[0]["with_error"] is False
    assert first[1]["content"] == "tool execution failed: `refund`: denied by reviewer: too much"
    assert first[2]["content"] == "the customer said so"
    assert context["human_input"] is True
    assert context["result_text"] == "sent"
    # The approved refund ran once; the denied one never ran.
    runs = [json.loads(line) for line in tool_log.read_text().splitlines()]
    assert [r["arguments"]["order"] for r in runs] == ["A-17"]
    # The model's next prompt carries the denial.
    assert "denied by reviewer: too much" in json.dumps(seen[1])


def test_an_async_on_input_and_the_clock_standing_still():
    async def person(request):
        await asyncio.sleep(1.0)
        return True if request["kind"] != "tool" else "ok"

    started = time.monotonic()
    opts = options(person)
    # Shorter than the four answers take together: waiting does not count.
    opts["timeout"] = 3000
    context = asyncio.run(aplc.start(AGENT, opts))
    assert time.monotonic() - started > 4.0
    assert context["result_text"] == "sent"


def test_a_bad_answer_names_the_request():
    def person(request):
        return {"input": "yes", "tool": "ok"}.get(request["kind"], True)

    opts = options(person)
    with pytest.raises(ValueError, match=r"`2-0`.*does not match its schema"):
        aplc.start_sync(AGENT, opts)
    with pytest.raises(ValueError, match=r"approval request '1-1' must be True, False"):
        aplc.start_sync(AGENT, options(lambda request: "sure"))


def test_without_on_input_a_run_that_asks_fails():
    opts = options(None)
    del opts["on_input"]
    with pytest.raises(aplc.RunError) as raised:
        aplc.start_sync(AGENT, opts)
    assert raised.value.kind == "input_unavailable"
    assert "the run needs input (1-1 (approval" in str(raised.value)
    with pytest.raises(TypeError, match="on_input"):
        aplc.start_sync(AGENT, {"on_input": 3})

"""Durable runs in Python wait for a person (spec/human.md §4.3): a run with a store that
asks pauses (``RunWaiting``), its requests are answered later through the same store
(``aplc.answer``) and it goes on with ``aplc.resume``, ending as a run answered at once,
with no provider call repeated and the approved tool run once. Each test runs on a
SQLite file and on a throwaway PostgreSQL server (``pg.py``)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aplc
from conftest import response, tool_call
from test_human import AGENT, HUMAN, first_turn

#: The answers every test gives: the small refund approved, the large one denied, the
#: human tool's question and the closing confirmation answered.
ANSWERS = {
    "1-1": True,
    "1-2": {"approve": False, "reason": "too much"},
    "1-3": "the customer said so",
    "2-0": True,
}


class Model:
    """A scripted Python provider that counts its calls: one object across a start and
    its resumes, so a repeated call shows as one answer too many."""

    def __init__(self):
        self.answers = [first_turn(), response("done"), response("sent")]
        self.calls = []

    def __call__(self, context):
        self.calls.append(context["prompts"])
        return self.answers.pop(0)

    @staticmethod
    def replay(log, context):
        """The same script across processes: the calls so far are the lines of ``log``."""
        with open(log, "a+") as f:
            f.seek(0)
            n = len(f.readlines())
            f.write(json.dumps(context["prompts"]) + "\n")
        return Model().answers[n]


@pytest.fixture(autouse=True)
def tool_log(tmp_path, monkeypatch):
    """fixtures/human/tool.py appends each call it runs to this file."""
    log = tmp_path / "tools.log"
    monkeypatch.setenv("APLC_TOOL_LOG", str(log))
    return log


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'runs.db'}"
    return request.getfixturevalue("postgres").database("human")


def options(model, **more):
    return {"with_providers": {"*": model}, "with_tools": str(HUMAN / "tools.json"), **more}


def person(request):
    return ANSWERS[request["id"]]


def ran(tool_log):
    if not tool_log.exists():
        return []
    return [json.loads(line)["arguments"]["order"] for line in tool_log.read_text().splitlines()]


def timeless(value):
    """``value`` without the fields that measure time, which differ between any two runs."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if "time" not in k}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def answered_at_once(tool_log):
    """The reference: the same run, in memory, every request answered by ``on_input``."""
    context = aplc.start_sync(AGENT, options(Model(), on_input=person))
    tool_log.unlink()
    return context


def test_the_three_kinds_wait_and_are_answered_later(store, tool_log):
    expected = answered_at_once(tool_log)
    model, events = Model(), []
    with pytest.raises(aplc.RunWaiting) as waiting:
        aplc.start_sync(AGENT, options(model, store=store, run_id="r1", on_event=events.append))
    assert not isinstance(waiting.value, aplc.RunError)
    assert (waiting.value.run_id, waiting.value.store) == ("r1", store)
    pending = waiting.value.pending
    assert [(r["id"], r["kind"]) for r in pending] == [("1-1", "approval"), ("1-2", "approval")]
    assert pending[0]["tool"] == "refund" and pending[0]["arguments"] == {"order": "A-17", "amount": 20}
    assert pending[0]["timeout_ms"] == 3600000 and pending[0]["requested_at"].endswith("Z")
    assert "requested_at_ms" not in pending[0]
    assert "1-1 (approval: Approve a call of `refund`" in str(waiting.value)
    # Every event reached on_event, in order, before start raised.
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["id"] for e in events if e["type"] == "input_requested"] == ["1-1", "1-2"]
    assert len(model.calls) == 1 and ran(tool_log) == []

    # A few answers at a time: the run waits again on the rest, and nothing ran yet.
    assert aplc.answer(store, "r1", "1-1", True) == ["1-2"]
    with pytest.raises(aplc.RunWaiting) as waiting:
        aplc.resume_sync(store, "r1", options(model))
    assert [r["id"] for r in waiting.value.pending] == ["1-2"]
    assert len(model.calls) == 1 and ran(tool_log) == []

    # Both approvals answered: the round runs up to the human tool, which asks.
    assert aplc.answer(store, "r1", "1-2", ANSWERS["1-2"], by="reviewer") == []
    with pytest.raises(aplc.RunWaiting) as waiting:
        asyncio.run(aplc.resume(store, "r1", options(model)))
    assert [(r["id"], r["kind"]) for r in waiting.value.pending] == [("1-3", "tool")]
    assert waiting.value.pending[0]["schema"] == {"type": "string"}
    assert len(model.calls) == 1 and ran(tool_log) == ["A-17"]

    assert aplc.answer(store, "r1", "1-3", ANSWERS["1-3"]) == []
    with pytest.raises(aplc.RunWaiting) as waiting:
        aplc.resume_sync(store, "r1", options(model))
    assert [(r["id"], r["kind"]) for r in waiting.value.pending] == [("2-0", "input")]
    assert len(model.calls) == 2 and ran(tool_log) == ["A-17"]

    assert aplc.answer(store, "r1", "2-0", True) == []
    events.clear()
    context = aplc.resume_sync(store, "r1", options(model, on_event=events.append))
    assert timeless(context) == timeless(expected)
    assert context["result_text"] == "sent" and context["human_input"] is True
    # No provider call was repeated, and the approved refund ran once, the denied never.
    assert len(model.calls) == 3 and model.answers == []
    assert ran(tool_log) == ["A-17"]
    assert "denied by reviewer: too much" in json.dumps(model.calls[1])
    assert events[-1]["type"] == "run_finished"
    received = [e for e in events if e["type"] == "input_received"]
    assert [(e["id"], e["by"]) for e in received] == [("2-0", "python")]


def test_bad_answers_raise_and_change_nothing(store, tool_log):
    model = Model()
    with pytest.raises(aplc.RunWaiting):
        aplc.start_sync(AGENT, options(model, store=store, run_id="r2"))
    bad = [
        (("nope", "1-1", True), r"no run `nope`"),
        (("r2", "9-9", True), r"run `r2` waits for no request `9-9` .*it waits for 1-1, 1-2"),
        (("r2", "1-3", True), r"run `r2` waits for no request `1-3`"),
        (("r2", "1-1", "yes"), r"answer: the answer to approval request '1-1' must be True, False"),
        (("r2", "1-2", {"approve": "no"}), r"answer: the answer to approval request '1-2' must be True"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            aplc.answer(store, *args)
    with pytest.raises(ValueError, match="invalid store URL"):
        aplc.answer("mysql://x", "r2", "1-1", True)
    assert aplc.answer(store, "r2", "1-1", True) == ["1-2"]
    with pytest.raises(ValueError, match="request `1-1` of run `r2` is already answered"):
        aplc.answer(store, "r2", "1-1", False)
    # A resume keeps the run's own options and needs the tools it started with.
    with pytest.raises(ValueError, match="'timeout' belong to the run"):
        aplc.resume_sync(store, "r2", {**options(model), "timeout": 5})
    with pytest.raises(ValueError, match="cannot resume with these tools"):
        aplc.resume_sync(store, "r2", {"with_providers": {"*": model}})
    with pytest.raises(ValueError, match="a run `r2` already exists"):
        aplc.start_sync(AGENT, options(model, store=store, run_id="r2"))
    with pytest.raises(ValueError, match="needs option 'store'"):
        aplc.start_sync(AGENT, options(model, run_id="r2"))
    # Nothing of the above changed the run: it waits on the request left.
    with pytest.raises(aplc.RunWaiting) as waiting:
        aplc.resume_sync(store, "r2", options(model))
    assert [r["id"] for r in waiting.value.pending] == ["1-2"]
    assert len(model.calls) == 1 and ran(tool_log) == []
    # A value is checked against the request's schema.
    aplc.answer(store, "r2", "1-2", False)
    with pytest.raises(aplc.RunWaiting):
        aplc.resume_sync(store, "r2", options(model))
    for value in (5, {"approve": True}):
        with pytest.raises(ValueError, match=r"the answer to `1-3` does not match its schema: .* is not of type"):
            aplc.answer(store, "r2", "1-3", value)

    context = aplc.resume_sync(store, "r2", options(model, on_input=person))
    assert context["result_text"] == "sent"
    with pytest.raises(ValueError, match="run `r2` is finished"):
        aplc.answer(store, "r2", "2-0", True)


def test_an_async_on_input_answers_a_durable_run_in_process(store, tool_log):
    expected = answered_at_once(tool_log)

    async def slow_person(request):
        await asyncio.sleep(0.7)
        return ANSWERS[request["id"]]

    model = Model()
    # Shorter than the four answers take together: the run's clock stands still while
    # it waits.
    opts = options(model, store=store, on_input=slow_person, timeout=2000)
    context = asyncio.run(aplc.start(AGENT, opts))
    assert timeless(context) == timeless(expected)
    assert len(model.calls) == 3 and ran(tool_log) == ["A-17"]


def test_on_input_may_leave_requests_for_later(store, tool_log):
    def approver(request):
        return ANSWERS[request["id"]] if request["kind"] == "approval" else aplc.LATER

    model = Model()
    program = aplc.Program.from_source(AGENT)
    with pytest.raises(aplc.RunWaiting) as waiting:
        program.start_sync(options(model, store=store, run_id="r3", on_input=approver))
    assert [r["id"] for r in waiting.value.pending] == ["1-3"]
    assert aplc.answer(store, "r3", "1-3", "because") == []

    def broken(request):
        raise KeyError("nobody home")

    # What on_input raises reaches the caller; the run waits in its store, unchanged.
    with pytest.raises(aplc.RunWaiting):
        aplc.resume_sync(store, "r3", options(model))
    with pytest.raises(KeyError, match="nobody home"):
        aplc.resume_sync(store, "r3", options(model, on_input=broken))
    # An answer that does not fit is refused the same way.
    with pytest.raises(ValueError, match=r"on_input: the answer to `2-0` does not match its schema"):
        aplc.resume_sync(store, "r3", options(model, on_input=lambda request: "yes"))
    context = aplc.resume_sync(store, "r3", options(model, on_input=person))
    assert context["result_text"] == "sent" and len(model.calls) == 3 and ran(tool_log) == ["A-17"]

    # In memory a request left for later cannot wait: the run fails as without on_input.
    with pytest.raises(aplc.RunError, match="the run needs input"):
        aplc.start_sync(AGENT, options(Model(), on_input=approver))


def test_a_python_call_past_the_deadline_is_cancelled(store):
    cancelled = asyncio.Event()

    async def stuck(context):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return response("late")

    async def main():
        with pytest.raises(aplc.RunError) as failed:
            await aplc.start("# prompt: a\n## user\nHi\n", {"with_providers": {"*": stuck}, "store": store, "timeout": 500})
        assert failed.value.kind == "timeout"
        # The run stopped waiting for the provider: its task was cancelled.
        await asyncio.wait_for(cancelled.wait(), 30)

    asyncio.run(main())


def test_run_waiting_shows_a_prompt_with_its_control_characters_escaped():
    waiting = aplc.RunWaiting("r", [{"id": "2-0", "kind": "input", "prompt": "ok?\x1b[2J\nsure"}], "sqlite:x")
    assert str(waiting) == "run 'r' waits for input: 2-0 (input: ok?\\x1b[2J\\nsure)"
    assert waiting.pending[0]["prompt"] == "ok?\x1b[2J\nsure"


def test_python_tools_run_in_a_durable_run_once(store, tool_log):
    noted = []

    async def note(text: str) -> str:
        """Notes something down."""
        noted.append(text)
        return f"noted {text}"

    manifest = json.loads((HUMAN / "tools.json").read_text())
    for entry in manifest.values():
        if "cwd" in entry:
            entry["cwd"] = str(HUMAN)
    tools = {"mcpServers": {}, **manifest, "note": {"fn": note}}
    model = Model()
    model.answers = [response("noting", [tool_call("n1", "note", {"text": "A-17"})]), response("done"), response("sent")]
    with pytest.raises(aplc.RunWaiting) as waiting:
        aplc.start_sync(AGENT, {"with_providers": {"*": model}, "with_tools": tools, "store": store, "run_id": "r5"})
    assert [r["id"] for r in waiting.value.pending] == ["2-0"]
    assert noted == ["A-17"] and len(model.calls) == 2
    assert aplc.answer(store, "r5", "2-0", False) == []
    context = aplc.resume_sync(store, "r5", {"with_providers": {"*": model}, "with_tools": tools})
    assert context["result_text"] == "sent" and context["human_input"] is False
    assert context["context_history"][0]["result_tool_calls"][0]["content"] == "noted A-17"
    assert noted == ["A-17"] and len(model.calls) == 3


CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import aplc
from test_human import AGENT, HUMAN
from test_human_durable import Model

store, calls, asked = sys.argv[2:5]


def model(context):
    return Model.replay(calls, context)


def person(request):
    with open(asked, "a") as f:
        f.write(request["id"] + "\\n")
    time.sleep(600)


aplc.start_sync(AGENT, {"with_providers": {"*": model}, "with_tools": str(HUMAN / "tools.json"),
                        "store": store, "run_id": "k1", "on_input": person})
"""


def test_a_run_killed_while_on_input_asks_is_answered_and_resumed_elsewhere(store, tool_log, tmp_path):
    """SIGKILL while ``on_input`` thinks: the requests were committed before it was
    asked, so another process answers them and goes on, repeating no call."""
    calls, asked = tmp_path / "calls.log", tmp_path / "asked.log"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(Path(__file__).parent), store, str(calls), str(asked)])
    try:
        deadline = time.monotonic() + 120
        while not (asked.exists() and asked.read_text()) and time.monotonic() < deadline:
            assert child.poll() is None, "the child ended before it asked"
            time.sleep(0.05)
        assert asked.read_text().split() == ["1-1"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(60)

    def model(context):
        return Model.replay(calls, context)

    def go_on(opts):
        # The dead process's lease is released by its store (a closed connection).
        deadline = time.monotonic() + 60
        while True:
            try:
                return aplc.resume_sync(store, "k1", opts)
            except ValueError as e:
                if "another process" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    assert aplc.answer(store, "k1", "1-1", True) == ["1-2"]
    assert aplc.answer(store, "k1", "1-2", ANSWERS["1-2"]) == []
    context = go_on(options(model, on_input=person))
    assert context["result_text"] == "sent"
    assert len(calls.read_text().splitlines()) == 3
    assert ran(tool_log) == ["A-17"]

"""How a run is driven on the caller's event loop: Rust providers that answer at once
(polled on the loop's thread) or later (on the tokio runtime), their streamed deltas,
timeouts and cancellation during such a call, and the per-call timer of Python < 3.11."""

import asyncio
import time

import pytest

import aplc
import aplc._runtime
from conftest import response

ONE_STEP = """
# prompt: ask
## user
Hello
"""

LOOP = """
# prompt: again
## user
x

# post: again
{% if global_runs < 3 %}{{ set_context('next_step', 'again') }}{% endif %}
"""


def mock(*answers, latency_ms=0, stream=False):
    route = {"model": "*", "kind": "mock", "responses": list(answers), "stream": stream}
    if latency_ms:
        route["latency_ms"] = latency_ms
    return {"routes": [route]}


@pytest.mark.parametrize("latency_ms", [0, 20], ids=["answers-at-once", "answers-later"])
def test_a_rust_providers_deltas_reach_on_event_in_order(latency_ms):
    events = []
    status = aplc.start_sync(
        LOOP,
        {"providers": mock("one", "two", "three", latency_ms=latency_ms, stream=True), "on_event": events.append},
    )
    assert status["result_text"] == "three"
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    # Each call's delta comes after its provider_call and before its provider_result.
    calls = [i for i, k in enumerate(kinds) if k == "provider_call"]
    results = [i for i, k in enumerate(kinds) if k == "provider_result"]
    deltas = [i for i, k in enumerate(kinds) if k == "provider_delta"]
    assert len(calls) == len(results) == len(deltas) == 3
    assert all(c < d < r for c, d, r in zip(calls, deltas, results))
    assert [events[i]["text"] for i in deltas] == ["one", "two", "three"]
    assert [events[d]["seq"] for d in deltas] == [events[c]["seq"] for c in calls]


def test_without_a_listener_a_rust_provider_answers_the_same():
    for latency_ms in (0, 20):
        status = aplc.start_sync(LOOP, {"providers": mock("a", "b", "c", latency_ms=latency_ms, stream=True)})
        assert status["result_text"] == "c"
        assert len(status["context_history"]) == 3


def test_a_rust_provider_slower_than_the_timeout_times_the_run_out():
    started = time.monotonic()
    with pytest.raises(aplc.RunError) as info:
        aplc.start_sync(ONE_STEP, {"providers": mock("late", latency_ms=60_000), "timeout": 200})
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 30


def test_cancelling_the_task_during_a_rust_provider_call_cancels_the_run():
    async def main():
        task = asyncio.ensure_future(aplc.start(ONE_STEP, {"providers": mock("late", latency_ms=3_600_000)}))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await aplc.start(ONE_STEP, {"providers": mock("still fine")})

    assert asyncio.run(asyncio.wait_for(main(), 30))["result_text"] == "still fine"


def test_python_and_rust_providers_mix_in_one_run():
    agent = """
# prompt: a
## user
x

# post: a
{{ set_context('from_python', result_text) }}
{{ set_context('model', 'routed') }}
{{ set_context('next_step', 'b') }}

# prompt: b
## user
y
"""

    async def python_provider(context):
        return response("from python")

    config = {"routes": [{"model": "routed", "kind": "mock", "responses": ["from rust"], "latency_ms": 5}]}
    status = aplc.start_sync(agent, {"with_providers": {"gpt-4o": python_provider}, "providers": config})
    assert status["from_python"] == "from python"
    assert status["result_text"] == "from rust"


def test_the_per_call_timer_of_python_before_3_11(monkeypatch):
    """Python 3.9 and 3.10 have no asyncio.timeout_at: each call gets wait_for."""
    monkeypatch.setattr(aplc._runtime, "_timeout_at", None)

    async def slow(context):
        await asyncio.sleep(3600)

    async def quick(context):
        return response("quick")

    with pytest.raises(aplc.RunError) as info:
        aplc.start_sync(ONE_STEP, {"with_providers": {"gpt-4o": slow}, "timeout": 200})
    assert info.value.kind == "timeout"
    events = []
    status = aplc.start_sync(LOOP, {"with_providers": {"gpt-4o": quick}, "on_event": events.append})
    assert status["result_text"] == "quick" and events[-1]["type"] == "run_finished"
    status = aplc.start_sync(LOOP, {"providers": mock("a", "b", "c", latency_ms=5)})
    assert status["result_text"] == "c"


def test_the_context_crosses_as_plain_python_values():
    seen = []

    async def provider(context):
        seen.append(context)
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 2**40, "completion_tokens": 1, "total_tokens": 2**40 + 1}}

    context = {"n": 3, "f": 1.5, "big": 2**63 + 1, "t": (1, "two"), "nested": {"a": [None, True, {"b": "c"}]}}
    status = aplc.start_sync(ONE_STEP, {"with_providers": {"gpt-4o": provider}, "with_context": context})
    assert status["n"] == 3 and status["f"] == 1.5 and status["t"] == [1, "two"]
    assert status["nested"] == {"a": [None, True, {"b": "c"}]}
    assert isinstance(status["big"], (int, float))
    assert seen[0]["nested"] == {"a": [None, True, {"b": "c"}]}
    assert seen[0]["prompts"] == [{"role": "user", "content": "Hello"}]
    assert status["usage"]["prompt_tokens"] == 2**40
    assert list(status) == sorted(status)


def test_a_self_referencing_answer_is_a_clear_error():
    async def provider(context):
        loop = []
        loop.append(loop)
        return {"choices": [{"message": {"role": "assistant", "content": "x"}}], "loop": loop}

    status = aplc.start_sync(ONE_STEP, {"with_providers": {"gpt-4o": provider}})
    assert "invalid provider response" in status["errors"][0]
    assert "nested more than" in status["errors"][0]

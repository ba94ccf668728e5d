"""Runs: provider failures, bad provider results, sync providers, concurrency,
cancellation, timeouts and budgets, events, options."""

import asyncio
import gc
import json
import threading

import pytest

import aplc
from conftest import response

ONE_STEP = """
# prompt: ask
## user
Hello
"""

TWO_STEPS = """
# prompt: first
## user
one

# post: first
{{ set_context('first_errors', errors) }}
{{ set_context('next_step', 'second') }}

# prompt: second
## user
two
"""


def start(agent, **options):
    return aplc.start_sync(agent, options)


def test_a_provider_exception_lands_in_errors_and_the_run_goes_on():
    calls = []

    async def flaky(context):
        calls.append(context["prompts"][-1])
        if len(calls) == 1:
            raise ConnectionError("model unreachable")
        return response("second answer")

    status = start(TWO_STEPS, with_providers={"gpt-4o": flaky})
    assert status["first_errors"] == ["provider error: ConnectionError: model unreachable"]
    assert status["result_text"] == "second answer"
    assert len(calls) == 2


@pytest.mark.parametrize(
    "bad, expected",
    [
        (5, "returned int, expected a dict"),
        (None, "returned NoneType, expected a dict"),
        ("text", "returned str, expected a dict"),
        ({"choices": "nope"}, "invalid provider response"),
        ({"choices": [{"message": {"content": {1, 2}}}]}, "not JSON-serialisable"),
    ],
)
def test_a_bad_provider_result_is_a_clear_error(bad, expected):
    async def provider(context):
        return bad

    status = start(ONE_STEP, with_providers={"gpt-4o": provider})
    [error] = status["errors"]
    assert expected in error
    assert status["result_text"] == ""


def test_sync_providers_run_in_a_thread_async_ones_on_the_loop():
    threads = {}

    def sync_provider(context):
        threads["sync"] = threading.current_thread()
        return response("from sync")

    async def async_provider(context):
        threads["async"] = threading.current_thread()
        return response("from async")

    assert start(ONE_STEP, with_providers={"gpt-4o": sync_provider})["result_text"] == "from sync"
    assert start(ONE_STEP, with_providers={"gpt-4o": async_provider})["result_text"] == "from async"
    assert threads["async"] is threading.main_thread()
    assert threads["sync"] is not threading.main_thread()


def test_the_provider_gets_the_context_and_model_routing():
    seen = {}

    async def a(context):
        seen["a"] = context
        return response("a")

    agent = "# pre: x\n{{ set_context('model', 'model-a') }}{{ set_context('temperature', 0.2) }}\n\n# prompt: x\n## user\nq\n"
    status = start(agent, with_providers={"model-a": a}, with_context={"tenant": "t1"})
    assert status["result_text"] == "a"
    ctx = seen["a"]
    assert ctx["model"] == "model-a" and ctx["temperature"] == 0.2 and ctx["tenant"] == "t1"
    assert ctx["prompts"][0]["role"] == "user"
    assert isinstance(ctx["with_tools"], dict)


def test_100_concurrent_runs_in_one_event_loop():
    active = 0
    peak = 0

    async def provider(context):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return response(f"answer for {context['n']}")

    program = aplc.Program.from_source(ONE_STEP + "{{ n }}\n", inputs=("n",))

    async def main():
        return await asyncio.gather(
            *(program.start({"with_providers": {"gpt-4o": provider}, "with_context": {"n": n}}) for n in range(100))
        )

    results = asyncio.run(main())
    assert [r["result_text"] for r in results] == [f"answer for {n}" for n in range(100)]
    assert all(r["errors"] == [] for r in results)
    assert peak > 1  # the runs overlapped on the loop


def test_cancelling_the_awaiting_task_cancels_the_run():
    entered = None
    provider_cancelled = None

    async def hanging(context):
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            provider_cancelled.set()
            raise
        return response("never")

    async def main():
        nonlocal entered, provider_cancelled
        entered, provider_cancelled = asyncio.Event(), asyncio.Event()
        task = asyncio.ensure_future(aplc.start(ONE_STEP, {"with_providers": {"gpt-4o": hanging}}))
        await asyncio.wait_for(entered.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The provider's coroutine is cancelled too: nothing of the run is left running.
        await asyncio.wait_for(provider_cancelled.wait(), 10)
        # The loop still runs other agents.
        return await aplc.start(ONE_STEP, {"with_providers": {"gpt-4o": quick}})

    async def quick(context):
        return response("still fine")

    assert asyncio.run(main())["result_text"] == "still fine"


def test_timeout_raises_run_error_with_the_context_so_far():
    async def slow(context):
        await asyncio.sleep(3600)

    with pytest.raises(aplc.RunError) as info:
        start("# pre: a\n{{ set_context('mark', 1) }}\n\n" + ONE_STEP.replace("# prompt: ask", "# prompt: a"),
              with_providers={"gpt-4o": slow}, timeout=200)
    error = info.value
    assert isinstance(error, RuntimeError)
    assert error.kind == "timeout"
    assert error.context["mark"] == 1
    assert error.step == "a"


def test_max_runs_and_max_steps_fail_the_run():
    loop = "# prompt: again\n## user\nx\n\n# post: again\n{{ set_context('next_step', 'again') }}\n"

    async def provider(context):
        return response("x")

    with pytest.raises(aplc.RunError) as info:
        start(loop, with_providers={"gpt-4o": provider}, max_runs=3)
    assert info.value.kind == "budget_exceeded"
    assert info.value.context["global_runs"] == 3
    with pytest.raises(aplc.RunError) as info:
        start(loop, with_providers={"gpt-4o": provider}, max_steps=5)
    assert info.value.kind == "step_budget_exceeded"


def test_on_event_receives_every_event_in_order(capsys):
    events = []

    async def provider(context):
        return response("hi")

    start(ONE_STEP, with_providers={"gpt-4o": provider}, on_event=events.append, debug=True)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert "provider_call" in kinds and "provider_result" in kinds
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    # debug: every event on stderr too.
    assert capsys.readouterr().err.count("aplc: {") == len(events)


def test_an_on_event_exception_does_not_stop_the_run(capsys):
    async def provider(context):
        return response("hi")

    def listener(event):
        raise ValueError("listener bug")

    assert start(ONE_STEP, with_providers={"gpt-4o": provider}, on_event=listener)["result_text"] == "hi"
    assert "listener bug" in capsys.readouterr().err


def test_providers_config_routes_to_http(fake_model, monkeypatch):
    model = fake_model([response("from the routed server")])
    monkeypatch.setenv("APLC_TEST_KEY", "routed-secret-key-0123456789")
    config = {"routes": [{"model": "*", "kind": "openai", "base_url": model.base_url,
                          "api_key_env": "APLC_TEST_KEY"}]}
    status = start(ONE_STEP, providers=config)
    assert status["result_text"] == "from the routed server"
    assert model.headers[0]["authorization"] == "Bearer routed-secret-key-0123456789"


def test_api_key_never_reaches_context_errors_or_events(fake_model):
    secret = "sk-never-show-me-0123456789abcdef"

    async def echo_key(context):
        # A provider that leaks the key into the text and into an error.
        raise RuntimeError(f"bad key {secret}")

    events = []
    # The first step's errors are copied into a variable: the secret must not be in them
    # while the run goes on either.
    agent = TWO_STEPS.replace("# prompt: second", "# prompt: second\n## system\nsys")
    model = fake_model([response(f"the server says {secret}")] * 2)
    status = start(agent, with_providers={"gpt-4o": echo_key}, base_url=model.base_url, api_key=secret,
                   on_event=events.append)
    text = json.dumps(status) + json.dumps(events)
    assert secret not in text
    assert "bad key" in text
    assert secret not in json.dumps(status["first_errors"]) and "bad key" in status["first_errors"][0]
    # The default provider (models without a Python callable) also redacts what it returns.
    status = start("# pre: a\n{{ set_context('model', 'other') }}\n\n# prompt: a\n## user\nq\n",
                   base_url=model.base_url, api_key=secret, on_event=events.append)
    assert secret not in json.dumps(status) + json.dumps(events)
    assert "the server says" in status["result_text"]


@pytest.mark.parametrize(
    "options, error",
    [
        ({"nope": 1}, ValueError),
        ({"jinja2_env": object()}, ValueError),
        ({"timeout": "soon"}, TypeError),
        ({"max_steps": 0}, ValueError),
        ({"with_providers": {"gpt-4o": "not callable"}}, TypeError),
        ({"with_context": {"f": object()}}, TypeError),
        ({"with_context": [1]}, TypeError),
        ({"providers": {"routes": "x"}}, ValueError),
        ({"dialect": "other"}, ValueError),
    ],
)
def test_bad_options_are_clear_errors(options, error):
    with pytest.raises(error):
        start(ONE_STEP, **options)


def test_the_interpreter_survives_many_bad_runs():
    async def provider(context):
        return object()

    for _ in range(50):
        status = start(ONE_STEP, with_providers={"gpt-4o": provider})
        assert status["errors"]
    gc.collect()


def test_a_provider_error_is_redacted_before_the_run_sees_it(fake_model):
    secret = "sk-quoted-by-the-provider-0123456789"

    async def leaky(context):
        raise RuntimeError(f"refused key {secret}")

    # The second step sends the first step's errors to an HTTP model: what it receives
    # is what the run held.
    agent = """
# prompt: first
## user
one

# post: first
{{ set_context('first_errors', errors) }}
{{ set_context('next_step', 'second') }}

# pre: second
{{ set_context('model', 'http-model') }}

# prompt: second
## user
{{ first_errors }}
"""
    model = fake_model([response("ok")])
    status = start(agent, with_providers={"gpt-4o": leaky}, base_url=model.base_url, api_key=secret)
    assert status["result_text"] == "ok"
    sent = json.dumps(model.requests)
    assert "refused key" in sent and secret not in sent

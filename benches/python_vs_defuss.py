"""aplc's Python package against defuss-apl 1.1.0, measured in one run.

The same agents, the same Python provider returning canned responses, one process:

    python benches/python_vs_defuss.py            # both packages installed
    python benches/python_vs_defuss.py --quick    # fewer repetitions

Reports, per agent, the time per step of ``aplc.start`` (source compiled every run, as
``defuss_apl.start`` parses it every run), of ``aplc.Program.start`` (compiled once) and
of ``defuss_apl.start``, and the ratio; then the cost of one Python provider call in
aplc beyond the provider's own work: a step answered by the Python provider, minus the
same step answered by aplc's Rust scripted provider, minus the provider's own work. Uses only spec helpers (`set_context`,
`get_context`), so both runtimes run the agents unchanged.
"""

import argparse
import asyncio
import statistics
import sys
import time

import aplc

try:
    import defuss_apl
except ImportError:  # the aplc figures alone still mean something
    defuss_apl = None

STEPS = 20

# A loop of STEPS steps, each rendering a prompt and calling the provider.
LOOP = f"""
# pre: work
{{{{ set_context('i', get_context('i', 0) + 1) }}}}
{{{{ set_context('model', 'gpt-4o') }}}}

# prompt: work
## system
You are step {{{{ i }}}} of a benchmark.

## user
Summarise item {{{{ i }}}}: {{{{ get_context('last', 'nothing yet') }}}}.

# post: work
{{{{ set_context('last', result_text) }}}}
{{% if i < {STEPS} %}}{{{{ set_context('next_step', 'work') }}}}{{% else %}}{{{{ set_context('next_step', 'return') }}}}{{% endif %}}
"""

ONE_STEP = """
# prompt: ask
## user
Say hello.
"""

CANNED = {
    "choices": [{"message": {"role": "assistant", "content": "canned answer"}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
}


async def provider(context):
    return CANNED


def options():
    return {"with_providers": {"gpt-4o": provider}}


def rust_mock_options():
    """The same canned answer from aplc's own scripted provider (a `mock` route), in Rust:
    the baseline for what the Python provider call adds."""
    return {"providers": {"routes": [{"model": "*", "kind": "mock", "responses": ["canned answer"] * (STEPS + 1)}]}}


async def per_run(start, agent, runs):
    """Median seconds per run over `runs` runs (after one warm-up run)."""
    await start(agent)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        status = await start(agent)
        times.append(time.perf_counter() - t0)
    assert status["result_text"] in ("canned answer", ""), status.get("errors")
    return statistics.median(times)


async def provider_own_work(n=20000):
    """Seconds per `await provider(context)` called directly."""
    context = {"prompts": [], "model": "gpt-4o"}
    t0 = time.perf_counter()
    for _ in range(n):
        await provider(context)
    return (time.perf_counter() - t0) / n


async def main(quick):
    runs = 5 if quick else 30
    program = aplc.Program.from_source(LOOP)
    one = aplc.Program.from_source(ONE_STEP)
    runners = {
        "aplc.start": lambda agent: aplc.start(agent, options()),
        "aplc.Program.start": lambda agent: {
            LOOP: program, ONE_STEP: one
        }[agent].start(options()),
    }
    if defuss_apl is not None:
        runners["defuss_apl.start"] = lambda agent: defuss_apl.start(agent, options())
    rows = []
    for name, agent, steps in (("20-step loop", LOOP, STEPS), ("one step", ONE_STEP, 1)):
        figures = {r: await per_run(run, agent, runs) / steps for r, run in runners.items()}
        rows.append((name, figures))
    print(f"Python {sys.version.split()[0]}, aplc {aplc.__version__}, "
          f"defuss-apl {getattr(defuss_apl, '__version__', 'absent' if defuss_apl is None else '1.1.x')}, "
          f"median of {runs} runs\n")
    print("| agent | " + " | ".join(f"{r} (µs/step)" for r in runners) + " | defuss / aplc.start |")
    print("|---|" + "---|" * (len(runners) + 1))
    for name, figures in rows:
        cells = " | ".join(f"{figures[r] * 1e6:,.0f}" for r in runners)
        ratio = (figures["defuss_apl.start"] / figures["aplc.start"]) if defuss_apl else float("nan")
        print(f"| {name} | {cells} | {ratio:,.0f}× |")

    with_call = await per_run(lambda a: program.start(options()), LOOP, runs) / STEPS
    without = await per_run(lambda a: program.start(rust_mock_options()), LOOP, runs) / STEPS
    own = await provider_own_work()
    print()
    print(f"aplc step with a Python provider call: {with_call * 1e6:,.1f} µs; "
          f"with aplc's Rust mock provider instead: {without * 1e6:,.1f} µs; the provider's own work: {own * 1e6:,.2f} µs")
    print(f"cost of one Python provider call beyond its own work: "
          f"{(with_call - without - own) * 1e6:,.1f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    asyncio.run(main(parser.parse_args().quick))

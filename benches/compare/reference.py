"""Runs an agent N times on the reference Python runtime (defuss-apl) with the same
scripted responses `aplc bench` uses, and prints the same JSON fields.

    python3 reference.py AGENT.apl RESPONSES.json [-n RUNS] [--warmup W] [--context C.json]

A scripted entry is a string (the assistant's text), an assistant message object, or a
full response with `choices`, exactly as for `aplc run --mock`.
"""
import argparse
import asyncio
import json
import statistics
import time

from defuss_apl import start


def as_response(entry):
    if isinstance(entry, str):
        return {"choices": [{"message": {"role": "assistant", "content": entry}}]}
    if "choices" in entry:
        return entry
    message = {"role": "assistant", **entry}
    return {"choices": [{"message": message}]}


async def run_once(agent, entries, context):
    responses = iter(entries)

    async def provider(_context):
        return as_response(next(responses))

    options = {"with_providers": {"*": provider}, "with_context": dict(context)}
    # The reference looks providers up by model name; register the common ones.
    for model in ("gpt-4o", "gpt-4o-mini", "o4-mini"):
        options["with_providers"][model] = provider
    return await start(agent, options)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("agent")
    p.add_argument("responses")
    p.add_argument("-n", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--context")
    a = p.parse_args()
    agent = open(a.agent).read()
    entries = json.load(open(a.responses))
    context = json.load(open(a.context)) if a.context else {}
    times, steps = [], 0
    for i in range(a.warmup + a.n):
        t0 = time.perf_counter()
        final = await run_once(agent, entries, context)
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
            steps = len(final.get("context_history", []))
    median = statistics.median(times)
    print(json.dumps({
        "runtime": "defuss-apl (reference)",
        "runs": a.n,
        "steps_per_run": steps,
        "median_run_us": median * 1e6,
        "min_run_us": min(times) * 1e6,
        "median_step_us": median * 1e6 / max(steps, 1),
        "min_step_us": min(times) * 1e6 / max(steps, 1),
    }))


asyncio.run(main())

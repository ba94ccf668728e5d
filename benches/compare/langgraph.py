"""aplc against LangGraph 1.x, in memory and durable, on the same agents, in one run.

    APLC=target/release/aplc python benches/compare/langgraph.py [--rounds R] [--quick]

(`benches/compare/langgraph.sh` makes the virtualenv with the pinned LangGraph and runs
this.) Each agent of `benches/agents/` is also written as a LangGraph `StateGraph` that
does the same work per step: it renders the same prompt, calls a scripted model (a plain
function returning the same canned answers, instantly), updates the same variables the
agent reads, and loops through a conditional edge. Before measuring, the script checks
that both send the same messages: it runs the agent with `aplc run --base-url` against a
fake OpenAI-compatible server on 127.0.0.1 that records every request, runs the graph with
a model that records its messages, and stops with an error if the two lists differ.

Seven figures per agent, in µs per step (a step is one model call):

  aplc memory      `aplc bench AGENT` (the VM, sequential): median run / steps
  aplc memory/tokio  `aplc bench AGENT --store sqlite:FRESH.db`: the same runs in memory
                   on the tokio driver, wall / steps
  aplc durable     the same bench, journaled in SQLite (WAL, synchronous=NORMAL): wall / steps
  LG none          the graph with no checkpointer
  LG memory        the graph with `InMemorySaver`
  LG sqlite        the graph with `SqliteSaver` on a connection set to WAL and
                   synchronous=NORMAL (the settings of aplc's store), default durability
                   ("async": a checkpoint is written while the next step runs)
  LG sqlite sync   the same with durability="sync" (each checkpoint written before the
                   next step; what aplc did before group commit)

LangGraph figures are wall / steps over all measured runs, one new thread_id per run and
a fresh database per round, as `aplc bench --store` does. Every round runs aplc then
LangGraph for each agent, so load from other work hits both alike; the table gives the
median over the rounds.
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib.metadata import version
from pathlib import Path
from typing import TypedDict

# This file's own name would shadow the `langgraph` package: drop its directory from the path.
HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "benches" / "agents"
APLC = os.environ.get("APLC", str(ROOT / "target" / "release" / "aplc"))


class Scripted:
    """The model: the agent's canned answers in order, one per call; records the messages
    when `record` is a list."""

    def __init__(self, answers):
        self.answers = answers
        self.next = 0
        self.record = None

    def rewind(self, record=None):
        self.next, self.record = 0, record

    def __call__(self, messages):
        if self.record is not None:
            self.record.append(messages)
        answer = self.answers[self.next]
        self.next += 1
        return answer


def user(text):
    """A user message as aplc sends it: the role section's text, trimmed."""
    return [{"role": "user", "content": text.strip()}]


# ---- self_loop: one step looping on itself `limit` times --------------------------------


class LoopState(TypedDict):
    i: int
    limit: int
    result_text: str
    prompts: list
    next_step: str | None


def self_loop_graph(model):
    def loop(state):
        i = state["i"] + 1  # pre: set_context('i', get_context('i', 0) + 1)
        messages = user(f"Iteration {i}: {state['result_text']}")
        answer = model(messages)
        return {
            "i": i,
            "prompts": messages,
            "result_text": answer,
            # post: loop while i < limit
            "next_step": "loop" if i < state["limit"] else None,
        }

    g = StateGraph(LoopState)
    g.add_node("loop", loop)
    g.add_edge(START, "loop")
    g.add_conditional_edges("loop", lambda s: s["next_step"] or END, ["loop", END])
    return g


def self_loop_input(context):
    return {"i": 0, "limit": context["limit"], "result_text": "", "prompts": [], "next_step": None}


# ---- loop4: a → b → c → d → a, once round ------------------------------------------------


class Loop4State(TypedDict):
    result_text: str
    prev_step: str | None
    global_runs: int
    runs: dict
    prompts: list
    next_step: str | None


def loop4_graph(model):
    prompts = {
        "a": lambda s: f"Step a, visit {s['runs'].get('a', 0) + 1}.",
        "b": lambda s: f"Step b after {s['prev_step']}: {s['result_text']}",
        "c": lambda s: f"Step c: {s['result_text'].upper()}",
        "d": lambda s: f"Step d, {s['global_runs']} calls so far.",
    }
    following = {"a": "b", "b": "c", "c": "d"}

    def step(name):
        def node(state):
            messages = user(prompts[name](state))
            answer = model(messages)
            global_runs = state["global_runs"] + 1
            if name == "d":  # post: back to a while global_runs < 4
                nxt = "a" if global_runs < 4 else None
            else:
                nxt = following[name]
            return {
                "prompts": messages,
                "result_text": answer,
                "global_runs": global_runs,
                "runs": {**state["runs"], name: state["runs"].get(name, 0) + 1},
                "prev_step": name,
                "next_step": nxt,
            }

        return node

    g = StateGraph(Loop4State)
    for name in "abcd":
        g.add_node(name, step(name))
        g.add_conditional_edges(name, lambda s: s["next_step"] or END, ["a", "b", "c", "d", END])
    g.add_edge(START, "a")
    return g


def loop4_input(_context):
    return {"result_text": "", "prev_step": None, "global_runs": 0, "runs": {}, "prompts": [],
            "next_step": None}


# ---- agent8: 8 steps, system and user roles, loops and filters over a list in each phase --


class Agent8State(TypedDict):
    items: list
    seen: int
    title: str
    result_text: str
    lengths: list
    total: int
    ok_calls: int
    prompts: list
    next_step: str | None


def truncate(text, length):
    """Jinja's `truncate` filter with its defaults: whole words, "...", a leeway of 5."""
    if len(text) <= length + 5:
        return text
    return text[: length - 3].rsplit(" ", 1)[0] + "..."


def agent8_graph(model):
    def step(n):
        def node(state):
            items = state["items"]
            # pre: count the long items, build the title
            seen = state["seen"] + sum(1 for item in items if len(item) > 4)
            title = truncate(", ".join(item.upper() for item in items), 30)
            known = ", ".join(f"{i}. {item.title()}" for i, item in enumerate(sorted(items), 1))
            listing = "".join(f"- {item.capitalize()} ({len(item)})\n" for item in reversed(items))
            # `result_text | default('none')`: result_text is always defined ("" at first),
            # so the default never applies.
            messages = [
                {"role": "system", "content": f"You are step s{n}. Known items: {known}.".strip()},
                {"role": "user", "content": (
                    f"{title} — seen {seen} long items. Previous answer: "
                    f"{truncate(state['result_text'], 40)}\n{listing}").strip()},
            ]
            answer = model(messages)
            # post: count the tool calls without error (none here), the lengths, the total
            lengths = [len(item) for item in items]
            return {
                "seen": seen, "title": title, "prompts": messages, "result_text": answer,
                "ok_calls": state["ok_calls"], "lengths": lengths, "total": sum(lengths),
                "next_step": f"s{n + 1}" if n < 7 else None,
            }

        return node

    g = StateGraph(Agent8State)
    names = [f"s{n}" for n in range(8)]
    for n, name in enumerate(names):
        g.add_node(name, step(n))
        g.add_conditional_edges(name, lambda s: s["next_step"] or END, [*names, END])
    g.add_edge(START, "s0")
    return g


def agent8_input(context):
    return {"items": context["items"], "seen": 0, "title": "", "result_text": "", "lengths": [],
            "total": 0, "ok_calls": 0, "prompts": [], "next_step": None}


# ---- the agents and their benchmark sizes ------------------------------------------------

# name: (graph, initial state, context, measured runs: aplc memory, aplc durable, LangGraph).
# The context and the scripted answers are the agent's files in benches/agents/, except
# self_loop's: 1,000 steps (its file scripts 500) and as many "ok" answers.
AGENT_SPECS = {
    "loop4": (loop4_graph, loop4_input, None, (3000, 300, 300)),
    "agent8": (agent8_graph, agent8_input, "file", (2000, 200, 200)),
    "self_loop": (self_loop_graph, self_loop_input, {"limit": 1000}, (100, 10, 5)),
}


class Agent:
    def __init__(self, name, tmp, quick):
        build, self.make_input, context, sizes = AGENT_SPECS[name]
        self.name, self.apl = name, AGENTS / f"{name}.apl"
        mock, ctx = AGENTS / f"{name}.mock.json", AGENTS / f"{name}.context.json"
        if isinstance(context, dict):
            mock, ctx = tmp / mock.name, tmp / ctx.name
            mock.write_text(json.dumps(["ok"] * (context["limit"] + 1)))
            ctx.write_text(json.dumps(context))
        self.answers = json.loads(mock.read_text())
        self.context = json.loads(ctx.read_text()) if context else None
        self.args = ["--mock", str(mock), "--max-steps", "20000"]
        if context:
            self.args += ["--context", str(ctx)]
        self.sizes = tuple(max(2, n // 10) for n in sizes) if quick else sizes
        self.model = Scripted(self.answers)
        self.graph = build(self.model)


# ---- the prompt check ----------------------------------------------------------------------


def aplc_requests(agent):
    """Every message list aplc sends for one run of the agent, captured by a fake
    OpenAI-compatible server that answers with the agent's canned answers in order."""
    seen, answers = [], iter(agent.answers)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body["messages"])
            reply = json.dumps({
                "id": f"c{len(seen)}", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": next(answers)}}],
            }).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_):
            pass

    # HTTP/1.0 (the default): one connection per request, so no delayed-ACK stalls.
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = [a for a in agent.args]
        mock = args.index("--mock")
        del args[mock:mock + 2]
        subprocess.run(
            [APLC, "run", str(agent.apl), *args, "--quiet",
             "--base-url", f"http://127.0.0.1:{server.server_address[1]}"],
            check=True, stdout=subprocess.DEVNULL,
            env={**os.environ, "OPENAI_API_KEY": "bench-not-a-key"})
    finally:
        server.shutdown()
    return seen


def check_prompts(agent):
    ours = aplc_requests(agent)
    theirs = []
    agent.model.rewind(theirs)
    agent.graph.compile().invoke(agent.make_input(agent.context), {"recursion_limit": 100_000})
    agent.model.rewind()
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                     min(len(ours), len(theirs)))
        sys.exit(f"{agent.name}: the prompts differ at call {first} of {len(ours)} (aplc) / "
                 f"{len(theirs)} (LangGraph):\n  aplc:      {ours[first:first + 1]}\n"
                 f"  LangGraph: {theirs[first:first + 1]}")
    last = ours[-1][-1]["content"]
    print(f"{agent.name}: prompts identical, {len(ours)} calls, the last ending {last[-40:]!r}",
          file=sys.stderr)
    return len(ours)


# ---- measuring -----------------------------------------------------------------------------


def warmups(runs):
    return max(1, runs // 10)


def aplc_bench(agent, runs, steps, store=None):
    cmd = [APLC, "bench", str(agent.apl), *agent.args, "-n", str(runs),
           "--warmup", str(warmups(runs)), "--json"]
    if store:
        cmd += ["--store", f"sqlite:{store}"]
    report = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if report.get("failed_runs") or report["steps_per_run"] != steps:
        sys.exit(f"{agent.name}: aplc runs failed or made other than {steps} steps: {report}")
    return report


def sqlite_saver(path):
    # The settings of aplc's SQLite store (spec/durability.md, "Stores"): WAL, NORMAL.
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    saver = SqliteSaver(conn)
    saver.setup()
    return saver


def langgraph_step_us(agent, checkpointer, runs, steps, durability=None, tag=""):
    """Wall time per step over `runs` runs after a warm-up, one thread per run."""
    graph = agent.graph.compile(checkpointer=checkpointer)
    extra = {"durability": durability} if durability else {}

    def run(i):
        agent.model.rewind()
        config = {"recursion_limit": 100_000, "configurable": {"thread_id": f"{tag}-{i}"}}
        final = graph.invoke(agent.make_input(agent.context), config, **extra)
        if agent.model.next != steps:
            sys.exit(f"{agent.name}: LangGraph made {agent.model.next} calls, aplc {steps}")
        return final

    for i in range(warmups(runs)):
        run(f"warm{i}")
    t0 = time.perf_counter()
    for i in range(runs):
        run(i)
    return (time.perf_counter() - t0) * 1e6 / (runs * steps)


COLUMNS = ["aplc memory", "aplc memory/tokio", "aplc durable", "LG none", "LG memory",
           "LG sqlite", "LG sqlite sync"]


def round_figures(agent, steps, tmp, r):
    n_mem, n_dur, n_lg = agent.sizes
    plain = aplc_bench(agent, n_mem, steps)
    durable = aplc_bench(agent, n_dur, steps, tmp / f"aplc-{agent.name}-{r}.db")
    figures = {
        "aplc memory": plain["median_step_us"],
        "aplc memory/tokio": durable["memory_step_us"],
        "aplc durable": durable["durable_step_us"],
        "commit_us": durable["commit_us"],
        "commits_per_run": durable["commits_per_run"],
        "aplc bytes/step": durable["bytes_per_step"],
        "LG none": langgraph_step_us(agent, None, n_lg, steps),
        "LG memory": langgraph_step_us(agent, InMemorySaver(), n_lg, steps, tag="m"),
    }
    for column, durability in (("LG sqlite", None), ("LG sqlite sync", "sync")):
        path = tmp / f"lg-{agent.name}-{r}-{durability}.db"  # fresh, as aplc's
        saver = sqlite_saver(str(path))
        figures[column] = langgraph_step_us(agent, saver, n_lg, steps, durability, tag="s")
        saver.conn.close()  # the last connection: SQLite folds the WAL into the file
        if durability is None:
            figures["LG bytes/step"] = path.stat().st_size / (warmups(n_lg) + n_lg) / steps
    return figures


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="a tenth of the runs")
    p.add_argument("--agents", default=",".join(AGENT_SPECS))
    p.add_argument("--json", help="also write every round's figures to this file")
    a = p.parse_args()
    aplc = subprocess.run([APLC, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{aplc} ({APLC}), Python {sys.version.split()[0]}, langgraph {version('langgraph')}, "
          f"langgraph-checkpoint {version('langgraph-checkpoint')}, "
          f"langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}, "
          f"SQLite {sqlite3.sqlite_version}, {a.rounds} rounds, load average {load()} at the start")
    with tempfile.TemporaryDirectory(prefix="aplc-lg-") as tmpdir:
        tmp = Path(tmpdir)
        agents = [Agent(name, tmp, a.quick) for name in a.agents.split(",")]
        steps = {agent.name: check_prompts(agent) for agent in agents}
        rounds = {agent.name: [] for agent in agents}
        for r in range(a.rounds):
            for agent in agents:
                rounds[agent.name].append(round_figures(agent, steps[agent.name], tmp, r))
            print(f"round {r + 1}/{a.rounds} done, load average {load()}", file=sys.stderr)
    print(f"load average {load()} at the end\n")
    if a.json:
        Path(a.json).write_text(json.dumps(rounds, indent=1))
    report(agents, steps, rounds)


def report(agents, steps, rounds):
    med = {n: {k: statistics.median(f[k] for f in rs) for k in rs[0]} for n, rs in rounds.items()}
    print("µs per step, median of the rounds (each round's figures below)\n")
    print("| agent | steps | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for agent in agents:
        n = agent.name
        print(f"| {n} | {steps[n]} | " + " | ".join(f"{med[n][c]:,.1f}" for c in COLUMNS) + " |")
    print("\nRatios (LangGraph ÷ aplc, per step):\n")
    pairs = [("LG none", "aplc memory"), ("LG memory", "aplc memory"),
             ("LG sqlite", "aplc durable"), ("LG sqlite sync", "aplc durable")]
    print("| agent | " + " | ".join(f"{t} ÷ {o}" for t, o in pairs)
          + " | aplc durable ÷ memory/tokio | aplc commit_us, commits per run"
          + " | bytes stored per step, aplc / LG |")
    print("|---|" + "---|" * (len(pairs) + 3))
    for agent in agents:
        m = med[agent.name]
        print(f"| {agent.name} | " + " | ".join(f"{m[t] / m[o]:,.1f}×" for t, o in pairs)
              + f" | {m['aplc durable'] / m['aplc memory/tokio']:,.1f}× "
              f"| {m['commit_us']:,.0f} µs, {m['commits_per_run']:,.1f} "
              f"| {m['aplc bytes/step']:,.0f} / {m['LG bytes/step']:,.0f} |")
    print("\nEach round:")
    for agent in agents:
        for c in COLUMNS:
            figures = ", ".join(f"{f[c]:,.1f}" for f in rounds[agent.name])
            print(f"  {agent.name:10} {c:18} {figures}")


if __name__ == "__main__":
    main()

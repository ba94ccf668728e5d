#!/usr/bin/env bash
# MCP servers' start time and aplc's per-call overhead (issue #25; benches/README.md,
# "MCP (issue #25)"). Needs a release build (cargo build --release -p aplc --locked),
# APLC_MCP_PYTHON (a Python with PyPI `mcp`) and APLC_MCP_EVERYTHING (npm's
# server-everything binary), as the tests do. Run it on a quiet machine: it prints the
# load average first.
#
# Start: the median wall time of `aplc run` (one provider answer, no tool call) with the
# server in its manifest, minus the same run without a manifest: spawning (stdio) or
# connecting (HTTP), initialize and tools/list. Per call: N sequential calls of a trivial
# tool in one run (distinct arguments, so an idempotent tool's result is never reused),
# timed by the run's own events (first `tool_call` to last `tool_result`, over N; the
# median of the runs); next to it the official Python client's time per call against the
# same server, and for stdio the floor: a client with no SDK writing one JSON line and
# reading its answer per call (both benches/mcp_client.py), and aplc's time over it.
set -euo pipefail
cd "$(dirname "$0")/.."
aplc="${MCP_BENCH_APLC:-$PWD/target/release/aplc}"
python="${APLC_MCP_PYTHON:?set APLC_MCP_PYTHON to a Python with the mcp package}"
everything="${APLC_MCP_EVERYTHING:?set APLC_MCP_EVERYTHING to mcp-server-everything}"
[ -x "$aplc" ] || { echo "no $aplc: cargo build --release -p aplc --locked" >&2; exit 1; }
calls="${MCP_BENCH_CALLS:-200}"
runs="${MCP_BENCH_RUNS:-10}"
work="$(mktemp -d)"
export COUNTER_FILE="$work/count" MCP_TOKEN="bench-token-0123456789abcdef"
export REMOTE_AUTH="Bearer $MCP_TOKEN"
port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$python" fixtures/mcp/counter_server.py --http "$port" 2>/dev/null &
http_pid=$!
trap 'kill $http_pid 2>/dev/null; rm -rf "$work"' EXIT
until "$python" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; do sleep 0.2; done

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; $calls calls, $runs runs each"
echo "aplc $("$aplc" --version | cut -d' ' -f2), $("$python" -c 'from importlib.metadata import version as v; print("mcp", v("mcp"))'), node $(node --version)"

APLC="$aplc" WORK="$work" CALLS="$calls" RUNS="$runs" PY="$python" EVERYTHING="$everything" \
  URL="http://127.0.0.1:$port/mcp" "$python" - <<'PY'
import json, os, statistics, subprocess, time

aplc, work, calls, runs = os.environ["APLC"], os.environ["WORK"], int(os.environ["CALLS"]), int(os.environ["RUNS"])
py, everything, url = os.environ["PY"], os.environ["EVERYTHING"], os.environ["URL"]
counter = os.path.abspath("fixtures/mcp/counter_server.py")
servers = {
    "stdio, server-everything (node)": ({"command": everything}, "get-sum", ["stdio", everything]),
    "stdio, counter_server.py (python)": ({"command": py, "args": [counter]}, "add", ["stdio", py, counter]),
    "streamable HTTP, counter_server.py": (
        {"url": url, "headers_env": {"Authorization": "REMOTE_AUTH"}}, "add", ["http", url]),
}
arguments = {"a": 1, "b": 2}
open(f"{work}/agent.apl", "w").write("# prompt: go\nGo.\n")

def mock(tool, n):
    tool_calls = [{"id": f"c{i}", "type": "function",
                   "function": {"name": tool, "arguments": json.dumps({"a": i, "b": 2})}}
                  for i in range(n)]
    return [{"content": None, "tool_calls": tool_calls}] if n else ["done"]

def run(manifest, tool, n):
    """One `aplc run`: its wall time (ms) and its events."""
    json.dump(mock(tool, n), open(f"{work}/mock.json", "w"))
    args = [aplc, "run", f"{work}/agent.apl", "--mock", f"{work}/mock.json",
            "--events", f"{work}/events.jsonl"]
    if manifest is not None:
        json.dump({"mcpServers": {"s": manifest}}, open(f"{work}/tools.json", "w"))
        args += ["--tools", f"{work}/tools.json"]
    started = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True)
    wall = (time.perf_counter() - started) * 1e3
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in open(f"{work}/events.jsonl")]
    return wall, events

def start_ms(manifest):
    return statistics.median(run(manifest, "none", 0)[0] for _ in range(runs))

def per_call_us(manifest, tool):
    """Microseconds per call inside the run, from its events."""
    per_run = []
    for _ in range(max(3, runs // 2)):
        events = run(manifest, tool, calls)[1]
        first = next(e["t_ms"] for e in events if e["type"] == "tool_call")
        results = [e for e in events if e["type"] == "tool_result"]
        assert len(results) == calls and not any(e["with_error"] or e["reused"] for e in results)
        per_run.append((results[-1]["t_ms"] - first) / calls * 1e3)
    return statistics.median(per_run)

bare = start_ms(None)
print(f"\naplc run without servers: {bare:.1f} ms (median of {runs})\n")
print("| server | start (ms) | aplc per call (µs) | Python SDK client per call (µs) | raw JSON lines per call (µs) | aplc over raw (µs) |")
print("|---|---:|---:|---:|---:|---:|")
for name, (manifest, tool, client) in servers.items():
    start = start_ms(manifest)
    per_call = per_call_us(manifest, tool)
    def client_us(kind, *target):
        out = subprocess.run([py, "benches/mcp_client.py", str(calls), tool, json.dumps(arguments), kind, *target],
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip())
    sdk = client_us(*client)
    floor = client_us("raw", *client[1:]) if client[0] == "stdio" else None
    over = f"{per_call - floor:+.0f}" if floor is not None else "–"
    print(f"| {name} | {start - bare:.0f} | {per_call:.0f} | {sdk} | {floor if floor is not None else '–'} | {over} |")
PY

#!/usr/bin/env bash
# Before/after on one machine in one run: two aplc binaries, the same benchmarks,
# alternating, ROUNDS rounds (default 3); prints the median of each figure per binary.
#
#   bash benches/compare/ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]
#
# The figures: the VM's per-step time (loop4, in memory), a durable 1,000-step self_loop
# on SQLite (in-memory and durable per step, commit, resume), and 100 durable loop4 runs
# at once with 50 ms per model call (throughput kept). See benches/README.md.
set -euo pipefail
before=$(realpath "$1"); after=$(realpath "$2"); rounds=${3:-3}
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo '{"limit": 1000}' > "$tmp/l1k.json"
python3 -c "import json; print(json.dumps(['ok'] * 10001))" > "$tmp/ok10k.json"
for round in $(seq "$rounds"); do
  for v in before after; do
    bin=$before; [ "$v" = after ] && bin=$after
    echo "$v vm-loop4 $("$bin" bench benches/agents/loop4.apl --mock benches/agents/loop4.mock.json -n 3000 --warmup 200 --json)"
    echo "$v durable-self_loop $("$bin" bench benches/agents/self_loop.apl --mock "$tmp/ok10k.json" --context "$tmp/l1k.json" --max-steps 20000 -n 10 --warmup 2 --store "sqlite:$tmp/s-$v-$round.db" --json)"
    echo "$v durable-loop4-c100 $("$bin" bench benches/agents/loop4.apl --mock benches/agents/loop4.mock.json --concurrency 100 --latency-ms 50 -n 1000 --store "sqlite:$tmp/c-$v-$round.db" --json)"
  done
done > "$tmp/results.txt"
python3 - "$tmp/results.txt" <<'PY'
import collections, json, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    version, kind, report = line.split(" ", 2)
    rows[(kind, version)].append(json.loads(report))
figures = {
    "vm-loop4": ["median_step_us"],
    "durable-self_loop": ["memory_step_us", "durable_step_us", "commit_us", "commits_per_run", "resume_ms"],
    "durable-loop4-c100": ["memory_runs_per_sec", "durable_runs_per_sec", "throughput_kept"],
}
for kind, names in figures.items():
    for name in names:
        b = [r[name] for r in rows[(kind, "before")]]
        a = [r[name] for r in rows[(kind, "after")]]
        print(f"{kind:20} {name:22} before {statistics.median(b):10.3f}  after {statistics.median(a):10.3f}"
              f"   ({', '.join(f'{x:.2f}' for x in b)} | {', '.join(f'{x:.2f}' for x in a)})")
PY

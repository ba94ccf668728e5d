#!/usr/bin/env bash
# Compares aplc with the reference runtime (defuss-apl on PyPI) on the same agents and
# scripted responses, in one run. Installs the reference into a throwaway virtualenv.
#
#   bash benches/compare/run.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-20}
venv=${APLC_REFERENCE_VENV:-target/reference-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet defuss-apl==1.1.0
fi
cargo build --quiet --release -p aplc
printf '%-10s %-22s %8s %14s %14s %10s\n' agent runtime steps median_run_us median_step_us speedup
for agent in loop4 agent8 self_loop; do
  apl=benches/agents/$agent.apl mock=benches/agents/$agent.mock.json
  ctx=(); [ -f "benches/agents/$agent.context.json" ] && ctx=(--context "benches/agents/$agent.context.json")
  ours=$(target/release/aplc bench "$apl" --mock "$mock" -n "$runs" --json "${ctx[@]}")
  ref=$("$venv/bin/python" benches/compare/reference.py "$apl" "$mock" -n "$runs" "${ctx[@]}")
  python3 - "$agent" "$ours" "$ref" <<'PY'
import json, sys
agent, ours, ref = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for name, r in (("aplc", ours), ("reference", ref)):
    print(f"{agent:<10} {name:<22} {r['steps_per_run']:>8} {r['median_run_us']:>14.1f} {r['median_step_us']:>14.2f}"
          + (f" {ref['median_step_us'] / ours['median_step_us']:>9.0f}x" if name == "aplc" else ""))
PY
done

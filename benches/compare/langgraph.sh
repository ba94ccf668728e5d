#!/usr/bin/env bash
# aplc against LangGraph 1.x (no checkpointer, InMemorySaver, SqliteSaver with aplc's
# SQLite settings) on the same agents, in one run; see benches/compare/langgraph.py.
# Installs the pinned LangGraph into a virtualenv kept outside the repository.
#
#   APLC=path/to/aplc bash benches/compare/langgraph.sh [--rounds R] [--quick] [--json FILE]
#
# APLC defaults to target/release/aplc (built if missing: cargo build --release -p aplc).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${APLC_LANGGRAPH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/aplc-bench/langgraph-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet langgraph==1.2.24 langgraph-checkpoint==4.3.2 \
    langgraph-checkpoint-sqlite==3.1.2
fi
export APLC=${APLC:-target/release/aplc}
[ -x "$APLC" ] || cargo build --quiet --release -p aplc --locked
exec "$venv/bin/python" benches/compare/langgraph.py "$@"

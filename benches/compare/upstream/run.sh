#!/usr/bin/env bash
# Runs defuss-apl's own test suite (the reference implementation's) against aplc's Python
# package in the defuss-1.1 dialect, through the `defuss_apl` shim next to this script,
# and prints how many of the applicable tests pass.
#
#   bash benches/compare/upstream/run.sh PATH_TO_UPSTREAM_TESTS [PYTEST_ARGS...]
#
# PATH_TO_UPSTREAM_TESTS is defuss-apl's `packages/apl/python/tests` directory (the
# repository's, not in the PyPI wheel). Its fixtures' `test_utils.py` is taken from the
# `defuss_apl/` next to it, or else from the defuss-apl 1.1.0 wheel on PyPI. Nothing of
# defuss-apl is kept in this repository. The tests in not_applicable.txt are deselected,
# each with its reason; spec/dialects.md lists the remaining differences.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
tests="$(cd "${1:?usage: run.sh PATH_TO_UPSTREAM_TESTS [PYTEST_ARGS...]}" && pwd)"
shift
venv="${APLC_UPSTREAM_VENV:-$repo/target/upstream-venv}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'pytest>=7' 'pytest-asyncio>=0.23'
fi
# The wheel as .ci/run builds it (dev profile, the workspace's target dir).
(cd "$repo" && MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/pip" install --quiet --force-reinstall --no-deps ./python)

utils="$tests/../defuss_apl/test_utils.py"
if [ ! -f "$utils" ]; then
  "$venv/bin/pip" download --quiet --no-deps --dest "$work/wheel" defuss-apl==1.1.0
  "$venv/bin/python" -m zipfile -e "$work"/wheel/defuss_apl-*.whl "$work/wheel/x"
  utils="$work/wheel/x/defuss_apl/test_utils.py"
fi

# A copy, so that a `defuss_apl/` next to the tests (the reference itself) is not the
# package they import: the shim comes first on the path, and nothing else is there.
cp -r "$tests" "$work/tests"
rm -f "$work/tests/test_apl.py" # re-imports the other modules: 159 duplicates
deselect=()
while read -r id; do
  deselect+=(--deselect "$id")
done < <(grep -v '^#' "$here/not_applicable.txt" | sed 's/ # .*//' | grep .)

cd "$work"
status=0
DEFUSS_APL_TEST_UTILS="$(cd "$(dirname "$utils")" && pwd)/$(basename "$utils")" \
  PYTHONPATH="$here" "$venv/bin/python" -m pytest tests -p no:cacheprovider \
  -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=function \
  --rootdir "$work" -q -rf "${deselect[@]}" "$@" | tee "$work/out" || status=$?
count() { grep -oE "[0-9]+ $1" "$work/out" | tail -1 | grep -oE '[0-9]+' || echo 0; }
passed=$(count passed) failed=$(count failed) errors=$(count error)
echo "upstream tests: $passed passed of $((passed + failed + errors)) applicable ($(( ${#deselect[@]} / 2 )) not applicable)"
exit "$status"

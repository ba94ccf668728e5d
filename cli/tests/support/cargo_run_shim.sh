#!/bin/sh
# Stands in for `cargo` in the commands tests/docs.rs runs from README.md: a nested cargo
# would rebuild the binary (the test build has other features) inside a running test.
# `cargo run -p aplc -- ARGS` is "build aplc, then run it on ARGS"; the build is the one
# this test runs in, so this runs the aplc that test was built with ($APLC_BIN) on ARGS.
# Anything else is refused: a new cargo command in the docs needs its own check.
# (.ci/run runs the README's real `cargo run` command as its last step.)
if [ "$1" = run ] && [ "$2" = -p ] && [ "$3" = aplc ] && [ "$4" = -- ]; then
  shift 4
  exec "$APLC_BIN" "$@"
fi
echo "docs test: only \`cargo run -p aplc -- ARGS\` can run here, not \`cargo $*\`" >&2
exit 99

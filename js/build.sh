#!/usr/bin/env bash
# Builds the npm package's WebAssembly module and its JavaScript glue into js/pkg/:
# `cargo build` of the aplc-js crate for wasm32-unknown-unknown (profile `wasm`: release,
# optimised for size), then the `wasm-bindgen` CLI (its version must equal the
# wasm-bindgen crate's: .ci/run installs it) with `--target web` (ES modules, which
# js/index.js initialises in Node from the file and in browsers by URL).
#
#   WASM_BINDGEN=/path/to/wasm-bindgen js/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0
wasm_bindgen="${WASM_BINDGEN:-wasm-bindgen}"
if ! command -v "$wasm_bindgen" >/dev/null 2>&1; then
  echo "js/build.sh: no wasm-bindgen CLI (set WASM_BINDGEN, or see .ci/run for its install)" >&2
  exit 1
fi
want="$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' Cargo.toml)"
have="$("$wasm_bindgen" --version | awk '{print $2}')"
if [ "$want" != "$have" ]; then
  echo "js/build.sh: wasm-bindgen CLI $have, but the crate is $want: they must be equal" >&2
  exit 1
fi
# jsonschema's hashing seeds from getrandom, whose JavaScript backend the cfg names.
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS='--cfg getrandom_backend="wasm_js"' \
  cargo build -p aplc-js --target wasm32-unknown-unknown --profile wasm --locked
rm -rf js/pkg
"$wasm_bindgen" --target web --out-dir js/pkg --out-name aplc_js \
  target/wasm32-unknown-unknown/wasm/aplc_js.wasm
# The glue's own package.json would make js/pkg a package of its own: the npm package is js/.
rm -f js/pkg/package.json js/pkg/.gitignore
ls -l js/pkg/aplc_js_bg.wasm

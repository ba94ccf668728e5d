#!/usr/bin/env python3
"""The crates' layering, checked on the resolved dependency graph (`cargo metadata`).

* `aplc-vm`, the sans-IO core, and `aplc-js`, the npm package's WebAssembly module,
  have no async runtime, HTTP stack, socket or TLS crate
  anywhere in its normal dependency tree, with every feature of every workspace crate on
  (`--all-features`), so it stays ready for `wasm32-unknown-unknown`.
* Crates depend downwards only: the core depends on no other aplc crate; the compiler on
  the core alone; the runtime on the core alone (it never compiles source); the server
  (`aplc serve`) on the core, the compiler and the runtime, and nothing below it on the
  server; the language server (`aplc lsp`) on the core and the compiler only.
* `aplc-test-support` (the tests' shared helpers) is a dev-dependency only: no crate
  depends on it for its build, and it depends on no aplc crate.

Reads the graph Cargo resolved; compiles nothing. Fails naming the path to each
forbidden crate.
"""
import json
import subprocess
import sys

# Crates that mean I/O: an async runtime, an HTTP stack, sockets, TLS, or a process API.
IO_CRATES = {
    "tokio", "mio", "reqwest", "hyper", "hyper-util", "h2", "socket2", "rustls",
    "ring", "async-std", "smol", "axum", "tower", "ureq", "native-tls", "openssl",
    "rustix", "nix",
}

# Which aplc crates each aplc crate may depend on (normal dependencies).
ALLOWED_INTERNAL = {
    "aplc-vm": set(),
    "aplc-compiler": {"aplc-vm"},
    "aplc-runtime": {"aplc-vm"},
    "aplc-server": {"aplc-vm", "aplc-compiler", "aplc-runtime"},
    # The language server (`aplc lsp`) answers from the compiler alone: it never runs.
    "aplc-lsp": {"aplc-vm", "aplc-compiler"},
    # The tests' shared helpers depend on no aplc crate (and nothing on them: see
    # `DEV_ONLY`).
    "aplc-test-support": set(),
    # The npm package's WebAssembly module: the compiler and the core, never the runtime
    # (no tokio, HTTP, stores or telemetry in the browser), so it is held to the core's
    # no-I/O rule too (`SANS_IO`).
    "aplc-js": {"aplc-vm", "aplc-compiler"},
}

# Crates with no I/O crate anywhere in their normal dependency tree.
SANS_IO = {"aplc-vm", "aplc-js"}

# Crates only tests may use: no crate has them as a normal dependency.
DEV_ONLY = {"aplc-test-support"}


def main():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    names = {p["id"]: p["name"] for p in meta["packages"]}
    normal = {}
    for node in meta["resolve"]["nodes"]:
        normal[node["id"]] = [
            dep["pkg"]
            for dep in node["deps"]
            # A dependency that is normal for some target (build and dev ones aside).
            if any(kind["kind"] is None for kind in dep["dep_kinds"])
        ]
    ids = {name: pid for pid, name in names.items() if name.startswith("aplc-")}
    failures = []

    def paths_from(root):
        """Every crate reachable from `root` through normal dependencies, with a path."""
        seen = {root: [names[root]]}
        stack = [root]
        while stack:
            node = stack.pop()
            for dep in normal.get(node, []):
                if dep not in seen:
                    seen[dep] = seen[node] + [names[dep]]
                    stack.append(dep)
        return seen

    for crate, allowed in ALLOWED_INTERNAL.items():
        if crate not in ids:
            failures.append(f"{crate} is not in the workspace")
            continue
        reachable = paths_from(ids[crate])
        for pid, path in reachable.items():
            name = names[pid]
            if name.startswith("aplc-") and name != crate and name not in allowed:
                if name != "aplc-workspace-hack":
                    failures.append(f"{crate} must not depend on {name}: {' -> '.join(path)}")
        if crate in SANS_IO:
            for pid, path in reachable.items():
                if names[pid] in IO_CRATES:
                    failures.append(
                        f"{crate} (sans-IO) depends on {names[pid]}: {' -> '.join(path)}"
                    )

    for pid, deps in normal.items():
        for dep in deps:
            if names[dep] in DEV_ONLY:
                failures.append(
                    f"{names[pid]} depends on {names[dep]} for its build: make it a dev-dependency"
                )

    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(
        "layering ok: aplc-vm and aplc-js have no I/O crate; crates depend downwards only; "
        "the test helpers are dev-only"
    )


if __name__ == "__main__":
    main()

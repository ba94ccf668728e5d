#!/usr/bin/env python3
"""aplc-runtime's cargo features leave out what they say (ARCHITECTURE.md, `runtime/`).

With `--no-default-features` the runtime builds, and its normal dependency tree has no
bundled SQLite, no tokio-postgres and no OpenTelemetry SDK; each feature alone brings in
its own crate and none of the others (`mcp`: rmcp, the MCP client). Fails loudly,
naming the crate and the build.
"""
import subprocess
import sys

HEAVY = {
    "sqlite": "rusqlite",
    "postgres": "tokio-postgres",
    "otel": "opentelemetry_sdk",
    "mcp": "rmcp",
}


def run(*args):
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, check=True, text=True, stdout=subprocess.PIPE).stdout


def selection(features):
    """Cargo's arguments for the runtime with only `features`."""
    chosen = ["--features", ",".join(features)] if features else []
    return ["-p", "aplc-runtime", "--locked", "--no-default-features", *chosen]


def tree(features):
    """The crate names in the runtime's normal dependency tree with only `features`."""
    out = run("cargo", "tree", *selection(features), "-e", "normal", "--prefix", "none")
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def main():
    failures = []
    for enabled in [[], *([feature] for feature in HEAVY)]:
        run("cargo", "check", *selection(enabled))
        crates = tree(enabled)
        build = "--no-default-features" + "".join(f" --features {f}" for f in enabled)
        for feature, crate in HEAVY.items():
            present = crate in crates
            if present != (feature in enabled):
                should = "must" if feature in enabled else "must not"
                failures.append(f"aplc-runtime {build}: `{crate}` {should} be in the tree")
    for failure in failures:
        print(failure, file=sys.stderr)
    if failures:
        sys.exit(1)
    print("aplc-runtime's features: each backend and the OpenTelemetry SDK only when asked for")


if __name__ == "__main__":
    main()

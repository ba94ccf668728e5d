#!/usr/bin/env python3
"""aplc-runtime's cargo features leave out what they say (ARCHITECTURE.md, `runtime/`).

With `--no-default-features` the runtime builds, and its normal dependency tree has no
bundled SQLite, no tokio-postgres and no OpenTelemetry SDK; each feature alone brings in
its own crate and none of the others (`mcp`: rmcp, the MCP client). Fails loudly,
naming the crate and the build.

Also the `mcp` feature of aplc-server and of the aplc CLI (`aplc mcp`, spec/mcp.md §3):
without it each builds and has none of rmcp's server half in its tree; with it (the
default), the server half is there.
"""
import subprocess
import sys

HEAVY = {
    "sqlite": "rusqlite",
    "postgres": "tokio-postgres",
    "otel": "opentelemetry_sdk",
    "mcp": "rmcp",
}


# Each build is linted as it is checked: `cargo clippy` rather than `cargo check`, so the
# builds reuse what `.ci/run`'s workspace clippy compiled and every feature set is
# lint-clean. A build is linted once: the default builds of aplc-server and aplc are the
# workspace clippy's, and the trees below are read with `cargo tree`, which builds
# nothing (each clippy of a new feature set re-checks the crates whose features change:
# about a minute each for the server's tree).
CHECK = ("cargo", "clippy")
LINTS = ("--", "-D", "warnings")


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


# rmcp's features that only `aplc mcp` needs: the MCP server half.
RMCP_SERVER = 'rmcp feature "server"'
MCP_PACKAGES = ["aplc-server", "aplc"]


def server_half(package, default):
    """Whether `package` (with or without its default features) has rmcp's server half."""
    chosen = [] if default else ["--no-default-features"]
    out = run(
        "cargo", "tree", "-p", package, "--locked", *chosen,
        "-e", "normal,features", "--prefix", "none",
    )
    return any(line.startswith(RMCP_SERVER) for line in out.splitlines())


def check_mcp_server(failures):
    """`aplc mcp`'s feature: off, no rmcp server half; on by default, there."""
    # Both without their defaults, in one build (the server's tree is checked once).
    packages = [arg for package in MCP_PACKAGES for arg in ("-p", package)]
    run(*CHECK, *packages, "--locked", "--no-default-features", *LINTS)
    for package in MCP_PACKAGES:
        if server_half(package, default=False):
            failures.append(f"{package} --no-default-features: rmcp's `server` must not be in the tree")
        if not server_half(package, default=True):
            failures.append(f"{package}: rmcp's `server` must be in the default tree (`mcp`)")


def main():
    failures = []
    check_mcp_server(failures)
    # Without any feature, tests included: what an embedder with `default-features =
    # false` builds (`--all-targets` lints the library too).
    run(*CHECK, *selection([]), "--all-targets", *LINTS)
    for enabled in [[], *([feature] for feature in HEAVY)]:
        if enabled:
            run(*CHECK, *selection(enabled), *LINTS)
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
    print("aplc-server's and aplc's `mcp`: rmcp's server half only with it")


if __name__ == "__main__":
    main()

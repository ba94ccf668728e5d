#!/usr/bin/env python3
"""The crates the dev profile builds at opt-level 0 (`[profile.dev.package]` in the root
Cargo.toml) run only at build time: each is a proc macro, or reached only through proc
macros and build dependencies, never a crate the tests or binaries run. A runtime crate
at opt-level 0 would slow every test that uses it, with no error to say so.

Reads the graph Cargo resolved (`cargo metadata`, every target platform); compiles
nothing. Fails naming each listed crate that some workspace crate also runs, and the
path to it.
"""
import json
import subprocess
import sys
import tomllib


def listed_at_opt0(manifest):
    packages = manifest.get("profile", {}).get("dev", {}).get("package", {})
    return sorted(
        name for name, settings in packages.items()
        if name != "*" and settings.get("opt-level") == 0
    )


def main():
    with open("Cargo.toml", "rb") as f:
        listed = listed_at_opt0(tomllib.load(f))
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True, capture_output=True, text=True,
    ).stdout)
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    members = set(metadata["workspace_members"])

    def is_proc_macro(pid):
        return any("proc-macro" in t["kind"] for t in packages[pid]["targets"])

    # What runs: the workspace's crates and their normal (and, for members, dev)
    # dependencies, short of proc macros; each with the path that reaches it.
    runs = {}
    stack = [(m, [packages[m]["name"]]) for m in members]
    while stack:
        pid, path = stack.pop()
        if pid in runs:
            continue
        runs[pid] = path
        for dep in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if is_proc_macro(dep["pkg"]):
                continue
            if None in kinds or (pid in members and "dev" in kinds):
                stack.append((dep["pkg"], path + [packages[dep["pkg"]]["name"]]))

    names = {packages[pid]["name"] for pid in packages}
    failures = []
    for name in listed:
        if name not in names:
            failures.append(f"`{name}` is in no build: take it off the list")
            continue
        for pid, path in runs.items():
            if packages[pid]["name"] == name:
                failures.append(
                    f"`{name}` runs in the tests or binaries ({' -> '.join(path)}): "
                    "it must not be built at opt-level 0"
                )
                break
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    print(f"{len(listed)} crates at opt-level 0, each run only at build time")
    return 0


if __name__ == "__main__":
    sys.exit(main())

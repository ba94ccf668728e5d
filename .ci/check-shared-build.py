#!/usr/bin/env python3
"""The README's two commands share one build.

`cargo run -p aplc` and `cargo test --workspace` compile a dependency once per distinct
feature set; when a dev-dependency adds a feature to a crate the binary also uses, the
second command recompiles that crate and everything above it. This compares the two
builds' feature sets (from `cargo tree`, which compiles nothing) and fails when they
differ beyond the differences kept on purpose. Fix a failure by adding the reported
features to workspace-hack/Cargo.toml.
"""
import subprocess
import sys

# Differences kept on purpose, as (package, feature set in the test build).
ALLOWED = {
    # A build-time (host) copy for proc macros, compiled with fewer features by the
    # binary's build; rebuilding it costs seconds.
    "memchr": {"default"},
    # Build-time (host) copies for the build scripts of the Temporal SDK's protobuf
    # crates (prost-build's tempfile), compiled with fewer features by the binary's
    # build; small crates, rebuilt in seconds.
    "getrandom": {"std", "sys_rng"},
    "libc": {"default", "extra_traits", "std"},
    "linux-raw-sys": {"prctl", "system"},
    "rustix": {"process", "system"},
}


def features(args):
    out = subprocess.run(
        ["cargo", "tree", *args, "-f", "{p} [{f}]", "--prefix", "none"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        line = line.strip()
        if not line:
            continue
        name = line.split(" [")[0].replace(" (*)", "").split(" (")[0]
        found.setdefault(name, set()).add(line[line.rfind("[") + 1 : line.rfind("]")])
    return found


run = features(["-p", "aplc", "-e", "normal,build"])
test = features(["--workspace", "-e", "normal,build,dev"])
problems = []
for package, sets in sorted(run.items()):
    if package not in test or sets == test[package]:
        continue
    crate = package.split(" ")[0]
    extra = {f for s in test[package] for f in s.split(",")} - {
        f for s in sets for f in s.split(",")
    }
    allowed = ALLOWED.get(crate)
    if allowed is not None and extra <= allowed | {""}:
        continue
    problems.append(f"{package}: binary build {sorted(sets)}, test build {sorted(test[package])}")
if problems:
    print("the binary's build and the test build compile these crates differently:")
    print("\n".join("  " + p for p in problems))
    print("add the test build's features to workspace-hack/Cargo.toml")
    sys.exit(1)
print("the binary's build and the test build share every dependency (host build-script copies aside)")

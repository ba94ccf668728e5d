#!/usr/bin/env python3
"""No Rust source file in the runtime passes 1,000 lines.

A file that grows past that is split along the seams of its state (STYLE.md), as the
run stores were split into `store/sqlite/` and `store/postgres/`. Counts lines with
`wc -l`'s rule (newlines); tests inside a file count too. Fails naming each file and its
length.
"""
import pathlib
import sys

ROOTS = ["runtime/src"]
LIMIT = 1000


def main():
    repo = pathlib.Path(__file__).resolve().parent.parent
    failures = []
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.rs")):
            lines = path.read_bytes().count(b"\n")
            if lines > LIMIT:
                failures.append(f"{path.relative_to(repo)}: {lines} lines (at most {LIMIT})")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"file sizes ok: no .rs file under {', '.join(ROOTS)} has more than {LIMIT} lines")


if __name__ == "__main__":
    main()

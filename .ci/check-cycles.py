#!/usr/bin/env python3
"""Import cycles between the modules of each crate (STYLE.md: "Modules that import each
other. Pull the shared part into a leaf module.").

A module is a file under `<crate>/src/` (a `foo.rs` file or a `foo/mod.rs` folder),
reached from the crate root by `mod name;` declarations. An edge A -> B means a path in
A's code names module B: `use crate::b::X`, `crate::b::f()`, `super::X`, `self::x::Y`, or
a bare `child::X` for a submodule A declares. A path resolves to the longest module prefix
it names; an item in an inline `mod name { ... }` belongs to its file. Not graphed:

* the crate root (`lib.rs`, `main.rs`): it declares every module and re-exports their
  items, so a path through it names the root, not the module that defines the item;
* test code: `#[cfg(test)]` modules (inline or in their own file) and `tests/`;
* `mod` declarations themselves: owning a submodule is not using it;
* a submodule's paths into its ancestors (`super::X`): a submodule is its owner's
  private part, split into a file of its own, not a peer module.

The same holds one level up: a top-level module together with everything under it (a
folder such as `vm/src/template/`) counts as one node, and those nodes may not form a
cycle either, so a crate's folders layer (`template` <- `provider` <- `run` in the VM)
even where no two files import each other.

Prints every elementary cycle, each edge with the file and line that makes it.

Usage: check-cycles.py [CRATE_DIR ...]
Exits 1 if any crate checked has a cycle. Default crates: compiler vm runtime server cli python examples/embed.
"""
import argparse
import os
import re
import sys

DEFAULT_CRATES = ["compiler", "vm", "runtime", "server", "cli", "python", "examples/embed"]
# Enough for these crates' graphs; a cap keeps a pathological graph from running long.
MAX_CYCLES = 200

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(src):
    """The source with comments and string/char literals blanked, newlines kept (so that
    offsets still map to lines)."""
    out = []
    i, n = 0, len(src)

    def blank(text):
        return re.sub(r"[^\n]", " ", text)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif re.match(r'b?r(#*)"', src[i:i + 260]) and (i == 0 or not re.match(r"\w", src[i - 1])):
            m = re.match(r'b?r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(blank(src[i:j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}'); a lifetime ('a) has no closing quote.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append(blank(m.group(0)))
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code, open_brace):
    """The offset just past the `}` matching the `{` at open_brace."""
    depth = 0
    for j in range(open_brace, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def drop_test_modules(code):
    """Blank `#[cfg(test)] mod x { ... }` bodies; return the code and the names of
    `#[cfg(test)] mod x;` files (not graphed)."""
    test_files = set()
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")
    while True:
        m = pattern.search(code)
        if not m:
            return code, test_files
        if m.group(2) == ";":
            test_files.add(m.group(1))
            end = m.end()
        else:
            end = block_end(code, m.end() - 1)
        code = code[:m.start()] + re.sub(r"[^\n]", " ", code[m.start():end]) + code[end:]


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (segments, `self` kept)."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas" + IDENT, "", tree)

    def split_top(s):
        parts, depth, start = [], 0, 0
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        return [p for p in parts if p]

    def expand(s):
        brace = s.find("{")
        if brace < 0:
            return [s.split("::")]
        prefix = [p for p in s[:brace].split("::") if p]
        inner = s[brace + 1:s.rfind("}")]
        paths = []
        for part in split_top(inner):
            for rest in expand(part):
                paths.append(prefix + ([] if rest == ["self"] else rest))
        return paths

    return expand(tree)


class Crate:
    def __init__(self, root_dir):
        self.src = os.path.join(root_dir, "src")
        self.name = os.path.basename(os.path.normpath(root_dir))
        self.files = {}  # module path (tuple) -> file
        self.children = {}  # module path -> set of submodule names
        self.code = {}  # module path -> code without comments, strings and tests
        root = next(f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(self.src, f)))
        self.load((), os.path.join(self.src, root), self.src)

    def load(self, module, path, child_dir):
        with open(path, encoding="utf-8") as f:
            code = strip_comments_and_strings(f.read())
        code, test_files = drop_test_modules(code)
        self.files[module] = path
        self.code[module] = code
        self.children[module] = set()
        for m in re.finditer(r"(?:^|[\s;}])(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", code):
            name = m.group(1)
            if name in test_files:
                continue
            flat = os.path.join(child_dir, name + ".rs")
            folder = os.path.join(child_dir, name, "mod.rs")
            if os.path.exists(flat):
                self.children[module].add(name)
                self.load(module + (name,), flat, os.path.join(child_dir, name))
            elif os.path.exists(folder):
                self.children[module].add(name)
                self.load(module + (name,), folder, os.path.join(child_dir, name))

    def resolve(self, module, segments, inline_depth):
        """The module a path names, or None (an outside crate, a local item)."""
        first = segments[0]
        if first == "crate":
            base, rest = (), segments[1:]
        elif first in ("super", "self"):
            base, k = module, 0
            supers = inline_depth
            while k < len(segments) and segments[k] in ("super", "self"):
                if segments[k] == "super":
                    if supers:
                        supers -= 1  # leaves an inline module, stays in the file
                    else:
                        base = base[:-1]
                k += 1
            rest = segments[k:]
        elif first in self.children[module]:
            base, rest = module, segments
        else:
            return None
        for seg in rest:
            if base + (seg,) in self.files:
                base = base + (seg,)
            else:
                break
        return base

    def edges(self):
        """{(from, to): [line, ...]} between non-root modules."""
        found = {}
        for module, code in self.code.items():
            if module == ():
                continue
            inline = [(m.end() - 1, block_end(code, m.end() - 1))
                      for m in re.finditer(r"\bmod\s+" + IDENT + r"\s*\{", code)]
            uses = [(m.start(), m.end(), m.group(1))
                    for m in re.finditer(r"\buse\s+([^;]*);", code)]

            def depth_at(pos):
                return sum(1 for a, b in inline if a < pos < b)

            def add(pos, segments):
                target = self.resolve(module, segments, depth_at(pos))
                # A submodule is its owner's private part, not a peer: its paths into
                # an ancestor (`super::X`) make no edge, else every split file cycles.
                if target is None or module[:len(target)] == target:
                    return
                line = code.count("\n", 0, pos) + 1
                found.setdefault((module, target), []).append(line)

            for start, _, tree in uses:
                for segments in expand_use_tree(tree):
                    if segments and segments[0]:
                        add(start, segments)
            rest = code
            for start, end, _ in uses:
                rest = rest[:start] + " " * (end - start) + rest[end:]
            heads = ["crate", "super", "self"] + sorted(self.children[module])
            pattern = r"(?<![\w:])(?:" + "|".join(heads) + r")(?:\s*::\s*" + IDENT + r")+"
            for m in re.finditer(pattern, rest):
                add(m.start(), re.split(r"\s*::\s*", m.group(0)))
        return found


def simple_cycles(nodes, adjacency):
    """Every elementary cycle, each once (started at its smallest node), capped."""
    cycles = []
    order = sorted(nodes)
    for start in order:
        stack = [(start, iter(sorted(adjacency.get(start, ()))))]
        path, on_path = [start], {start}
        while stack and len(cycles) < MAX_CYCLES:
            node, neighbours = stack[-1]
            nxt = next(neighbours, None)
            if nxt is None:
                stack.pop()
                on_path.discard(path.pop())
            elif nxt == start:
                cycles.append(list(path))
            elif nxt not in on_path and nxt > start:
                path.append(nxt)
                on_path.add(nxt)
                stack.append((nxt, iter(sorted(adjacency.get(nxt, ())))))
    return cycles


def module_name(crate, module):
    return crate.name + "::" + "::".join(module)


def print_cycles(crate, kind, cycles, edges, files):
    for cycle in cycles:
        print("%s in %s: %s" % (kind, crate.name, " -> ".join(
            [module_name(crate, m) for m in cycle] + [module_name(crate, cycle[0])])))
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            (file, lines) = files(a, b)
            print("    %s uses %s (%s: %s)" % ("::".join(a), "::".join(b), file, lines))


def report(crate):
    edges = crate.edges()
    adjacency = {}
    for a, b in edges:
        adjacency.setdefault(a, set()).add(b)
    cycles = simple_cycles(set(crate.files) - {()}, adjacency)

    def module_edge(a, b):
        return (os.path.relpath(crate.files[a]),
                ", ".join(str(n) for n in sorted(set(edges[(a, b)]))[:5]))

    print_cycles(crate, "cycle", cycles, edges, module_edge)

    # Top-level modules (a folder and all under it as one): the first edge found of
    # each pair, to show where to look.
    top_edges = {}
    for a, b in sorted(edges):
        if a[:1] != b[:1]:
            top_edges.setdefault((a[:1], b[:1]), (a, edges[(a, b)]))
    top_adjacency = {}
    for a, b in top_edges:
        top_adjacency.setdefault(a, set()).add(b)
    top_cycles = simple_cycles({m[:1] for m in crate.files if m}, top_adjacency)

    def top_edge(a, b):
        module, lines = top_edges[(a, b)]
        return (os.path.relpath(crate.files[module]),
                ", ".join(str(n) for n in sorted(set(lines))[:5]))

    # A cycle of files is one of their folders too: report only the new ones.
    seen = {tuple(sorted({m[:1] for m in c})) for c in cycles}
    top_cycles = [c for c in top_cycles if tuple(sorted(c)) not in seen]
    print_cycles(crate, "cycle between folders", top_cycles, top_edges, top_edge)
    return len(cycles) + len(top_cycles)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crates", nargs="*", default=DEFAULT_CRATES)
    args = parser.parse_args()
    failed = []
    for crate_dir in args.crates:
        crate = Crate(crate_dir)
        count = report(crate)
        print("%s: %d module import cycle(s)" % (crate.name, count))
        if count:
            failed.append(crate.name)
    if failed:
        print("modules that import each other in %s: pull the shared part into a leaf "
              "module (STYLE.md)" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Diagnostics latency of `aplc lsp` on a 1,000-step file (issue #29).

Starts `aplc lsp` (the binary given, default target/release/aplc), opens the same
1,000-step agent as `aplc_benches::generated_agent(1000)` (each step: pre, two role
sections, post), then applies N single-character edits, each toggling an error on and
off, and times each from writing the `didChange` to reading the `publishDiagnostics` for
that version. The time includes the server's 50 ms debounce; the report also gives the
time without it (the compile, the conversion and the I/O).

    python3 benches/lsp_latency.py [target/release/aplc] [-n 30]
"""
import json
import statistics
import subprocess
import sys
import time

DEBOUNCE_MS = 50


def generated_agent(n):
    out = []
    for i in range(n):
        nxt = f"s{i + 1}" if i + 1 < n else "return"
        out.append(
            f"# pre: s{i}\n{{{{ set_context('k{i}', {i}) }}}}\n\n"
            f"# prompt: s{i}\n## system\nYou are step {i}.\n## user\nValue {{{{ k{i} }}}}, previous {{{{ prev_step }}}}.\n\n"
            f"# post: s{i}\n{{% if runs < 2 %}}{{{{ set_context('next_step', '{nxt}') }}}}{{% endif %}}\n\n"
        )
    return "".join(out)


class Server:
    def __init__(self, binary):
        self.p = subprocess.Popen([binary, "lsp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(self, message):
        body = json.dumps(message).encode()
        self.p.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.p.stdin.flush()

    def read(self):
        header = b""
        while not header.endswith(b"\r\n\r\n"):
            header += self.p.stdout.read(1)
        length = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        return json.loads(self.p.stdout.read(length))

    def diagnostics(self, version):
        while True:
            m = self.read()
            if m.get("method") == "textDocument/publishDiagnostics" and m["params"].get("version") == version:
                return m["params"]["diagnostics"]


def main():
    args = sys.argv[1:]
    n = 30
    if "-n" in args:
        i = args.index("-n")
        n = int(args[i + 1])
        del args[i : i + 2]
    binary = args[0] if args else "target/release/aplc"
    text = generated_agent(1000)
    uri = "file:///bench/agent1000.apl"
    s = Server(binary)
    s.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}})
    s.read()
    s.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    s.send({"jsonrpc": "2.0", "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "aplc", "version": 1, "text": text}}})
    assert s.diagnostics(1) == [], "the generated agent is valid"
    # Line 11 is step s0's post: `'s1'` becomes `'sX'` (an unknown step) and back.
    line = text.split("\n")[10]
    col = line.index("'s1'") + 2
    times = []
    for version in range(2, n + 2):
        new = "X" if version % 2 == 0 else "1"
        change = {"range": {"start": {"line": 10, "character": col}, "end": {"line": 10, "character": col + 1}},
                  "text": new}
        start = time.perf_counter()
        s.send({"jsonrpc": "2.0", "method": "textDocument/didChange",
                "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}})
        diagnostics = s.diagnostics(version)
        times.append((time.perf_counter() - start) * 1000)
        assert len(diagnostics) == (1 if new == "X" else 0), diagnostics
    s.send({"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
    s.read()
    s.send({"jsonrpc": "2.0", "method": "exit"})
    s.p.wait()
    median = statistics.median(times)
    print(json.dumps({
        "steps": 1000, "bytes": len(text.encode()), "edits": n,
        "median_ms": round(median, 1), "min_ms": round(min(times), 1), "max_ms": round(max(times), 1),
        "median_without_debounce_ms": round(median - DEBOUNCE_MS, 1),
    }))


if __name__ == "__main__":
    main()

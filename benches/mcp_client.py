"""The official Python MCP client (PyPI `mcp`) making N sequential calls of one tool,
for benches/mcp.sh: the server's own time per call, as a client without aplc sees it.

    mcp_client.py N TOOL ARGS_JSON stdio COMMAND [ARG...]
    mcp_client.py N TOOL ARGS_JSON http URL        (Authorization from REMOTE_AUTH)
    mcp_client.py N TOOL ARGS_JSON raw COMMAND [ARG...]

Prints the median of 3 rounds of N calls, in microseconds per call (after initialize
and one warm-up call). `raw` is the floor of a stdio server: no SDK, one JSON line
written and its answer read per call.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


async def calls(session, n, tool, arguments):
    await session.initialize()
    await session.call_tool(tool, arguments)
    rounds = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(n):
            result = await session.call_tool(tool, arguments)
            assert not result.is_error, result
        rounds.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(rounds)


def rounds(n, call):
    call(0)
    per_round = []
    for _ in range(3):
        started = time.perf_counter()
        for i in range(n):
            call(i + 1)
        per_round.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(per_round)


def raw(n, tool, arguments, command):
    server = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    counter = iter(range(1 << 30))

    def send(message):
        server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        server.stdin.flush()

    def rpc(method, params):
        ident = next(counter)
        send({"id": ident, "method": method, "params": params})
        while True:
            answer = json.loads(server.stdout.readline())
            if answer.get("id") == ident:
                return answer

    info = {"name": "raw", "version": "1"}
    rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info})
    send({"method": "notifications/initialized"})

    def call(_):
        answer = rpc("tools/call", {"name": tool, "arguments": arguments})
        assert not answer["result"].get("isError"), answer

    try:
        return rounds(n, call)
    finally:
        server.kill()


async def main():
    n, tool, arguments, kind, *target = sys.argv[1:]
    n, arguments = int(n), json.loads(arguments)
    if kind == "raw":
        print(round(raw(n, tool, arguments, target)))
    elif kind == "stdio":
        params = StdioServerParameters(command=target[0], args=target[1:], env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            print(round(await calls(session, n, tool, arguments)))
    else:
        headers = {"Authorization": os.environ["REMOTE_AUTH"]}
        async with httpx2.AsyncClient(headers=headers) as http:
            async with streamable_http_client(target[0], http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    print(round(await calls(session, n, tool, arguments)))


anyio.run(main)

"""The official Python MCP client (PyPI `mcp`) making N sequential calls of one tool,
for benches/mcp.sh: the server's own time per call, as a client without aplc sees it.

    mcp_client.py N TOOL ARGS_JSON stdio COMMAND [ARG...]
    mcp_client.py N TOOL ARGS_JSON http URL        (Authorization from REMOTE_AUTH)

Prints the median of 3 rounds of N calls, in microseconds per call (after initialize
and one warm-up call).
"""

import json
import os
import statistics
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


async def main():
    n, tool, arguments, kind, *target = sys.argv[1:]
    n, arguments = int(n), json.loads(arguments)
    if kind == "stdio":
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

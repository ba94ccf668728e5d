"""MCP servers from a tool manifest (spec/mcp.md, spec/python.md): ``with_tools`` as a
manifest's path, or as the parsed manifest with its ``mcpServers`` key, next to Python
tools. The server is ``fixtures/mcp/counter_server.py`` on the official SDK (PyPI
``mcp``), run by ``APLC_MCP_PYTHON`` (``.ci/run`` makes that venv); without it these
tests fail, never skip."""

import json
import os
import time
from pathlib import Path

import pytest

import aplc
from conftest import response, tool_call

AGENT = """
# pre: go
{{ set_context('allowed_tools', allowed) }}

# prompt: go
## user
Use the tools.
"""

SERVER = Path(__file__).resolve().parents[2] / "fixtures" / "mcp" / "counter_server.py"


@pytest.fixture
def mcp_python():
    python = os.environ.get("APLC_MCP_PYTHON")
    if not python:
        pytest.fail(
            "APLC_MCP_PYTHON is not set: these tests need a Python with the `mcp` package "
            "(python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install mcp; "
            "APLC_MCP_PYTHON=/tmp/mcpvenv/bin/python)"
        )
    return python


def counter(python, tmp_path):
    """The counter server's manifest entry: side effects in ``count``, its pid in ``pid``."""
    return {
        "command": python,
        "args": [str(SERVER)],
        "env": {"COUNTER_FILE": str(tmp_path / "count"), "PID_FILE": str(tmp_path / "pid")},
        "prefix": "c_",
        "startup_timeout_ms": 60000,
    }


def run(with_tools, calls, allowed, **more):
    """Answers "done" with ``calls``."""

    async def provider(context):
        return response("done", calls)

    return aplc.start_sync(AGENT, {
        "with_providers": {"gpt-4o": provider},
        "with_tools": with_tools,
        "with_context": {"allowed": list(allowed)},
        **more,
    })


def results(status):
    return [(r["content"], r["with_error"]) for r in status["result_tool_calls"]]


def assert_gone(pid_file):
    """The server's process is gone (or a zombie an init has not reaped yet) soon after
    the run ended."""
    pid = int(pid_file.read_text().strip())
    stat = Path(f"/proc/{pid}/stat")

    def alive():
        try:
            return ") Z " not in stat.read_text()
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(), f"the MCP server {pid} outlived its run"


def test_a_manifest_path_starts_its_servers_for_the_run(mcp_python, tmp_path):
    manifest = tmp_path / "tools.json"
    manifest.write_text(json.dumps({"mcpServers": {"counter": counter(mcp_python, tmp_path)}}))
    calls = [tool_call("1", "c_add", {"a": 40, "b": 2}), tool_call("2", "c_bump", {}),
             tool_call("3", "c_add", {"a": "forty", "b": 2})]
    status = run(manifest, calls, allowed=("c_add", "c_bump"))
    first, second, third = results(status)
    assert first == ({"sum": 42}, False)
    assert second == ("count=1", False)
    # Checked against the server's inputSchema before the call, as any tool.
    assert third[1] is True and "forty" in json.dumps(third[0])
    assert status["result_text"] == "done"
    assert (tmp_path / "count").read_text() == "bump\n"
    assert_gone(tmp_path / "pid")
    # A str path works too, and each run has its own server.
    status = run(str(manifest), [tool_call("1", "c_bump", {})], allowed=("c_bump",))
    assert results(status) == [("count=2", False)]


def test_the_parsed_manifest_runs_next_to_python_tools(mcp_python, tmp_path):
    def mul(a: int, b: int) -> int:
        """Multiply."""
        return a * b

    with_tools = {"mcpServers": {"counter": counter(mcp_python, tmp_path)}, "mul": {"fn": mul}}
    calls = [tool_call("1", "mul", {"a": 6, "b": 7}), tool_call("2", "c_greet", {"name": "Ada"}),
             tool_call("3", "c_fail", {"reason": "testing"})]
    allowed = ("mul", "c_greet", "c_fail")
    # In memory, and as a durable run (one toolbox for the driver, spec/python.md).
    for more in ({}, {"store": f"sqlite:{tmp_path / 'runs.db'}"}):
        status = run(with_tools, calls, allowed, **more)
        first, second, third = results(status)
        assert first == (42, False)
        assert second == ("Hello, Ada!", False)
        assert third[1] is True and "failed on purpose: testing" in json.dumps(third[0])
        assert_gone(tmp_path / "pid")


def test_a_server_that_does_not_start_is_a_clear_error(mcp_python, tmp_path):
    broken = {"command": mcp_python, "args": ["-c", "import sys; sys.exit(3)"]}
    with pytest.raises(ValueError, match="MCP server `broken`: did not initialize"):
        run({"mcpServers": {"broken": broken}}, [], allowed=())


def test_two_tools_with_one_name_are_refused(mcp_python, tmp_path):
    def c_add(a: int, b: int) -> int:
        """Clashes with the server's `add` once prefixed."""
        return a + b

    with_tools = {"mcpServers": {"counter": counter(mcp_python, tmp_path)}, "c_add": {"fn": c_add}}
    for more in ({}, {"store": f"sqlite:{tmp_path / 'runs.db'}"}):
        with pytest.raises(ValueError, match="two tools are named `c_add`"):
            run(with_tools, [], allowed=(), **more)
        assert_gone(tmp_path / "pid")

"""check, ValidationError, compile, Program.load and bundles."""

import asyncio

import pytest

import aplc
from conftest import response

AGENT = """
# pre: greet
{{ set_context('who', name | default('world')) }}

# prompt: greet
## user
Say hello to {{ who }}.
"""


async def echo(context):
    return response(context["prompts"][-1]["content"][0]["text"] if isinstance(context["prompts"][-1]["content"], list) else context["prompts"][-1]["content"])


def test_check_accepts_a_valid_agent():
    assert aplc.check(AGENT) is True


def test_check_raises_validation_error_with_diagnostics():
    source = "# prompt: a\n## user\n{{ foo(\n"
    with pytest.raises(aplc.ValidationError) as info:
        aplc.check(source)
    error = info.value
    [d] = [d for d in error.diagnostics if d["severity"] == "error"]
    assert d["code"] == "APL0009"
    assert (d["line"], d["column"]) == (3, 7)
    assert "template syntax error" in d["message"]
    rendered = str(error)
    assert "APL0009" in rendered and "<agent>:3:7" in rendered


def test_check_reports_every_problem_and_relaxed_mode():
    relaxed = "# pre: a\nset_context('x', 1)\n\n# prompt: a\n## user\nhi\n"
    assert aplc.check(relaxed, relaxed=True) is True
    with pytest.raises(aplc.ValidationError):
        aplc.check("not an agent")


def test_check_rejects_non_text():
    with pytest.raises(TypeError):
        aplc.check(b"# prompt: a\n")


def test_compile_then_load_then_run_many_times():
    bundle = aplc.compile(AGENT)
    assert isinstance(bundle, bytes) and len(bundle) > 16
    program = aplc.Program.load(bundle)

    async def main():
        return await asyncio.gather(
            *(program.start({"with_providers": {"gpt-4o": echo}, "with_context": {"name": f"n{i}"}}) for i in range(10))
        )

    results = asyncio.run(main())
    assert [r["result_text"] for r in results] == [f"Say hello to n{i}." for i in range(10)]
    # start() takes the bundle bytes directly too, and so does start_sync.
    status = aplc.start_sync(bundle, {"with_providers": {"gpt-4o": echo}})
    assert status["result_text"] == "Say hello to world."
    assert program.start_sync({"with_providers": {"gpt-4o": echo}})["result_text"] == "Say hello to world."


def test_program_runs_from_threads():
    import concurrent.futures

    program = aplc.Program.load(aplc.compile(AGENT))

    def one(i):
        return program.start_sync({"with_providers": {"gpt-4o": echo}, "with_context": {"name": str(i)}})["result_text"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(one, range(8))) == sorted(f"Say hello to {i}." for i in range(8))


def test_compile_rejects_invalid_source():
    with pytest.raises(aplc.ValidationError) as info:
        aplc.compile("# prompt: a\n{% if %}\n")
    assert info.value.diagnostics


@pytest.mark.parametrize(
    "data",
    [b"", b"not a bundle at all", b"\x00" * 64],
)
def test_invalid_bundle_is_a_clear_error(data):
    with pytest.raises(ValueError, match="invalid bundle"):
        aplc.Program.load(data)


def test_corrupted_bundle_is_a_clear_error():
    bundle = bytearray(aplc.compile(AGENT))
    for at in (len(bundle) // 2, len(bundle) - 1):
        broken = bytearray(bundle)
        broken[at] ^= 0xFF
        with pytest.raises(ValueError, match="invalid bundle"):
            aplc.Program.load(bytes(broken))
    with pytest.raises(ValueError, match="invalid bundle"):
        aplc.Program.load(bytes(bundle[: len(bundle) // 2]))
    with pytest.raises(ValueError, match="invalid bundle"):
        aplc.start_sync(bytes(bundle[:-3]))


def test_start_raises_validation_error_on_invalid_source():
    with pytest.raises(aplc.ValidationError):
        aplc.start_sync("# prompt: a\n{{ (\n")

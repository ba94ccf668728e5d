"""The defuss-1.1 dialect: defuss-apl 1.1.0's helpers, opt-in. The expected values are
what defuss-apl 1.1.0 itself gives for these agents."""

import pytest

import aplc
from conftest import response

AGENT = """
# pre: s
{{ set('a', 1) }}{{ add('a', 5) }}{{ inc('b') }}{{ inc('b') }}{{ dec('c') }}
{{ set('p.q.r', 2) }}{{ inc('d', 5) }}{{ rem('e', 2) }}{{ set('s', 'x') }}{{ add('s', 'y') }}
{{ set('l', [0, 1]) }}{{ set('l.1', 9) }}{{ set('f', 10) }}{{ rem('f', 3) }}
{{ set_context('out', [get('a'), get('p.q.r'), get('p'), get('zz'), get('zz', 'dflt'), get('p.q.x', 5)]) }}

# prompt: s
## user
hi

# post: s
{{ next('t') }}

# pre: t
{{ set('g', prev()) }}

# prompt: t
## user
{{ result() }}
"""


async def echo(context):
    return response("answer " + str(len(context["prompts"])))


def test_the_dialect_runs_defuss_agents():
    status = aplc.start_sync(AGENT, {"with_providers": {"gpt-4o": echo}, "dialect": "defuss-1.1"})
    assert status["errors"] == []
    assert [status[k] for k in "abcdefgls"] == [6, 2, -1, 6, -2, 7, "s", [0, 9], "xy"]
    assert status["p"] == {"q": {"r": 2}}
    assert status["out"] == [6, 2, {"q": {"r": 2}}, None, "dflt", 5]
    assert status["prev_step"] == "s"
    assert status["prompts"][-1]["content"] in ("answer 1", [{"type": "text", "text": "answer 1"}])


def test_the_default_is_the_spec_and_the_checks_know_the_dialect():
    with pytest.raises(aplc.ValidationError) as info:
        aplc.check(AGENT)
    codes = {d["code"] for d in info.value.diagnostics}
    assert codes == {"APL0022"}
    assert aplc.check(AGENT, dialect="defuss-1.1") is True
    with pytest.raises(aplc.ValidationError):
        aplc.start_sync(AGENT, {"with_providers": {"gpt-4o": echo}})
    with pytest.raises(ValueError, match="unknown dialect"):
        aplc.check(AGENT, dialect="defuss-2")


def test_a_bundle_records_its_dialect_and_runs_in_it():
    bundle = aplc.compile(AGENT, dialect="defuss-1.1")
    for dialect in ("spec", "defuss-1.1"):
        status = aplc.start_sync(bundle, {"with_providers": {"gpt-4o": echo}, "dialect": dialect})
        assert status["a"] == 6 and status["g"] == "s"
    assert aplc.Program.load(bundle).start_sync({"with_providers": {"gpt-4o": echo}})["a"] == 6
    # A spec bundle is byte for byte what builds before the dialect was recorded wrote:
    # the header's flags (bytes 10-11) are 0, and only they differ.
    spec_bundle = aplc.compile("# prompt: s\n## user\nhi\n")
    assert spec_bundle[10:12] == b"\x00\x00" and bundle[10:12] == b"\x01\x00"


def test_a_bundle_that_records_no_dialect_runs_in_the_one_named():
    # As built before bundles recorded their dialect: the flags say nothing.
    old = bytearray(aplc.compile(AGENT, dialect="defuss-1.1"))
    old[10] = 0
    status = aplc.Program.load(bytes(old), dialect="defuss-1.1").start_sync({"with_providers": {"gpt-4o": echo}})
    assert status["a"] == 6
    # Loaded in the spec dialect, the helpers do not exist: the phases fail, nothing is
    # set, and without `next('t')` the run ends after the first step.
    status = aplc.Program.load(bytes(old)).start_sync({"with_providers": {"gpt-4o": echo}})
    assert "a" not in status and "g" not in status
    assert status["prev_step"] is None


def test_a_bundle_with_unknown_flags_is_refused():
    damaged = bytearray(aplc.compile(AGENT, dialect="defuss-1.1"))
    damaged[10] = 7
    with pytest.raises(ValueError, match="unknown bundle flags 0x0007"):
        aplc.Program.load(bytes(damaged))


def test_dialect_helper_errors_land_in_errors():
    agent = "# pre: s\n{{ set('d', [1]) }}{{ add('d', 3) }}\n\n# prompt: s\n## user\nhi\n\n# post: s\n{{ set_context('seen', errors) }}\n"
    status = aplc.start_sync(agent, {"with_providers": {"gpt-4o": echo}, "dialect": "defuss-1.1"})
    [error] = status["seen"]
    assert "add('d', ...)" in error


def test_current_step_names_the_step_being_run_as_in_defuss():
    agent = """
# pre: s
{{ set('in_pre', current_step) }}

# prompt: s
## user
step {{ current_step }}

# post: s
{{ set('in_post', current_step) }}
{{ next('t') }}

# prompt: t
## user
{{ current_step }}
"""
    status = aplc.start_sync(agent, {"with_providers": {"gpt-4o": echo}, "dialect": "defuss-1.1"})
    assert status["errors"] == []
    assert (status["in_pre"], status["in_post"], status["current_step"]) == ("s", "s", "t")
    assert [h["current_step"] for h in status["context_history"]] == ["s", "t"]
    assert status["prompts"] == [{"role": "user", "content": "t"}]
    # Not a variable of the spec.
    status = aplc.start_sync("# prompt: s\n## user\nx\n", {"with_providers": {"gpt-4o": echo}})
    assert "current_step" not in status


def test_set_json_path_as_defuss_apl_gives_it():
    # The expected values are what defuss-apl 1.1.0 gives for this agent.
    agent = """
# pre: s
{{ set('data', {'a': {'b': [1, 2]}, 'l': [{'x': 1}]}) }}

# prompt: s
## user
x

# post: s
{{ set('r1', set_json_path(data, 'a.b.0', 7)) }}
{{ set('r2', set_json_path(data, 'a.c', 'x')) }}
{{ set('r3', set_json_path(data, 'a.b[1]', 8)) }}
{{ set('r5', set_json_path(data, 'l.0.x', 5)) }}
{{ set('r6', set_json_path(data, 'new.deep.path', 5)) }}
{{ set('r7', set_json_path(data, 'a.b.5', 5)) }}
{{ set('r8', set_json_path(3, 'a', 5)) }}
{{ set('r9', set_json_path(data, '', 5)) }}
{{ set('r10', set_json_path(data, 'a.b.-1', 5)) }}
{{ set('r11', set_json_path(data, 'new2.0.x', 1)) }}
"""
    status = aplc.start_sync(agent, {"with_providers": {"gpt-4o": echo}, "dialect": "defuss-1.1"})
    assert status["errors"] == []
    assert status["data"] == {
        "a": {"b": [7, 2, None, None, None, 5], "c": "x", "b[1]": 8},
        "l": [{"x": 5}],
        "new": {"deep": {"path": 5}},
        "": 5,
        "new2": [{"x": 1}],
    }
    assert [status[f"r{i}"] for i in (1, 2, 3, 5, 6, 7, 8, 9, 10, 11)] == [
        True, True, True, True, True, True, False, True, False, True,
    ]

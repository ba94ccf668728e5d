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


def test_a_dialect_bundle_loads_in_its_dialect():
    bundle = aplc.compile(AGENT, dialect="defuss-1.1")
    status = aplc.start_sync(bundle, {"with_providers": {"gpt-4o": echo}, "dialect": "defuss-1.1"})
    assert status["a"] == 6
    # Loaded in the spec dialect, the helpers do not exist: the phases fail, nothing is
    # set, and without `next('t')` the run ends after the first step.
    status = aplc.Program.load(bundle).start_sync({"with_providers": {"gpt-4o": echo}})
    assert "a" not in status and "g" not in status
    assert status["prev_step"] is None


def test_dialect_helper_errors_land_in_errors():
    agent = "# pre: s\n{{ set('d', [1]) }}{{ add('d', 3) }}\n\n# prompt: s\n## user\nhi\n\n# post: s\n{{ set_context('seen', errors) }}\n"
    status = aplc.start_sync(agent, {"with_providers": {"gpt-4o": echo}, "dialect": "defuss-1.1"})
    [error] = status["seen"]
    assert "add('d', ...)" in error

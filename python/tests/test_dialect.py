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


# Issue #22, drop-in fidelity: what defuss-apl 1.1.0 does, and its own tests expect.

DEFUSS = {"dialect": "defuss-1.1"}


def _check_message(source, **kwargs):
    with pytest.raises(aplc.ValidationError) as info:
        aplc.check(source, **kwargs)
    return str(info.value), {d["code"] for d in info.value.diagnostics}


def test_validation_messages_carry_defuss_apl_s_phrases_in_its_dialect():
    cases = [
        ("# pre: a\nx\n# post: a\ny\n", "APL0004", "Step 'a' missing required prompt phase"),
        ("# prompt: a:b\nx\n", "APL0001", "Invalid step identifier: a:b"),
        ("# setup: a\nx\n# prompt: a\ny\n", "APL0001", "Invalid phase: setup"),
        ("# pre: a\n# pre: a\n# prompt: a\nx\n", "APL0005", "Duplicate step identifier: a"),
    ]
    for source, code, phrase in cases:
        text, codes = _check_message(source, dialect="defuss-1.1")
        assert code in codes and phrase in text, (source, text)
        # The spec dialect keeps aplc's own words alone.
        text, codes = _check_message(source)
        assert code in codes and "defuss-apl" not in text, (source, text)


def test_a_title_line_is_text_of_its_phase_in_the_dialect():
    source = "# pre: a\n# Set up the counter\n{{ set('n', 1) }}\n\n# prompt: a\nhi\n"
    assert aplc.check(source, dialect="defuss-1.1") is True
    _, codes = _check_message(source)
    assert "APL0001" in codes
    status = aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, **DEFUSS})
    assert status["n"] == 1 and status["errors"] == []


def test_relaxed_set_calls_and_multi_line_literals():
    source = """
# pre: a
{{ set('cfg', {
    "name": "x",
    "nested": {"deep": {"n": 42}}
}) }}
set('items.0.name', 'first')

# prompt: a
hi
"""
    status = aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, "relaxed": True, **DEFUSS})
    assert status["errors"] == []
    assert status["cfg"] == {"name": "x", "nested": {"deep": {"n": 42}}}
    assert status["items"] == {"0": {"name": "first"}}


def test_set_builds_lists_for_index_segments():
    source = "# pre: a\n{{ set('d', {}) }}{{ set('d.items.0.n', 1) }}{{ set('d.items.1.n', 2) }}\n# prompt: a\nhi\n"
    status = aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, **DEFUSS})
    assert status["errors"] == []
    assert status["d"] == {"items": [{"n": 1}, {"n": 2}]}


def test_an_unknown_jump_set_in_pre_fails_the_run_as_in_defuss():
    source = "# pre: a\n{{ set('next_step', 'nowhere') }}\n# prompt: a\nhi\n"
    with pytest.raises(aplc.RunError) as info:
        aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, **DEFUSS})
    assert "Unknown step: nowhere" in str(info.value)
    assert info.value.kind == "unknown_step"


def test_the_final_context_has_a_context_view_and_no_pending_jump():
    source = "# prompt: a\nhi\n# post: a\n{{ next('return') }}\n"
    status = aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, **DEFUSS})
    assert status["next_step"] is None
    assert status["context_history"][-1]["next_step"] == "return"
    view = status["context"]
    assert view["result_text"] == status["result_text"] and "context_history" not in view
    spec = aplc.start_sync(source.replace("next(", "set_context('next_step', "),
                           {"with_providers": {"gpt-4o": echo}})
    assert "context" not in spec and spec["next_step"] == "return"


def test_unknown_options_are_context_variables_in_the_dialect():
    source = "# prompt: a\n{{ flavour }}\n"
    status = aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, "flavour": "mint", **DEFUSS})
    assert status["flavour"] == "mint"
    with pytest.raises(ValueError, match="unknown option"):
        aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, "flavour": "mint"})


def test_a_star_provider_answers_every_model_without_its_own():
    seen = []

    async def any_model(context):
        seen.append(context["model"])
        return response("star")

    source = "# pre: a\n{{ set_context('model', 'some-model') }}\n# prompt: a\nhi\n"
    status = aplc.start_sync(source, {"with_providers": {"*": any_model}})
    assert status["result_text"] == "star" and seen == ["some-model"]


def test_the_step_budget_names_the_timeout_it_stands_in_for():
    source = "# prompt: loop\nhi\n# post: loop\n{{ next('loop') }}\n"
    with pytest.raises(aplc.RunError) as info:
        aplc.start_sync(source, {"with_providers": {"gpt-4o": echo}, "max_steps": 5, **DEFUSS})
    assert info.value.kind == "step_budget_exceeded"
    assert str(info.value).startswith("Step budget exceeded: 5 steps")
    assert "timeout" in str(info.value).lower()

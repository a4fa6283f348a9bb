"""A user rule that returns something other than its op's single-dim strategies, or that
raises, fails with a StrategyError naming the op and what the rule returned (the rule's own
exception chained), in select and in programs alike; with_rule checks what it can when the
rule is registered."""

import pytest

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import DimStrategy, Placeholder, RuleSet, select

MESH = Mesh.create(2)
A = Spec(MESH, [Shard(0)], (8, 8))
S, R = Placeholder(0), Replicate()


def _outputs(inputs, **args):
    return inputs[:1]


class _Boom(ValueError):
    pass


def _raises(inputs, **args):
    raise _Boom("the rule's own bug")


# each malformed rule for the binary op "add" (1 output, 2 inputs), and what the error says
BAD = {
    "none": (lambda inputs, **a: None, r"returned None"),
    "string": (lambda inputs, **a: "S(0)", r"returned 'S\(0\)'"),
    "not_strategies": (lambda inputs, **a: [("S", "S")], r"returned .*\('S', 'S'\)"),
    "swapped": (lambda inputs, **a: [DimStrategy([S, S], [S])], r"2 outputs and 1 input"),
    "too_few_inputs": (lambda inputs, **a: [DimStrategy([S], [S])], r"1 outputs? and 1 input"),
    "too_many_outputs": (
        lambda inputs, **a: [DimStrategy([S, S], [S, S])],
        r"2 outputs and 2 inputs",
    ),
    "missing_dim": (
        lambda inputs, **a: [DimStrategy([Placeholder(5)], [Placeholder(5), Placeholder(5)])],
        r"dim 5 of a 2-D",
    ),
}


def _registered(rule):
    """The rule in a RuleSet, registered past with_rule's checks where they catch it."""
    try:
        return RuleSet.default().with_rule("add", rule, outputs=_outputs)
    except StrategyError as e:
        assert "check_rule(" in str(e) and "impl=" in str(e)
        return None


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_malformed_rule_fails_select_naming_the_op_and_what_it_returned(name):
    rule, said = BAD[name]
    rs = _registered(rule)
    if rs is None:
        return
    with pytest.raises(StrategyError, match=f"add.*{said}"):
        select("add", [A, A], ruleset=rs)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_malformed_rule_fails_a_program_naming_the_op_and_what_it_returned(name):
    from meshplan.strategy import plan_program

    rule, said = BAD[name]
    rs = _registered(rule)
    if rs is None:
        return
    with pytest.raises(StrategyError, match=f"add.*{said}"):
        plan_program(lambda x, y: x + y, A, A, ruleset=rs)


@pytest.mark.parametrize("name", ["none", "string", "not_strategies"])
def test_with_rule_refuses_a_rule_that_returns_no_strategies(name):
    rule, said = BAD[name]
    with pytest.raises(StrategyError, match=f"add.*{said}.*check_rule\\(.*impl="):
        RuleSet.default().with_rule("add", rule, outputs=_outputs)


def test_a_raising_rule_is_wrapped_with_its_exception_chained():
    from meshplan.strategy import plan_program

    rs = RuleSet.default().with_rule("add", _raises, outputs=_outputs)
    with pytest.raises(StrategyError, match=r"add.*raised _Boom: the rule's own bug") as info:
        select("add", [A, A], ruleset=rs)
    assert isinstance(info.value.__cause__, _Boom)
    with pytest.raises(StrategyError, match=r"add.*raised _Boom") as info:
        plan_program(lambda x, y: x + y, A, A, ruleset=rs)
    assert isinstance(info.value.__cause__, _Boom)


def test_a_good_rule_still_registers_and_serves():
    rs = RuleSet.default().with_rule(
        "add", lambda inputs, **a: [DimStrategy([S], [S, S]), DimStrategy([R], [R, R])],
        outputs=_outputs,
    )
    assert select("add", [A, A], ruleset=rs).output_spec.placements == (Shard(0),)

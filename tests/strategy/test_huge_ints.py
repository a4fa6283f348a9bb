"""Integers beyond a float's range given to planning entry points raise a typed error
naming the value and the accepted range (never an OverflowError from inside)."""

import pytest

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import plan_program, state_bytes

MESH = Mesh.create((2, 2))
A = Spec(MESH, [Shard(0), Replicate()], (8, 8))
HUGE = 10**400


def _double(t):
    return t * 2


@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["huge", "minus_huge"])
def test_a_memory_budget_beyond_a_float_is_refused_by_name(value):
    with pytest.raises(StrategyError, match=r"memory_budget=-?1000000.*bytes per rank.*<= 1\.8e\+308"):
        plan_program(_double, A, choose=[0], memory_budget=value)


@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["huge", "minus_huge"])
def test_state_bytes_per_param_beyond_a_float_is_refused_by_name(value):
    with pytest.raises(StrategyError, match=r"state_bytes_per_param=-?1000000.*<= 1\.8e\+308"):
        plan_program(_double, A, choose=[0], memory_budget=1000, state_bytes_per_param=value)
    with pytest.raises(StrategyError, match=r"state_bytes_per_param=-?1000000"):
        state_bytes(A, True, value)


def test_huge_int_limits_are_accepted_or_refused_by_name():
    # the search limits are ints compared, never turned into floats: any size works
    prog = plan_program(_double, A, max_factor=HUGE, max_options=HUGE)
    assert prog.cost.total >= 0


def test_the_largest_float_budget_still_plans():
    prog = plan_program(_double, A, choose=[0], memory_budget=10**300)
    assert prog.memory.total <= 10**300

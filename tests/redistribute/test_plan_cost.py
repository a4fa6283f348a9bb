"""plan_cost prices through a Planner: the price of the plan, remembered by the planner
given (and only by it), forgotten by its clear(); select and plan_program price through
the planner they are given."""

from __future__ import annotations

import warnings

import pytest
from _plan_cases import spec_pairs
from hypothesis import given

from meshplan.errors import PlanError, StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.redistribute import MergeWarning, Planner, cost, plan, plan_cost
from meshplan.redistribute._store import default_planner

warnings.simplefilter("ignore", MergeWarning)


@given(spec_pairs(max_ranks=8, max_dims=3, max_side=6))
def test_plan_cost_is_the_plans_price(pair):
    src, dst = pair
    mine = Planner()
    assert plan_cost(src, dst, planner=mine) == cost(plan(src, dst, planner=Planner())).total


def test_plan_cost_is_remembered_by_its_planner_only():
    mesh = Mesh.create((2, 2))
    a = Spec(mesh, [Shard(0), Shard(1)], (8, 8))
    b = Spec(mesh, [Replicate(), Shard(0)], (8, 8))
    mine = Planner()
    default_planner().clear()
    price = plan_cost(a, b, planner=mine)
    assert mine.prices and mine.plans
    assert not default_planner().prices and not default_planner().plans
    mine.clear()
    assert not mine.prices and not mine.plans and not mine.contexts
    assert plan_cost(a, b, planner=mine) == price


def test_plan_cost_checks_its_arguments():
    mesh = Mesh.create(2)
    a = Spec(mesh, [Shard(0)], (4,))
    with pytest.raises(PlanError, match="planner must be a Planner"):
        plan_cost(a, a, planner="mine")
    with pytest.raises(PlanError, match="global shape"):
        plan_cost(a, Spec(mesh, [Shard(0)], (5,)))
    assert plan_cost(a, a) == 0.0


def test_select_prices_through_the_planner_given():
    from meshplan.strategy import select

    mesh = Mesh.create((2, 2))
    x = Spec(mesh, [Shard(0), Shard(1)], (16, 8))
    w = Spec(mesh, [Replicate(), Shard(0)], (8, 4))
    mine = Planner()
    c = select("mm", (x, w), planner=mine)
    assert mine.prices
    assert select("mm", (x, w)).cost == c.cost
    with pytest.raises(StrategyError, match="planner"):
        select("mm", (x, w), planner=object())


def test_plan_program_prices_through_the_planner_given():
    from meshplan.strategy import plan_program

    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 4), "float64")
    w = Spec(mesh, [Shard(1)], (4, 3), "float64")
    mine = Planner()
    prog = plan_program(lambda x, w: (x @ w).sum(), x, w, planner=mine)
    assert mine.prices or mine.plans
    other = plan_program(lambda x, w: (x @ w).sum(), x, w)
    assert [str(s) for s in prog.grad_specs] == [str(s) for s in other.grad_specs]

"""A pair plan cut short by the planner's budget is not proven the cheapest: a program
priced with it never claims "exact", and its bound takes the pair's proven lower price."""

import warnings

import pytest

from meshplan.layout import Mesh
from meshplan.placement import Shard, Spec
from meshplan.redistribute import Planner, plan_cost

MESH = Mesh.create((2, 2, 2))
A = Spec(MESH, [Shard(0), Shard(0), Shard(0)], (8, 8))
B = Spec(MESH, [Shard(0), Shard(1), Shard(0)], (8, 8))


def _identity(t):
    return t


def test_a_cut_pair_price_comes_with_a_proven_lower_price():
    from meshplan.redistribute._planner import price_bound

    cheapest = plan_cost(A, B, planner=Planner())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        price, lower = price_bound(A, B, planner=Planner(max_states=3))
    assert price > cheapest * 1.5  # (the case is one the budget cuts)
    assert lower <= cheapest < price
    assert price_bound(A, B, planner=Planner()) == (cheapest, cheapest)


def test_a_program_over_a_cut_pair_plan_is_not_exact_and_its_bound_holds():
    from meshplan.strategy import plan_program

    best = plan_program(_identity, A, out_specs=[B])
    assert best.method == "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = plan_program(_identity, A, out_specs=[B], planner=Planner(max_states=3))
    assert cut.cost.total > best.cost.total * 1.5
    assert cut.method != "exact"
    assert cut.lower_bound <= best.cost.total  # a true bound of the minimum
    assert cut.lower_bound == pytest.approx(best.cost.total, rel=0.6)  # not a trivial one

"""The search's heuristic is a lower bound: at the source, and at every state of a cheapest
plan, it never exceeds what the rest of that plan costs (so A* returns minimum-cost plans
on meshes too big for the brute force of test_plan_optimal), with and without aliases."""

from __future__ import annotations

import math

from _plan_cases import spec_pairs
from hypothesis import given
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.redistribute import CostModel, HardwareProfile
from meshplan.redistribute._planner import _state, _universe
from meshplan.redistribute._search import _Context, search

MODELS = [
    CostModel(),
    CostModel(HardwareProfile.nvlink_ib(gpus_per_node=4)),
    CostModel(HardwareProfile.gloo_cpu()),
]


def _fresh(src, model, shards, ptargets, objective) -> _Context:
    # a context of its own (not the planner's cached one), so its memo tables hold only
    # what this test computes
    return _Context(src.mesh, src.shape, src.dtype, model, shards, ptargets, None, objective)


def _dijkstra(src, dst, model, objective):
    """The cheapest plan by uniform-cost search (the heuristic replaced by zero)."""
    shards, ptargets = _universe(src, dst, src.ndim)
    ctx = _fresh(src, model, shards, ptargets, objective)
    ctx.heuristic = lambda i, goal: 0.0
    start, goal = ctx.intern(_state(src)), ctx.intern(_state(dst))
    return ctx, start, goal, search(ctx, start, goal)


def _check_bounds(src, dst, model, objective):
    ctx, start, goal, found = _dijkstra(src, dst, model, objective)
    assert found is not None, (src, dst)
    total, moves = found
    shards, ptargets = _universe(src, dst, src.ndim)
    bounds = _fresh(src, model, shards, ptargets, objective)
    goal_b = bounds.intern(ctx.states[goal])
    rest = total
    states = [start] + [t for _, _, t in moves]
    prices = [trans[0] for _, trans, _ in moves] + [0.0]
    for i, price in zip(states, prices, strict=True):
        h = bounds.heuristic(bounds.intern(ctx.states[i]), goal_b)
        assert h <= rest * (1 + 1e-9) + 1e-15, (src, dst, ctx.states[i], h, rest)
        rest -= price
    # and A* with the heuristic finds a plan as cheap
    astar = search(bounds, bounds.intern(_state(src)), goal_b)
    assert math.isclose(astar[0], total, rel_tol=1e-9), (src, dst, astar[0], total)


@given(
    spec_pairs(max_ranks=16, max_dims=4, max_aliases=3, max_side=8),
    st.sampled_from(MODELS),
    st.sampled_from(["time", "collectives"]),
)
def test_the_heuristic_never_exceeds_the_cost_of_a_cheapest_plan(pair, model, objective):
    src, dst = pair
    _check_bounds(src, dst, model, objective)


def test_aliases_raise_the_collective_count_only_as_far_as_they_reach():
    # on a torchtitan-like mesh a merged all_gather over (dp, cp, tp) serves dp and tp,
    # but the re-shard on pp (in no alias) needs a collective of its own: two at least
    from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard

    mesh = (
        Mesh.create((2, 2, 2, 2), ("dp", "pp", "cp", "tp"))
        .flatten(("dp", "cp"), "dp_cp")
        .flatten(("cp", "tp"), "cp_tp")
        .flatten(("dp", "cp", "tp"), "dct")
    )
    src = Spec(mesh, [StridedShard(0, 3), Shard(0), Replicate(), Shard(1)], (7, 7))
    dst = Spec(mesh, [Replicate(), StridedShard(1, 2), Partial("avg"), Replicate()], (7, 7))
    model = CostModel()
    shards, ptargets = _universe(src, dst, src.ndim)
    ctx = _fresh(src, model, shards, ptargets, "time")
    assert ctx._cover(0b1001, 0b0010) == 2  # dp, tp to gather; pp to re-shard
    assert ctx._cover(0b1001, 0b0100) == 1  # cp is in an alias with dp and tp
    assert ctx._cover(0b1011, 0) == 2  # pp gathers on its own
    _check_bounds(src, dst, model, "time")

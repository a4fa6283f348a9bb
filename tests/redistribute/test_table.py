"""Plan tables: a context's all-pairs table walks to exactly the plan the A* search finds.

The planner searches until a context has planned a few pairs, then builds a table; the
two must never disagree (every rank of a job computes its plans on its own, whatever it
planned before), so prices carry a deterministic tie-break that makes each minimum unique.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
from _plan_cases import FLAT, PER_COLLECTIVE, context_of, delivers, on_mesh, spec_pairs, values
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import (
    Replicate,
    Shard,
    Spec,
    StridedShard,
    is_shard_like,
    parse_placements,
)
from meshplan.redistribute import CostModel, HardwareProfile, clear_plan_cache, cost, plan
from meshplan.redistribute import _planner as P
from meshplan.redistribute._engine import _encoding as E
from meshplan.redistribute._engine import _goals as G
from meshplan.redistribute._engine import _search as S
from meshplan.redistribute._engine import _table as T
from meshplan.redistribute._engine._problem import Problem
from meshplan.redistribute._store import default_planner

MODELS = [
    CostModel.default(),
    CostModel(HardwareProfile.nvlink_ib(gpus_per_node=2)),
    CostModel(HardwareProfile.gloo_cpu()),
    PER_COLLECTIVE,
    FLAT,
]


def _context(src, dst, model, bound=None, objective="time"):
    """A context of the pair, the start's id and the goal's: its id, or the ids of every
    state of its layout when plan() searches to those (``_goals.goal_class``)."""
    ctx = context_of(src, dst, model, bound, objective)
    goals = G.goal_class(E.encode(dst), src.shape, src.mesh.shape, ctx.shards)
    return ctx, ctx.intern(E.encode(src)), P._interned(ctx, goals)


def _table(ctx):
    """The context's plan table, built now (None when its states are too many)."""
    return default_planner().tables.table(ctx, after=0)


def _moves(found):
    return [(prev, trans[1:4]) for prev, trans, _ in found[1]]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    pair=spec_pairs(max_ranks=16, max_dims=4, max_side=9, max_aliases=1),
    model=st.sampled_from(MODELS),
    bounded=st.booleans(),
    objective=st.sampled_from(["time", "collectives"]),
)
def test_the_table_walk_is_the_search_plan(pair, model, bounded, objective):
    src, dst = pair
    model = on_mesh(model, src.mesh)
    bound = None
    if bounded:  # a memory bound some plans exceed
        full = math.prod(src.shape) * 8
        bound = max(full // 2, 16)
    ctx, start, goal = _context(src, dst, model, bound, objective)
    event("one goal" if type(goal) is int else "several goals of one layout")
    with ctx.lock:
        tab = _table(ctx)
        event("tabled" if tab is not None else "too many states for a table")
        if tab is None:  # the search alone plans it
            assert T.state_count(ctx) > T.MAX_STATES
            return
        by_search = S.search(ctx, start, goal)
        by_table = T.walk(ctx, tab, start, goal)
    if by_search is None:
        event("no plan within the bound")
        assert by_table is None
        return
    assert by_table is not None
    assert _moves(by_table) == _moves(by_search)
    assert by_table[0] == pytest.approx(by_search[0], rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh_shape, tensor",
    [
        ((2, 2, 2, 2), (1024, 1024)),
        ((2, 2, 2, 2), (5, 3)),
        ((2, 2, 2), (1, 4, 6)),
        ((3, 2, 2), (1, 4, 6)),
        ((4, 2), (5, 3)),
        ((3, 2, 2), (1024, 1024)),
    ],
)
def test_the_table_walk_is_the_search_plan_on_every_pair_of_a_context(mesh_shape, tensor):
    """Exhaustive on one context: every (source, target) among a fixed sample of its states."""
    mesh = Mesh.create(mesh_shape)
    from meshplan.placement import Partial

    a = Spec(mesh, [Partial()] + [Replicate()] * (mesh.ndim - 1), tensor)
    b = Spec(mesh, [Shard(0)] * mesh.ndim, tensor)
    ctx, _, _ = _context(a, b, CostModel.default())
    with ctx.lock:
        tab = _table(ctx)
        assert tab is not None, T.state_count(ctx)
        ids = tab.ids[:: max(1, len(tab.ids) // 23)]
        for start, goal in itertools.permutations(ids, 2):
            found = S.search(ctx, start, goal)
            walked = T.walk(ctx, tab, start, goal)
            assert _moves(walked) == _moves(found), (ctx.states[start], ctx.states[goal])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["time", "collectives"])
def test_the_table_walk_to_a_big_goal_class_is_the_search_plan(objective):
    """Past ``_goals.CLASS_LIMIT`` specs of the target's layout, the goal is a pattern
    of them all (``_goals.class_goal``): the walk scans the rows it admits."""
    mesh = Mesh.create((2, 2, 2))
    dst = Spec(mesh, *parse_placements("S(0) SS(0,2) R")[:1], (1,), "float64")
    # (each source brings a split factor that makes 16 or more specs of one layout)
    sources = ["SS(0,3) R S(0)", "P(max) SS(0,3) R", "R R SS(0,4)", "SS(0,3) S(0) SS(0,3)"]
    sources += ["R SS(0,4) P(max)", "P(sum) P(sum) SS(0,3)"]
    model = on_mesh(CostModel(HardwareProfile.nvlink_ib(gpus_per_node=2)), mesh)
    for text in sources:
        src = Spec(mesh, *parse_placements(text)[:1], (1,), "float64")
        ctx, start, goal = _context(src, dst, model, None, objective)
        assert type(goal) is int and G.is_pattern(ctx.states[goal])
        with ctx.lock:
            tab = _table(ctx)
            assert tab is not None
            by_search = S.search(ctx, start, goal)
            by_table = T.walk(ctx, tab, start, goal)
        assert _moves(by_table) == _moves(by_search), text
        end = ctx.states[by_search[1][-1][2]]
        assert G.admits(ctx.states[goal], end)


def test_state_count_is_the_number_of_states_enumerated():
    mesh = Mesh.create((2, 3, 2))
    for text_a, text_b, shape in [
        ("P(sum) R R", "S(0) S(1) R", (6, 6)),
        ("P(sum) P(avg) R", "SS(0,2) R S(0)", (8, 4, 2)),
        ("R R R", "S(0) S(0) S(0)", (12,)),
    ]:
        a = Spec(mesh, *parse_placements(text_a)[:1], shape)
        b = Spec(mesh, *parse_placements(text_b)[:1], shape)
        ctx, _, _ = _context(a, b, CostModel.default())
        states = list(T._states(ctx))
        assert len(states) == len(set(states)) == T.state_count(ctx)
        # every one is a canonical spec: its Spec round-trips to the same state
        for s in states[:: max(1, len(states) // 40)]:
            assert E.encode(E.decode(a, s)) == s


@pytest.mark.parametrize("sizes", [(8,), (2, 4), (2, 2, 2), (2, 3, 2), (2, 2, 2, 2), (2, 1, 2)])
def test_state_count_counts_what_the_listing_lists(sizes):
    # the count (no listing) against every code assignment's shard orders, listed: one
    # Partial op or several (mixing or not), StridedShards, tensors of 1-3 dims
    mesh = Mesh.create(sizes)
    for ndim in (1, 2, 3):
        plain = tuple((d, 1) for d in range(ndim))
        for shards in (plain, plain + ((0, 2),), plain + ((0, 2), (ndim - 1, 3))):
            for ops in ((), (1,), (1, 2), (3,), (1, 3), (1, 2, 3, 4)):
                problem = Problem(
                    mesh, (8,) * ndim, "float32", CostModel.default(), shards, ops, None
                )
                ctx = default_planner().context(problem)
                listed = sum(
                    math.prod(math.factorial(len(m)) for m in T._members(ctx, codes))
                    for codes in T._codes(ctx)
                )
                assert T.state_count(ctx) == listed, (shards, ops)


def test_a_context_builds_its_table_only_after_planning_some_pairs():
    clear_plan_cache()
    mesh = Mesh.create((2, 2, 2))
    from meshplan.placement import Partial

    def spec(*pl):
        return Spec(mesh, list(pl), (64, 64))

    a = spec(Partial(), Replicate(), Replicate())
    targets = [
        spec(p, q, r) for p, q, r in itertools.product([Replicate(), Shard(0), Shard(1)], repeat=3)
    ]
    ctx, _, _ = _context(a, targets[1], CostModel.default())
    lazy = T.lazy_pairs(T.state_count(ctx))
    assert 2 <= lazy < len(targets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, t in enumerate(targets[:lazy]):
            plan(a, t)
            assert ctx.tabled is True and ctx.planned == k + 1 and ctx.lazy == lazy
            assert ctx not in default_planner().tables
        plan(a, targets[lazy])
    assert ctx in default_planner().tables
    # the plans made by search and those made from the table are the same
    first = [plan(a, t) for t in targets]
    clear_plan_cache()  # tables too: every plan below is searched again
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = [plan(a, t) for t in targets[:lazy]]
    assert again == first[:lazy]


def test_a_context_too_big_for_a_table_is_searched():
    mesh = Mesh.create((2, 2, 2, 2))
    a = Spec(mesh, *parse_placements("P(sum) P(avg) R R")[:1], (8, 8, 8), "float64")
    b = Spec(mesh, *parse_placements("S(0) S(1) S(2) R")[:1], (8, 8, 8), "float64")
    ctx, start, goal = _context(a, b, CostModel.default())
    with ctx.lock:
        assert _table(ctx) is None
    assert ctx.tabled is False and T.state_count(ctx) > T.MAX_STATES
    assert delivers(plan(a, b), values(a.shape))


@pytest.mark.slow
@pytest.mark.parametrize(
    "src_text, dst_text, shape, before_us",
    [
        ("R S(0) S(0) S(1)", "S(0) S(0) S(0) S(0)", (1000, 768), 35.458),
        ("S(1) S(0) S(1) S(1)", "R S(1) S(0) P(sum)", (1000, 768), 55.504),
        ("S(0) S(0) P(sum) S(0)", "R S(0) R R", (1024, 1024), 94.288),
    ],
)
def test_every_valid_all_permute_is_a_move(src_text, dst_text, shape, before_us):
    """Regression: while permutes were limited to candidates derived from the target (one
    order re-arranged, or a jump to the target's placements), these plans cost more
    (``before_us``); with every valid all_permute a move they are 9-25% cheaper."""
    mesh = Mesh.create((2, 2, 2, 2), tuple("abcd"))
    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=8))
    a = Spec(mesh, *parse_placements(src_text)[:1], shape)
    b = Spec(mesh, *parse_placements(dst_text)[:1], shape)
    p = plan(a, b, cost_model=model, merge=False)
    assert delivers(p, values(shape).float())
    assert cost(p, model).total * 1e6 < before_us * 0.92
    assert any(s.collective == "all_permute" and not _old_candidate(s, b) for s in p.steps), str(p)


def _old_candidate(step, goal: Spec) -> bool:
    """Whether the former candidate rule generated this permute for ``goal``: its target
    puts one tensor dim in the goal's order, or gives every mesh dim sharding in both the
    goal's placement (and shards with the same mesh dims: that rule had no other)."""
    s, t = step.src, step.dst
    if {m for m in step.mesh_dims if is_shard_like(s.placements[m])} != {
        m for m in step.mesh_dims if is_shard_like(t.placements[m])
    }:
        return False
    for d in range(s.ndim):
        if t.order(d) == goal.order(d) and set(s.order(d)) == set(goal.order(d)):
            others = [m for m in range(s.mesh.ndim) if m not in t.order(d)]
            if all(s.placements[m] == t.placements[m] for m in others):
                return True
    both = [
        m
        for m in range(s.mesh.ndim)
        if is_shard_like(s.placements[m]) and is_shard_like(goal.placements[m])
    ]
    return bool(both) and all(t.placements[m] == goal.placements[m] for m in both)


def test_a_merged_step_and_a_permute_at_one_price_resolve_alike():
    # an empty tensor: a merged all_to_all over (d1, d2) and an all_permute over the
    # same dims cost the same latency; the table must keep the search's choice (to the
    # target state itself: plan() would take none, as every spec here holds its layout)
    mesh = Mesh.create((1, 2, 4), ("d0", "d1", "d2")).flatten(("d1", "d2"), "f0")
    src = Spec(mesh, [Replicate(), Shard(0), Shard(0)], (0, 0), "float64")
    dst = Spec(mesh, [Replicate(), Shard(1), Shard(1)], (0, 0), "float64")
    ctx, start, _ = _context(src, dst, CostModel(HardwareProfile.nvlink_ib()))
    goal = ctx.intern(E.encode(dst))
    assert plan(src, dst).steps == ()
    with ctx.lock:
        by_search = S.search(ctx, start, goal)
        by_table = T.walk(ctx, _table(ctx), start, goal)
    assert _moves(by_table) == _moves(by_search)
    assert [t[3] for _, t, _ in by_search[1]] == ["all_to_all"]


@pytest.mark.slow
def test_goals_reached_at_one_price_resolve_alike():
    # under the "collectives" objective a collective's weight dwarfs its bytes, and the
    # tie-breaking factors of two permutes into two specs of the target's layout round
    # away: both reach a goal at one price, and the search and the table walk must end
    # at the same one (``_encoding.state_order``)
    mesh = Mesh.create((2, 2, 2, 2), ("d0", "d1", "d2", "d3"))
    R = Replicate()
    src = Spec(mesh, (Shard(0), R, R, R), (2,), "float64")
    dst = Spec(mesh, (StridedShard(0, 2), R, Shard(0), R), (2,), "float64", {0: (0, 2)})
    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=8))
    ctx, start, goal = _context(src, dst, model, 16, "collectives")
    assert type(goal) is tuple
    with ctx.lock:
        by_search = S.search(ctx, start, goal)
        by_table = T.walk(ctx, _table(ctx), start, goal)
    assert _moves(by_table) == _moves(by_search)
    assert by_table[0] == by_search[0]

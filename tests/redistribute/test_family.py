"""Plans shared across tensor sizes: a size between two planned sizes with one plan takes
that plan without a search, and it is exactly the plan a search returns (``_family``)."""

from __future__ import annotations

import warnings

import pytest
from _plan_cases import FLAT, PER_COLLECTIVE, on_mesh, spec_pairs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Shard, Spec, StridedShard, parse_placements
from meshplan.redistribute import CostModel, HardwareProfile, MergeWarning, clear_plan_cache, plan
from meshplan.redistribute import _budgeted as B
from meshplan.redistribute import _planner as P
from meshplan.redistribute._engine import _encoding as E
from meshplan.redistribute._engine import _family as F
from meshplan.redistribute._engine._edges import successors
from meshplan.redistribute._engine._exact import even_steps
from meshplan.redistribute._engine._problem import Problem
from meshplan.redistribute._store import Planner, default_planner

MODELS = [
    CostModel.default(),
    CostModel(HardwareProfile.nvlink_ib(gpus_per_node=2)),
    CostModel(HardwareProfile.gloo_cpu()),
    PER_COLLECTIVE,
    FLAT,
]


def _resized(spec: Spec, shape) -> Spec:
    return Spec(spec.mesh, spec.placements, shape, spec.dtype, shard_order=spec.shard_order)


def _fresh(src, dst, model):
    # planned by search or table (their plans are equal: test_table.py), never shared
    default_planner().families.clear()
    clear_plan_cache(tables=False)
    return plan(src, dst, cost_model=model)


def _plain(spec: Spec) -> Spec:
    """``spec`` with Shard(d) for every StridedShard(d, sf) (a family has none)."""
    placements = tuple(Shard(p.dim) if isinstance(p, StridedShard) else p for p in spec.placements)
    return Spec(spec.mesh, placements, spec.shape, spec.dtype, shard_order=spec.shard_order)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    pair=spec_pairs(max_ranks=8, max_dims=3, max_side=4, max_aliases=1),
    model=st.sampled_from(MODELS),
    base=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=3, max_size=3),
    scales=st.lists(
        st.sampled_from([1, 2, 3, 4, 6, 8, 16, 64, 256, 1024]), min_size=3, max_size=5, unique=True
    ),
    strided=st.booleans(),
)
def test_a_plan_shared_across_sizes_is_the_search_plan(pair, model, base, scales, strided):
    src, dst = pair
    model = on_mesh(model, src.mesh)
    if not strided:
        src, dst = _plain(src), _plain(dst)
        if src == dst:
            return
    # multiples of the family's steps (with StridedShards: every shard order chunks evenly)
    shards, _ = E.universe(src, dst)
    step = even_steps(src.mesh.shape, src.ndim, shards) + (1, 1, 1)
    sizes = [
        (step[0] * base[0] * k, step[1] * base[1], step[2] * base[2])[: src.ndim] for k in scales
    ]
    pairs = [(_resized(src, s), _resized(dst, s)) for s in sizes]
    hits: list = []
    lookup = F.Families.shared

    def counted(self, *args):
        found = lookup(self, *args)
        hits.append(found is not None)
        return found

    clear_plan_cache(tables=False)
    default_planner().families.clear()
    F.Families.shared = counted
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MergeWarning)
            shared = [plan(a, b, cost_model=model) for a, b in pairs]
            prices = [P._min_cost_plan(default_planner(), a, b, model, None)[1] for a, b in pairs]
    finally:
        F.Families.shared = lookup
    has = any(isinstance(p, StridedShard) for p in src.placements + dst.placements)
    event(f"{'StridedShard ' if has else ''}family, a plan shared: {any(hits)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MergeWarning)
        for (a, b), p, price in zip(pairs, shared, prices, strict=True):
            assert p == _fresh(a, b, model)
            default_planner().families.clear()  # the steps' prices too, to the last bit
            assert P._min_cost_plan(default_planner(), a, b, model, None)[1] == price


def _searches(monkeypatch) -> list:
    calls: list = []
    search, walk = P.search, P.walk
    counted = lambda *a, **k: calls.append("search") or search(*a, **k)  # noqa: E731
    # the planner searches through _budgeted.bounded_search (and directly for a second order)
    monkeypatch.setattr(B, "search", counted)
    monkeypatch.setattr(P, "search", counted)
    monkeypatch.setattr(P, "walk", lambda *a: calls.append("walk") or walk(*a))
    return calls


def test_a_size_between_two_with_one_plan_needs_no_search(monkeypatch):
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c"))
    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=4))
    a, b = parse_placements("S(0) S(0) S(1)")[0], parse_placements("R S(1) R")[0]

    def pair(rows):
        return (Spec(mesh, a, (rows, 64), "float32"), Spec(mesh, b, (rows, 64), "float32"))

    clear_plan_cache()
    calls = _searches(monkeypatch)
    low, high = plan(*pair(64), cost_model=model), plan(*pair(256), cost_model=model)
    assert len(calls) == 2
    steps = [(s.mesh_dims, s.collective) for s in low.steps]
    assert [(s.mesh_dims, s.collective) for s in high.steps] == steps
    middle = plan(*pair(128), cost_model=model)
    assert len(calls) == 2  # no search: sizes 64 and 256 bracket it
    assert [(s.mesh_dims, s.collective) for s in middle.steps] == steps
    assert middle.src.shape == (128, 64) and middle.steps[-1].dst == middle.dst
    # another dtype of the same bytes is the same size of the family
    same = plan(
        Spec(mesh, a, (256, 64), "bfloat16"), Spec(mesh, b, (256, 64), "bfloat16"), cost_model=model
    )
    assert len(calls) == 2 and [(s.mesh_dims, s.collective) for s in same.steps] == steps
    # beyond the sizes planned: the family's largest size is planned (the pair has two
    # sizes), and this one unless the two bracket it with one plan
    plan(*pair(1024), cost_model=model)
    assert len(calls) in (3, 4)
    clear_plan_cache()
    assert middle == plan(*pair(128), cost_model=model)


def test_sizes_where_the_plans_differ_are_searched(monkeypatch):
    # on a two-tier network a small tensor and a large one take different plans: a size
    # between them is searched, never given either plan unchecked
    mesh = Mesh.create((2, 2, 2, 2), ("a", "b", "c", "d"))
    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=8))
    a, b = parse_placements("S(0) S(0) S(0) S(0)")[0], parse_placements("R R R R")[0]

    def steps(rows, cols):
        p = plan(
            Spec(mesh, a, (rows, cols), "float32"),
            Spec(mesh, b, (rows, cols), "float32"),
            cost_model=model,
        )
        return [(s.mesh_dims, s.collective) for s in p.steps]

    clear_plan_cache()
    small, large = steps(16, 16), steps(16 * 256, 16 * 256)
    assert small != large
    calls = _searches(monkeypatch)
    for k in (2, 4, 16, 64):
        rows = 16 * k
        got = steps(rows, rows)
        clear_plan_cache()
        assert got == steps(rows, rows)
    assert calls


@pytest.mark.parametrize(
    "placements, shape, bound, objective, why",
    [
        ("S(0) R", (8, 8), None, "time", None),
        ("S(0) R", (8, 6), None, "time", "a side not a multiple of 4"),
        ("S(0) R", (0, 8), None, "time", "an empty side"),
        ("SS(0,2) S(0)", (8, 8), None, "time", None),
        ("SS(0,2) S(0)", (12, 8), None, "time", "a StridedShard dim not a multiple of 4 * 2"),
        ("SS(0,2) SS(0,3)", (48, 4), None, "time", None),
        ("SS(0,2) SS(0,3)", (36, 4), None, "time", "not a multiple of 4 * lcm(2, 3)"),
        ("S(0) R", (8, 8), 1 << 20, "time", "a memory bound"),
        ("S(0) R", (8, 8), None, "collectives", "the collectives objective"),
    ],
)
def test_only_contexts_whose_prices_scale_with_bytes_form_a_family(
    placements, shape, bound, objective, why
):
    mesh = Mesh.create((2, 2))
    src = Spec(mesh, parse_placements(placements)[0], shape, "float32")
    shards, ptargets = E.universe(src, src)
    problem = Problem(
        mesh, shape, "float32", CostModel.default(), shards, ptargets, bound, objective
    )
    fam = F.family_of(problem)
    assert (fam is None) == (why is not None), why


def _moves_from(src: Spec, dst: Spec, shape, model, limit: int = 60) -> dict:
    """The transitions (without prices) of the states a context of ``shape`` reaches from
    ``src``'s, breadth first, generated on a clean start (no moves shared)."""
    shards, ptargets = E.universe(src, dst)
    ctx = Planner().context(Problem(src.mesh, shape, src.dtype, model, shards, ptargets, None))
    start = ctx.intern(E.encode(src))
    seen = {start: None}
    queue = [start]
    out = {}
    while queue and len(out) < limit:
        i = queue.pop(0)
        moves = sorted(
            (
                (ctx.states[t.target], t.dims, t.collective)
                for t in successors(ctx, i)
                if t.target != i
            ),
            key=repr,
        )
        out[ctx.states[i]] = moves
        for t in successors(ctx, i):
            if t.target not in seen:
                seen[t.target] = None
                queue.append(t.target)
    return out


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    pair=spec_pairs(max_ranks=8, max_dims=3, max_side=4, max_aliases=1),
    k=st.sampled_from([2, 3, 5]),
)
def test_a_family_has_the_same_moves_at_every_size(pair, k):
    # with StridedShards, a step's validity is an exact check on index intervals; at every
    # multiple of the family's steps it must answer alike, or plans could not be shared
    # (and contexts of the family share their moves: generated apart, they agree)
    src, dst = pair
    shards, _ = E.universe(src, dst)
    step = even_steps(src.mesh.shape, src.ndim, shards)
    model = CostModel.default()
    small = _moves_from(src, dst, step, model)
    large = _moves_from(src, dst, (step[0] * k,) + step[1:], model)
    assert small == large


def test_sizes_beyond_those_planned_are_bracketed_by_the_family_extremes(monkeypatch):
    # weights of growing models, one after another: after two sizes the pair is planned at
    # its family's largest size, and every size below with the same plan needs no search
    mesh = Mesh.create((2, 4), ("dp", "tp"))
    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=8))
    a, b = parse_placements("S(0) S(1)")[0], parse_placements("R S(1)")[0]
    sizes = [(8 * k, 8 * k) for k in (4, 8, 16, 32, 64, 128, 256, 512)]
    clear_plan_cache()
    calls = _searches(monkeypatch)
    plans = [
        plan(Spec(mesh, a, s, "float32"), Spec(mesh, b, s, "float32"), cost_model=model)
        for s in sizes
    ]
    searched = len(calls)
    assert searched <= 4  # two sizes, the largest, at most one more: not one per size
    for s, p in zip(sizes, plans, strict=True):
        assert p == _fresh(Spec(mesh, a, s, "float32"), Spec(mesh, b, s, "float32"), model)
    assert F.SIZES_FIRST == 2 and F.LARGEST >= 30


def test_threads_planning_one_family_agree_with_one_thread():
    import random
    import threading

    mesh = Mesh.create((2, 2, 2), ("a", "b", "c"))
    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=4))
    texts = [
        ("S(0) S(0) S(1)", "R S(1) R"),
        ("P(sum) R S(0)", "S(0) S(1) R"),
        ("R R R", "S(1) S(0) S(0)"),
    ]
    jobs = [
        (parse_placements(a)[0], parse_placements(b)[0], (8 * k, 8 * j))
        for a, b in texts
        for k in (1, 3, 4, 16, 64)
        for j in (1, 2)
    ]
    random.Random(0).shuffle(jobs)
    clear_plan_cache()
    results: dict = {}

    def work(part):
        for a, b, shape in part:
            src, dst = Spec(mesh, a, shape, "float32"), Spec(mesh, b, shape, "float32")
            results[(a, b, shape)] = plan(src, dst, cost_model=model)

    threads = [threading.Thread(target=work, args=(jobs[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and len(results) == len(jobs)
    for (a, b, shape), p in results.items():
        src, dst = Spec(mesh, a, shape, "float32"), Spec(mesh, b, shape, "float32")
        assert p == _fresh(src, dst, model)


def test_scalars_of_every_dtype_plan_alike():
    # a 0-D tensor's size is its dtype's: no smallest or largest shape to plan it at
    mesh = Mesh.create((2, 2))
    a, b = parse_placements("P(sum) R")[0], parse_placements("R R")[0]
    clear_plan_cache()
    for dtype in ("float32", "bfloat16", "float64", "int8", "float16"):
        p = plan(Spec(mesh, a, (), dtype), Spec(mesh, b, (), dtype))
        assert [s.collective for s in p.steps] == ["all_reduce"]
        assert p == _fresh(Spec(mesh, a, (), dtype), Spec(mesh, b, (), dtype), CostModel.default())

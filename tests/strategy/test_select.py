"""Selection laws: the search finds the enumerated minimum, and the chosen strategy computes the op."""

import itertools
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard, unshard
from meshplan.redistribute import CostModel, HardwareProfile
from meshplan.strategy import OPS, expand, propagate_simulated, random_locals, select
from meshplan.strategy.rules._rule import meta_of
from meshplan.strategy.selection._price import (
    default_model,
    input_bound,
    redistribute_cost,
    transition_bound,
)
from meshplan.strategy.selection._reference import random_inputs
from meshplan.testing import op_calls, specs

MODEL = default_model()


def _globals_and_locals(call, seed):
    gen = torch.Generator().manual_seed(seed)
    metas = [meta_of(s) for s in call.input_specs]
    locals_, globals_ = [], []
    for i, spec in enumerate(call.input_specs):
        loc, x = random_locals(spec, lambda i=i: random_inputs(call.op, metas, gen)[i])
        locals_.append(loc)
        globals_.append(x)
    return globals_, locals_


MODELS = [
    None,  # the planner's default: NVLink within 8-GPU nodes, InfiniBand across
    CostModel(HardwareProfile.gloo_cpu()),
    CostModel(HardwareProfile.nvlink_ib(gpus_per_node=2)),  # most mesh dims span nodes
]


@pytest.mark.slow
@given(call=op_calls(max_side=5), seed=st.integers(0, 2**16), model=st.sampled_from(MODELS))
def test_search_finds_the_enumerated_minimum_and_the_choice_computes_the_op(call, seed, model):
    search = select(call.op, call.input_specs, cost_model=model, method="search", **call.kwargs)
    full = select(call.op, call.input_specs, cost_model=model, method="enumerate", **call.kwargs)
    assert search.cost == full.cost
    assert search.strategy == full.strategy  # same deterministic tie-break
    assert search.visited <= full.visited == full.states

    globals_, locals_ = _globals_and_locals(call, seed)
    out, choice = propagate_simulated(
        call.op, locals_, call.input_specs, cost_model=model, **call.kwargs
    )
    assert choice.strategy == search.strategy
    got = unshard(out, choice.output_spec)
    want = OPS[call.op](*globals_, **call.kwargs)
    assert got.shape == want.shape
    assert torch.allclose(got, want.to(got.dtype), rtol=1e-6, atol=1e-8, equal_nan=True)


MESHES = [
    Mesh.create(4),
    Mesh.create((2, 3)),
    Mesh.create((2, 2, 2)),
    Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac"),
    Mesh.create((2, 2, 2), ranks=(3, 1, 0, 2, 7, 5, 6, 4)).flatten(None, "all"),
]


@settings(max_examples=2 * settings.default.max_examples)  # 200 in CI
@given(data=st.data(), mesh=st.sampled_from(MESHES))
def test_dim_bounds_add_up_to_at_most_the_input_bound_and_it_to_the_planned_cost(data, mesh):
    src = data.draw(specs(mesh=mesh, min_dims=1, max_dims=3, min_side=1, max_side=9))
    dst = data.draw(specs(mesh=mesh, shape=src.shape, max_split_factor=3))
    per_dim = sum(transition_bound(src, m, q, MODEL) for m, q in enumerate(dst.placements))
    whole = input_bound(src, dst.placements, MODEL)
    assert per_dim <= whole * (1 + 1e-12)
    assert whole <= redistribute_cost(src, dst, MODEL)


def test_inputs_that_fit_a_strategy_stay_put():
    mesh = Mesh.create((2, 2, 2))
    a = Spec(mesh, (Shard(0), Shard(1), Replicate()), (64, 32))
    b = Spec(mesh, (Replicate(), Shard(0), Partial()), (32, 16))
    c = select("mm", (a, b), accept_partial=True)  # a consumer taking the partial sums
    assert c.input_specs == (a, b) and c.cost == 0 and c.visited == 1
    assert c.output_spec.placements == (Shard(0), Partial(), Partial())


def test_search_visits_a_small_fraction_of_a_3d_mesh():
    mesh = Mesh.create((2, 2, 2))
    visited, states = 0, 0
    for pa, pb in itertools.product(["S(1) R R", "P R S(0)", "R S(0) P"], ["R R S(1)", "S(0) P R"]):
        from meshplan.placement import parse_placements

        a = Spec(mesh, parse_placements(pa)[0], (256, 128))
        b = Spec(mesh, parse_placements(pb)[0], (128, 64))
        c = select("mm", (a, b))
        visited, states = visited + c.visited, states + c.states
    assert visited * 10 < states


def test_strided_inputs_keep_their_kind():
    mesh = Mesh.create((2, 2))
    x = Spec(mesh, (StridedShard(0, 2), Shard(1)), (8, 6))
    c = select("relu", (x,))
    assert c.input_specs == (x,) and c.output_spec.placements == x.placements


def test_a_flattened_inner_shard_becomes_a_strided_shard():
    # beyond torch 2.13: one rule fills the input with Shard and the output with StridedShard
    mesh = Mesh.create(2)
    x = Spec(mesh, (Shard(1),), (3, 8))
    c = select("view", (x,), shape=(24,))
    assert c.cost == 0 and c.output_spec.placements == (StridedShard(0, 3),)


def test_uneven_outer_shards_do_not_flatten_in_place():
    mesh = Mesh.create(2)
    x = Spec(mesh, (Shard(0),), (3, 4))
    assert all(s.input_specs[0] != x for s in expand("view", (x,), shape=(12,)))


def test_expand_lists_distinct_strategies_and_the_minimum_is_among_them():
    mesh = Mesh.create((2, 3))
    a = Spec(mesh, (Shard(0), Partial()), (6, 5))
    b = Spec(mesh, (Replicate(), Shard(1)), (5, 4))
    strategies = expand("mm", (a, b))
    assert len(set(strategies)) == len(strategies)
    from meshplan.strategy.selection._select import reduction_cost

    for accept in (True, False):
        c = select("mm", (a, b), accept_partial=accept)
        assert c.strategy in strategies
        cheapest = min(
            sum(
                redistribute_cost(s, t, MODEL) for s, t in zip((a, b), st_.input_specs, strict=True)
            )
            + (0.0 if accept else reduction_cost(st_.output_spec, MODEL))
            for st_ in strategies
        )
        assert c.cost == pytest.approx(cheapest, rel=1e-12, abs=0)


def test_select_rejects_unknown_methods_and_ops():
    mesh = Mesh.create(2)
    x = Spec(mesh, (Replicate(),), (4,))
    with pytest.raises(ValueError, match="method"):
        select("relu", (x,), method="greedy")
    with pytest.raises(ValueError, match="no rule for op 'frobnicate'"):
        select("frobnicate", (x,))


def test_selection_is_deterministic():
    mesh = Mesh.create((2, 2))
    a = Spec(mesh, (Partial(), Shard(1)), (8, 8))
    b = Spec(mesh, (Shard(0), Partial()), (8, 8))
    first = select("add", (a, b))
    for _ in range(3):
        assert select("add", (a, b)) == first


def test_pricing_a_redistribution_does_not_warn_about_merges_and_matches_plan():
    # selection prices many candidate plans that never run: no "flatten to merge" warning,
    # and the price is that of the plan plan() returns
    from meshplan.redistribute import MergeWarning, cost, plan, reset_merge_warnings
    from meshplan.strategy.selection._price import default_model, redistribute_cost

    mesh = Mesh.create((2, 2), ("a", "b"))
    src = Spec(mesh, [Partial(), Partial()], (8, 8))
    dst = Spec(mesh, [Replicate(), Replicate()], (8, 8))
    model = default_model()
    reset_merge_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        price = redistribute_cost(src, dst, model)
    assert not [w for w in caught if issubclass(w.category, MergeWarning)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = plan(src, dst, cost_model=model)
    assert [w for w in caught if issubclass(w.category, MergeWarning)]  # plan() still warns
    assert price == cost(p, model).total
    reset_merge_warnings()


@pytest.mark.slow
def test_a_partial_output_carries_the_price_of_its_reduction():
    # cat of (R R S(1)) and (S(1) S(1) S(1)) on (2,2,2): a Partial output is cheap now and
    # dear later; priced with its reduction, the choice is torch's (S(1) S(1) S(1)) and
    # its total (1.3e-5 s) is below what the partial choice costs once reduced
    mesh = Mesh.create((2, 2, 2))
    a = Spec(mesh, (Replicate(), Replicate(), Shard(1)), (8, 8, 8))
    b = Spec(mesh, (Shard(1), Shard(1), Shard(1)), (8, 8, 8))
    eager = select("cat", (a, b), dim=0, accept_partial=True)
    priced = select("cat", (a, b), dim=0)
    assert eager.output_spec.is_partial
    assert priced.output_spec.placements == (Shard(1), Shard(1), Shard(1))
    from meshplan.strategy.selection._select import reduction_cost

    later = eager.cost + reduction_cost(eager.output_spec, MODEL)
    assert priced.cost < later
    assert priced.cost == select("cat", (a, b), dim=0, method="enumerate").cost

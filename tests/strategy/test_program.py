"""Whole programs in the simulator: loss and every argument's gradient equal single-process
autograd of the same function, the plan is the exhaustive minimum on small graphs, and
bad input is refused with a StrategyError naming the fix."""

from __future__ import annotations

import functools
import itertools
import warnings

import pytest
import torch
from _program_cases import (
    arg_specs,
    build,
    meshes,
    planned_transformer,
    programs,
    transformer,
    transformer_args,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.redistribute import Planner
from meshplan.runtime import simulate_program
from meshplan.strategy import ComputeModel, plan_program
from meshplan.strategy.programs._program import grad_spec

warnings.filterwarnings("ignore", category=UserWarning, module="meshplan")


def _reference(fn, tensors):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
    loss = fn(*leaves)
    diff = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(loss, diff, allow_unused=True)
    it = iter(grads)
    return loss.detach(), [next(it) if t.requires_grad else None for t in leaves]


def _check(prog, fn, tensors, specs):
    locals_ = [shard(t, s) for t, s in zip(tensors, specs, strict=True)]
    outs, grads = simulate_program(prog, *locals_)
    loss, ref = _reference(fn, tensors)
    got = unshard(outs[0], prog.out_specs[0])
    assert torch.allclose(got, loss, rtol=1e-10, atol=1e-12), (got, loss)
    for i, (g, r, s) in enumerate(zip(grads, ref, prog.grad_specs, strict=True)):
        if r is None:
            assert g is None
            continue
        assert s == grad_spec(specs[i])
        full = unshard(g, s)
        r = torch.zeros_like(full) if r is None else r
        assert torch.allclose(full, r, rtol=1e-10, atol=1e-10), (i, s, (full - r).abs().max())


@settings(max_examples=min(settings.default.max_examples, 30), deadline=None)
@given(data=st.data())
def test_random_programs_give_the_single_process_loss_and_gradients(data):
    mesh = data.draw(meshes(), label="mesh")
    prog_desc = data.draw(programs(), label="program")
    n = data.draw(st.integers(1, 7), label="rows")
    d = data.draw(st.integers(1, 5), label="width")
    specs = data.draw(arg_specs(mesh, n, d, 2), label="specs")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    tensors = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in specs]
    # a Partial argument is the sum of its ranks' pieces: shard() splits the value so
    tensors = [t for t in tensors]
    fn = build(prog_desc, 2)
    prog = plan_program(fn, *specs, compute=ComputeModel.cpu())
    _check(prog, fn, tensors, specs)


@pytest.mark.parametrize("shape", [(2, 2), pytest.param((2, 2, 2), marks=pytest.mark.slow)])
def test_a_two_layer_transformer_gives_the_single_process_loss_and_gradients(shape):
    tensors, specs, prog = planned_transformer(shape)  # (the gloo test checks this plan too)
    assert not prog.fallbacks
    _check(prog, transformer, tensors, specs)


def test_a_data_parallel_weight_gets_its_gradient_reduce_scattered_once():
    mesh = Mesh.create((4,), ("dp",))
    x = Spec(mesh, [Shard(0)], (1024, 32), "float64")  # a batch: dearer to gather than w
    w = Spec(mesh, [Shard(0)], (32, 32), "float64")  # FSDP: the weight stored sharded on dp
    prog = plan_program(lambda x, w: (x @ w).tanh().sum(), x, w, compute=ComputeModel.cpu())
    assert prog.grad_moves[1] is not None, prog.explain()
    kinds = [s.collective for s in prog.grad_moves[1].steps]
    assert kinds == ["reduce_scatter"], prog.explain()
    assert prog.grad_specs[1] == w


def test_a_row_parallel_partial_sum_is_reduced_exactly_once():
    mesh = Mesh.create((2,), ("tp",))
    x = Spec(mesh, [Shard(1)], (4, 8), "float64")
    w = Spec(mesh, [Shard(0)], (8, 6), "float64")
    prog = plan_program(lambda x, w: (x @ w).sum(), x, w, compute=ComputeModel.cpu())
    reduces = [
        s
        for m in [*(m for op in prog.ops for m in op.moves), *prog.out_moves]
        if m is not None
        for s in m.steps
        if s.collective in ("all_reduce", "reduce_scatter")
    ]
    assert len(reduces) == 1, prog.explain()


def _brute_force(prog_fn, specs, compute):
    """Every combination of every op's candidate strategies, priced exactly."""
    from meshplan.strategy.programs._program import plan_graph
    from meshplan.strategy.programs._trace import trace

    graph = trace(prog_fn, specs, [True] * len(specs))
    prog = plan_graph(graph, specs, compute=compute, max_factor=1 << 40)
    return prog, graph


@settings(max_examples=min(settings.default.max_examples, 15), deadline=None)
@given(data=st.data())
def test_plan_program_matches_exhaustive_search_on_small_graphs(data):
    """The solver's minimum (a value moved to a layout once for all its readers) equals
    the minimum over all strategy combinations, and its bound lies below it."""
    from meshplan.strategy.programs import _program_solve

    mesh = Mesh.create((2,))
    prog_desc = data.draw(programs(max_ops=2, n_weights=1), label="program")
    specs = data.draw(arg_specs(mesh, 4, 4, 1), label="specs")
    fn = build(prog_desc, 1)
    captured = {}
    real = _program_solve.solve

    def spy(problem, *args, **kw):  # the planner hands the solver one Problem
        captured["problem"] = problem
        return real(problem, *args, **kw)

    _program_solve.solve = spy
    try:  # a fresh planner: one that planned this program already keeps its answer
        prog = plan_program(fn, *specs, compute=ComputeModel.cpu(), planner=Planner())
    finally:
        _program_solve.solve = real
    problem = captured["problem"]
    if _prod(problem.sizes) > 200_000:
        return
    best = min(problem.evaluate(c) for c in itertools.product(*map(range, problem.sizes)))
    assert prog.lower_bound <= best + 1e-12 + 1e-9 * best
    assert prog.exact == (prog.method == "exact")  # the typed field and the display agree
    if prog.exact:
        assert abs(prog.cost.total - best) <= 1e-12 + 1e-9 * best, prog.explain()
    else:
        assert prog.cost.total >= best - 1e-12 - 1e-9 * best


def _prod(sizes):
    out = 1
    for s in sizes:
        out *= s
    return out


def test_the_forest_bound_is_below_and_local_search_above_the_exact_minimum():
    mesh = Mesh.create((2, 2))
    tensors, specs = transformer_args(mesh, layers=1)
    fn = functools.partial(transformer, layers=1)
    exact = plan_program(fn, *specs, compute=ComputeModel.cpu())
    from meshplan.strategy.programs._program import plan_graph

    approx = plan_graph(exact.graph, specs, compute=ComputeModel.cpu(), max_factor=1)
    assert approx.method != "exact" and not approx.exact
    assert approx.lower_bound <= exact.cost.total + 1e-15
    assert approx.cost.total >= exact.cost.total - 1e-15
    _check(approx, fn, tensors, specs)


# -- bad input ----------------------------------------------------------------------------


def test_a_spec_whose_shape_disagrees_with_the_function_is_named():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (4, 3), "float64")
    w = Spec(mesh, [Replicate()], (5, 2), "float64")
    with pytest.raises(StrategyError, match="tracing the program"):
        plan_program(lambda x, w: (x @ w).sum(), x, w)


def test_branching_on_a_tensor_value_is_refused():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (4, 3), "float64")

    def fn(x):
        if x.sum() > 0:
            return x.sum()
        return -x.sum()

    with pytest.raises(StrategyError, match="branches on a tensor"):
        plan_program(fn, x)


def test_an_op_without_a_rule_runs_replicated_with_a_warning_or_is_refused_when_strict():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (4, 3), "float64")
    fn = lambda x: torch.roll(x, 1, 0).sum()  # noqa: E731
    with pytest.warns(UserWarning, match="roll"):
        prog = plan_program(fn, x)
    assert "aten.roll.default" in prog.fallbacks  # (and its backward, a roll back)
    assert prog.replicated == 2 and "replicated=2" in repr(prog)
    assert "replicated for want of a rule: 2 ops" in prog.explain()
    t = torch.randn(4, 3, dtype=torch.float64)
    _check(prog, fn, [t], [x])
    with pytest.raises(StrategyError, match="roll"):
        plan_program(fn, x, strict=True)


def test_strict_lists_every_op_without_a_rule_not_only_the_first():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (4, 3), "float64")

    def fn(x):
        return torch.roll(x, 1, 0).sum() + torch.logcumsumexp(x, 1).sum() + x.sort(1)[0].sum()

    with pytest.raises(StrategyError) as info:
        plan_program(fn, x, strict=True)
    text = str(info.value)
    for op in ("aten.roll.default", "aten.logcumsumexp.default", "aten.sort.default"):
        assert op in text
    assert "with_rule" in text and "ruleset=" in text
    with pytest.warns(UserWarning) as record:
        prog = plan_program(fn, x)
    warned = [str(w.message) for w in record if "no sharding rule" in str(w.message)]
    assert len(warned) == 1 and all(op in warned[0] for op in prog.fallbacks)
    assert len(prog.fallbacks) >= 3


def test_non_spec_arguments_and_bad_out_specs_are_named():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (4, 3), "float64")
    with pytest.raises(StrategyError, match="not a Spec"):
        plan_program(lambda x: x.sum(), (4, 3))
    with pytest.raises(StrategyError, match="disagrees"):
        plan_program(lambda x: x.sum(), x, out_specs=[x])


@settings(max_examples=min(settings.default.max_examples, 10), deadline=None)
@given(data=st.data())
def test_lazy_pricing_finds_the_same_minimum_as_pricing_every_pair(data):
    """Lower bounds where no price is known, exact prices where the answer goes: the
    answer's cost equals the one found with every pair planned up front."""
    from meshplan.strategy.programs._program import plan_graph
    from meshplan.strategy.programs._trace import trace

    mesh = data.draw(meshes(), label="mesh")
    desc = data.draw(programs(max_ops=4), label="program")
    specs = data.draw(arg_specs(mesh, 6, 4, 2), label="specs")
    graph = trace(build(desc, 2), specs, [True] * len(specs))
    cm = ComputeModel.cpu()
    full = plan_graph(graph, specs, compute=cm, max_priced=1 << 40, max_factor=1 << 18)
    lazy = plan_graph(graph, specs, compute=cm, max_priced=0, max_factor=1 << 18)
    if full.method == lazy.method == "exact":
        assert lazy.cost.total == pytest.approx(full.cost.total, rel=1e-12, abs=1e-18)
    # either way each answer's bound lies below the other's cost
    tol = 1e-12 * full.cost.total + 1e-18
    assert lazy.lower_bound <= full.cost.total + tol
    assert full.lower_bound <= lazy.cost.total + tol


@settings(max_examples=min(settings.default.max_examples, 10), deadline=None)
@given(data=st.data())
def test_the_whole_program_choice_costs_no_more_than_the_op_by_op_choice(data):
    from meshplan.strategy.programs._program import plan_graph
    from meshplan.strategy.programs._trace import trace

    mesh = data.draw(meshes(), label="mesh")
    desc = data.draw(programs(max_ops=5), label="program")
    specs = data.draw(arg_specs(mesh, 8, 4, 2), label="specs")
    fn = build(desc, 2)
    graph = trace(fn, specs, [True] * len(specs))
    cm = ComputeModel.cpu()
    whole = plan_graph(graph, specs, compute=cm)
    greedy = plan_graph(graph, specs, compute=cm, solver="op_by_op")
    assert whole.cost.total <= greedy.cost.total * (1 + 1e-12)
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in specs]
    _check(greedy, fn, tensors, specs)  # the baseline runs right too


@pytest.mark.slow
def test_on_a_3d_mesh_the_bounded_search_never_loses_to_op_by_op():
    from meshplan.strategy.programs._program import plan_graph

    mesh = Mesh.create((2, 2, 2))
    tensors, specs = transformer_args(mesh, layers=1)
    fn = functools.partial(transformer, layers=1)
    from meshplan.strategy.programs._trace import trace

    graph = trace(fn, specs, [s.dtype != "int64" for s in specs])
    cm = ComputeModel.cpu()
    whole = plan_graph(graph, specs, compute=cm)
    greedy = plan_graph(graph, specs, compute=cm, solver="op_by_op")
    assert whole.lower_bound <= whole.cost.total <= greedy.cost.total * (1 + 1e-12)


# -- shared moves ---------------------------------------------------------------------------


def _moves_run(prog, case, specs):
    """The moves ``simulate_program`` runs, as (source spec, target spec) pairs."""
    from meshplan.runtime import _program as runner

    ran = []
    real = runner._Sim.move

    def spy(self, plan, value):
        if plan is not None:
            ran.append((plan.src, plan.dst))
        return real(self, plan, value)

    runner._Sim.move = spy
    try:
        _check(prog, *case)
    finally:
        runner._Sim.move = real
    return ran


def _distinct_moves(prog):
    keys = {}
    reads = [zip(op.inputs, op.moves, strict=True) for op in prog.ops]
    reads.append(zip(prog.graph.outputs, prog.out_moves, strict=True))
    reads.append(zip(prog.graph.grads, prog.grad_moves, strict=True))
    for pairs in reads:
        for v, p in pairs:
            if p is not None:
                keys.setdefault((v, p.dst), []).append(p)
    return keys


def test_a_weight_read_forward_and_backward_is_gathered_once():
    """An FSDP weight (Shard(0) on dp) read by the forward mm and by the backward's
    transpose in the same layout is all-gathered once; the plan and the run agree."""
    from meshplan.redistribute import cost as plan_cost
    from meshplan.strategy.selection._price import check_model

    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 4), "float64")
    w = Spec(mesh, [Shard(0)], (4, 6), "float64")

    def fn(x, w):
        return torch.tanh(x @ w).sum()

    tensors = [torch.randn(8, 4, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)]
    prog = plan_program(fn, x, w, compute=ComputeModel.cpu())
    keys = _distinct_moves(prog)
    assert any(len(ps) > 1 for ps in keys.values()), prog.explain()
    ran = _moves_run(prog, (fn, tensors, [x, w]), [x, w])
    assert len(ran) == len(keys)
    model = check_model(None)
    comm = sum(plan_cost(ps[0], model).total for ps in keys.values())
    assert prog.cost.comm == pytest.approx(comm, rel=1e-12)


@settings(max_examples=min(settings.default.max_examples, 20), deadline=None)
@given(data=st.data())
def test_each_value_is_moved_once_per_layout_and_priced_once(data):
    """simulate_program runs one move per (value, target layout), shared by every
    reader; the program's modeled communication counts each once; gradients match."""
    from meshplan.redistribute import cost as plan_cost
    from meshplan.strategy.selection._price import check_model

    mesh = data.draw(meshes(), label="mesh")
    prog_desc = data.draw(programs(max_ops=4, n_weights=2), label="program")
    specs = data.draw(arg_specs(mesh, 4, 4, 2), label="specs")
    fn = build(prog_desc, 2)
    tensors = [torch.randn(s.shape, dtype=torch.float64) for s in specs]
    prog = plan_program(fn, *specs, compute=ComputeModel.cpu())
    keys = _distinct_moves(prog)
    ran = _moves_run(prog, (fn, tensors, specs), specs)
    assert len(ran) == len(keys)
    model = check_model(None)
    comm = sum(plan_cost(ps[0], model).total for ps in keys.values())
    assert prog.cost.comm == pytest.approx(comm, rel=1e-9, abs=1e-15)

"""Recompute (activation checkpointing) chosen by the planner: ``recompute=`` of
``plan_program`` and the graph rewrite behind it (``strategy.programs._recompute``).

The laws: a recomputing plan gives the same loss and gradients as one process (float64,
dropout redrawn identically); its saved activations shrink and its walked peak drops;
its modeled step pays the recompute; a budget only recompute meets gives a plan that
recomputes and fits; a budget no plan meets names the smallest feasible one, recompute
counted. Gloo: ``tests/runtime/test_step_memory_gloo.py`` (measured peak) and
``tests/runtime/test_program_gloo.py`` (parity).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import MemoryBudgetError, StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.runtime import run_unsharded, simulate_program
from meshplan.strategy import plan_graph, plan_program
from meshplan.strategy.programs._recompute import check_recompute, layer_groups, with_recompute
from meshplan.strategy.programs._repeats import find_repeats
from meshplan.strategy.programs._trace import trace

MESH = Mesh.create((2, 2), ("dp", "tp"))
N, D, LAYERS = 16, 8, 4


def residual(x, *ws, p: float = 0.0):
    """``LAYERS`` residual tanh-MLP layers (dropout ``p`` inside each), a mean square loss."""
    for i in range(0, len(ws), 2):
        h = torch.tanh(x @ ws[i])
        if p:
            h = torch.nn.functional.dropout(h, p)
        x = x + h @ ws[i + 1]
    return x.square().mean()


def specs(tp: bool = False):
    x = Spec(MESH, [Shard(0), Replicate()], (N, D), "float64")
    w = [Spec(MESH, [Replicate(), Shard(1) if tp else Replicate()], (D, D), "float64")]
    w.append(Spec(MESH, [Replicate(), Shard(0) if tp else Replicate()], (D, D), "float64"))
    return [x, *(w * LAYERS)]


def tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(N, D, generator=g, dtype=torch.float64)]
    out += [torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(2 * LAYERS)]
    return out


@functools.cache
def planned(recompute: str, p: float = 0.0, tp: bool = False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_program(functools.partial(residual, p=p), *specs(tp), recompute=recompute)


def _simulated(program, ts, seed):
    outs, grads = simulate_program(
        program, *[shard(t, s) for t, s in zip(ts, program.arg_specs, strict=True)], seed=seed
    )
    loss = unshard(outs[0], program.out_specs[0])
    return loss, [
        None if g is None else unshard(g, s) for g, s in zip(grads, program.grad_specs, strict=True)
    ]


def test_recomputing_every_layer_keeps_float64_parity_with_one_process_dropout_included():
    # tensor parallel: the recompute repeats the layers' moves (a partial sum reduced)
    always, never = planned("always", 0.1, True), planned("never", 0.1, True)
    assert len(always.recomputed) > 0 and not never.recomputed
    ts = tensors()
    (want,), want_grads = run_unsharded(never, *ts, seed=7, step=3)
    for program in (always, never):
        outs, grads = simulate_program(
            program,
            *[shard(t, s) for t, s in zip(ts, program.arg_specs, strict=True)],
            seed=7,
            step=3,
        )
        got = unshard(outs[0], program.out_specs[0])
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
        for g, s, w in zip(grads, program.grad_specs, want_grads, strict=True):
            if s is not None:
                assert torch.allclose(unshard(g, s), w, rtol=1e-12, atol=1e-14)


def test_recompute_shrinks_the_saved_activations_and_the_peak_and_pays_in_time():
    always, never = planned("always"), planned("never")
    assert always.memory.activations < never.memory.activations
    assert always.memory.peak < never.memory.peak
    assert always.memory.recomputed == len(always.recomputed) > 0
    assert always.cost.recompute > 0 and never.cost.recompute == 0
    assert always.cost.compute > never.cost.compute
    assert "recomputed in the backward" in always.explain()
    assert "forward calls recomputed" in str(always.memory)


def test_a_budget_only_recompute_meets_gives_a_plan_that_recomputes_and_fits():
    always, never = planned("always"), planned("never")
    budget = (always.memory.peak + never.memory.peak) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = plan_program(residual, *specs(), memory_budget=budget, choose=())
        plain = plan_program(residual, *specs(), recompute="never")
    assert program.recomputed
    assert program.memory.peak <= budget
    # not every layer: the fewest that fit in the layouts of the plan recomputing all,
    # at most what that plan costs
    assert len(program.recomputed) < len(always.recomputed)
    assert program.cost.total <= always.cost.total
    ts = tensors()
    (want,), want_grads = run_unsharded(plain, *ts, seed=0)
    got, grads = _simulated(program, ts, 0)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
    for g, w in zip(grads, want_grads, strict=True):
        if g is not None:
            assert torch.allclose(g, w, rtol=1e-12, atol=1e-14)
    assert program.lower_bound <= program.cost.total * (1 + 1e-9)
    assert program.lower_bound <= plain.cost.total * (1 + 1e-9)  # a bound over every choice


def test_an_infeasible_budget_names_the_smallest_feasible_one_with_recompute_counted():
    with pytest.raises(MemoryBudgetError, match="smallest feasible budget") as info:
        plan_program(residual, *specs(), memory_budget=1e4)
    least = info.value.least
    assert f"at least {least:.0f} bytes" in str(info.value)
    with pytest.raises(MemoryBudgetError, match="smallest feasible budget") as plain:
        plan_program(residual, *specs(), memory_budget=1e4, recompute="never")
    assert least < plain.value.least
    # the budget named as feasible is: every layer recomputed, it plans and fits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = plan_program(residual, *specs(), memory_budget=info.value.most)
    assert fits.recomputed and fits.memory.peak <= info.value.most


def test_recompute_takes_auto_never_always_and_names_the_choices_otherwise():
    assert check_recompute(None) == "auto"
    with pytest.raises(StrategyError, match="'auto', 'never', 'always'"):
        plan_program(residual, *specs(), recompute="sometimes")


def test_always_on_a_program_without_repeated_layers_is_refused_not_ignored():
    # two layers repeat too few times to be recomputed: "always" must not plan as "never"
    s = specs()[:5]
    with pytest.raises(StrategyError, match="recompute='always'.*has none"):
        plan_program(residual, *s, recompute="always")
    graph = trace(residual, specs(), [False] + [True] * (2 * LAYERS))
    with pytest.raises(StrategyError, match="solver='op_by_op'"):
        plan_graph(graph, specs(), recompute="always", solver="op_by_op")


@functools.cache
def _graph_and_groups():
    s = specs()
    graph = trace(functools.partial(residual, p=0.1), s, [False] + [True] * (2 * LAYERS))
    fixed = {k: spec for k, spec in zip(graph.args, s, strict=True)}
    return graph, layer_groups(graph, find_repeats(graph, fixed).blocks)


@settings(max_examples=min(settings.default.max_examples, 6), deadline=None)
@given(chosen=st.sets(st.integers(0, LAYERS - 1), min_size=1), seed=st.integers(0, 3))
def test_any_set_of_recomputed_layers_gives_the_single_process_results(chosen, seed):
    from meshplan.strategy.programs._program import plan_graph

    graph, groups = _graph_and_groups()
    assert len(groups) == LAYERS
    rewritten = with_recompute(graph, [groups[k] for k in sorted(chosen)])
    assert len({o for _, o in rewritten.recomputes}) == len(rewritten.recomputes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = plan_graph(rewritten, specs(), recompute="never")
    ts = tensors(seed)
    (want,), want_grads = run_unsharded(planned("never", 0.1), *ts, seed=seed)
    got, grads = _simulated(program, ts, seed)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
    for g, w in zip(grads, want_grads, strict=True):
        if g is not None:
            assert torch.allclose(g, w, rtol=1e-12, atol=1e-14)


def test_auto_under_a_budget_the_plan_without_recompute_meets_plans_no_recompute(monkeypatch):
    # a budget the plan without recompute fits within 1% of the bound over every choice:
    # that plan is kept, and no recomputing graph is planned at all
    import meshplan.strategy.programs._recompute_search as program_module

    roomy = 4 * planned("never").memory.peak
    rewrites = []
    real = program_module.recompute_origins
    monkeypatch.setattr(
        program_module, "recompute_origins", lambda *a: rewrites.append(a) or real(*a)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = plan_program(residual, *specs(), recompute="auto", memory_budget=roomy)
    assert rewrites == [] and not auto.recomputed
    assert auto.memory.peak <= roomy
    assert auto.lower_bound <= auto.cost.total <= 1.01 * auto.lower_bound + 1e-15


def test_auto_keeps_the_bounds_own_plan_where_it_fits_not_solving_it_again(monkeypatch):
    # the bound over every choice is the plan without recompute under the state budget;
    # where that plan's whole step fits the budget it is the plan without recompute's
    # answer too (the same objective): one solve in all, not two
    import meshplan.strategy.programs._program as program_module

    roomy = 4 * planned("never").memory.peak
    solves, answers = [], []
    real_solve, real_plan = program_module.solve_lazily, program_module._plan_graph

    def solve_spy(*a, **kw):
        solves.append(kw)
        return real_solve(*a, **kw)

    def plan_spy(graph, arg_specs, **kw):
        out = real_plan(graph, arg_specs, **kw)
        if kw.get("answer") is not None:
            answers.append((kw["answer"], out))
        return out

    monkeypatch.setattr(program_module, "solve_lazily", solve_spy)
    monkeypatch.setattr(program_module, "_plan_graph", plan_spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = plan_program(residual, *specs(), recompute="auto", memory_budget=roomy, choose=())
    assert len(solves) == 1 and len(answers) == 1
    (bound_plan, kept), = answers
    assert [op.output_specs for op in kept.ops] == [op.output_specs for op in bound_plan.ops]
    assert auto.cost.total == kept.cost.total and auto.memory.peak <= roomy


def test_auto_bounds_every_recompute_choice_once_and_each_plan_takes_that_bound(monkeypatch):
    # the bound over every choice (the plan without recompute under the state budget) is
    # solved first and once; the plans of the search take it instead of their own parts'
    import meshplan.strategy.programs._program as program_module

    always, never = planned("always"), planned("never")
    budget = (always.memory.peak + never.memory.peak) / 2
    calls = []
    real = program_module._plan_graph

    def spy(graph, arg_specs, **kw):
        out = real(graph, arg_specs, **kw)
        calls.append((kw, out))
        return out

    monkeypatch.setattr(program_module, "_plan_graph", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = plan_program(residual, *specs(), memory_budget=budget, choose=())
    bounds = [out.lower_bound for kw, out in calls if kw.get("bound_only")]
    assert len(bounds) == 1
    (bound,) = bounds
    solved = [kw for kw, _ in calls[:-1] if not kw.get("bound_only") and kw.get("follow") is None]
    assert solved and all(kw.get("known_bound") == bound for kw in solved)
    assert program.lower_bound == min(bound, program.cost.total)
    assert program.lower_bound <= never.cost.total * (1 + 1e-9)


@settings(max_examples=min(settings.default.max_examples, 50), deadline=None)
@given(layers=st.integers(1, 80), data=st.data())
def test_the_halving_search_finds_the_fewest_recomputed_layers_that_fit(layers, data):
    # peaks that fall as more layers are recomputed; the budget between two of them
    from types import SimpleNamespace

    from meshplan.strategy.programs._recompute_search import fewest_recomputed

    drops = data.draw(st.lists(st.integers(0, 5), min_size=layers, max_size=layers))
    peaks = [100 + sum(drops[k:]) for k in range(layers + 1)]  # peaks[k]: k recomputed
    budget = data.draw(st.integers(peaks[layers], peaks[0] + 1))
    known_not = data.draw(st.booleans()) and peaks[0] > budget
    calls = []

    def follow(k):
        calls.append(k)
        return SimpleNamespace(k=k, memory=SimpleNamespace(peak=peaks[k]))

    found = fewest_recomputed(follow, 0 if known_not else -1, layers, budget)
    fewest = min(k for k in range(layers + 1) if peaks[k] <= budget)
    assert all(p.memory.peak <= budget for p in found)
    assert min([p.k for p in found], default=layers) == fewest
    # nothing known: the count 0 first (one call where it fits), then the halving
    assert len(calls) <= max(1, layers + 1).bit_length() + 1 + (not known_not)
    if not known_not and peaks[0] <= budget:
        assert calls == [0]

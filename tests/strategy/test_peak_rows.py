"""The step's live bytes op by op, each a separable lower bound of the walked peak
(``strategy.programs._peak_rows``), and the budgeted plan they bound.

The laws: whatever the layouts, the state and inputs plus any op's row never exceed the
peak ``program.memory`` walks (a row is a relaxation of the peak's budget: a solve within
it bounds the constrained minimum); under a whole-step budget the plan fits it and its
bound, tightened by the rows, stays at or under its cost and at or over the estimate's.
"""

from __future__ import annotations

import functools
import warnings

import pytest
from _program_cases import transformer, transformer_args
from hypothesis import given, settings
from hypothesis import strategies as st
from test_step_memory import GRAD as MLP_GRAD
from test_step_memory import LAYERS as MLP_LAYERS
from test_step_memory import _mlp
from test_step_memory import _specs as _mlp_specs

import meshplan.strategy.programs._program as program_module
from meshplan.layout import Mesh
from meshplan.strategy import plan_program
from meshplan.strategy.programs._auto import layout_candidates
from meshplan.strategy.programs._peak_rows import PeakRows, held_values, schedule

MESH = Mesh.create((2, 2))


@functools.cache
def _case():
    _, specs = transformer_args(MESH, B=4, T=4, D=8, V=12, layers=1)
    return specs


def _fn(*args):
    return transformer(*args, layers=1, fused=False)


def _rows_of(program):
    """Each op's counted bytes under ``program``'s own layouts (every argument's known)."""
    graph = program.graph
    return PeakRows(graph, None, {n: 0 for n in graph.args}).live(program)


@settings(max_examples=min(settings.default.max_examples, 6), deadline=None)
@given(picks=st.lists(st.integers(0, 1 << 16), min_size=20, max_size=20))
def test_no_row_exceeds_the_walked_peak_whatever_the_layouts(picks):
    specs = list(_case())
    grads = [False] + [True] * (len(specs) - 2) + [False]
    for i in range(1, len(specs) - 1):
        cands = layout_candidates(specs[i])
        specs[i] = cands[picks[i % len(picks)] % len(cands)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = plan_program(_fn, *specs, requires_grad=grads)
    m = program.memory
    rows = _rows_of(program)
    assert len(rows) == len(schedule(program.graph)) == len(program.ops)
    assert m.total + m.inputs + float(rows.max()) <= m.peak * (1 + 1e-12)


def test_rows_count_what_the_estimate_leaves_out():
    """At the op where the walk peaks, the rows hold more than the saved values alone:
    the backward's own values, the copies its moves make, the storage views keep."""
    specs = _case()
    grads = [False] + [True] * (len(specs) - 2) + [False]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = plan_program(_fn, *specs, requires_grad=grads)
    m = program.memory
    top = m.total + m.inputs + float(_rows_of(program).max())
    assert m.total + m.inputs + m.activations < top <= m.peak
    kinds = {(h.read, h.sign) for h in held_values(program.graph, frozenset(program.graph.args))}
    assert kinds == {(False, 1), (True, 1), (False, -1)}


@functools.cache
def _budgeted_mlp():
    """The MLP's budget (70% of the free plan's peak), the keywords that plan it, its plan
    and what each fit's LP within the rows (``_program_fit._by_limits``) returned."""
    from meshplan.strategy.programs import _program_fit

    free = range(1, MLP_LAYERS + 1)
    ran = []
    real = _program_fit._by_limits

    def spy(*args):
        ran.append(real(*args))
        return ran[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        roomy = plan_program(_mlp, *_mlp_specs(), requires_grad=MLP_GRAD, choose=free)
        budget = roomy.memory.peak * 0.7
        kw = dict(requires_grad=MLP_GRAD, choose=free, memory_budget=budget)
        _program_fit._by_limits = spy
        try:
            plan = plan_program(_mlp, *_mlp_specs(), **kw)
        finally:
            _program_fit._by_limits = real
    return budget, kw, plan, ran


@pytest.mark.slow
def test_a_budgeted_plan_fits_and_the_rows_bound_it_at_least_as_tightly(monkeypatch):
    """Three residual-free tanh layers with every weight chosen, at 70% of the free plan's
    peak: the rows' bound is the tighter one (the estimate's misses the backward's own
    values), and both are under the plan's cost."""
    budget, kw, plan, _ = _budgeted_mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(program_module, "PeakRows", lambda *a: None)
        alone = plan_program(_mlp, *_mlp_specs(), **kw)
    assert plan.memory.peak <= budget * (1 + 1e-9)
    assert plan.cost.total <= alone.cost.total * (1 + 1e-12)  # the same fit, or a cheaper plan
    assert alone.lower_bound < plan.lower_bound <= plan.cost.total * (1 + 1e-12)


@pytest.mark.slow
def test_the_lp_within_the_rows_keeps_the_plan_and_bound_or_betters_them(monkeypatch):
    """The same budgeted MLP with and without the transportation LP within the rows of
    the ops where plans peak (and its MIP's choice): no costlier plan, no looser bound, and
    the LP's plans fit."""
    pytest.importorskip("highspy")
    from meshplan.strategy.programs import _program_fit

    budget, kw, plan, ran = _budgeted_mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(_program_fit, "_by_limits", lambda *a: (-float("inf"), []))
        alone = plan_program(_mlp, *_mlp_specs(), **kw)
    assert ran, "the LP within the rows did not run"
    for _, plans in ran:
        assert all(p.memory.peak <= budget * (1 + 1e-9) for p in plans)
    assert plan.memory.peak <= budget * (1 + 1e-9)
    assert plan.cost.total <= alone.cost.total * (1 + 1e-12)
    assert alone.lower_bound <= plan.lower_bound * (1 + 1e-12) <= plan.cost.total * (1 + 1e-9)

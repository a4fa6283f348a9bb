"""The whole step's memory per rank: ``program.memory`` and ``memory_budget=``.

``program.memory.peak`` walks the schedule ``run_program`` runs (it is checked against
measured peaks in ``tests/runtime/test_step_memory_gloo.py``); the solver bounds a
separable lower estimate of it (state, inputs and saved activations, each in its
producer's layout). The laws: the estimate never exceeds the peak, whatever the layouts;
a plan under ``memory_budget=`` fits it; a budget no plan meets names a feasible one.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import MemoryBudgetError, StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import ProgramMemory, plan_program
from meshplan.strategy.programs._auto import layout_candidates
from meshplan.strategy.programs._memory import _counted, local_bytes, saved_values

MESH = Mesh.create((2, 2), ("dp", "tp"))
N, D, LAYERS = 64, 16, 3
GRAD = [False] + [True] * LAYERS


def _mlp(x, *ws):
    for w in ws:
        x = torch.tanh(x @ w)
    return x.square().mean()


def _specs(layouts=None):
    x = Spec(MESH, [Shard(0), Replicate()], (N, D), "float32")
    w = Spec(MESH, [Replicate(), Replicate()], (D, D), "float32")
    ws = [w] * LAYERS if layouts is None else list(layouts)
    return [x, *ws]


def _estimate(program) -> float:
    """The separable estimate the solver's memory row holds, of the plan's own layouts."""
    m = program.memory
    counted = _counted(program.graph, saved_values(program.graph))
    return m.total + m.inputs + sum(local_bytes(program.spec_of(v)) for v in counted)


@settings(max_examples=min(settings.default.max_examples, 12), deadline=None)
@given(picks=st.lists(st.integers(0, 1 << 16), min_size=LAYERS, max_size=LAYERS))
def test_the_separable_estimate_never_exceeds_the_walked_peak(picks):
    cands = layout_candidates(_specs()[1])
    layouts = [cands[k % len(cands)] for k in picks]
    program = plan_program(_mlp, *_specs(layouts), requires_grad=GRAD)
    m = program.memory
    assert _estimate(program) <= m.peak + 1e-6
    assert m.peak == pytest.approx(
        m.params + m.grads + m.optimizer + m.inputs + m.activations + m.moved + m.transient
    )
    assert min(m.activations, m.moved, m.transient, m.inputs) >= 0


def test_a_whole_step_budget_is_met_and_shards_what_it_must():
    free = range(1, LAYERS + 1)
    roomy = plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free)
    budget = roomy.memory.peak * 0.97
    tight = plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free, memory_budget=budget)
    assert tight.memory.peak <= budget
    assert tight.cost.total >= roomy.cost.total * (1 - 1e-9)
    assert tight.lower_bound <= tight.cost.total
    assert tight.memory.total < roomy.memory.total  # state sharded to make room


def test_an_infeasible_whole_step_budget_names_a_feasible_one():
    free = range(1, LAYERS + 1)
    with pytest.raises(MemoryBudgetError, match="smallest feasible budget") as info:
        plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free, memory_budget=1000)
    at_most = info.value.most
    assert info.value.value == 1000 and 1000 < info.value.least <= at_most
    assert f"at most {at_most:.0f} bytes" in str(info.value)  # the message names it too
    fits = plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free, memory_budget=at_most)
    assert fits.memory.peak <= at_most


def test_state_budget_bounds_the_state_alone_and_not_both_budgets_at_once():
    free = range(1, LAYERS + 1)
    roomy = plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free)
    budget = roomy.memory.total * 0.6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tight = plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free, state_budget=budget)
    assert tight.memory.total <= budget
    with pytest.raises(StrategyError, match="not both"):
        plan_program(
            _mlp, *_specs(), requires_grad=GRAD, choose=free, state_budget=budget, memory_budget=1e9
        )
    with pytest.raises(StrategyError, match="state_budget"):
        plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free, state_budget=-1)


def test_program_memory_prints_its_parts():
    m = ProgramMemory(1e9, 1e9, 2e9, (), inputs=0.0, activations=3e9, moved=1e8, transient=5e8)
    assert m.peak == pytest.approx(7.6e9)
    assert "activations 3 GB" in str(m) and "peak 7.6 GB" in str(m)


def test_a_fit_that_runs_out_of_rounds_takes_the_lightest_plan_where_it_fits(monkeypatch):
    # regression: when tightening the estimate ran out of rounds (or below its least), the
    # planner raised "infeasible" naming as feasible a budget above the lightest plan's peak
    # (GPT-2, 2 layers on (8,), the halfway budget of benchmarks/program_speed.py, once in
    # two runs: the rounds' solves are time-limited)
    from meshplan.strategy.programs import _program_fit

    free = range(1, LAYERS + 1)
    with pytest.raises(MemoryBudgetError) as info:
        plan_program(_mlp, *_specs(), requires_grad=GRAD, choose=free, memory_budget=1000)
    lightest_peak = info.value.most
    taken = []
    real = _program_fit._lightest_plan

    def spy(*args):
        taken.append(real(*args))
        return taken[-1]

    # no tightening round, and neither the rows' solves nor the LP within them to meet a
    # plan that fits first
    monkeypatch.setattr(_program_fit, "FIT_ROUNDS", 0)
    monkeypatch.setattr(_program_fit, "ROW_SOLVES", 0)
    monkeypatch.setattr(_program_fit, "_by_limits", lambda *a: (-float("inf"), []))
    monkeypatch.setattr(_program_fit, "_lightest_plan", spy)
    fits = plan_program(
        _mlp, *_specs(), requires_grad=GRAD, choose=free, memory_budget=lightest_peak
    )
    assert taken and fits.memory.peak <= lightest_peak * (1 + 1e-9)
    assert fits.lower_bound <= fits.cost.total

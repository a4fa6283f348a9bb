"""A choice brought within a memory budget a variable at a time
(``solver._local_search.repair_within``), and the budgeted solve that uses it.

The laws: from any choice, where the lightest choice fits, the repaired one fits and is
priced by the problem's own objective; a budgeted solve with repair keeps bound <=
minimum <= cost (brute force over every choice) and fits its budget."""

from __future__ import annotations

import itertools

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from test_shared_solve import problems

from meshplan.strategy.solver import MemoryRow, Options, Problem, solve
from meshplan.strategy.solver._local_search import repair_within


@st.composite
def budgeted(draw):
    """A shared problem with a memory row per variable and a budget between the lightest
    and the heaviest choice's bytes, and a choice to start from."""
    problem = draw(problems(max_ops=5, max_options=3))
    rows = [
        MemoryRow(v, [draw(st.integers(0, 6)) for _ in range(k)])
        for v, k in enumerate(problem.sizes)
    ]
    light = sum(min(r.bytes) for r in rows)
    heavy = sum(max(r.bytes) for r in rows)
    budget = light + draw(st.floats(0, 1)) * (heavy - light)
    start = [draw(st.integers(0, k - 1)) for k in problem.sizes]
    return attrs.evolve(problem, memory=rows, budget=budget), start


def _brute(problem: Problem) -> float:
    return min(
        problem.evaluate(c)
        for c in itertools.product(*map(range, problem.sizes))
        if problem.fits(c)
    )


@settings(max_examples=min(settings.default.max_examples, 60), deadline=None)
@given(budgeted())
def test_a_repaired_choice_fits_whatever_it_starts_from(case):
    problem, start = case
    fixed = repair_within(problem, start)
    assert fixed is not None and len(fixed) == len(start)
    assert problem.fits(fixed)
    assert problem.evaluate(fixed) >= _brute(problem) - 1e-9


@settings(max_examples=min(settings.default.max_examples, 40), deadline=None)
@given(budgeted())
def test_a_budgeted_solve_with_repair_keeps_its_bound_below_the_minimum(case):
    problem, _ = case
    best = _brute(problem)
    for repair in (True, False):
        sol = solve(problem, Options(repair=repair))
        assert problem.fits(sol.choice)
        assert sol.bound <= best + 1e-9 <= sol.cost + 2e-9
        assert sol.cost == problem.evaluate(sol.choice)


def test_the_repair_takes_the_cheapest_bytes_first():
    # from (0, 0) (6 bytes over a budget of 3): variable 0's second option saves 2 bytes for
    # 1, variable 1's second saves 1 for 2; the cheaper rate first, then the smaller saving
    # of equal rates (so the last step overshoots least): (1, 1), not (2, 0)
    p = Problem(
        [[0.0, 1.0, 5.0], [0.0, 2.0]],
        budget=3.0,
        memory=[MemoryRow(0, [4.0, 2.0, 0.0]), MemoryRow(1, [2.0, 1.0])],
    )
    assert repair_within(p, [0, 0]) == [1, 1]
    assert repair_within(attrs.evolve(p, budget=None), [0, 0]) is None

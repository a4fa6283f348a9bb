"""Limits: more memory constraints beside a problem's own budget (a step's live bytes op
by op), each its rows within its own budget. The transportation LP keeps to every one:
its bound lies below the least cost of the choices within all of them (brute force), and
its MIP's choice fits all of them."""

from __future__ import annotations

import itertools

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_shared_solve import problems

from meshplan.strategy.solver import Limit, MemoryRow, Problem, solve_lp_within, transport_lp


def _within(problem):
    """The choices that fit ``problem``'s budget and limits."""
    return [c for c in itertools.product(*map(range, problem.sizes)) if problem.fits(c)]


@st.composite
def limited(draw):
    """A shared problem with one to three limits over random bytes per option, each
    budget between its lightest and heaviest choice."""
    problem = draw(problems(max_ops=4, max_options=3))
    limits = []
    for _ in range(draw(st.integers(1, 3))):
        rows = [
            MemoryRow(v, [draw(st.integers(0, 8)) for _ in range(k)])
            for v, k in enumerate(problem.sizes)
            if draw(st.booleans())
        ]
        least = sum(min(r.bytes) for r in rows)
        most = sum(max(r.bytes) for r in rows)
        limits.append(Limit(rows, least + draw(st.floats(0, 1)) * (most - least)))
    return attrs.evolve(problem, limits=limits)


def test_a_limit_counts_its_rows_and_a_problem_fits_every_limit():
    rows = [MemoryRow(0, [4.0, 2.0]), MemoryRow(1, [1.0, 3.0])]
    problem = Problem([[0.0, 1.0], [0.0, 1.0]], limits=[Limit(rows, 5.0)])
    assert problem.limits[0].used((1, 1)) == 5.0
    assert _within(problem) == [(0, 0), (1, 0), (1, 1)]  # (0, 1) holds 7
    assert problem.without_budget().fits((0, 0))
    with pytest.raises(ValueError, match="memory row"):
        Problem([[0.0, 1.0]], limits=[Limit([MemoryRow(1, [1.0, 2.0])], 1.0)])


pytest.importorskip("highspy")


@settings(max_examples=min(settings.default.max_examples, 60), deadline=None)
@given(limited())
def test_the_lp_within_every_limit_bounds_the_least_cost_within_them(problem):
    fitting = _within(problem)
    assume(fitting)
    best = min(problem.evaluate(c) for c in fitting)
    relaxed = transport_lp(problem, [fitting[0]])
    assert relaxed is not None and relaxed.bound <= best + 1e-9
    sol = solve_lp_within(problem, [fitting[0]])
    assert sol is not None and problem.fits(sol.choice)
    assert sol.bound <= best + 1e-9 <= sol.cost + 2e-9
    assert sol.cost == pytest.approx(problem.evaluate(sol.choice))


def test_two_limits_bound_more_than_each_alone():
    """Each limit holds one op to its dear option: alone, either costs 5; together 10."""
    unary = [[0.0, 5.0], [0.0, 5.0]]
    a = Limit([MemoryRow(0, [1.0, 0.0])], 0.0)
    b = Limit([MemoryRow(1, [1.0, 0.0])], 0.0)
    problem = Problem(unary, limits=[a, b])
    assert _within(problem) == [(1, 1)]
    alone = [solve_lp_within(attrs.evolve(problem, limits=[x]), [(1, 1)]) for x in (a, b)]
    both = solve_lp_within(problem, [(1, 1)])
    assert [s.cost for s in alone] == [5.0, 5.0] and all(s.bound <= 5.0 + 1e-9 for s in alone)
    assert both.bound == pytest.approx(10.0) and both.cost == 10.0 and problem.fits(both.choice)


def test_no_choice_within_the_limits_known_gives_none():
    # the lightest choice and every start exceed a limit: nothing to start the LP from
    problem = Problem([[0.0, 1.0]], limits=[Limit([MemoryRow(0, [3.0, 2.0])], 1.0)])
    assert solve_lp_within(problem, [(0,), (1,)]) is None

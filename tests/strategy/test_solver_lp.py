"""The transportation LP of a shared problem: its bound lies below the minimum (brute
force over every choice, and HiGHS's MILP on bigger ones) and its rounded choice costs
what it says."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from test_shared_solve import problems

from meshplan.strategy.solver import Options, solve_shared
from meshplan.strategy.solver._transport import solve_lp, transport_lp

pytest.importorskip("highspy")


def _brute(problem):
    return min(problem.evaluate(c) for c in itertools.product(*map(range, problem.sizes)))


@settings(max_examples=min(settings.default.max_examples, 60), deadline=None)
@given(problems(max_ops=5, max_options=3))
def test_the_lp_bound_lies_below_the_minimum_and_the_rounding_costs_what_it_says(problem):
    best = _brute(problem)
    sol = solve_lp(problem)
    assert sol.bound <= best + 1e-9
    assert sol.cost == problem.evaluate(sol.choice) >= best - 1e-9
    if sol.exact:
        assert abs(sol.cost - best) <= 1e-6 * max(1.0, best)


@settings(max_examples=min(settings.default.max_examples, 40), deadline=None)
@given(problems(max_ops=5, max_options=3))
def test_the_lp_is_at_least_as_tight_as_the_even_shares(problem):
    """The transportation LP's bound is at least that of the below problem with even
    shares (a point of its dual), and solving with it keeps bound <= min <= cost. (Where
    an op reads one value in two inputs the pair table is the tighter one: see below.)"""
    assume(not _reads_twice(problem))
    best = _brute(problem)
    lp = transport_lp(problem)
    plain = solve_shared(problem, Options(max_factor=1, steps=0))
    assert lp.bound >= plain.bound - 1e-6 * max(1.0, abs(plain.bound))
    both = solve_shared(problem, Options(max_factor=1, lp=True))
    assert both.bound <= best + 1e-9 <= both.cost + 2e-9
    assert both.bound >= lp.bound - 1e-9


def _reads_twice(problem) -> bool:
    return any(
        len(ops := [r.op for r in v.readers if not r.fixed]) != len(set(ops))
        for v in problem.values
    )


def test_an_op_reading_one_value_twice_keeps_the_pair_tables_tighter_bound():
    """Op 1 reads op 0's output in both inputs, in layouts (1, 0) or (0, 1): every choice
    moves once (0.5). The LP's per-read transportation splits each read its own way and
    bounds 0; the pair table of (op 0, op 1) charges each read its share of the move, 0.25
    at the least; the solve keeps the larger bound, and both lie below the minimum."""
    from meshplan.strategy.solver import Problem, Reader, SharedValue

    v = SharedValue(0, 0, -1, (Reader(1, 0), Reader(1, 1)))
    problem = Problem(
        [[0.0, 0.0], [0.0, 0.0]],
        values=[v],
        ins=[[[], []], [[1, 0], [0, 1]]],
        outs=[[[0], [1]], [[0], [0]]],
        price=lambda a, b: 0.0 if a == b else 0.5,
    )
    assert _reads_twice(problem) and _brute(problem) == 0.5
    lp = transport_lp(problem)
    plain = solve_shared(problem, Options(max_factor=1, steps=0))
    assert lp.bound == pytest.approx(0.0, abs=1e-9) and plain.bound == pytest.approx(0.25)
    both = solve_shared(problem, Options(max_factor=1, lp=True))
    assert both.bound == pytest.approx(0.25) and both.cost == 0.5


def test_a_shared_move_the_pairwise_bounds_split_is_paid_once_in_the_lp():
    """Two readers of one fixed value both want layout 1: the below problem's even shares
    charge each half a move, the LP charges the move once, which is the minimum."""
    from meshplan.strategy.solver import Problem, Reader, SharedValue

    v = SharedValue(-1, 0, 0, (Reader(0, 0), Reader(1, 0)))
    ins = [[[0], [1]], [[0], [1]]]  # each reads the value in layout 0 (cost 5) or 1
    problem = Problem(
        [[5.0, 0.0], [5.0, 0.0]],
        values=[v],
        ins=ins,
        outs=[[[], []], [[], []]],
        price=lambda a, b: 4.0,
    )
    assert _brute(problem) == 4.0
    assert transport_lp(problem).bound == pytest.approx(4.0, abs=1e-6)


def test_a_solve_prints_nothing_of_highs_to_the_process_output():
    # HiGHS writes a banner to file descriptor 1 on its first instance in a process; a
    # plan's output must stay the caller's (a fresh process: the banner is once per process)
    import subprocess
    import sys

    code = (
        "from meshplan.strategy.solver import Problem\n"
        "from meshplan.strategy.solver._transport import solve_lp\n"
        "sol = solve_lp(Problem([[1.0, 0.0], [0.0, 3.0]], {(0, 1): [[0, 5], [5, 0]]}))\n"
        "print(sol.cost)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout == "1.0\n"


@settings(max_examples=min(settings.default.max_examples, 30), deadline=None)
@given(problems(max_ops=5, max_options=3))
def test_an_lp_stopped_early_keeps_a_true_bound_and_none_without_a_round(problem):
    """Column generation cut short (one round, as a time limit cuts it) keeps the best
    bound of the rounds run, still below the minimum; with no time at all no round runs
    and there is no relaxation (the caller's own bound stands)."""
    best = _brute(problem)
    short = transport_lp(problem, max_rounds=1)
    full = transport_lp(problem)
    assert short.bound <= full.bound + 1e-9 and short.bound <= best + 1e-9
    assert transport_lp(problem, seconds=0.0) is None


def test_each_restricted_lp_run_gets_its_own_seconds():
    # HiGHS's time limit counts the run time of every run of one instance: the column
    # generation's late rounds (and a later solve's, warm-started from its LP) were cut at
    # what was left of LP_SECONDS minus the earlier rounds' time, and lost (Llama-3 70B's
    # tied bound: the last round of each part's LP stopped after 2-5 s, unsolved)
    from hypothesis import find

    from meshplan.strategy.solver import Warm
    from meshplan.strategy.solver._transport import _Restricted

    problem = find(problems(max_ops=5, max_options=3), lambda p: bool(p.values))
    warm = Warm()
    assert transport_lp(problem, warm=warm) is not None
    lp = warm.lp
    limits = []

    class Clocked:  # the same HiGHS instance, its time limit recorded
        def __init__(self, h):
            self.h = h

        def __getattr__(self, name):
            return getattr(self.h, name)

        def setOptionValue(self, key, value):
            if key == "time_limit":
                limits.append((value, self.h.getRunTime()))
            return self.h.setOptionValue(key, value)

    lp.h = Clocked(lp.h)
    assert isinstance(lp, _Restricted)
    assert lp.run(7.0) is not None
    ((limit, spent),) = limits
    assert spent > 0  # the first solve's rounds ran on this instance
    assert limit - spent == pytest.approx(7.0, abs=1e-9)

"""A tied program takes its bound's layer: the linked layer's LP optimum (a coordinated
change of many calls) replaces the rounds' draft wherever it costs less and fits."""

from __future__ import annotations

import itertools
import warnings

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.strategy.programs._program_solve import with_layer
from meshplan.strategy.solver import MemoryRow, Method, Problem, Solution, has_lp, run_bound


@attrs.define
class _Objective:
    """What :func:`with_layer` reads of a program's objective: the problem at the prices,
    each node's variable and the bytes outside the variables."""

    problem: Problem
    var: dict
    fixed_bytes: float = 0.0

    def at(self, prices) -> Problem:
        return self.problem


class _Prices:
    """Every move priced exactly already: nothing left to learn."""

    def learn_used(self, problem, choice) -> int:
        return 0


def _coupled() -> Problem:
    # two calls of a layer that gain together only: (0, 0) costs 2, (1, 1) costs 0, and
    # either alone costs 6; one call at a time, the draft (0, 0) cannot leave
    return Problem([[1.0, 0.0], [1.0, 0.0]], {(0, 1): [[0.0, 5.0], [5.0, 0.0]]})


def test_the_bounds_layer_replaces_a_draft_one_call_at_a_time_cannot_leave():
    obj = _Objective(_coupled(), {10: 0, 11: 1})
    draft = Solution((0, 0), 2.0, 0.0, Method.TIED)
    out = with_layer(obj, _Prices(), draft, {10: 1, 11: 1}, None)
    assert out.choice == (1, 1) and out.cost == 0.0
    assert out.bound == draft.bound and out.method is draft.method


def test_a_layer_that_costs_more_leaves_the_draft_as_it_is():
    obj = _Objective(_coupled(), {10: 0, 11: 1})
    best = Solution((1, 1), 0.0, 0.0, Method.TIED)
    assert with_layer(obj, _Prices(), best, {10: 0, 11: 0}, None) is best


def test_a_layer_that_holds_more_than_the_budget_is_not_taken():
    heavy = attrs.evolve(_coupled(), memory=[MemoryRow(0, [0.0, 8.0]), MemoryRow(1, [0.0, 8.0])])
    obj = _Objective(heavy, {10: 0, 11: 1}, fixed_bytes=1.0)
    draft = Solution((0, 0), 2.0, 0.0, Method.TIED)
    out = with_layer(obj, _Prices(), draft, {10: 1, 11: 1}, 10.0)  # 9 bytes of room
    assert attrs.evolve(heavy, budget=9.0).fits(out.choice)
    assert out.choice == (0, 0) and out.cost == 2.0
    roomy = with_layer(obj, _Prices(), draft, {10: 1, 11: 1}, 17.0)  # 16 bytes of room
    assert roomy.choice == (1, 1)


@pytest.mark.skipif(not has_lp(), reason="the layer's choice is the transportation LP's")
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 5),
)
def test_the_linked_layers_choice_is_periodic_and_its_cost_bounded_below(seed, n):
    # one layer (variables 0, 1) and copies of its calls in the next layer (2, 3): its
    # choice takes each copy's option from its own call, and n layers of that choice
    # cost at least the bound, which no periodic choice beats
    rng = np.random.default_rng(seed)
    unary = [rng.integers(0, 5, 3).astype(float) for _ in range(2)] + [np.zeros(3)] * 2
    pairs = {(0, 1): rng.integers(0, 5, (3, 3)), (1, 2): rng.integers(0, 5, (3, 3))}
    problem = Problem(unary, pairs)
    links = [(2, 0), (3, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bound, _, x = run_bound(problem, links, n=n, max_factor=1 << 10, choice=[0, 0, 0, 0])
    assert x is not None and x[2] == x[0] and x[3] == x[1]
    periodic = min(
        problem.evaluate([a, b, a, b]) for a, b in itertools.product(range(3), repeat=2)
    )
    eps = 1e-9 * max(1.0, abs(bound))
    assert bound <= n * periodic + eps
    assert n * problem.evaluate(x) >= bound - eps

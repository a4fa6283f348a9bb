"""The message-passing bound of a pairwise problem: a true lower bound of the minimum
(brute force over every choice), never above the cost of the choice it reads off, and
equal to the minimum on trees, where the relaxation is exact."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.strategy.solver import lp_bound, total
from meshplan.strategy.solver import solve_pairwise as solve


@st.composite
def pairwise(draw, max_nodes: int = 6, max_options: int = 3, tree: bool = False):
    n = draw(st.integers(1, max_nodes))
    sizes = [draw(st.integers(1, max_options)) for _ in range(n)]
    cost = st.integers(0, 8).map(lambda x: x / 4)
    unary = [[draw(cost) for _ in range(s)] for s in sizes]
    pairs = {}
    for b in range(1, n):
        parents = [draw(st.integers(0, b - 1))] if tree else draw(st.sets(st.integers(0, b - 1)))
        for a in parents:
            key = (a, b) if draw(st.booleans()) else (b, a)
            rows, cols = sizes[key[0]], sizes[key[1]]
            pairs[key] = [[draw(cost) for _ in range(cols)] for _ in range(rows)]
    return unary, pairs


def _minimum(unary, pairs) -> float:
    return min(total(x, unary, pairs) for x in itertools.product(*(range(len(u)) for u in unary)))


@settings(max_examples=min(settings.default.max_examples, 150), deadline=None)
@given(pairwise())
def test_the_bound_is_true_and_the_choice_costs_at_least_the_minimum(problem):
    unary, pairs = problem
    best = _minimum(unary, pairs)
    r = lp_bound(unary, pairs)
    assert r.bound <= best + 1e-9
    assert total(r.choice, unary, pairs) >= best - 1e-9
    assert r.bound <= total(r.choice, unary, pairs) + 1e-9


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(pairwise(tree=True))
def test_the_relaxation_is_exact_on_trees(problem):
    unary, pairs = problem
    best = _minimum(unary, pairs)
    assert abs(lp_bound(unary, pairs).bound - best) <= 1e-6 * max(1.0, best)


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(pairwise())
def test_the_bounded_solver_keeps_a_true_bound(problem):
    """With no factor allowed, the solver falls back on the bounds: its bound stays below
    the minimum and its choice costs what it says."""
    unary, pairs = problem
    best = _minimum(unary, pairs)
    sol = solve(unary, pairs, max_factor=0)
    assert sol.lower_bound <= best + 1e-9 <= sol.cost + 2e-9
    assert abs(sol.cost - total(sol.choice, unary, pairs)) <= 1e-9
    if sol.method == "exact":
        assert abs(sol.cost - best) <= 1e-9


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(pairwise(), pairwise(), st.booleans(), st.integers(0, 3))
def test_a_solve_from_an_earlier_solves_messages_keeps_a_true_bound(first, other, prove, bump):
    """``memo``: the messages one solve leaves (of the same terms at other costs, or of
    another problem altogether, whose messages do not fit and are not used) start the
    next one's bound, which stays below the minimum."""
    unary, pairs = first
    memo: dict = {}
    solve(unary, pairs, max_factor=0, prove=prove, memo=memo)
    assert "messages" in memo
    raised = [[c + bump * (k % 2) / 4 for k, c in enumerate(u)] for u in unary]
    for un, pw in [(raised, pairs), other]:
        best = _minimum(un, pw)
        sol = solve(un, pw, max_factor=0, prove=prove, memo=memo)
        assert sol.lower_bound <= best + 1e-9 <= sol.cost + 2e-9
        assert abs(sol.cost - total(sol.choice, un, pw)) <= 1e-9

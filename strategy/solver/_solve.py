"""The solver's entry: :func:`solve`, a :class:`~._problem.Problem` to a
:class:`~._solution.Solution` by the method that suits it (numpy when used)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._budget import budget_binds, solve_within
from ._eliminate import solve_pairwise
from ._problem import Problem
from ._shared import Split, solve_shared, split
from ._solution import Options, Solution, Warm

__all__ = ["solve"]


def solve(
    problem: Problem,
    options: Options | None = None,
    *,
    starts: Sequence[Sequence[int]] = (),
    seeds: Sequence[dict[int, int]] = (),
    warm: Warm | None = None,
) -> Solution:
    """The least-cost choice of ``problem``, with a true lower bound of its minimum.

    Pairwise problems: exact elimination where narrow enough, else message passing and
    local search (:func:`._eliminate.solve_pairwise`). Shared moves: exact elimination
    over each value's factor, else the sharing dual (:func:`._shared.solve_shared`).
    Under a binding memory budget: Lagrangian relaxation and branch and bound over
    those (:func:`._budget.solve_within`), the relaxation's solves drafts unless
    ``options.draft`` is off for the final one. ``starts``: choices local search also
    starts from; ``seeds``: partial choices a budget's search completes first;
    ``warm``: what the last solve of the same terms left (see :class:`Warm`).

    >>> p = Problem([[1, 0], [0, 3]], {(0, 1): [[0, 5], [5, 0]]})
    >>> solve(p)
    Solution(choice=(0, 0), cost=1.0, bound=1.0, method=<Method.EXACT: 'exact'>)
    """
    options = Options() if options is None else options
    moves = split(problem) if problem.values else None
    if problem.budget is None or not budget_binds(problem.weights(), problem.budget):
        return _free(problem.without_budget(), options, starts, warm, moves)
    # shared moves: the search's solves are drafts, one final solve gives the bound
    search = attrs.evolve(options, steps=0, draft=True) if problem.values else options
    final = None if options.draft or not problem.values else attrs.evolve(options, draft=False)
    if warm is not None and options.max_branches and warm.search is None:
        warm.search = {}  # a search carried over the calls
    kept = warm if warm is None or options.max_branches else attrs.evolve(warm, search=None)

    def relax(p: Problem, o: Options) -> Solution:
        return _free(p, o, starts, warm, moves)

    above = None if moves is None else moves.above(problem.unary)
    return solve_within(
        problem,
        relax,
        search,
        seeds=() if options.draft else seeds,
        final=final,
        warm=kept,
        above=above,
    )


def _free(
    problem: Problem, options: Options, starts, warm: Warm | None, moves: Split | None
) -> Solution:
    """The unconstrained minimum (see :func:`solve`)."""
    if problem.values:
        return solve_shared(problem, options, starts=starts, warm=warm, moves=moves)
    return solve_pairwise(
        problem.unary,
        problem.pairs,
        max_factor=options.max_factor,
        starts=starts,
        prove=options.prove and not options.draft,
    )

"""The solver's entry: :func:`solve`, a :class:`~._problem.Problem` to a
:class:`~._solution.Solution` by the method that suits it (numpy when used)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._budget import budget_binds, check_room, solve_within
from ._eliminate import solve_pairwise
from ._problem import Problem
from ._shared import Split, solve_shared, split
from ._solution import Method, Options, Solution, Warm, proven
from ._transport import has_lp
from ._transport_mip import mix_within, solve_lp_within

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
    lp = bool(problem.values) and options.lp and not options.draft and has_lp()
    small = None
    if lp and sum(problem.sizes) <= LP_WITHIN:
        # the transportation LP with the memory row bounds it, a MIP over its columns
        # chooses; where that leaves a gap, the search below too, the better of both
        check_room(problem)
        small = solve_lp_within(problem, starts)
        if small is not None and small.cost - small.bound <= options.gap * abs(small.cost):
            return small
    # shared moves: the search's solves are drafts, one final solve gives the bound
    search = attrs.evolve(options, steps=0, draft=True) if problem.values else options
    final = None if options.draft or not problem.values else attrs.evolve(options, draft=False)
    if warm is not None and options.max_branches and warm.search is None:
        warm.search = {}  # a search carried over the calls
    kept = warm if warm is None or options.max_branches else attrs.evolve(warm, search=None)

    def relax(p: Problem, o: Options) -> Solution:
        return _free(p, o, starts, warm, moves)

    above = None if moves is None else moves.above(problem.unary)
    sol = solve_within(
        problem,
        relax,
        search,
        seeds=() if options.draft else seeds,
        final=final,
        warm=kept,
        above=above,
        mix=mix_within if lp else None,
    )
    return sol if small is None else better(sol, small)


def better(a: Solution, b: Solution) -> Solution:
    """The cheaper of two solutions of one problem, with the larger of their bounds."""
    best = a if a.cost <= b.cost else b
    bound = min(max(a.bound, b.bound), best.cost)
    if bound <= best.bound:
        return best
    method = Method.EXACT if proven(best.cost, bound) else best.method
    return attrs.evolve(best, bound=bound, method=method)


#: the most options in all a budgeted problem with shared moves has for the
#: transportation LP with its memory row to solve it first (:func:`._transport_mip.solve_lp_within`;
#: past that its column generation costs more than the Lagrangian search)
LP_WITHIN = 2000


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

"""A choice within a memory budget from the transportation LP's columns (no torch; numpy
and highspy when used): the LP with its memory row bounds the budgeted minimum
(:func:`._transport.transport_lp`), and HiGHS's MIP over the restricted LP's columns
chooses (:func:`mip_choice`): for a budgeted problem alone (:func:`solve_lp_within`), or
mixing the options of choices on either side of the budget (:func:`mix_within`)."""

from __future__ import annotations

from collections.abc import Sequence

from ._budget import lightest_choice
from ._problem import Problem
from ._solution import Effort, Method, Solution
from ._transport import LPRelaxation, has_lp, transport_lp

__all__ = ["MIP_SECONDS", "mip_choice", "mix_within", "solve_lp_within"]


def mip_choice(
    relaxed: LPRelaxation,
    starts: Sequence[Sequence[int]] = (),
    time_limit: float = 10.0,
    among: Sequence[Sequence[int]] = (),
    rel_gap: float = 1e-4,
) -> list[int] | None:
    """The best choice among the columns of ``relaxed``'s restricted LP, by HiGHS's MIP
    (each ``x`` integral, the plans and moves continuous: at an integral ``x`` each plan
    is the one move its reader makes, so a solution's objective is its choice's cost),
    started from ``starts`` (choices whose columns the LP holds), within ``time_limit``
    seconds or until proven within ``rel_gap`` of the best among them; ``among``: choices
    whose options alone each variable may take (none: any); None when it finds no
    solution (or highspy is missing)."""
    if relaxed.restricted is None:
        return None
    import highspy
    import numpy as np

    rlp = relaxed.restricted
    model = rlp.m
    lp = rlp.h.getLp()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    kinds = [highspy.HighsVarType.kContinuous] * lp.num_col_
    kinds[: model.nx] = [highspy.HighsVarType.kInteger] * model.nx
    lp.integrality_ = kinds
    if among:
        keep = np.zeros(model.nx, dtype=bool)
        for c in among:
            keep[model.off[:-1] + np.asarray(c, dtype=np.int64)] = True
        upper = np.asarray(lp.col_upper_, dtype=float)
        upper[: model.nx] = np.where(keep, upper[: model.nx], 0.0)
        lp.col_upper_ = upper
    h.passModel(lp)
    xs = np.arange(model.nx, dtype=np.int32)
    for s in starts:
        value = np.zeros(model.nx)
        value[model.off[:-1] + np.asarray(s, dtype=np.int64)] = 1.0
        h.setSolution(model.nx, xs, value)
    h.run()
    if h.getInfo().primal_solution_status != 2:  # no feasible point found
        return None
    col = np.asarray(h.getSolution().col_value)[: model.nx]
    return [int(np.argmax(col[model.off[v] : model.off[v + 1]])) for v in range(model.n)]


#: the MIP's time in :func:`solve_lp_within` (seconds): it chooses, the LP bounds, and
#: the Lagrangian search and its mix run after it anyway. On a tied 4-layer program of
#: 1,725 options HiGHS used every one of 10 s without closing its gap, three times in one
#: plan, for the same final plan as with 2 s (68 s of planning against 40 s)
MIP_SECONDS = 2.0


def solve_lp_within(
    problem: Problem,
    starts: Sequence[Sequence[int]] = (),
    warm=None,
    *,
    time_limit: float | None = None,
    rel_gap: float = 1e-4,
) -> Solution | None:
    """The least-cost choice of ``problem`` within its memory budget, by the LP with the
    memory row (its bound: the Lagrangian dual at the simplex's duals and the row's
    multiplier, true for any of them) and a MIP over the LP's columns (:func:`mip_choice`)
    for the choice (within ``time_limit`` seconds, default :data:`MIP_SECONDS`, or
    ``rel_gap`` of the best among the LP's columns), from the
    lightest choice and the ``starts`` that fit (the budget and every limit); None without
    highspy, when the LP does not solve, or when none of those fits."""
    if not has_lp():
        return None
    light = lightest_choice(problem)
    fit = [list(s) for s in (*starts, light) if problem.fits(s)]
    if not fit:  # (limits the lightest choice exceeds, and no start within them)
        return None
    best = min(((problem.evaluate(s), s) for s in fit), key=lambda t: t[0])
    relaxed = transport_lp(problem, [*fit, *starts], target=best[0], warm=warm)
    if relaxed is None:
        return None
    found = [[int(row.argmax()) for row in relaxed.x]]
    seconds = MIP_SECONDS if time_limit is None else time_limit
    mip = mip_choice(relaxed, [best[1]], seconds, rel_gap=rel_gap)
    if mip is not None:
        found.append(mip)
    for c in found:
        cost = problem.evaluate(c)
        if problem.fits(c) and cost < best[0]:
            best = (cost, c)
    cost, choice = best
    bound = min(relaxed.bound, cost)
    effort = Effort(simplex=relaxed.iterations)
    method = Method.EXACT if cost - bound <= 1e-9 * max(abs(cost), 1e-300) else Method.TRANSPORT_LP
    return Solution(choice, cost, bound, method, effort, multiplier=relaxed.multiplier)


def mix_within(
    problem: Problem, choices: Sequence[Sequence[int]], time_limit: float = 10.0
) -> list[int] | None:
    """A choice within ``problem``'s budget taking each variable's option from one of
    ``choices`` (on either side of the budget), the best such by HiGHS's MIP over their
    LP columns (:func:`mip_choice`: one layer from a light choice, another from a heavy
    one); None without highspy, or when it finds none better than the fitting
    ``choices``."""
    if not has_lp() or not choices:
        return None
    choices = [list(c) for c in dict.fromkeys(map(tuple, choices))]
    fit = sorted((c for c in choices if problem.fits(c)), key=problem.evaluate)
    relaxed = transport_lp(problem, choices, max_rounds=1)
    if relaxed is None:
        return None
    found = mip_choice(relaxed, fit[:1], time_limit, among=choices)
    if found is None or not problem.fits(found):
        return None
    if fit and problem.evaluate(found) >= problem.evaluate(fit[0]):
        return None
    return found

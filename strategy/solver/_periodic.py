"""A layer's bound with its neighbours' layouts priced as its own (numpy when used).

A program whose repeated layers share one plan is bounded part by part (the program
planner's ``_program_parts``): each layer of a tied program alone, its inputs from the
layers before and after it read from *copies* whose options the layer picks freely. A
copy stands for a call of the next or previous layer, which in the program is that
layer's own call of the same class (tied to the same representative). Lagrange
multipliers ``lam`` price the link: ``+lam`` on every copy's option of a class, ``-lam``
on every own call of that class once per part copying it. For any choice of the whole
program, the copies take their calls' options, so the multipliers' terms cancel: the
parts' bounds still sum to a bound of the program, whatever ``lam`` is. The run of
alike layers tunes ``lam`` (:func:`run_bound`), by supergradient steps together with
the readers' shares of shared moves (:mod:`._sharing`); the other parts take the same
``lam``. At the best ``lam`` a layer's copies take about the layouts the layer itself
produces, as in the program, and its bound approaches that of the layer repeated
periodically.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["run_bound"]


def run_bound(
    problem,
    links: Sequence[tuple[int, int]],
    *,
    n: int,
    max_factor: int,
    choice: Sequence[int],
    steps: int = 40,
    lp: bool = True,
    warm=None,
) -> tuple[float, list, list[int] | None]:
    """``n`` times a lower bound of one part's minimum with the links priced by
    multipliers, the multipliers (per link, by option), and the LP's choice of the part
    (each variable's heaviest option, each copy taking its own call's; None without the
    LP): see the module docstring. With the links as rows the LP's optimum is a
    periodic plan of the layer, most often integral (Llama-3 8B and 70B: every option
    weight 0 or 1), so that choice is the layer's best plan the bound proves.
    ``problem`` is one part's (a :class:`~._problem.Problem`), ``links``
    its ``(copy, own)`` variable pairs, ``choice`` a choice of the part whose copies
    agree with their own calls (the program's: its cost aims the steps). ``lp``: with
    highspy installed, the transportation LP with the links as rows (the best
    multipliers, and a tighter relaxation of the shared moves) instead of the steps;
    ``warm``: a :class:`~._solution.Warm` the LP starts from and leaves its own in (the
    same part bounded again at other prices)."""
    import numpy as np

    from ._sharing import _ascent, _at, _project, _splits, pairwise_min
    from ._transport import has_lp, transport_lp

    if lp and has_lp() and (problem.values or problem.pairs):
        # the links as rows of the transportation LP: its minimum is the best over the
        # multipliers, which its rows' duals are
        relaxed = transport_lp(problem, [choice], links=links, warm=warm)
        if relaxed is not None:
            x = [int(row.argmax()) for row in relaxed.x]
            for c, o in links:
                x[c] = x[o]
            return n * relaxed.bound, relaxed.links, x
    unary = problem.unary
    splits, weights = _splits(problem)
    able = [w > 0 for w in weights]
    lam = [np.zeros(len(unary[c])) for c, _ in links]
    solve = pairwise_min(max_factor)

    def at(weights, lam, start, passes):
        un, pairs, const = _at(unary, splits, weights, problem.pairs)
        for (c, o), m in zip(links, lam, strict=True):
            un[c] = un[c] + m
            un[o] = un[o] - m
        low, x, start = solve(un, pairs, start, passes)
        return low + const, x, start

    best = None  # (total, weights, lam, start)
    upper = problem.evaluate(choice)
    theta, stale, start = 1.0, 0, None
    for _ in range(steps):
        low, x, start = at(weights, lam, start, 40)
        if best is None or n * low > best[0]:
            best, stale = (n * low, weights, [m.copy() for m in lam], start), 0
        else:
            stale += 1
            if stale >= 4:
                theta, stale = theta / 2, 0
        # a choice of the linked parts: each copy as its own call, priced on the part
        y = list(x)
        for c, o in links:
            y[c] = y[o]
        upper = min(upper, problem.evaluate(y))
        grads, norm = _ascent(splits, weights, x)
        moved = [(k, x[c], x[o]) for k, (c, o) in enumerate(links) if x[c] != x[o]]
        if (norm <= 0 and not moved) or theta < 1e-3:
            break
        if upper - low <= 1e-9 * max(abs(upper), 1e-300):
            break
        # the shares (no unit) and the multipliers (a price) take a step each, of half
        # the gap: their supergradients differ in units
        gap = theta * max(upper - low, 0.0) / 2
        if norm > 0:
            t = gap / norm
            weights = [_project(w + t * g, a) for w, g, a in zip(weights, grads, able, strict=True)]
        lam = [m.copy() for m in lam]
        for k, xc, xo in moved:  # the copy's option dearer, its own call's cheaper
            lam[k][xc] += gap / (2 * len(moved))
            lam[k][xo] -= gap / (2 * len(moved))
    _, weights, lam, start = best
    if start is not None:  # the best point's bound, its passes run to convergence
        low, _, _ = at(weights, lam, start, 200)
        return max(best[0], n * low), lam, None
    return best[0], lam, None

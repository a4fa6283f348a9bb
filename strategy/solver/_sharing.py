"""A tighter bound of the shared objective: the readers' shares of a move, tuned (no torch).

A value moved to layout ``B`` pays ``price(A, B)`` once, however many of its readers
want ``B`` (see :mod:`._shared`). Any weights ``w[r, B] >= 0`` whose sum over the
readers able to want ``B`` is at most 1 split that price into pairwise terms
``w[r, B] * price(A, B)`` (reader ``r`` wanting ``B``) that never exceed it, so the
pairwise problem they make is a lower bound of the shared one, whatever the weights.
:mod:`._shared` starts from even shares; :func:`tighten` raises the bound by projected
supergradient ascent over the weights (the Lagrangian dual of sharing): where the
pairwise answer has several readers wanting one layout, their shares grow at the
expense of readers not wanting it. Every step's answer is also a candidate choice,
improved by local search on the shared objective itself, so the gap closes from both
sides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

__all__ = ["Tightened", "tighten"]


@attrs.frozen
class Tightened:
    """The best ``bound`` found, the cheapest shared ``cost`` and its ``choice``, the
    number of ``steps`` taken, and the readers' shares of the best bound (to start a
    problem over the same values from)."""

    bound: float
    cost: float
    choice: tuple[int, ...]
    steps: int
    weights: list = attrs.field(eq=False, repr=False, factory=list)


@attrs.frozen(eq=False)
class _Split:
    """Reader ``row`` of value ``value``: the source's options (rows) against the
    reader's (columns) as a price table, which layout each column wants (``column``: an
    index into the value's layouts), and the ops at either end (-1: fixed)."""

    producer: int
    reader: int
    value: int
    row: int
    prices: Any
    column: Any


def _splits(problem) -> tuple[list[_Split], list[Any]]:
    """The splits of every reader, and per value a weight table (readers x layouts, 0
    where a reader cannot want the layout) holding even shares to start from."""
    import numpy as np

    values, ins, outs, price = problem.values, problem.ins, problem.outs, problem.price
    splits: list[_Split] = []
    weights = []
    for vi, v in enumerate(values):
        srcs = [v.layout] if v.producer < 0 else [row[v.j] for row in outs[v.producer]]
        wants = [[r.layout] if r.op < 0 else [row[r.i] for row in ins[r.op]] for r in v.readers]
        layouts = sorted({b for w in wants for b in w})
        at = {b: n for n, b in enumerate(layouts)}
        able = np.zeros((len(v.readers), len(layouts)))
        for ri, (r, w) in enumerate(zip(v.readers, wants, strict=True)):
            column = np.array([at[b] for b in w])
            able[ri, column] = 1.0
            table = np.array([[0.0 if a == b else price(a, b) for b in w] for a in srcs])
            table = table * v.count
            splits.append(_Split(v.producer, r.op, vi, ri, table, column))
        weights.append(able / np.maximum(able.sum(axis=0), 1.0)[None, :])
    return splits, weights


def _at(unary, splits: list[_Split], weights, base=None) -> tuple[list, dict, float]:
    """The pairwise problem at ``weights``: ``(unary, pairs, constant)`` (``base``: pair
    tables of the problem's own, added)."""
    import numpy as np

    un = [np.asarray(u, dtype=float).copy() for u in unary]
    pairs: dict[tuple[int, int], Any] = dict(base or {})
    const = 0.0
    for s in splits:
        m = s.prices * weights[s.value][s.row, s.column][None, :]
        p, c = s.producer, s.reader
        if p >= 0 and c >= 0 and p != c:
            pairs[(p, c)] = pairs[(p, c)] + m if (p, c) in pairs else m
        elif p >= 0 and c >= 0:
            un[p] = un[p] + np.diagonal(m)
        elif p >= 0:
            un[p] = un[p] + m[:, 0]
        elif c >= 0:
            un[c] = un[c] + m[0, :]
        else:
            const += float(m[0, 0])
    return un, pairs, const


def _ascent(splits: list[_Split], weights, choice: Sequence[int]) -> tuple[list, float]:
    """The supergradient of the bound at the pairwise answer ``choice``: per value, the
    price each reader's wanted layout would cost from the chosen source; and its squared
    norm."""
    import numpy as np

    grads = [np.zeros_like(w) for w in weights]
    norm = 0.0
    for s in splits:
        k = 0 if s.producer < 0 else choice[s.producer]
        j = 0 if s.reader < 0 else choice[s.reader]
        g = float(s.prices[k, j])
        if g > 0:
            grads[s.value][s.row, s.column[j]] += g
            norm += g * g
    return grads, norm


def _project(w, able) -> Any:
    """Each column of ``w`` (restricted to ``able``) onto ``{x >= 0, sum x <= 1}``."""
    import numpy as np

    w = np.where(able, np.maximum(w, 0.0), 0.0)
    for b in np.flatnonzero(w.sum(axis=0) > 1.0):
        col = w[able[:, b], b]
        srt = np.sort(col)[::-1]
        cum = np.cumsum(srt) - 1.0
        k = np.flatnonzero(srt - cum / np.arange(1, len(srt) + 1) > 0)[-1]
        w[able[:, b], b] = np.maximum(col - cum[k] / (k + 1), 0.0)
    return w


def tighten(
    problem,
    best: tuple[float, Sequence[int]],
    bound: float,
    *,
    pairwise_min: Callable[[list, dict, Any, int], tuple[float, Sequence[int], Any]],
    improve: Callable[[Sequence[int]], tuple[float, Sequence[int]]],
    steps: int = 30,
    tol: float = 1e-9,
    start_weights: list | None = None,
) -> Tightened:
    """Raise ``bound`` (a true bound of the shared minimum) and lower ``best`` (a cost and
    its choice) for up to ``steps`` steps or until they meet within ``tol`` (relative).

    ``problem`` is the shared :class:`~._problem.Problem`; ``pairwise_min(unary, pairs, start,
    passes)`` returns a true lower bound of a pairwise problem, a choice for it and what
    to start a nearby problem from (after about ``passes`` passes of work);
    ``improve(choice)`` returns a (cost, choice) on the shared objective no worse than
    ``choice``; ``start_weights``: the ``weights`` of an earlier result over the same
    values (else even shares).
    """
    unary = problem.unary
    splits, weights = _splits(problem)
    able = [w > 0 for w in weights]
    fits = start_weights is not None and len(start_weights) == len(weights)
    if fits and all(w.shape == x.shape for w, x in zip(weights, start_weights, strict=True)):
        weights = [_project(x, a) for x, a in zip(start_weights, able, strict=True)]
    cost, choice = best
    seen = {tuple(choice)}
    theta, stale, start = 1.0, 0, None
    kept = None  # the weights of the best bound, and the messages it ended with
    taken = 0
    while taken < steps:
        taken += 1
        if cost - bound <= tol * max(abs(cost), 1e-300):
            break
        un, pairs, const = _at(unary, splits, weights, problem.pairs)
        low, x, start = pairwise_min(un, pairs, start, 10)
        low += const
        if low > bound + 1e-12 * max(abs(bound), 1e-300):
            bound, stale, kept = low, 0, (weights, start)
        else:
            stale += 1
            if stale >= 4:  # no gain for a while: shorter steps
                theta, stale = theta / 2, 0
        if tuple(x) not in seen:
            seen.add(tuple(x))
            c, xc = improve(x)
            if c < cost:
                cost, choice = c, tuple(xc)
        grads, norm = _ascent(splits, weights, x)
        if norm <= 0 or theta < 1e-3:
            break
        t = theta * max(cost - low, 0.0) / norm
        weights = [_project(w + t * g, a) for w, g, a in zip(weights, grads, able, strict=True)]
    if kept is not None and kept[1] is not None and cost - bound > tol * max(abs(cost), 1e-300):
        # the steps run few passes each: the best weights' bound, raised to convergence
        un, pairs, const = _at(unary, splits, kept[0], problem.pairs)
        bound = max(bound, pairwise_min(un, pairs, kept[1], 200)[0] + const)
    best_weights = kept[0] if kept is not None else weights
    return Tightened(min(bound, cost), cost, tuple(choice), taken, best_weights)


def pairwise_min(max_factor: int) -> Callable:
    """A ``pairwise_min`` for :func:`tighten`: exact elimination where the problem is
    narrow enough, else the message-passing bound, started from the previous step's.
    The steps' problems share their terms (only the weights change), so the elimination
    order is found once per set of terms."""
    from ._eliminate import _eliminate, elimination_order, total
    from ._messages import lp_bound

    orders: dict[frozenset, list[int] | None] = {}

    def run(un, pairs, start, passes):
        key = frozenset(pairs)
        if key not in orders:
            orders[key] = elimination_order([len(u) for u in un], pairs.keys(), max_factor)
        order = orders[key]
        if order is not None:
            x = _eliminate(un, pairs, order)
            return total(x, un, pairs), x, None
        r = lp_bound(un, pairs, start=start, max_passes=passes)
        return r.bound, r.choice, r.messages

    return run

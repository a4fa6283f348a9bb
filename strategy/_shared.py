"""Shared moves: one move of a value to a layout serves every reader wanting that layout.

Every op picks one option; a *value* (an argument, or one output of an op) is read by
*readers* (op inputs, and fixed targets such as output and gradient specs), each in a
layout that depends on the reader's option. A value pays, for each distinct layout its
readers want, the price of one move there from the layout its source chose
(:func:`shared_total`). That is not a sum of pairwise terms, so the solver works with
two pairwise problems around it:

* above: every reader pays its own move (what a planner without sharing minimizes);
  any choice costs at least as much there as shared;
* below: reader ``r`` pays ``lam[r, B] * price(A, B)``, where ``lam[r, B]`` is one over
  the number of the value's readers that may want ``B`` (:func:`reader_weights`). The
  readers wanting ``B`` in any choice pay at most one ``price(A, B)`` together, so every
  choice costs at least as much shared as below: the minimum below is a true lower
  bound of the shared minimum.

The choice is the best of the pairwise answers improved by :func:`local_search` on the
shared objective itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ._local_search import Searcher, local_search
from ._sharing import pairwise_min, tighten
from ._solve import Solution, solve

__all__ = [
    "Reader",
    "SharedValue",
    "local_search",
    "reader_weights",
    "shared_solver",
    "shared_total",
    "solve_shared",
]


@attrs.frozen
class Reader:
    """One read of a value: by input ``i`` of op ``op`` (its options' layouts in
    ``ins[op][k][i]``), or by a fixed target ``layout`` (``op`` is -1)."""

    op: int
    i: int = 0
    layout: int = -1


@attrs.frozen
class SharedValue:
    """A value: its source (``producer`` op and output ``j``, or a fixed ``layout`` when
    ``producer`` is -1) and its readers; ``count`` values alike (repeated layers planned
    as one, :mod:`._repeats`) pay its moves ``count`` times (a fraction: a share of
    them, :mod:`._program_parts`)."""

    producer: int
    j: int
    layout: int
    readers: tuple[Reader, ...]
    count: float = 1


def _source(v: SharedValue, choice: Sequence[int], outs) -> int:
    return v.layout if v.producer < 0 else outs[v.producer][choice[v.producer]][v.j]


def _value_cost(v: SharedValue, choice, ins, outs, price) -> float:
    a = _source(v, choice, outs)
    dsts = {r.layout if r.op < 0 else ins[r.op][choice[r.op]][r.i] for r in v.readers}
    return v.count * sum(price(a, b) for b in dsts if b != a)


def shared_total(
    choice: Sequence[int],
    unary: Sequence[Sequence[float]],
    values: Sequence[SharedValue],
    ins,
    outs,
    price: Callable[[int, int], float],
) -> float:
    """The cost of ``choice``: unary terms plus, per value, one move per distinct layout read.

    >>> v = SharedValue(-1, 0, 0, (Reader(0, 0), Reader(1, 0)))
    >>> ins = [[[0], [1]], [[1]]]  # op 0 reads the value in layout 0 or 1, op 1 in 1
    >>> shared_total((1, 0), [[0, 0], [0]], [v], ins, [[[]], [[]]], lambda a, b: 2.0)
    2.0
    """
    s = sum(float(unary[c][k]) for c, k in enumerate(choice))
    return float(s + sum(_value_cost(v, choice, ins, outs, price) for v in values))


def reader_weights(values: Sequence[SharedValue], ins) -> dict[tuple, dict[int, float]]:
    """Per reader ``(op, input)`` (``("sink", op, output)`` for fixed targets) and layout,
    one over the number of the value's readers that may want that layout."""
    out: dict[tuple[int, int], dict[int, float]] = {}
    for v in values:
        wants = []
        for r in v.readers:
            if r.op < 0:  # a fixed target: keyed by the value's producer and output
                wants.append((("sink", v.producer, v.j), {r.layout}))
            else:
                wants.append(((r.op, r.i), {row[r.i] for row in ins[r.op]}))
        count: dict[int, int] = {}
        for _, bs in wants:
            for b in bs:
                count[b] = count.get(b, 0) + 1
        for key, bs in wants:
            mine = out.setdefault(key, {})
            for b in bs:
                mine[b] = min(mine.get(b, 1.0), 1.0 / count[b])
    return out


def _improver(unary, values, ins, outs, price, best: list[float], search: Searcher):
    """Local search (``search``) from a choice that costs at most 10% over the best one
    seen (others rarely end below it), on the shared objective."""

    def improve(x) -> tuple[float, Sequence[int]]:
        c = shared_total(x, unary, values, ins, outs, price)
        if c <= best[0] * 1.1:
            x = search(x, unary)
            c = shared_total(x, unary, values, ins, outs, price)
        best[0] = min(best[0], c)
        return c, x

    return improve


def solve_shared(
    above,
    below,
    shared,
    *,
    max_factor: int,
    starts=(),
    steps: int = 30,
    memo=None,
    draft: bool = False,
) -> Solution:
    """The shared minimum: pairwise problems ``above`` and ``below`` (``(unary, pairs)``,
    see the module docstring) solved, their answers improved on the ``shared`` objective
    (``(unary, values, ins, outs, price)``) by :func:`local_search`; the bound is
    ``below``'s (its exact minimum, or a bound of it: see :func:`._solve.solve`), raised
    and the choice improved by up to ``steps`` steps of :func:`._sharing.tighten`
    (``draft``: neither, and the cheaper, looser bound of ``below``). ``memo``: a dict
    carried between solves of one program (the readers' shares start where the last
    solve left them)."""
    unary, values, ins, outs, price = shared
    exact = solve_exact(unary, values, ins, outs, price, max_factor=max_factor)
    if exact is not None:
        return exact
    up = solve(*above, max_factor=max_factor, starts=starts, prove=False)
    lo = solve(*below, max_factor=max_factor, prove=not draft)
    best = None
    search = Searcher(values, ins, outs, price)  # the price tables, built once
    for start in dict.fromkeys([up.choice, lo.choice, *map(tuple, starts)]):
        c = search(start, unary)
        cost = shared_total(c, unary, values, ins, outs, price)
        if best is None or cost < best[0]:
            best = (cost, tuple(c))
    cost, choice = best
    bound = min(lo.lower_bound, cost)
    # what bounds the choice: the below problem's minimum, or its bound (see solve)
    method = "exact relaxation bound" if lo.method == "exact" else lo.method
    method = method.removesuffix(" + local search")
    if steps and not draft and cost - bound > 1e-9 * max(cost, 1e-300):
        t = tighten(
            unary,
            (values, ins, outs, price),
            (cost, choice),
            bound,
            pairwise_min=pairwise_min(max_factor),
            improve=_improver(unary, values, ins, outs, price, [cost], search),
            # from the shares a solve of the same program left: half the steps
            steps=steps if memo is None or "weights" not in memo else (steps + 1) // 2,
            start_weights=None if memo is None else memo.get("weights"),
        )
        if memo is not None:
            memo["weights"] = t.weights
        if t.bound > bound:
            method = f"sharing dual bound ({t.steps} steps)"
        cost, choice, bound = t.cost, t.choice, t.bound
    if cost - bound <= 1e-12 * max(cost, 1e-300):
        return Solution(choice, cost, bound, "exact")
    return Solution(choice, cost, bound, method + " + local search")


def shared_solver(above, below, shared) -> tuple[Callable[..., Solution], Callable]:
    """:func:`solve_shared` as a solver of ``(unary, pairs)`` problems, and the shared
    objective of a choice.

    The solver's unary rows may add terms to ``above``'s (a Lagrangian multiplier times
    memory, a branch's exclusions); the same terms are added to ``below`` and to
    ``shared``'s unary, so the answer and its bound are for the shared objective plus them.
    """
    base = above[0]

    def solve_with(unary, pairs, **kwargs) -> Solution:
        extra = [u - b for u, b in zip(unary, base, strict=True)]
        lo = [x + d for x, d in zip(below[0], extra, strict=True)]
        un = [x + d for x, d in zip(shared[0], extra, strict=True)]
        return solve_shared((unary, above[1]), (lo, below[1]), (un, *shared[1:]), **kwargs)

    def cost(choice) -> float:
        return shared_total(choice, *shared)

    return solve_with, cost


def _factor(v: SharedValue, ins, outs, price, sizes):
    """Value ``v``'s moves as one factor: ``(scope, table)`` over the ops involved."""
    import numpy as np

    scope = sorted({r.op for r in v.readers if r.op >= 0} | ({v.producer} - {-1}))
    axis = {c: n for n, c in enumerate(scope)}
    shape = [sizes[c] for c in scope]

    def along(c: int, arr):
        s = [1] * len(scope)
        s[axis[c]] = len(arr)
        return np.asarray(arr).reshape(s)

    wanted: dict[int, Any] = {}
    for r in v.readers:
        if r.op < 0:
            wanted[r.layout] = True
            continue
        for b in dict.fromkeys(row[r.i] for row in ins[r.op]):
            hit = along(r.op, [row[r.i] == b for row in ins[r.op]])
            old = wanted.get(b, False)
            wanted[b] = hit if old is False else (old if old is True else old | hit)
    table = np.zeros(shape)
    srcs = [v.layout] if v.producer < 0 else [row[v.j] for row in outs[v.producer]]
    for b, hit in wanted.items():
        cost = [0.0 if a == b else v.count * price(a, b) for a in srcs]
        cost = cost[0] if v.producer < 0 else along(v.producer, cost)
        table = table + np.where(hit, cost, 0.0) if hit is not True else table + cost
    return tuple(scope), table


def solve_exact(unary, values, ins, outs, price, *, max_factor: int) -> Solution | None:
    """The exact shared minimum by variable elimination over each value's factor (its
    producer and readers together), or None when a factor would exceed ``max_factor``
    entries or all of them together would."""
    import math

    import numpy as np

    from ._solve import _eliminate, _order, work

    sizes = [len(u) for u in unary]
    scopes = []
    for v in values:
        scope = {r.op for r in v.readers if r.op >= 0} | ({v.producer} - {-1})
        if math.prod(sizes[c] for c in scope) > max_factor:
            return None
        scopes.append(sorted(scope))
    edges = {(a, b) for s in scopes for a in s for b in s if a < b}
    order = _order(len(unary), sizes, edges, max_factor)
    if order is None or work(len(unary), sizes, edges, order) > max_factor:
        return None  # too wide, or too much work in all: the pairwise problems answer
    un = [np.asarray(u, dtype=float) for u in unary]
    factors: dict[tuple[int, ...], Any] = {}
    for v in values:
        scope, table = _factor(v, ins, outs, price, sizes)
        if not scope:
            continue
        if len(scope) == 1:
            un[scope[0]] = un[scope[0]] + table
        else:
            factors[scope] = factors[scope] + table if scope in factors else table
    choice = _eliminate(un, factors, order)
    cost = shared_total(choice, unary, values, ins, outs, price)
    return Solution(choice, cost, cost, "exact")

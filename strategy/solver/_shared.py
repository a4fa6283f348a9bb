"""Shared moves: one move of a value to a layout serves every reader wanting that layout.

Every variable picks one option; a *value* (an argument, or one output of an op) is
read by *readers* (op inputs, and fixed targets such as output and gradient specs), each
in a layout that depends on the reader's option. A value pays, for each distinct layout
its readers want, the price of one move there from the layout its source chose
(:meth:`~._problem.Problem.evaluate`). That is not a sum of pairwise terms, so the
solver works with two pairwise problems around it (:class:`Split`):

* above: every reader pays its own move (what a planner without sharing minimizes);
  any choice costs at least as much there as shared;
* below: reader ``r`` pays ``lam[r, B] * price(A, B)``, where ``lam[r, B]`` is one over
  the number of the value's readers that may want ``B`` (:func:`reader_weights`). The
  readers wanting ``B`` in any choice pay at most one ``price(A, B)`` together, so every
  choice costs at least as much shared as below: the minimum below is a true lower
  bound of the shared minimum.

The choice is the best of the pairwise answers improved by local search on the shared
objective itself (:mod:`._local_search`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from ._eliminate import _eliminate, _order, solve_pairwise, work
from ._local_search import Searcher
from ._problem import Problem, SharedValue
from ._sharing import pairwise_min, tighten
from ._solution import Effort, Method, Options, Solution, Warm, proven

__all__ = ["Split", "reader_weights", "solve_exact", "solve_shared", "split"]


def reader_weights(problem: Problem) -> list[list[dict[int, float]]]:
    """Per value, per reader, per layout the reader may want: one over the number of the
    value's readers that may want that layout.

    >>> from meshplan.strategy.solver import Reader
    >>> v = SharedValue(-1, 0, 0, (Reader(0, 0), Reader(1, 0)))
    >>> p = Problem([[0, 0], [0]], values=[v], ins=[[[0], [1]], [[1]]], outs=[[[], []], [[]]])
    >>> reader_weights(p)
    [[{0: 1.0, 1: 0.5}, {1: 0.5}]]
    """
    out = []
    for v in problem.values:
        wants = [
            {r.layout} if r.fixed else {row[r.i] for row in problem.ins[r.op]} for r in v.readers
        ]
        count: dict[int, int] = {}
        for bs in wants:
            for b in bs:
                count[b] = count.get(b, 0) + 1
        out.append([{b: 1.0 / count[b] for b in sorted(bs)} for bs in wants])
    return out


def _matrix(srcs: Sequence[int], dsts: Sequence[int], price):
    """``price(src, dst)`` for every pair of layouts, each distinct pair priced once."""
    import numpy as np

    us, ud = list(dict.fromkeys(srcs)), list(dict.fromkeys(dsts))
    row = {s: i for i, s in enumerate(us)}
    col = {d: j for j, d in enumerate(ud)}
    small = np.array([[price(s, d) for d in ud] for s in us], dtype=float).reshape(len(us), len(ud))
    return small[np.array([row[s] for s in srcs])][:, np.array([col[d] for d in dsts])]


@attrs.frozen(eq=False)
class Split:
    """The moves of a shared problem as pairwise terms, above and below it (see the module
    docstring): per variable the unary part (moves from fixed sources, to fixed targets)
    and the pair tables, each edge once."""

    above_unary: tuple
    above_pairs: dict
    below_unary: tuple
    below_pairs: dict
    _searchers: dict = attrs.field(init=False, factory=dict, repr=False)

    def searcher(self, problem: Problem) -> Searcher:
        """Local search's price tables for ``problem`` (the one split, at any unary rows:
        the relaxations of a budget's search share them), built once per values and
        price (the split's caller vouches that its pair tables are the problem's)."""
        key = (id(problem.values), id(problem.price))
        found = self._searchers.get(key)
        if found is None or found[0] is not problem.values or found[1] is not problem.price:
            found = self._searchers[key] = (problem.values, problem.price, Searcher(problem))
        return found[2]

    def above(self, unary: Sequence[Any]) -> Problem:
        return Problem(
            [u + d for u, d in zip(unary, self.above_unary, strict=True)], self.above_pairs
        )

    def below(self, unary: Sequence[Any]) -> Problem:
        return Problem(
            [u + d for u, d in zip(unary, self.below_unary, strict=True)], self.below_pairs
        )


def split(problem: Problem) -> Split:
    """The pairwise problems above and below ``problem``'s shared moves (its own pair
    tables join both)."""
    import numpy as np

    ins, outs, price = problem.ins, problem.outs, problem.price
    up = [np.zeros(len(u)) for u in problem.unary]
    lo = [np.zeros(len(u)) for u in problem.unary]
    pairs: dict[tuple[int, int], Any] = dict(problem.pairs)
    pairs_lo: dict[tuple[int, int], Any] = dict(problem.pairs)

    def add(table: dict, a: int, b: int, m) -> None:
        if a > b:
            a, b, m = b, a, m.T
        table[(a, b)] = table[(a, b)] + m if (a, b) in table else m

    for v, lams in zip(problem.values, reader_weights(problem), strict=True):
        srcs = [v.layout] if v.fixed else [row[v.j] for row in outs[v.producer]]
        for r, lam in zip(v.readers, lams, strict=True):
            if v.fixed and r.fixed:
                continue  # a constant: neither problem holds it
            dsts = [r.layout] if r.fixed else [row[r.i] for row in ins[r.op]]
            m = _matrix(srcs, dsts, price) * v.count
            w = np.array([lam[b] for b in dsts])
            if v.fixed:
                up[r.op] += m[0]
                lo[r.op] += m[0] * w
            elif r.fixed:
                up[v.producer] += m[:, 0]
                lo[v.producer] += m[:, 0] * w[0]
            elif v.producer == r.op:  # a tied op reading its own output in the layer before
                up[r.op] += np.diagonal(m)
                lo[r.op] += np.diagonal(m) * w
            else:
                add(pairs, v.producer, r.op, m)
                add(pairs_lo, v.producer, r.op, m * w[None, :])
    return Split(tuple(up), pairs, tuple(lo), pairs_lo)


def _improver(problem: Problem, best: list[float], search: Searcher):
    """Local search (``search``) from a choice that costs at most 10% over the best one
    seen (others rarely end below it), on the shared objective."""

    def improve(x) -> tuple[float, Sequence[int]]:
        c = problem.evaluate(x)
        if c <= best[0] * 1.1:
            x = search(x, problem.unary)
            c = problem.evaluate(x)
        best[0] = min(best[0], c)
        return c, x

    return improve


def solve_shared(
    problem: Problem,
    options: Options | None = None,
    *,
    starts: Sequence[Sequence[int]] = (),
    warm: Warm | None = None,
    moves: Split | None = None,
) -> Solution:
    """The shared minimum: exact by elimination over each value's factor where that is
    narrow enough (:func:`solve_exact`), else the pairwise problems above and below
    (:func:`split`) solved, their answers and ``starts`` improved on the shared objective
    by local search; the bound is the below problem's (its exact minimum, or a bound of
    it), raised and the choice improved by up to ``options.steps`` steps of
    :func:`._sharing.tighten` (``options.draft``: neither, and the cheaper, looser bound of
    below). ``warm``: carried between solves of one program (the readers' shares start
    where the last solve left them). ``moves``: ``split(problem)`` at another problem's
    unary rows, when the caller has it (only ``problem.unary`` is read from ``problem``
    for the pairwise problems then).
    """
    options = Options() if options is None else options
    exact = solve_exact(problem, options.max_factor)
    if exact is not None:
        return exact
    moves = split(problem) if moves is None else moves
    above, below = moves.above(problem.unary), moves.below(problem.unary)
    memo = None if warm is None else warm.messages
    up = solve_pairwise(
        above.unary,
        above.pairs,
        max_factor=options.max_factor,
        starts=starts,
        prove=False,
        memo=None if memo is None else memo.setdefault("above", {}),
    )
    lo = solve_pairwise(
        below.unary,
        below.pairs,
        max_factor=options.max_factor,
        prove=not options.draft,
        memo=None if memo is None else memo.setdefault("below", {}),
    )
    best = None
    search = moves.searcher(problem)  # the price tables, built once per split
    for start in dict.fromkeys([up.choice, lo.choice, *map(tuple, starts)]):
        c = search(start, problem.unary)
        cost = problem.evaluate(c)
        if best is None or cost < best[0]:
            best = (cost, tuple(c))
    cost, choice = best
    bound = min(lo.bound, cost)
    # what bounds the choice: the below problem's minimum, or its bound
    method = Method.RELAXATION if lo.method is Method.EXACT else lo.method
    effort = lo.effort
    lp = None
    if options.lp and not options.draft and not proven(cost, bound, 1e-9):
        from ._transport import solve_lp

        lp = solve_lp(problem, search, [choice, up.choice, lo.choice], warm)
        if lp is not None:
            effort = effort + lp.effort
            if lp.cost < cost:
                cost, choice = lp.cost, tuple(lp.choice)
            if lp.bound > bound:
                bound, method = min(lp.bound, cost), Method.TRANSPORT_LP
    # the LP's bound is at least the sharing dual's (whose shares are a point of its dual)
    if lp is None and options.steps and not options.draft and not proven(cost, bound, 1e-9):
        start_weights = None if warm is None else warm.weights
        t = tighten(
            problem,
            (cost, choice),
            bound,
            pairwise_min=pairwise_min(options.max_factor),
            improve=_improver(problem, [cost], search),
            # from the shares a solve of the same program left: half the steps
            steps=options.steps if start_weights is None else (options.steps + 1) // 2,
            start_weights=start_weights,
        )
        if warm is not None:
            warm.weights = t.weights
        if t.bound > bound:
            method = Method.SHARING_DUAL
        effort = effort + Effort(steps=t.steps)
        cost, choice, bound = t.cost, t.choice, t.bound
    if proven(cost, bound):
        return Solution(choice, cost, bound, Method.EXACT, effort)
    return Solution(choice, cost, bound, method, effort)


def _factor(problem: Problem, v: SharedValue):
    """Value ``v``'s moves as one factor: ``(scope, table)`` over the variables involved."""
    import numpy as np

    ins, outs, price, sizes = problem.ins, problem.outs, problem.price, problem.sizes
    scope = sorted({r.op for r in v.readers if not r.fixed} | ({v.producer} - {-1}))
    axis = {c: n for n, c in enumerate(scope)}
    shape = [sizes[c] for c in scope]

    def along(c: int, arr):
        s = [1] * len(scope)
        s[axis[c]] = len(arr)
        return np.asarray(arr).reshape(s)

    wanted: dict[int, Any] = {}
    for r in v.readers:
        if r.fixed:
            wanted[r.layout] = True
            continue
        for b in dict.fromkeys(row[r.i] for row in ins[r.op]):
            hit = along(r.op, [row[r.i] == b for row in ins[r.op]])
            old = wanted.get(b, False)
            wanted[b] = hit if old is False else (old if old is True else old | hit)
    table = np.zeros(shape)
    srcs = [v.layout] if v.fixed else [row[v.j] for row in outs[v.producer]]
    for b, hit in wanted.items():
        cost = [0.0 if a == b else v.count * price(a, b) for a in srcs]
        cost = cost[0] if v.fixed else along(v.producer, cost)
        table = table + np.where(hit, cost, 0.0) if hit is not True else table + cost
    return tuple(scope), table


def solve_exact(problem: Problem, max_factor: int) -> Solution | None:
    """The exact shared minimum by variable elimination over each value's factor (its
    producer and readers together) and the pair tables, or None when a factor would exceed
    ``max_factor`` entries or all of them together would."""

    sizes = problem.sizes
    scopes = [tuple(k) for k in problem.pairs]
    for v in problem.values:
        scope = {r.op for r in v.readers if not r.fixed} | ({v.producer} - {-1})
        if math.prod(sizes[c] for c in scope) > max_factor:
            return None
        scopes.append(tuple(sorted(scope)))
    edges = {(a, b) for s in scopes for a in s for b in s if a < b}
    order = _order(len(sizes), list(sizes), edges, max_factor)
    if order is None or work(len(sizes), sizes, edges, order) > max_factor:
        return None  # too wide, or too much work in all: the pairwise problems answer
    un = [u.copy() for u in problem.unary]
    factors: dict[tuple[int, ...], Any] = dict(problem.pairs)
    for v in problem.values:
        scope, table = _factor(problem, v)
        if not scope:
            continue
        if len(scope) == 1:
            un[scope[0]] = un[scope[0]] + table
        else:
            factors[scope] = factors[scope] + table if scope in factors else table
    choice = _eliminate(un, factors, order)
    cost = problem.evaluate(choice)
    return Solution(choice, cost, cost, Method.EXACT)

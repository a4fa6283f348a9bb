"""Exact elimination, and bounds where it is too wide, of a pairwise problem (numpy).

A pairwise problem picks one option per node to minimize unary plus pairwise costs.
:func:`solve_pairwise` finds the exact minimum by variable
elimination (dynamic programming over the graph: exact on chains, trees and any graph
whose elimination keeps factors small — residual blocks and attention included) and
returns how it did it. When a factor would exceed ``max_factor`` entries it drops the
cheapest-to-ignore pairwise terms until the rest is a forest, solves that exactly (a
lower bound: dropped costs are never negative), and improves the result by local search
(each node re-chosen given its neighbours until nothing improves); the gap between the
two is reported.

numpy is imported when a problem is solved, not when the module is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._solution import Effort, Method, Solution

__all__ = ["elimination_order", "solve_pairwise", "total", "work"]


def total(
    choice: Sequence[int],
    unary: Sequence[Sequence[float]],
    pairs: dict[tuple[int, int], Sequence[Sequence[float]]],
) -> float:
    """The cost of ``choice`` (one option index per node)."""
    s = sum(unary[v][choice[v]] for v in range(len(unary)))
    for (a, b), m in pairs.items():
        s += m[choice[a]][choice[b]]
    return float(s)


def solve_pairwise(
    unary: Sequence[Sequence[float]],
    pairs: dict[tuple[int, int], Sequence[Sequence[float]]],
    *,
    max_factor: int = 1 << 21,
    starts: Sequence[Sequence[int]] = (),
    prove: bool = True,
    memo: dict | None = None,
) -> Solution:
    """The minimum of ``sum unary[v][x_v] + sum pairs[a, b][x_a][x_b]`` over choices ``x``.

    Exact by elimination where :func:`elimination_order` finds it cheap enough; else the
    best choice found, with a true lower bound (see :func:`_bounded`; ``prove=False`` when only
    the choice matters: the bound is then the cheaper, looser one). ``memo``: working
    memory kept between solves of problems over the same terms (the messages of the last
    one's bound: message passing starts from them, as any messages give a true bound).

    >>> solve_pairwise([[1, 0], [0, 3]], {(0, 1): [[0, 5], [5, 0]]})
    Solution(choice=(0, 0), cost=1.0, bound=1.0, method=<Method.EXACT: 'exact'>)
    """
    import numpy as np

    un = [np.asarray(u, dtype=float) for u in unary]
    pw = {k: np.asarray(m, dtype=float) for k, m in pairs.items()}
    order = elimination_order([len(u) for u in un], pw.keys(), max_factor)
    if order is not None:
        choice = _eliminate(un, pw, order)
        c = total(choice, unary, pairs)
        return Solution(choice, c, c, Method.EXACT)
    return _bounded(un, pw, unary, pairs, starts, prove, memo)


def _bounded(un, pw, unary, pairs, starts, prove: bool = True, memo=None) -> Solution:
    """A problem too wide to eliminate: the best of local searches from the choices the
    bounds read off (and ``starts``), with the better of two true lower bounds: the
    linear-programming relaxation's dual (:mod:`._messages`) and a spanning forest with
    the rest folded into unary minima."""
    from ._messages import lp_bound

    n = len(un)
    kept = _forest(n, pw)
    # a dropped term m[x_a, x_b] is at least u[x_a] + v[x_b] (u its row minima, v the
    # column minima of what is left): kept as unary terms, the forest's minimum stays a
    # lower bound, and a tighter one than dropping the term
    folded = [u.copy() for u in un]
    for (a, b), m in pw.items():
        if (a, b) not in kept:
            u = m.min(axis=1)
            folded[a] = folded[a] + u
            folded[b] = folded[b] + (m - u[:, None]).min(axis=0)
    order = _order(n, [len(u) for u in un], kept.keys(), math.inf)  # a forest: factors of one node
    choice = _eliminate(folded, kept, order)
    bound = float(sum(folded[v][choice[v]] for v in range(n)))
    bound += sum(float(m[choice[a], choice[b]]) for (a, b), m in kept.items())
    best = None
    for start in [choice, *starts]:  # e.g. the op-by-op choice: never worse than it
        c = _local_search(list(start), un, pw)
        cost = total(c, unary, pairs)
        if best is None or cost < best[0]:
            best = (cost, tuple(c))
    start = None if memo is None else memo.get("messages")
    # from an earlier solve's messages, a few batched passes stand in for the
    # sequential ones that start a fresh bound
    passes = 400 if prove else (0 if start is None else 10)
    relaxed = lp_bound(un, pw, target=best[0], max_passes=passes, start=start)
    if memo is not None:
        memo["messages"] = relaxed.messages
    c = _local_search(list(relaxed.choice), un, pw)
    cost = total(c, unary, pairs)
    if cost < best[0]:
        best = (cost, tuple(c))
    bound = max(bound, relaxed.bound)
    effort = Effort(passes=relaxed.passes)
    if best[0] - bound <= 1e-9 * max(abs(best[0]), 1e-300):
        return Solution(best[1], best[0], min(bound, best[0]), Method.EXACT, effort)
    method = Method.MESSAGES if relaxed.bound >= bound else Method.FOREST
    return Solution(best[1], best[0], bound, method, effort)


def elimination_order(sizes: Sequence[int], edges, max_factor: int) -> list[int] | None:
    """An order to eliminate the nodes in, if no factor exceeds ``max_factor`` entries and
    all of them together 4 times that (:func:`work`); else None."""
    n = len(sizes)
    order = _order(n, list(sizes), edges, max_factor)
    if order is None or work(n, sizes, edges, order) > max(max_factor, 1) << 2:
        return None
    return order


def work(n: int, sizes, edges, order) -> int:
    """Entries the elimination along ``order`` computes, summed over its steps."""
    nb = _neighbours(n, edges)
    total_ = 0
    for v in order:
        total_ += sizes[v] * math.prod(sizes[u] for u in nb[v])
        for u in nb[v]:
            nb[u] |= nb[v] - {u}
            nb[u].discard(v)
    return total_


def _neighbours(n: int, edges) -> list[set[int]]:
    nb: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        if a != b:
            nb[a].add(b)
            nb[b].add(a)
    return nb


def _order(n: int, sizes: list[int], edges, max_factor: int) -> list[int] | None:
    """A greedy elimination order (smallest new factor first, ties to the lower vertex);
    None if one grows too big.

    A vertex's factor size changes only when its neighbourhood does, i.e. when a
    neighbour is eliminated, so sizes live in a heap and only the eliminated vertex's
    neighbours are re-pushed (stale entries are skipped): O(fill log n), not a rescan
    of every live vertex per step.
    """
    import heapq

    nb = _neighbours(n, edges)
    size = [math.prod(sizes[u] for u in nb[v]) for v in range(n)]
    heap = [(size[v], v) for v in range(n)]
    heapq.heapify(heap)
    alive = [True] * n
    order = []
    while heap:
        s, best = heapq.heappop(heap)
        if not alive[best] or s != size[best]:
            continue  # eliminated, or a stale size
        if s > max_factor:
            return None
        order.append(best)
        alive[best] = False
        for u in nb[best]:
            nb[u] |= nb[best] - {u}
            nb[u].discard(best)
        for u in nb[best]:
            new = math.prod(sizes[w] for w in nb[u])
            if new != size[u]:
                size[u] = new
                heapq.heappush(heap, (new, u))
    return order


def _eliminate(un, pw, order: list[int]) -> tuple[int, ...]:
    import numpy as np

    factors: list[tuple[tuple[int, ...], np.ndarray]] = [((v,), u) for v, u in enumerate(un)]
    for scope, m in pw.items():  # pairs, or factors over any number of nodes
        factors.append((tuple(scope), m))
    trail = []
    for v in order:
        mine = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        scope = sorted({u for vs, _ in mine for u in vs})
        joined = np.zeros([un[u].shape[0] for u in scope])
        for vs, arr in mine:
            joined = joined + _align(vs, arr, scope)
        axis = scope.index(v)
        rest = tuple(u for u in scope if u != v)
        trail.append((v, rest, np.argmin(joined, axis=axis)))
        factors.append((rest, np.min(joined, axis=axis)))
    choice = [0] * len(un)
    for v, rest, arg in reversed(trail):
        choice[v] = int(arg[tuple(choice[u] for u in rest)]) if rest else int(arg)
    return tuple(choice)


def _align(vs: tuple[int, ...], arr, scope: list[int]):
    """``arr`` over ``vs`` as an array broadcastable over ``scope`` (sorted)."""
    perm = sorted(range(len(vs)), key=lambda i: vs[i])
    a = arr.transpose(perm) if len(vs) > 1 else arr
    ordered = [vs[i] for i in perm]
    shape = [a.shape[ordered.index(u)] if u in ordered else 1 for u in scope]
    return a.reshape(shape)


def _residual(m) -> float:
    """What a term loses when replaced by its row and column minima (see ``solve``)."""
    u = m.min(axis=1)
    v = (m - u[:, None]).min(axis=0)
    return float((m - u[:, None] - v[None, :]).max())


def _forest(n: int, pw: dict) -> dict:
    """A maximum spanning forest of the pairwise terms, weighted by what each loses when
    folded into row and column minima."""
    weight = {k: _residual(m) for k, m in pw.items()}
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    kept = {}
    for k in sorted(pw, key=lambda k: (-weight[k], k)):
        a, b = find(k[0]), find(k[1])
        if a != b:
            parent[a] = b
            kept[k] = pw[k]
    return kept


def _local_search(choice: list[int], un, pw, rounds: int = 50) -> list[int]:
    import numpy as np

    by_node: dict[int, list[tuple[tuple[int, int], np.ndarray]]] = {}
    for k, m in pw.items():
        by_node.setdefault(k[0], []).append((k, m))
        by_node.setdefault(k[1], []).append((k, m))
    for _ in range(rounds):
        changed = False
        for v in range(len(un)):
            local = un[v].copy()
            for (a, b), m in by_node.get(v, ()):
                local = local + (m[:, choice[b]] if a == v else m[choice[a], :])
            best = int(np.argmin(local))
            if local[best] < local[choice[v]] - 1e-18:
                choice[v] = best
                changed = True
        if not changed:
            break
    return choice

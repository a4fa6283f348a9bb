"""A lower bound of a pairwise min-sum problem by message passing (no torch; numpy when used).

The problem: choose ``x_v`` per node to minimize ``sum_v u_v(x_v) + sum_ab P_ab(x_a, x_b)``.
Its linear-programming relaxation (over local marginals) has a dual whose every value is
a true lower bound of the minimum: with a message ``d_ab`` from each term to each of its
two nodes,

    L(d) = sum_v min_x (u_v(x) + sum_b d_vb(x)) + sum_ab min_xy (P_ab(x, y) - d_ab(x) - d_ba(y))

for *any* ``d`` (each labelling's cost splits into those parts, each at least its
minimum). :func:`lp_bound` raises ``L`` by block coordinate ascent over the terms (one term
at a time, both of its messages set to the best split of the term between its nodes: the
MPLP update), which never lowers it, until it stops rising. On the problems whole
programs give, the relaxation is often tight: the bound then meets the cost of the
choice read off the messages, and that choice is proven a minimum.

The choice is read off node by node, each node taking its best option given the nodes
already read (their actual pairwise costs) and the messages of those not yet read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["Relaxation", "lp_bound"]


@attrs.frozen
class Relaxation:
    """What message passing found: a true lower ``bound``, the ``choice`` read off the
    messages, the number of passes over the terms it took, and the ``messages`` (to start
    a nearby problem from: see :func:`lp_bound`)."""

    bound: float
    choice: tuple[int, ...]
    passes: int
    messages: dict = attrs.field(eq=False, repr=False, factory=dict)


def lp_bound(
    unary: Sequence[Any],
    pairs: dict[tuple[int, int], Any],
    *,
    sequential: int = 20,
    max_passes: int = 400,
    tol: float = 1e-8,
    target: float | None = None,
    start: dict | None = None,
) -> Relaxation:
    """The dual bound of the pairwise problem: ``sequential`` passes of
    :func:`_sequential` to start, then term-by-term ascent until the bound gains less
    than ``tol`` (relative) over ten passes, meets ``target`` (a known cost: nothing to
    prove beyond it) or ``max_passes`` passes ran (0: the start's bound and choice).
    ``start``: the ``messages`` of an earlier call on a problem over the same terms (the
    ascent starts from them instead; any messages give a true bound).

    >>> r = lp_bound([[0.0, 1.0], [1.0, 0.0]], {(0, 1): [[0.0, 3.0], [3.0, 0.0]]})
    >>> round(r.bound, 9), r.choice
    (1.0, (0, 0))
    """
    import numpy as np

    un = [np.asarray(u, dtype=float) for u in unary]
    terms = _terms(un, pairs)
    scale = max([1e-300] + [float(np.abs(u).max()) for u in un if u.size])
    scale = max([scale] + [float(np.abs(m).max()) for m in terms.values()])
    un = [u / scale for u in un]
    terms = {k: m / scale for k, m in terms.items()}
    edges = list(terms)
    if start is not None and all(
        k in start
        and (a, b) in start
        and len(start[k]) == len(un[b])
        and len(start[(a, b)]) == len(un[a])
        for a, b in terms
        for k in [(b, a)]
    ):
        msg = {}
        for a, b in edges:
            msg[(a, b)] = np.asarray(start[(a, b)], dtype=float) / scale
            msg[(b, a)] = np.asarray(start[(b, a)], dtype=float) / scale
    else:
        msg = _sequential(un, terms, sequential)
    batches = _Batches(un, terms, msg)
    goal = None if target is None else target / scale
    last = -np.inf
    passes = 0
    while passes < max_passes:
        for _ in range(10):
            passes += 1
            batches.ascend()
        bound = batches.dual()
        if goal is not None and bound >= goal - 1e-12 * abs(goal):
            break
        if bound - last <= tol * max(abs(bound), 1e-30):
            break
        last = bound
    bound = batches.dual()
    msg, belief = batches.messages(), batches.beliefs()
    choice = _read_off(un, terms, msg, belief)
    messages = {k: m * scale for k, m in msg.items()}
    return Relaxation(float(bound * scale), choice, passes, messages)


class _Batches:
    """The terms in batches of one shape with no node twice in a batch, updated a batch
    at a time (the updates within a batch touch different nodes, so together they are
    the term-by-term ascent, in numpy calls per batch rather than per term). Beliefs are
    rows of one table, padded with infinity past each node's options."""

    def __init__(self, un, terms: dict, msg: dict) -> None:
        import numpy as np

        self.sizes = [len(u) for u in un]
        width = max(self.sizes, default=1)
        self.belief = np.full((len(un), width), np.inf)
        for v, u in enumerate(un):
            self.belief[v, : len(u)] = u
        groups: dict[tuple[int, int], list[tuple[list, list, set]]] = {}
        for (a, b), m in terms.items():
            for batch in groups.setdefault(m.shape, []):
                if a not in batch[2] and b not in batch[2]:
                    left, right, seen = batch
                    break
            else:
                left, right, seen = [], [], set()
                groups[m.shape].append((left, right, seen))
            left.append(a)
            right.append(b)
            seen.update((a, b))
        self.batches = []
        for (sa, sb), bs in groups.items():
            for left, right, _ in bs:
                ia, ib = np.array(left), np.array(right)
                m = np.stack([terms[(a, b)] for a, b in zip(left, right, strict=True)])
                ma = np.stack([msg[(a, b)] for a, b in zip(left, right, strict=True)])
                mb = np.stack([msg[(b, a)] for a, b in zip(left, right, strict=True)])
                self.belief[ia, :sa] += ma
                self.belief[ib, :sb] += mb
                self.batches.append((ia, ib, sa, sb, m, ma, mb))

    def ascend(self) -> None:
        bel = self.belief
        for ia, ib, sa, sb, m, ma, mb in self.batches:
            rest_a = bel[ia, :sa] - ma
            rest_b = bel[ib, :sb] - mb
            new_a = 0.5 * ((m + rest_b[:, None, :]).min(axis=2) - rest_a)
            new_b = 0.5 * ((m + rest_a[:, :, None]).min(axis=1) - rest_b)
            bel[ia, :sa] = rest_a + new_a
            bel[ib, :sb] = rest_b + new_b
            ma[...] = new_a
            mb[...] = new_b

    def dual(self) -> float:
        s = float(self.belief.min(axis=1).sum())
        for _, _, _, _, m, ma, mb in self.batches:
            s += float((m - ma[:, :, None] - mb[:, None, :]).min(axis=(1, 2)).sum())
        return s

    def messages(self) -> dict:
        out = {}
        for ia, ib, _, _, _, ma, mb in self.batches:
            for k, (a, b) in enumerate(zip(ia.tolist(), ib.tolist(), strict=True)):
                out[(a, b)] = ma[k].copy()
                out[(b, a)] = mb[k].copy()
        return out

    def beliefs(self) -> list:
        return [self.belief[v, :s].copy() for v, s in enumerate(self.sizes)]


def _sequential(un, terms, passes: int) -> dict:
    """Messages from sequential tree-reweighted passes (nodes in order, then back, each
    sending to the nodes ahead a weighted share of its belief): they carry news along
    the whole graph in one pass, where term-by-term updates move it one term a pass,
    so the term-by-term ascent that follows starts near its end. Returned in that
    ascent's form: ``msg[(a, b)]`` is what term ``ab`` moved into node ``a``."""
    import numpy as np

    n = len(un)
    ahead: list[list[int]] = [[] for _ in range(n)]
    behind: list[list[int]] = [[] for _ in range(n)]
    for a, b in terms:
        ahead[a].append(b)
        behind[b].append(a)
    share = [1.0 / max(len(behind[v]), len(ahead[v]), 1) for v in range(n)]
    into: dict[tuple[int, int], Any] = {}  # into[(a, b)]: message from a into b
    for a, b in terms:
        into[(a, b)] = np.zeros(len(un[b]))
        into[(b, a)] = np.zeros(len(un[a]))
    belief = [u.copy() for u in un]

    def send(v: int, w: int) -> None:
        m = terms[(v, w)] if v < w else terms[(w, v)].T
        new = ((share[v] * belief[v] - into[(w, v)])[:, None] + m).min(axis=0)
        new = new - new.min()
        belief[w] = belief[w] + new - into[(v, w)]
        into[(v, w)] = new

    for _ in range(passes):
        for v in range(n):
            for w in ahead[v]:
                send(v, w)
        for v in reversed(range(n)):
            for w in behind[v]:
                send(v, w)
    return {(a, b): into[(b, a)] for a, b in into}


def _terms(un, pairs) -> dict[tuple[int, int], Any]:
    """The pairwise terms keyed ``(a, b)`` with ``a < b``, (b, a) terms folded in, a
    term over one node folded into its unary row."""
    import numpy as np

    out: dict[tuple[int, int], Any] = {}
    for (a, b), m in pairs.items():
        m = np.asarray(m, dtype=float)
        if a == b:
            un[a] = un[a] + np.diagonal(m)
            continue
        if a > b:
            a, b, m = b, a, m.T
        out[(a, b)] = out[(a, b)] + m if (a, b) in out else m
    return out


def _read_off(un, terms, msg, belief) -> tuple[int, ...]:
    """A choice from the messages: nodes in order, each given the ones already chosen."""
    import numpy as np

    n = len(un)
    near: list[list[tuple[int, Any, bool]]] = [[] for _ in range(n)]
    for (a, b), m in terms.items():
        near[a].append((b, m, True))
        near[b].append((a, m, False))
    choice = [-1] * n
    for v in range(n):
        score = belief[v].copy()
        for w, m, first in near[v]:
            if choice[w] >= 0:  # chosen: its real cost replaces the term's message
                score = score - msg[(v, w)] + (m[:, choice[w]] if first else m[choice[w], :])
        choice[v] = int(np.argmin(score))
    return tuple(choice)

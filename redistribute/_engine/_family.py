"""Plans shared by every tensor size of a family of search contexts (no torch).

When every tensor dim's length is a positive multiple of its *step*
(``_exact.even_steps``: the product of the mesh's active dim sizes, times the least
common multiple of the split factors of its StridedShards, if any), every shard order of
the placement universe chunks it evenly: each state's padded local size is exactly
``T / split`` (``T``: the tensor's bytes, ``split``: the product of the mesh dims sharding
it), so every transition's price is ``(a + b * T) * tie``, linear in ``T``; and every
piece is the piece at the step with its indices scaled, so every exact check on index
intervals (tiny dims, StridedShards) answers alike and every size has the same
transitions. The contexts of one mesh, tensor rank, cost model, placement
universe and merging (objective "time", no memory bound) then differ only in ``T``: a
*family*.

A plan's price is then a line in ``T`` too, and the cheapest price over all plans, their
lower envelope, is concave. So when one plan is the cheapest at two sizes ``T1 < T2`` of
a family, it is the cheapest at every size between them (on ``[T1, T2]`` the envelope
lies above the chord between those two points, which is that plan's own line), and the
only one (another plan touching that line inside the interval would equal it on the
whole of it, tying at ``T1``, where the cheapest plan is unique): exactly what a search
at ``T`` would return. Per family and pair of states, the sizes planned so far and their
plans are kept sorted; a size between two with the same plan takes it without a search.
When a pair planned at a few sizes is asked at a size beyond those, it is planned at the
family's smallest or largest size too (:func:`extremes`), so that a program that plans
the same few pairs for tensors of many shapes, in any order, searches a handful.
"""

from __future__ import annotations

import bisect
import math
from typing import NamedTuple

from ._encoding import Edge
from ._exact import even_steps
from ._price import permute_price, price_coefficients, step_price, tie

__all__ = ["family_of", "Families", "Leg", "LARGEST", "SIZES_FIRST"]

_KEPT = 20000  # pairs kept over all families before the store starts over
_PER_PAIR = 256  # sizes kept per pair (only where its plan changes, and the ends)


def family_of(problem):
    """The family of a search context's problem, or None when its prices are not all
    linear in the tensor's bytes (see the module doc)."""
    p = problem
    if p.objective != "time" or p.bound is not None:
        return None
    for length, step in zip(p.shape, even_steps(p.mesh.shape, len(p.shape), p.shards), strict=True):
        if length <= 0 or length % step:
            return None
    return (p.mesh, len(p.shape), p.model, p.shards, p.ptargets, bool(p.merge))


LARGEST = 40
"""The largest size of a family planned is its smallest times ``2**LARGEST`` (a petabyte
for a 2-D float32 tensor on 16 ranks): beyond any tensor a program shards."""


SIZES_FIRST = 2
"""Sizes a pair is planned at before :func:`extremes` plans it at its family's smallest
and largest sizes too (a rent-or-buy rule: a pair planned at two sizes is likely to be
planned at more; each extreme costs a search)."""


class Leg(NamedTuple):
    """A step of a plan kept for a family's other sizes: its states and its move."""

    src: tuple
    dst: tuple
    dims: tuple[int, ...]
    collective: str | None
    n_send: int
    scaled: bool
    touch: tuple | None


def _split(codes: tuple, sizes: tuple) -> int:
    n = 1
    for c, size in zip(codes, sizes, strict=True):
        if type(c) is tuple:
            n *= size
    return n


class Families:
    """A planner's plans shared across the sizes of families: per family and pair of
    states, the sizes planned so far (sorted) and their plans; ``lock``: the planner's."""

    def __init__(self, lock) -> None:
        self.lock = lock
        self._pairs: dict = {}  # family -> {(start state, goal state): ((T, ...), (path, ...))}
        self._count = 0  # pairs kept, over every family

    def shared(self, fam, t: int, start_state, goal_state):
        """The cheapest plan from ``start_state`` to ``goal_state`` at size ``t`` (bytes) of
        family ``fam`` when sizes planned before bracket ``t`` with one plan (else None), as
        ``[(state, edge, next state)]`` (the edges' targets None): priced as a search
        context of that size prices them, without making one (at a size of a family a
        state's local bytes are ``t / split``)."""
        # read without the lock: an entry is replaced whole, never changed (``record``)
        pairs = self._pairs.get(fam)
        if pairs is None:
            return None
        entry = pairs.get((start_state, goal_state))
        if entry is None:
            return None
        sizes, paths = entry
        k = bisect.bisect_left(sizes, t)
        # this very size, or two sizes around it with one plan
        if k == len(sizes) or (sizes[k] != t and (k == 0 or paths[k - 1] != paths[k])):
            return None
        path = paths[k]
        mesh, model = fam[0], fam[2]
        sizes = mesh.shape
        copy = 1.0 / model.profile.copy_bytes_per_s
        out = []
        for a, b, dims, collective, n_send, scaled, touch in path:
            b_in, b_out = t // _split(a[0], sizes), t // _split(b[0], sizes)
            c = price_coefficients(model, mesh, dims, collective, n_send)
            if collective == "all_permute":
                c = permute_price(c, b_in, b_out, a, b)
            else:
                c = step_price(c, b_in, b_out, scaled, copy) * tie(a, b)
            out.append((a, Edge(c, None, dims, collective, n_send, scaled, touch), b))
        return out

    def record(self, fam, ctx, start_state, goal_state, found) -> None:
        """Keep the cheapest plan ``found`` (as the search returns it) on ``ctx``, a context
        of family ``fam``, for the family's other sizes."""
        states = ctx.states
        path = tuple(
            Leg(states[i], states[j], e.dims, e.collective, e.n_send, e.scaled, e.touch)
            for i, e, j in found[1]
        )
        t = ctx.total_bytes
        with self.lock:
            if self._count >= _KEPT:
                self._pairs.clear()
                self._count = 0
            pairs = self._pairs.setdefault(fam, {})
            entry = pairs.get((start_state, goal_state))
            if entry is None:
                pairs[(start_state, goal_state)] = ((t,), (path,))
                self._count += 1
                return
            sizes, paths = list(entry[0]), list(entry[1])
            k = bisect.bisect_left(sizes, t)
            if (k < len(sizes) and sizes[k] == t) or len(sizes) >= _PER_PAIR:
                return
            sizes.insert(k, t)
            paths.insert(k, path)
            # a size between two with its own plan adds nothing: drop it
            for x in (k + 1, k, k - 1):
                if 0 < x < len(sizes) - 1 and paths[x - 1] == paths[x] == paths[x + 1]:
                    del sizes[x], paths[x]
            pairs[(start_state, goal_state)] = (tuple(sizes), tuple(paths))

    def extremes(self, fam, ctx, start_state, goal_state) -> list[tuple[int, ...]]:
        """Shapes of family ``fam`` (its smallest, its largest; ``ctx``: a context of it) at
        which to plan the pair too, so that sizes planned bracket ``ctx``'s: when the pair was
        planned at :data:`SIZES_FIRST` sizes already (a program that plans it at many), and
        ``ctx``'s lies beyond those."""
        if not ctx.ndim:
            return []  # a 0-D tensor's sizes are its dtypes': a few, each planned once
        smallest = even_steps(ctx.sizes, ctx.ndim, ctx.shards)
        largest = (smallest[0] << LARGEST,) + smallest[1:]
        with self.lock:
            entry = self._pairs.get(fam, {}).get((start_state, goal_state))
            if entry is None or len(entry[0]) < SIZES_FIRST:
                return []
            low, high = entry[0][0], entry[0][-1]
        t = ctx.total_bytes
        item = ctx.itemsize
        out = []
        if t > high and high < item * math.prod(largest):
            out.append(largest)
        if t < low and low > item * math.prod(smallest):
            out.append(smallest)
        return out

    def clear(self) -> None:
        with self.lock:
            self._pairs.clear()
            self._count = 0

"""The least bandwidth weight of gathers or reduce-scatters run one after another (no torch).

Dims to gather run one at a time, each on a tensor the dims gathered before it have grown;
Partial dims to reduce-scatter likewise, counted from the last. An item is
``(weight, size, tensor dim, order position)``: the item's bandwidth weight, its mesh
dim's size, the tensor dim it shards (-1: a tiny dim or a detour, which keeps no order)
and its position in that dim's shard order. The bound (``_dim_bound``) takes the
cheapest order, and the cheapest that keeps each tensor dim's shard order.
"""

from __future__ import annotations

import functools
import math

__all__ = ["sequence_weights"]


@functools.lru_cache(maxsize=65536)
def sequence_weights(gathers, scatters, more) -> tuple[float, float]:
    """The least bandwidth weight of the gather sequence (``gathers`` and the detour
    dims ``more``) and the reduce-scatter sequence (``scatters``, counted from the
    last), in any order and in one that keeps the shard orders (:func:`_orders`). A pure
    function of its items, so one memo serves every context (a mesh's tensor shapes)."""
    free = kept = 0.0
    if gathers is not None or more:
        f, k = _orders(gathers + more if gathers is not None else more)
        free += f
        kept += k
    if scatters is not None:
        f, k = _orders(scatters)
        free += f
        kept += k
    return free, kept


def _orders(items: tuple) -> tuple[float, float]:
    """The least bandwidth weight of a sequence of gathers (or reduce-scatters counted
    from the last) ``items`` = ``(weight, size, tensor dim, order position)``: in any
    order, and in an order that keeps each tensor dim's shard order (a higher position
    first; tensor dim -1: free). The k-th item's weight is multiplied by the sizes of
    the items before it."""
    # the cheapest order takes the slowest links first (by weight / (n-1), an exchange
    # argument)
    best = sorted(items, key=_by_link, reverse=True)
    free = _weight(best)
    if _keeps(best):
        return free, free
    return free, _kept_weight(items)


def _kept_weight(items: tuple) -> float:
    """The least weight (:func:`_weight`) of an order of ``items`` that keeps each tensor
    dim's shard order: over the sets of items taken first, as the product of their sizes
    multiplies the next one's weight whatever order they came in (each set keeps its
    least weight; rounding is monotone, so the result is an order's own weight)."""
    k = len(items)
    # the items each one must follow: its tensor dim's at higher order positions
    after = [
        sum(1 << j for j, y in enumerate(items) if y[2] == x[2] >= 0 and y[3] > x[3]) for x in items
    ]
    best: dict = {0: (0.0, 1)}  # a set (bit mask) -> (least weight, product of sizes)
    for mask in range(1 << k):  # (every set before the sets holding it)
        v = best.get(mask)
        if v is None:
            continue
        w, prefix = v
        for x in range(k):
            if mask >> x & 1 or after[x] & ~mask:
                continue
            nxt = mask | 1 << x
            nw = w + items[x][0] * prefix
            old = best.get(nxt)
            if old is None or nw < old[0]:
                best[nxt] = (nw, prefix * items[x][1])
    return best[(1 << k) - 1][0]


def _weight(order) -> float:
    """The weight of a sequence of ``_orders`` items taken in ``order``."""
    prefix = 1
    total = 0.0
    for dw, n, _, _ in order:
        total += dw * prefix
        prefix *= n
    return total


def _by_link(item) -> float:
    return item[0] / (item[1] - 1)


def _keeps(order) -> bool:
    """Whether ``order`` (:func:`_orders` items) takes each tensor dim's items from
    the highest order position down."""
    last: dict = {}
    for _, _, d, pos in order:
        if d >= 0:
            if last.get(d, math.inf) < pos:
                return False
            last[d] = pos
    return True

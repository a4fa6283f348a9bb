"""Lower bounds of plans that take a general all_permute (no torch).

A plan through a general permute (``_general``) may skip the gathers and slices the
per-mesh-dim bound (``_dim_bound``) counts, so :func:`general_bound` bounds every plan
taking one: its launch and latency, the reductions and local steps no permute does, and
the largest of three floors of the bytes received (what the gathers and the permute
move, what the neediest rank lacks, what must cross one mesh dim). The search takes the
least of the two bounds (``_bounds.Bounds.heuristic``). Each function reads a
:class:`~._bounds.Bounds` ``b`` (its constants and memo tables).
"""

from __future__ import annotations

import itertools
import math

from ._bound_parts import first_rank_missing, interval_length, interval_overlap
from ._encoding import SUMAVG, R, is_partial, is_wildcard
from ._exact import piece

__all__ = [
    "general_bound",
    "general_kept_bound",
    "crossing_floor",
    "cut_floor",
    "most_missing",
    "permute_bytes_floor",
]


def _is_partial(code) -> bool:
    return type(code) is int and code != R


def _needs(b, codes, goal_codes) -> tuple[int, float, int]:
    """What no permute does on the way from ``codes`` to ``goal_codes``: the mesh dims to
    reduce, their reductions' latency, and the local steps (a dim made Partial, or its
    Partial op changed)."""
    n_red = local = 0
    lat = 0.0
    for m in b.active:
        a, gb = codes[m], goal_codes[m]
        goal_partial = is_partial(gb)
        if _is_partial(a):
            if goal_partial and gb == a:
                continue
            if goal_partial and a in SUMAVG and gb in SUMAVG:
                local += 1
                continue
            n_red += 1
            lat += b.reduce_alpha[m]
            if goal_partial:
                local += 1
        elif goal_partial:
            local += 1
    return n_red, lat, local


def _split(b, codes, goal: bool) -> int:
    """The product of the sizes of the mesh dims sharding or Partial in ``codes`` (of a
    ``goal``: those where its pattern allows any placement but Partial too)."""
    n = 1
    for m in b.active:
        c = codes[m]
        if type(c) is tuple or c > R or (goal and c < R):
            n *= b.sizes[m]
    return n


def _gathers(b, codes, goal_codes) -> tuple[int, float]:
    """How many gathering collectives a plan from ``codes`` to ``goal_codes`` needs at
    least, and the seconds their received bytes take at least. Only an all_gather or an
    all_reduce lowers the product of the sizes of the mesh dims sharding or Partial: by
    its group's size at most (one dim, or an alias's); permutes, all_to_alls, a shard
    turned Partial and reduce-scatters keep it, slices raise it. Lowering it from
    ``split`` to ``goal`` receives at least ``T / goal - T / split`` bytes however the
    factor is taken (the received bytes telescope: a step's input is at least ``T``
    over the product before it), at the fastest link at best."""
    split, goal = _split(b, codes, False), _split(b, goal_codes, True)
    if split <= goal:
        return 0, 0.0
    widest = b.widest_group
    count = 1
    reach = widest
    while reach * goal < split:
        count += 1
        reach *= widest
    return count, (b.total_bytes / goal - b.total_bytes / split) / b.fastest


def general_kept_bound(b, state: int, goal: int) -> float:
    """A lower bound of every plan from ``state`` (id) to ``goal`` that takes a general
    permute, from its launches and latencies, reductions, gathers and local steps alone
    (those of any state a permute out of ``state`` leads to as well: a permute keeps
    Partial dims and the split). An all_reduce may be a reduction and a gather at once."""
    codes, goal_codes = b.states[state][0], b.states[goal][0]
    n_red, lat, local = _needs(b, codes, goal_codes)
    n_gather, _ = _gathers(b, codes, goal_codes)
    collectives = max(-(-n_red // b.widest), n_gather)
    hops = 1 + max(0, n_gather - n_red)
    return (
        (1 + collectives) * (b.launch + b.per_collective)
        + hops * b.latency_floor
        + lat
        + local * b.local_launch
    )


def general_bound(b, state: int, goal: int, cap: float = math.inf) -> float:
    """:func:`general_kept_bound` plus the largest of three floors of the bytes received:
    what the gathers receive and the permute itself (:func:`permute_bytes_floor`), what
    the neediest rank lacks (when the goal has no Partial dim), each at the least price
    the model charges a received byte, and what must cross one mesh dim
    (:func:`crossing_floor`). Cheapest floors first: once the bound reaches ``cap`` it is
    returned as it stands (the caller takes the least of it and ``cap``)."""
    h = general_kept_bound(b, state, goal)
    codes, goal_codes = b.states[state][0], b.states[goal][0]
    _, bw = _gathers(b, codes, goal_codes)
    bw += permute_bytes_floor(b)  # (the permute is no gather: its bytes come on top)
    if h + bw >= cap:
        return h + bw
    if not any(is_partial(gb) for gb in goal_codes):
        reduce = any(_is_partial(codes[m]) and goal_codes[m] != codes[m] for m in b.active)
        missing = most_missing(b, state, goal, reduce) * b.itemsize * b.missing_rate
        if missing > bw:
            bw = missing
            if h + bw >= cap:
                return h + bw
    across = crossing_floor(b, state, goal)
    if across > bw:
        bw = across
    return h + bw


def crossing_floor(b, state: int, goal: int) -> float:
    """:func:`cut_floor` where it holds: a goal without Partial dims (a reduction due when
    the state has Partial dims the goal does not keep), or a state without any."""
    codes, goal_codes = b.states[state][0], b.states[goal][0]
    if not any(is_partial(gb) for gb in goal_codes):
        reduce = any(_is_partial(codes[m]) and goal_codes[m] != codes[m] for m in b.active)
        return cut_floor(b, state, goal, reduce)
    if not any(_is_partial(codes[m]) for m in b.active):
        return cut_floor(b, state, goal, False)
    return 0.0


def permute_bytes_floor(b) -> float:
    """The least byte part of any general permute's price in the context: every state's
    local tensor holds at least ``T / n`` bytes (``n`` the ranks of the active dims), in
    and out, at the least byte coefficients of an all_permute over any group of them."""
    floor = b.permute_bytes
    if floor is None:
        active = b.active
        sizes = b.sizes
        least = math.inf
        for k in range(1, len(active) + 1):
            for dims in itertools.combinations(active, k):
                for j in range(len(dims) + 1):
                    for senders in itertools.combinations(dims, j):
                        n_send = math.prod(sizes[m] for m in senders)
                        c = b.coefs(dims, "all_permute", n_send)
                        least = min(least, c.per_in + c.per_out)
        n = math.prod(sizes[m] for m in active)
        floor = b.permute_bytes = least * b.total_bytes / n if least < math.inf else 0.0
    return floor


def cut_floor(b, state: int, goal: int, reduce: bool) -> float:
    """Seconds a plan from ``state`` to ``goal`` (ids) spends at least on the bytes that
    must cross one mesh dim: for a dim ``m``, what a rank needs and no rank of its
    coordinate on ``m`` holds (with a reduction due, all it needs, for each Partial dim
    to reduce) comes to it only through collectives whose group spans ``m``, each
    charging a received byte at least ``(k-1)/k`` of one on the fastest link of any
    group spanning ``m``. The most over the dims and the ranks (of the active dims, up to
    ``_MAX_RANKS``; past that, none). A bound of every plan.

    A goal with Partial dims (from a state without any) asks the ranks that differ only
    on them for one sum together: what it lacks comes to them across ``m`` (not one of
    them), to one of them at least its share."""
    key = (state, goal, reduce)
    memo = b.cut_memo
    out = memo.get(key)
    if out is not None:
        return out
    a, gb = b.states[state], b.states[goal]
    active = b.active
    ranks = _ranks(b)
    if ranks is None or not all(type(c) is tuple for c in a[1] + gb[1]):
        memo[key] = 0.0
        return 0.0
    if any(is_wildcard(c) for c in a[0] + gb[0]):
        memo[key] = 0.0  # (a pattern)
        return 0.0
    summed = [m for m in active if _is_partial(gb[0][m])]
    share = math.prod(b.sizes[m] for m in summed)
    need = _need(b, gb)
    out = 0.0
    for m in active:
        if m in summed:
            continue
        if reduce:
            if not _is_partial(a[0][m]) or a[0][m] == gb[0][m]:
                continue
            lack = max(need)
        else:
            d = next((d for d, chain in enumerate(a[1]) if m in chain), None)
            if d is None:
                continue  # every rank of its coordinate on m together holds the tensor
            lack_d = _lack(b, d, a, gb, m)
            need_d = _need_dim(b, d, gb)
            lack = 0
            for r, n in enumerate(need):
                if lack_d[r]:
                    x = n // need_d[r] * lack_d[r]
                    if x > lack:
                        lack = x
        t = lack / share * b.itemsize * b.missing_rate * b.fastest / _fastest_across(b, m)
        if t > out:
            out = t
    memo[key] = out
    return out


def _ranks(b):
    """The coordinates of every rank on the active dims (None past ``_MAX_RANKS``)."""
    rs = b.cut_memo.get("ranks", False)
    if rs is False:
        sizes = [b.sizes[m] for m in b.active]
        rs = None
        if math.prod(sizes) <= _MAX_RANKS:
            rs = tuple(itertools.product(*(range(n) for n in sizes)))
        b.cut_memo["ranks"] = rs
    return rs


def _links(b, codes, chain) -> tuple:
    return tuple((b.sizes[m], codes[m][1]) for m in chain)


def _need_dim(b, d: int, gb) -> tuple:
    """Per rank, the length of its piece of tensor dim ``d`` in state ``gb``."""
    chain = gb[1][d]
    links = _links(b, gb[0], chain)
    key = ("need", d, chain, links)
    out = b.cut_memo.get(key)
    if out is None:
        n = b.shape[d]
        out = b.cut_memo[key] = _per_rank(b, chain, lambda c: interval_length(piece(n, links, c)))
    return out


def _projection(b, dims: tuple) -> tuple:
    """Per rank (of the active dims), its coordinates on ``dims``."""
    key = ("projection", dims)
    out = b.cut_memo.get(key)
    if out is None:
        where = {m: k for k, m in enumerate(b.active)}
        at = [where[m] for m in dims]
        out = b.cut_memo[key] = tuple(tuple([c[k] for k in at]) for c in _ranks(b))
    return out


def _per_rank(b, dims: tuple, value) -> tuple:
    """``value(coordinates on dims)`` per rank, computed once per distinct coordinates
    (what a rank holds of a tensor dim depends only on its coordinates on the dims of
    that dim's orders)."""
    seen: dict = {}
    out = []
    for c in _projection(b, dims):
        v = seen.get(c)
        if v is None:
            v = seen[c] = value(c)
        out.append(v)
    return tuple(out)


def _need(b, gb) -> tuple:
    """Per rank, the elements it holds in state ``gb``."""
    key = ("needall", gb[1], tuple(_links(b, gb[0], c) for c in gb[1]))
    out = b.cut_memo.get(key)
    if out is None:
        per = [_need_dim(b, d, gb) for d in range(len(gb[1]))]
        out = b.cut_memo[key] = (
            tuple(math.prod(x) for x in zip(*per, strict=True)) if per else (1,) * len(_ranks(b))
        )
    return out


def _held_dim(b, d: int, a, gb) -> tuple:
    """Per rank, the indices of tensor dim ``d`` its piece holds in both ``a`` and ``gb``."""
    x, y = a[1][d], gb[1][d]
    lx, ly = _links(b, a[0], x), _links(b, gb[0], y)
    key = ("held", d, x, lx, y, ly)
    out = b.cut_memo.get(key)
    if out is None:
        n = b.shape[d]
        nx = len(x)
        out = b.cut_memo[key] = _per_rank(
            b,
            x + y,
            lambda c: interval_overlap(piece(n, lx, c[:nx]), piece(n, ly, c[nx:])),
        )
    return out


def _lack(b, d: int, a, gb, m: int) -> tuple:
    """Per rank, the indices of tensor dim ``d`` its piece in ``gb`` has and no rank of its
    coordinate on ``m`` (a mesh dim of ``a``'s order of ``d``) holds in ``a``."""
    x, y = a[1][d], gb[1][d]
    lx, ly = _links(b, a[0], x), _links(b, gb[0], y)
    key = ("lack", d, x, lx, y, ly, m)
    out = b.cut_memo.get(key)
    if out is None:
        n = b.shape[d]
        held = {}  # m's coordinate -> what the ranks with it hold together
        for v in range(b.sizes[m]):
            axes = [range(b.sizes[q]) if q != m else (v,) for q in x]
            held[v] = _union([piece(n, lx, c) for c in itertools.product(*axes)])

        def lack(c):
            goal_piece = piece(n, ly, c[1:])
            return interval_length(goal_piece) - interval_overlap(held[c[0]], goal_piece)

        out = b.cut_memo[key] = _per_rank(b, (m, *y), lack)
    return out


def _fastest_across(b, m: int) -> float:
    """The fastest link (bytes per second) of any collective on any group spanning ``m``."""
    key = ("fastest", m)
    out = b.cut_memo.get(key)
    if out is None:
        from .._collectives import COLLECTIVES
        from .._links import group_link

        others = [q for q in b.active if q != m]
        out = 0.0
        for k in range(len(others) + 1):
            for rest in itertools.combinations(others, k):
                dims = tuple(sorted((m, *rest)))
                for kind in COLLECTIVES:
                    bw = group_link(b.model, b.mesh, dims, kind).bytes_per_s
                    if bw > out:
                        out = bw
        b.cut_memo[key] = out
    return out


def _union(pieces) -> tuple:
    ivs = sorted(iv for p in pieces for iv in p)
    out: list = []
    for i, j in ivs:
        if out and i <= out[-1][1]:
            if j > out[-1][1]:
                out[-1] = (out[-1][0], j)
        else:
            out.append((i, j))
    return tuple(out)


_MAX_RANKS = 64  # mesh ranks (over the active dims) past which only rank 0's floor is taken


def most_missing(b, state: int, goal: int, reduce: bool) -> int:
    """Elements the neediest rank needs in ``goal`` and lacks in ``state`` (ids): the most
    over every rank of the active dims (up to ``_MAX_RANKS`` of them; past that, or for a
    pattern goal, the first rank's, ``_bound_parts.first_rank_missing``). Every plan must bring a rank what
    it lacks, so the most is a floor of the bytes the busiest rank receives."""
    key = (state, goal, reduce)
    memo = b.most_missing_memo
    out = memo.get(key)
    if out is not None:
        return out
    a, gb = b.states[state], b.states[goal]
    active = b.active
    ranks = math.prod(b.sizes[m] for m in active)
    if ranks > _MAX_RANKS or not all(type(c) is tuple for c in a[1] + gb[1]):
        out = memo[key] = first_rank_missing(b, state, goal, reduce)
        return out
    need = _need(b, gb)
    if reduce:
        out = max(need)
    else:
        have = [1] * len(need)
        for d in range(len(a[1])):
            for r, k in enumerate(_held_dim(b, d, a, gb)):
                have[r] *= k
        out = max(n - h for n, h in zip(need, have, strict=True))
    memo[key] = out
    return out

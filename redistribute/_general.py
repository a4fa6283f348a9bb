"""General all_permutes: one step between states whose ranks hold the same pieces (no torch).

An all_permute sends whole local tensors between the ranks of its group. When two states
give the ranks the same pieces, one all_permute takes every rank its target from the
member that holds it, even when the states shard with different mesh dims (PyTorch PR
#162294's example 3: ``S(0) S(0) R -> R R S(0)`` on a (4, 4, 16) mesh, or
``S(0) R -> R S(0)`` on (2, 2)). Per tensor dim the states must chunk it alike: the same
number of pieces, and at every position of the mesh dims' mixed-radix order (the first of
a shard order most significant) the same index interval. Then a rank's piece along each
tensor dim is its position there, which a one-to-one map of the group's coordinates
carries from source to target.

The step's group is every mesh dim after the common prefix (the same mesh dims with the
same placements) of each tensor dim's orders, so ``S(0)[a,b] -> S(0)[a,c]`` runs over
``b`` and ``c`` only. Moves between states that shard with the same mesh dims are the
search's permute hubs (``_search``); these are the others. They are priced like every
all_permute (``_search.permute_price``), so searches, tables and plans shared across
sizes agree.

A plan through such a step may skip the gathers and slices the heuristic counts per mesh
dim, so :func:`general_bound` is a lower bound of every plan taking one (its launch and
latency, the reductions and local steps no permute does, what the first rank lacks); the
search takes the least of the two bounds.
"""

from __future__ import annotations

import functools
import itertools
import math

from ._exact import piece
from ._heuristic import SUMAVG, R
from ._price import _prefix_length, permute_price

__all__ = [
    "general_permutes",
    "general_bound",
    "general_kept_bound",
    "crossing_floor",
    "MAX_DIMS",
]

MAX_DIMS = 6  # mesh dims (active, not Partial) past which no general permute is tried
_MAX_PIECES = 4096  # pieces per tensor dim compared one by one; past it, a closed form


def general_permutes(ctx, i: int) -> tuple:
    """The general all_permute transitions from state ``i`` of context ``ctx`` (see the
    module doc), as the search's transitions ``(price, next id, mesh dims,
    "all_permute", n_send, False, None)``; memoized on the context."""
    out = ctx._general.get(i)
    if out is None:
        out = ctx._general[i] = _priced(ctx, i)
    return out


def _priced(ctx, i: int) -> tuple:
    state = ctx.states[i]
    b_in = ctx.nbytes(i)
    bound = ctx.bound
    out = []
    for t, dims, n_send in _targets(ctx, state):
        j = ctx.intern(t)
        b_out = ctx.nbytes(j)
        if bound is not None and b_in + b_out > bound:
            continue
        c = ctx._coefs(dims, "all_permute", n_send)
        out.append(
            (permute_price(c, b_in, b_out, state, t), j, dims, "all_permute", n_send, False, None)
        )
    return tuple(out)


def _targets(ctx, state) -> list:
    """``(state, mesh dims, n_send)`` of every general permute out of ``state``."""
    codes, chains = state
    sizes = ctx.sizes
    free = [m for m in ctx.active if not _is_partial(codes[m])]
    if len(free) < 2 or len(free) > MAX_DIMS:
        return []
    options = []
    for d, chain in enumerate(chains):
        if not chain:
            options.append(((),))
            continue
        want = _signature(ctx.shape[d], tuple((sizes[m], codes[m][1]) for m in chain))
        k = math.prod(sizes[m] for m in chain)
        found = []
        for n in range(1, len(free) + 1):
            for dims in itertools.permutations(free, n):
                if math.prod(sizes[m] for m in dims) != k:
                    continue
                sfs = [[c[1] for c in ctx.shards if c[0] == d]] * n
                for combo in itertools.product(*sfs):
                    links = tuple(zip((sizes[m] for m in dims), combo, strict=True))
                    if _signature(ctx.shape[d], links) == want:
                        found.append(tuple(zip(dims, combo, strict=True)))
        options.append(found)
    sharded = frozenset(m for chain in chains for m in chain)
    out = []
    for choice in itertools.product(*options):
        used = [m for chain in choice for m, _ in chain]
        if len(set(used)) != len(used) or frozenset(used) == sharded:
            continue  # a mesh dim twice; or the same mesh dims (the permute hubs' moves)
        new_codes = list(codes)
        for m in free:
            new_codes[m] = R
        new_chains = []
        for d, chain in enumerate(choice):
            for m, sf in chain:
                new_codes[m] = (d, sf)
            new_chains.append(tuple(m for m, _ in chain))
        t = (tuple(new_codes), tuple(new_chains))
        dims = _group(state, t)
        n_send = math.prod(sizes[m] for m in dims if type(codes[m]) is tuple)
        out.append((t, dims, n_send))
    return out


def _is_partial(code) -> bool:
    return type(code) is int and code != R


def _group(a, b) -> tuple:
    """The mesh dims after the common prefix of each tensor dim's orders in ``a`` and
    ``b`` (sorted): the group of the all_permute between them."""
    codes, chains = a
    new_codes, new_chains = b
    dims: set = set()
    for x, y in zip(chains, new_chains, strict=True):
        k = _prefix_length(codes, x, new_codes, y)
        dims.update(x[k:])
        dims.update(y[k:])
    return tuple(sorted(dims))


@functools.lru_cache(maxsize=16384)
def _signature(length: int, links: tuple):
    """What a shard order of ``links`` (``(size, split factor)`` each, first most
    significant) gives each position along a dim of ``length``: the pieces in
    mixed-radix order; past ``_MAX_PIECES`` positions, a closed form that equal orders
    share (plain shards chunking evenly: just the count)."""
    count = math.prod(n for n, _ in links)
    if count <= _MAX_PIECES:
        return tuple(
            piece(length, links, coords)
            for coords in itertools.product(*(range(n) for n, _ in links))
        )
    if all(sf == 1 for _, sf in links) and length % count == 0:
        return ("even", count)
    return ("links", links)


def _needs(ctx, codes, goal_codes) -> tuple[int, float, int]:
    """What no permute does on the way from ``codes`` to ``goal_codes``: the mesh dims to
    reduce, their reductions' latency, and the local steps (a dim made Partial, or its
    Partial op changed)."""
    n_red = local = 0
    lat = 0.0
    for m in ctx.active:
        a, b = codes[m], goal_codes[m]
        goal_partial = type(b) is int and b > R
        if _is_partial(a):
            if goal_partial and b == a:
                continue
            if goal_partial and a in SUMAVG and b in SUMAVG:
                local += 1
                continue
            n_red += 1
            lat += ctx.reduce_alpha[m]
            if goal_partial:
                local += 1
        elif goal_partial:
            local += 1
    return n_red, lat, local


def _split(ctx, codes, goal: bool) -> int:
    """The product of the sizes of the mesh dims sharding or Partial in ``codes`` (of a
    ``goal``: those where its pattern allows any placement but Partial too)."""
    n = 1
    for m in ctx.active:
        c = codes[m]
        if type(c) is tuple or c > R or (goal and c < R):
            n *= ctx.sizes[m]
    return n


def _gathers(ctx, codes, goal_codes) -> tuple[int, float]:
    """How many gathering collectives a plan from ``codes`` to ``goal_codes`` needs at
    least, and the seconds their received bytes take at least. Only an all_gather or an
    all_reduce lowers the product of the sizes of the mesh dims sharding or Partial: by
    its group's size at most (one dim, or an alias's); permutes, all_to_alls, a shard
    turned Partial and reduce-scatters keep it, slices raise it. Lowering it from
    ``split`` to ``goal`` receives at least ``T / goal - T / split`` bytes however the
    factor is taken (the received bytes telescope: a step's input is at least ``T``
    over the product before it), at the fastest link at best."""
    split, goal = _split(ctx, codes, False), _split(ctx, goal_codes, True)
    if split <= goal:
        return 0, 0.0
    widest = ctx.widest_group
    count = 1
    reach = widest
    while reach * goal < split:
        count += 1
        reach *= widest
    return count, (ctx.total_bytes / goal - ctx.total_bytes / split) / ctx.fastest


def general_kept_bound(ctx, state: int, goal: int) -> float:
    """A lower bound of every plan from ``state`` (id) to ``goal`` that takes a general
    permute, from its launches and latencies, reductions, gathers and local steps alone
    (those of any state a permute out of ``state`` leads to as well: a permute keeps
    Partial dims and the split). An all_reduce may be a reduction and a gather at once."""
    codes, goal_codes = ctx.states[state][0], ctx.states[goal][0]
    n_red, lat, local = _needs(ctx, codes, goal_codes)
    n_gather, _ = _gathers(ctx, codes, goal_codes)
    collectives = max(-(-n_red // ctx.widest), n_gather)
    hops = 1 + max(0, n_gather - n_red)
    return (
        (1 + collectives) * (ctx.launch + ctx.per_collective)
        + hops * ctx.latency_floor
        + lat
        + local * ctx.local_launch
    )


def general_bound(ctx, state: int, goal: int) -> float:
    """:func:`general_kept_bound` plus the largest of three floors of the bytes received:
    what the gathers receive and the permute itself (:func:`permute_bytes_floor`), what
    the neediest rank lacks (when the goal has no Partial dim), each at the least price
    the model charges a received byte, and what must cross one mesh dim
    (:func:`crossing_floor`)."""
    h = general_kept_bound(ctx, state, goal)
    codes, goal_codes = ctx.states[state][0], ctx.states[goal][0]
    _, bw = _gathers(ctx, codes, goal_codes)
    bw += permute_bytes_floor(ctx)  # (the permute is no gather: its bytes come on top)
    if not any(type(b) is int and b > R for b in goal_codes):
        reduce = any(_is_partial(codes[m]) and goal_codes[m] != codes[m] for m in ctx.active)
        missing = most_missing(ctx, state, goal, reduce) * ctx.itemsize * ctx.missing_rate
        if missing > bw:
            bw = missing
    across = crossing_floor(ctx, state, goal)
    if across > bw:
        bw = across
    return h + bw


def crossing_floor(ctx, state: int, goal: int) -> float:
    """:func:`cut_floor` where it holds: a goal without Partial dims (a reduction due when
    the state has Partial dims the goal does not keep), or a state without any."""
    codes, goal_codes = ctx.states[state][0], ctx.states[goal][0]
    if not any(type(b) is int and b > R for b in goal_codes):
        reduce = any(_is_partial(codes[m]) and goal_codes[m] != codes[m] for m in ctx.active)
        return cut_floor(ctx, state, goal, reduce)
    if not any(_is_partial(codes[m]) for m in ctx.active):
        return cut_floor(ctx, state, goal, False)
    return 0.0


def permute_bytes_floor(ctx) -> float:
    """The least byte part of any general permute's price in the context: every state's
    local tensor holds at least ``T / n`` bytes (``n`` the ranks of the active dims), in
    and out, at the least byte coefficients of an all_permute over any group of them."""
    floor = ctx._permute_floor
    if floor is None:
        active = ctx.active
        sizes = ctx.sizes
        least = math.inf
        for k in range(1, len(active) + 1):
            for dims in itertools.combinations(active, k):
                for j in range(len(dims) + 1):
                    for senders in itertools.combinations(dims, j):
                        n_send = math.prod(sizes[m] for m in senders)
                        c = ctx._coefs(dims, "all_permute", n_send)
                        least = min(least, c[1] + c[2])
        n = math.prod(sizes[m] for m in active)
        floor = ctx._permute_floor = least * ctx.total_bytes / n if least < math.inf else 0.0
    return floor


def cut_floor(ctx, state: int, goal: int, reduce: bool) -> float:
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
    memo = ctx._cut
    out = memo.get(key)
    if out is not None:
        return out
    a, b = ctx.states[state], ctx.states[goal]
    active = ctx.active
    ranks = _ranks(ctx)
    if ranks is None or not all(type(c) is tuple for c in a[1] + b[1]):
        memo[key] = 0.0
        return 0.0
    if any(type(c) is int and c < R for c in a[0] + b[0]):
        memo[key] = 0.0  # (a pattern)
        return 0.0
    summed = [m for m in active if _is_partial(b[0][m])]
    share = math.prod(ctx.sizes[m] for m in summed)
    need = _need(ctx, b)
    out = 0.0
    for m in active:
        if m in summed:
            continue
        if reduce:
            if not _is_partial(a[0][m]) or a[0][m] == b[0][m]:
                continue
            lack = max(need)
        else:
            d = next((d for d, chain in enumerate(a[1]) if m in chain), None)
            if d is None:
                continue  # every rank of its coordinate on m together holds the tensor
            lack_d = _lack(ctx, d, a, b, m)
            need_d = _need_dim(ctx, d, b)
            lack = 0
            for r, n in enumerate(need):
                if lack_d[r]:
                    x = n // need_d[r] * lack_d[r]
                    if x > lack:
                        lack = x
        t = lack / share * ctx.itemsize * ctx.missing_rate * ctx.fastest / _fastest_across(ctx, m)
        if t > out:
            out = t
    memo[key] = out
    return out


def _ranks(ctx):
    """The coordinates of every rank on the active dims (None past ``_MAX_RANKS``)."""
    rs = ctx._cut.get("ranks", False)
    if rs is False:
        sizes = [ctx.sizes[m] for m in ctx.active]
        rs = None
        if math.prod(sizes) <= _MAX_RANKS:
            rs = tuple(itertools.product(*(range(n) for n in sizes)))
        ctx._cut["ranks"] = rs
    return rs


def _links(ctx, codes, chain) -> tuple:
    return tuple((ctx.sizes[m], codes[m][1]) for m in chain)


def _need_dim(ctx, d: int, b) -> tuple:
    """Per rank, the length of its piece of tensor dim ``d`` in state ``b``."""
    chain = b[1][d]
    links = _links(ctx, b[0], chain)
    key = ("need", d, chain, links)
    out = ctx._cut.get(key)
    if out is None:
        where = {m: k for k, m in enumerate(ctx.active)}
        n = ctx.shape[d]
        out = ctx._cut[key] = tuple(
            _length(piece(n, links, tuple(c[where[m]] for m in chain))) for c in _ranks(ctx)
        )
    return out


def _need(ctx, b) -> tuple:
    """Per rank, the elements it holds in state ``b``."""
    key = ("needall", b[1], tuple(_links(ctx, b[0], c) for c in b[1]))
    out = ctx._cut.get(key)
    if out is None:
        per = [_need_dim(ctx, d, b) for d in range(len(b[1]))]
        out = ctx._cut[key] = (
            tuple(math.prod(x) for x in zip(*per, strict=True)) if per else (1,) * len(_ranks(ctx))
        )
    return out


def _lack(ctx, d: int, a, b, m: int) -> tuple:
    """Per rank, the indices of tensor dim ``d`` its piece in ``b`` has and no rank of its
    coordinate on ``m`` (a mesh dim of ``a``'s order of ``d``) holds in ``a``."""
    x, y = a[1][d], b[1][d]
    lx, ly = _links(ctx, a[0], x), _links(ctx, b[0], y)
    key = ("lack", d, x, lx, y, ly, m)
    out = ctx._cut.get(key)
    if out is None:
        where = {q: k for k, q in enumerate(ctx.active)}
        n = ctx.shape[d]
        k = x.index(m)
        held = {}  # m's coordinate -> what the ranks with it hold together
        for v in range(ctx.sizes[m]):
            axes = [range(ctx.sizes[q]) if q != m else (v,) for q in x]
            held[v] = _union([piece(n, lx, c) for c in itertools.product(*axes)])
        rows = []
        for c in _ranks(ctx):
            goal_piece = piece(n, ly, tuple(c[where[q]] for q in y))
            rows.append(_length(goal_piece) - _common(held[c[where[x[k]]]], goal_piece))
        out = ctx._cut[key] = tuple(rows)
    return out


def _fastest_across(ctx, m: int) -> float:
    """The fastest link (bytes per second) of any collective on any group spanning ``m``."""
    key = ("fastest", m)
    out = ctx._cut.get(key)
    if out is None:
        from ._cost import COLLECTIVES, group_link

        others = [q for q in ctx.active if q != m]
        out = 0.0
        for k in range(len(others) + 1):
            for rest in itertools.combinations(others, k):
                dims = tuple(sorted((m, *rest)))
                for kind in COLLECTIVES:
                    bw = group_link(ctx.model, ctx.mesh, dims, kind).bytes_per_s
                    if bw > out:
                        out = bw
        ctx._cut[key] = out
    return out


def _length(ivs) -> int:
    return sum(j - i for i, j in ivs)


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


def most_missing(ctx, state: int, goal: int, reduce: bool) -> int:
    """Elements the neediest rank needs in ``goal`` and lacks in ``state`` (ids): the most
    over every rank of the active dims (up to ``_MAX_RANKS`` of them; past that, or for a
    pattern goal, the first rank's, ``ctx._missing``). Every plan must bring a rank what
    it lacks, so the most is a floor of the bytes the busiest rank receives."""
    key = (state, goal, reduce)
    memo = ctx._most_missing
    out = memo.get(key)
    if out is not None:
        return out
    a, b = ctx.states[state], ctx.states[goal]
    active = ctx.active
    ranks = math.prod(ctx.sizes[m] for m in active)
    if ranks > _MAX_RANKS or not all(type(c) is tuple for c in a[1] + b[1]):
        out = memo[key] = ctx._missing(state, goal, reduce)
        return out
    sizes, shape = ctx.sizes, ctx.shape
    dims = []  # per tensor dim: the chain's links in the state and the goal
    for d, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
        lx = tuple((sizes[m], a[0][m][1]) for m in x)
        ly = tuple((sizes[m], b[0][m][1]) for m in y)
        dims.append((d, x, lx, y, ly))
    out = 0
    where = {m: k for k, m in enumerate(active)}
    for coords in itertools.product(*(range(sizes[m]) for m in active)):
        need = have = 1
        for d, x, lx, y, ly in dims:
            h = piece(shape[d], lx, tuple(coords[where[m]] for m in x))
            n = piece(shape[d], ly, tuple(coords[where[m]] for m in y))
            need *= sum(j - i for i, j in n)
            if not reduce:
                have *= _common(h, n)
        lack = need if reduce else need - have
        if lack > out:
            out = lack
    memo[key] = out
    return out


def _common(a, b) -> int:
    n = 0
    for x0, x1 in a:
        for y0, y1 in b:
            lo, hi = max(x0, y0), min(x1, y1)
            if lo < hi:
                n += hi - lo
    return n


def uses_general(ctx) -> bool:
    """Whether the context's searches take general permutes (two or more active dims)."""
    return len(ctx.active) >= 2

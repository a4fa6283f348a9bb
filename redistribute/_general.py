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

__all__ = ["general_permutes", "general_bound", "general_kept_bound", "MAX_DIMS"]

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
    from ._search import permute_price

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
        out.append((permute_price(c, b_in, b_out, state, t), j, dims, "all_permute", n_send, False, None))
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
    from ._search import _prefix_length

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
    """:func:`general_kept_bound` plus the larger of two floors of the bytes received:
    what the gathers receive, and what the first rank lacks (when the goal has no
    Partial dim), each at the least price the model charges a received byte."""
    h = general_kept_bound(ctx, state, goal)
    codes, goal_codes = ctx.states[state][0], ctx.states[goal][0]
    _, bw = _gathers(ctx, codes, goal_codes)
    if not any(type(b) is int and b > R for b in goal_codes):
        reduce = any(_is_partial(codes[m]) and goal_codes[m] != codes[m] for m in ctx.active)
        missing = ctx._missing(state, goal, reduce) * ctx.itemsize * ctx.missing_rate
        if missing > bw:
            bw = missing
    return h + bw


def uses_general(ctx) -> bool:
    """Whether the context's searches take general permutes (two or more active dims)."""
    return len(ctx.active) >= 2


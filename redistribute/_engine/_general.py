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
search's permute hubs (``_permutes``); these are the others. They are priced like every
all_permute (``_price.permute_price``), so searches, tables and plans shared across
sizes agree.

A plan through such a step may skip the gathers and slices the heuristic counts per mesh
dim, so ``_general_bound.general_bound`` is a lower bound of every plan taking one; the
search takes the least of the two bounds.
"""

from __future__ import annotations

import functools
import itertools
import math

from ._encoding import Edge, R
from ._exact import piece
from ._price import permute_price, prefix_length

__all__ = ["general_permutes", "MAX_DIMS"]

MAX_DIMS = 6  # mesh dims (active, not Partial) past which no general permute is tried
_MAX_PIECES = 4096  # pieces per tensor dim compared one by one; past it, a closed form


def general_permutes(ctx, i: int) -> tuple:
    r"""The general all_permute transitions from state ``i`` of context ``ctx`` (see the
    module doc), as :class:`~._encoding.Edge`\ s; memoized on the context."""
    out = ctx.generals.get(i)
    if out is None:
        out = ctx.generals[i] = _priced(ctx, i)
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
        c = ctx.coefs(dims, "all_permute", n_send)
        price = permute_price(c, b_in, b_out, state, t)
        out.append(Edge(price, j, dims, "all_permute", n_send, False, None))
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
        key = (d, want, k, *free)
        found = ctx.general_orders.get(key)
        if found is None:
            found = ctx.general_orders[key] = _orders_like(ctx, d, want, k, free)
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


def _orders_like(ctx, d: int, want, k: int, free: list) -> tuple:
    """Every shard order of tensor dim ``d`` over mesh dims of ``free`` (with the
    context's split factors) that cuts it into ``k`` pieces as the signature ``want``
    says (``_signature``): ``((mesh dim, split factor), ...)`` each."""
    sizes = ctx.sizes
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
    return tuple(found)


def _is_partial(code) -> bool:
    return type(code) is int and code != R


def _group(a, b) -> tuple:
    """The mesh dims after the common prefix of each tensor dim's orders in ``a`` and
    ``b`` (sorted): the group of the all_permute between them."""
    codes, chains = a
    new_codes, new_chains = b
    dims: set = set()
    for x, y in zip(chains, new_chains, strict=True):
        k = prefix_length(codes, x, new_codes, y)
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


def uses_general(ctx) -> bool:
    """Whether the context's searches take general permutes (two or more active dims)."""
    return len(ctx.active) >= 2

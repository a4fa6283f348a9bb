"""Collectives merged onto a mesh's flattened aliases, as moves of the search (no torch).

With merging on, a step may run one all_reduce, all_gather, reduce_scatter or all_to_all
over every dim of an alias at once. It ends where a chain of like-kind single-dim steps
over those dims ends, when that is one valid step (``_merge._valid_merge``'s rules): by
the structural rule per tensor dim, or on index intervals (``_exact``). Shape-free: a
planner's contexts of one mesh share them (``SharedMoves.merged``).
"""

from __future__ import annotations

import math

from .._collectives import MERGEABLE, REDUCING
from ._encoding import AVG, Move, R, is_partial
from ._exact import exact_covers, links
from ._moves import single_moves
from ._price import prefix_length, tie

__all__ = ["merged_moves", "chain_ends", "valid_moving_merge", "merges_floor"]


def merged_moves(ctx, state) -> tuple:
    r"""The shape-free merged moves out of ``state`` (:class:`~._encoding.Move`\ s, no
    ``touch``). A merged step ends where a chain of like-kind
    single-dim steps over the alias's dims (in any order) ends; it is a move when it
    is one valid step (``_merge``'s rules). Chains are shape-free (:func:`_chain_moves`),
    and so is the check at their ends: on a tensor dim that is not tiny, every link
    leaves an order from its end and joins one at its end, so the orders keep a common
    prefix and differ only in the step's dims after it (the structural rule)."""

    codes = state[0]
    out = []
    for _, dims in ctx.aliases:
        # a merged step moves each of its dims once: from Partial (all_reduce,
        # reduce_scatter) or from a shard (all_gather, all_to_all)
        if all(type(codes[m]) is tuple for m in dims):
            reducing = False
        elif all(is_partial(codes[m]) for m in dims):
            reducing = True
        else:
            continue
        for kind in MERGEABLE:
            if (kind in REDUCING) != reducing:
                continue
            for end in chain_ends(ctx, state, dims, (1 << len(dims)) - 1, kind):
                if end == state or not _valid_merge(ctx, state, end, dims, kind):
                    continue
                n_send = 1
                if not reducing:
                    n_send = math.prod(ctx.sizes[m] for m in dims if type(codes[m]) is tuple)
                scaled = reducing and any(codes[m] == AVG for m in dims)
                out.append(Move(end, dims, kind, n_send, scaled, None, tie(state, end)))
    return tuple(out)


def chain_ends(ctx, state, dims: tuple, left: int, kind: str) -> tuple:
    """Where chains of single-dim ``kind`` collectives out of ``state`` end that move
    each of the alias dims ``dims`` picked by the bit mask ``left`` once, in any order.

    Shape-free and shared (``SharedMoves.chain_ends``): the states a chain passes through are the
    same for many starts (each link changes its mesh dim's placement and no other, so
    a state tells which dims moved), and the ends from there are found once. A start
    with ``k`` dims left has up to ``k!`` chains to each end; each link is followed
    once per state it leaves, not once per chain."""
    if not left:
        return (state,)
    key = (ctx.merges_key, state, dims, left, kind)
    memo = ctx.moves.chain_ends
    ends = memo.get(key)
    if ends is None:
        found: dict = {}
        for t, (m,), *_ in _chain_moves(ctx, state, dims, kind):
            bit = 1 << dims.index(m)
            if left & bit:
                for end in chain_ends(ctx, t, dims, left & ~bit, kind):
                    found[end] = None
        ends = ctx.moves.keep(memo, key, tuple(found))
    return ends


def _chain_moves(ctx, state, dims: tuple, kind: str) -> tuple:
    """The single-dim ``kind`` collectives on ``dims`` out of ``state`` (shape-free,
    unbounded): the links of the chains a merged step stands for."""
    only = (dims, kind)
    return ctx.moves.get(
        ctx.moves.chain_moves,
        (ctx.moves_key, only),
        state,
        lambda s: single_moves(ctx, s, only),
    )


def _valid_merge(ctx, a, b, dims: tuple, kind: str) -> bool:
    """Whether a merged ``kind`` over ``dims`` takes state ``a`` to the chain end ``b``
    in one valid step (shape-free: see :func:`merged_moves`)."""
    if kind == "all_reduce":
        return all(type(a[0][m]) is int and a[0][m] != R for m in dims) and all(
            b[0][m] == R for m in dims
        )
    return valid_moving_merge(ctx, a, b, dims, kind, shape_free=True)


def valid_moving_merge(ctx, a, b, dims: tuple, kind: str, shape_free=False) -> bool:
    """``_merge._valid_merge`` for a merged all_gather, all_to_all or reduce_scatter on
    states: per tensor dim the structural rule (the orders differ only in the step's
    dims after a common prefix), else the exact check on index intervals of that dim
    alone (``_exact.exact_covers``; a reduce_scatter reads nothing from its group's
    shards, so each rank's new piece must lie in its own). A rank's pieces along two
    tensor dims depend on the coordinates of disjoint sets of mesh dims (those of each
    dim's new order), and along a tensor dim of positive length some rank holds a piece
    that is not empty: so a rank needing an element it cannot get exists exactly when
    one tensor dim's check fails and the tensor is not empty. ``shape_free``: a dim
    that is not tiny and fails the structural rule fails (no exact check of its
    length), so the answer holds for every context sharing the moves' key."""
    codes, chains = a
    new_codes, new_chains = b
    for m in dims:
        c, n = codes[m], new_codes[m]
        if kind == "reduce_scatter":
            if type(c) is not int or c == R or type(n) is not tuple:
                return False
        elif type(c) is not tuple or ((n != R) if kind == "all_gather" else (type(n) is not tuple)):
            return False
    if ctx.empty:
        return True  # no rank holds or needs an element
    sizes = ctx.sizes
    group = tuple(sorted(dims))
    for d, (x, y) in enumerate(zip(chains, new_chains, strict=True)):
        k = prefix_length(codes, x, new_codes, y)
        if all(m in dims for m in x[k:]) and all(m in dims for m in y[k:]):
            continue
        if shape_free and not ctx.tiny[d]:
            return False
        src = links(sizes, codes, x)
        dst = links(sizes, new_codes, y)
        if not exact_covers(ctx.shape[d], src, dst, group):
            return False
    return True


def merges_floor(ctx, i: int) -> float:
    """A lower bound on the price of every merged step from state ``i`` (inf: none):
    over the aliases whose dims are all sharded (a merged all_gather or all_to_all) or
    all Partial (all_reduce, reduce_scatter), the step's price on this input and the
    least output any step can have (the tensor split over every dim sharded here and
    the alias's)."""
    f = ctx.merge_floors.get(i)
    if f is None:
        codes = ctx.states[i][0]
        b_in = ctx.nbytes(i)
        split = math.prod(ctx.sizes[m] for m in ctx.active if type(codes[m]) is tuple)
        f = math.inf
        for _, dims in ctx.aliases:
            if all(type(codes[m]) is tuple for m in dims):
                n = math.prod(ctx.sizes[m] for m in dims)
                kinds = (("all_gather", n), ("all_to_all", n))
            elif all(type(codes[m]) is int and codes[m] != R for m in dims):
                kinds = (("all_reduce", 1), ("reduce_scatter", 1))
            else:
                continue
            least = ctx.total_bytes / (split * math.prod(ctx.sizes[m] for m in dims))
            for kind, n_send in kinds:
                c = ctx.coefs(dims, kind, n_send)
                v = c.fixed + c.per_in * b_in + c.per_out * least
                if v < f:
                    f = v
        ctx.merge_floors[i] = f
    return f

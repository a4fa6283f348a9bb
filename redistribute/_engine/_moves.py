"""Single-dim steps out of a state, shape-free (no torch).

Per mesh dim ``m`` (``_planner``'s module doc has the rules): from Replicate, a slice to
a shard (``m`` joins the end of its tensor dim's order) or a local step to Partial;
from Partial, an all_reduce, a reduce_scatter or a sum <-> avg change; from a shard, an
all_gather, an all_to_all or a local step to Partial, and on a tiny dim a relabel that
moves nothing (another shard placement of the same pieces). A mesh dim leaves an order
from its end and joins one at its end (the structural rule); on tiny dims and with
StridedShards it may leave or join the middle where an exact check on index intervals
allows (``_exact``), memoized on what it reads in the context's ``exacts``.

The moves depend on the mesh, the placement universe and the tiny dims' lengths only,
so a planner's contexts share them (``SharedMoves.singles``).
"""

from __future__ import annotations

import itertools

from ._encoding import SUMAVG, Move, R, mixable, put
from ._exact import _smallest_piece, exact_covers, links, piece_classes
from ._price import tie

__all__ = ["single_moves", "relabels"]


def single_moves(ctx, state, only=None) -> tuple:
    r"""The single-dim steps out of ``state`` on context ``ctx``, as shape-free
    :class:`~._encoding.Move`\ s; with ``only = (mesh dims, collective)``, just those
    collectives on those dims (the same moves, in the same order)."""
    codes, chains = state
    out: list = []
    sizes = ctx.sizes
    want_dims, kind = only if only is not None else (None, None)

    def add(dims, collective, t, touch, n_send=1, scaled=False):
        out.append(Move(t, dims, collective, n_send, scaled, touch, tie(state, t)))

    for m in ctx.active:
        if want_dims is not None and m not in want_dims:
            continue
        a = codes[m]
        dims = (m,)
        if a == R:
            if kind is not None:
                continue  # local steps only
            for code in ctx.shards:
                for t, touch in _inserted(ctx, state, codes, chains, m, code):
                    add(dims, None, t, touch)
            for op in ctx.ptargets:
                if mixable(codes, op):
                    add(dims, None, (put(codes, m, op), chains), ())
        elif type(a) is int:
            scaled = a == 2
            if kind is None or kind == "all_reduce":
                add(dims, "all_reduce", (put(codes, m, R), chains), (), 1, scaled)
            if kind is None or kind == "reduce_scatter":
                for code in ctx.shards:
                    for t, touch in _inserted(ctx, state, codes, chains, m, code):
                        add(dims, "reduce_scatter", t, touch, 1, scaled)
            if a in SUMAVG and kind is None:
                for op in ctx.ptargets:
                    if op in SUMAVG and op != a:
                        add(dims, None, (put(codes, m, op), chains), ())
        elif kind is None or kind == "all_gather" or kind == "all_to_all":
            d = a[0]
            chain = chains[d]
            last = chain[-1] == m
            rest = chain[:-1] if last else tuple(x for x in chain if x != m)
            n = sizes[m]
            removed = put(chains, d, rest)
            gone = (put(codes, m, R), removed)
            if last or _exact(ctx, state, d, gone, rest, m):
                touch = (d,) if last else None
                if kind is None or kind == "all_gather":
                    add(dims, "all_gather", gone, touch, n)
                if kind is None:
                    for op in ctx.ptargets:
                        if mixable(codes, op):
                            add(dims, None, (put(codes, m, op), removed), touch)
                others_ok = True
            else:
                others_ok = False
            if kind == "all_gather":
                continue
            for code in ctx.shards:
                if code == a or (code[0] != d and not others_ok):
                    continue
                for t, touch in _inserted(ctx, state, codes, removed, m, code, last):
                    if touch is not None and code[0] != d:
                        touch = (d, code[0]) if last else None
                    add(dims, "all_to_all", t, touch, n)
            if kind is None and ctx.tiny[d]:
                for t in relabels(ctx, state, m, d):
                    add(dims, None, t, None)
    return tuple(out)


def relabels(ctx, state, m: int, d: int) -> list:
    """The states where mesh dim ``m`` shards tensor dim ``d`` with another shard
    placement, in any order of ``d``'s mesh dims, and every rank keeps the very same
    piece: a StridedShard and a shard order that chunk alike, say. Such a change is a
    local step that moves nothing (an all_to_all would pay a launch to send nothing),
    and it may say the other dims' order another way too. Tiny dims only: elsewhere
    two shard orders never hold the same pieces. The answer depends on ``d``'s order
    and its placements alone (memoized on them)."""
    codes, chains = state
    chain = chains[d]
    key = ("relabels", d, m, chain, tuple([codes[x] for x in chain]))
    found = ctx.exacts.get(key)
    if found is None:
        found = ctx.exacts[key] = _relabels_uncached(ctx, codes, chain, m, d)
    return [(put(codes, m, code), put(chains, d, c)) for code, c in found]


def _relabels_uncached(ctx, codes, chain, m: int, d: int) -> list:
    options = [c for c in ctx.shards if c[0] == d and c != codes[m]]
    if ctx.empty:  # no rank holds an element: every relabel keeps the (empty) pieces
        return [(code, c) for code in options for c in itertools.permutations(chain)]
    dims = tuple(sorted(chain))
    codes_of_d = tuple([c for c in ctx.shards if c[0] == d])
    sig_of, members = piece_classes(ctx.shape[d], dims, ctx.sizes, codes_of_d)
    own = tuple([codes[x] for x in dims])
    ways = members[sig_of[own, chain]]
    at = dims.index(m)
    position = {x: i for i, x in enumerate(chain)}
    found = []
    for code in options:  # in the order of the shard placements,
        orders = ways.get(own[:at] + (code,) + own[at + 1 :], ())
        # then of ``itertools.permutations(chain)``
        for order in sorted(orders, key=lambda o: [position[x] for x in o]):
            found.append((code, order))
    return found


def _inserted(ctx, state, codes, chains, m, code, last=True):
    """``(state, touch)`` where mesh dim ``m`` takes shard ``code``, joining its tensor
    dim's order last (valid when ``m`` left its old order from the end), or, for tiny
    dims, anywhere the exact check allows."""
    d = code[0]
    base = chains[d]
    new_codes = put(codes, m, code)
    t = (new_codes, put(chains, d, base + (m,)))
    old = codes[m]
    same_dim = type(old) is tuple and old[0] == d
    if last or not same_dim:
        yield t, (d,)
    elif _exact(ctx, state, d, t, base + (m,), m):
        yield t, None
    if ctx.tiny[d]:
        for i in range(len(base)):
            new_chain = base[:i] + (m,) + base[i:]
            t = (new_codes, put(chains, d, new_chain))
            if _exact(ctx, state, d, t, new_chain, m):
                yield t, None


def _exact(ctx, state, d, new_state, new_chain, m) -> bool:
    """Whether mesh dim ``m`` may leave or join the middle of tensor dim ``d``'s order
    (a tiny dim), taking ``state`` to ``new_state`` (``new_chain`` its order of ``d``):
    the exact check on index intervals, memoized on what it reads."""
    if not ctx.tiny[d]:
        return False
    if ctx.empty:
        return True  # no rank holds or needs an element
    chain = state[1][d]
    if ctx.strided:
        codes, new_codes = state[0], new_state[0]
        key = (
            d,
            chain,
            new_chain,
            m,
            tuple([codes[x][1] for x in chain]),
            tuple([new_codes[x][1] for x in new_chain]),
        )
    else:
        key = (d, chain, new_chain, m)
    ok = ctx.exacts.get(key)
    if ok is None:
        ok = ctx.exacts[key] = _exact_uncached(ctx, state, d, new_state, new_chain, m)
    return ok


def _exact_uncached(ctx, state, d, new_state, new_chain, m) -> bool:
    codes, chains = state
    new_codes = new_state[0]
    src = links(ctx.sizes, codes, chains[d])
    dst = links(ctx.sizes, new_codes, new_chain)
    length = ctx.shape[d]
    if all(sf == 1 for _, _, sf in src + dst) and (
        _smallest_piece(length, tuple(n for _, n, _ in src)) > 0
        and _smallest_piece(length, tuple(n for _, n, _ in dst)) > 0
    ):
        # plain shards, no empty piece: each rank's pieces are disjoint runs that only
        # the structural moves keep inside its group's holdings
        return False
    return exact_covers(length, src, dst, m)

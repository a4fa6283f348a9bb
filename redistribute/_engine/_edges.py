"""A context's moves priced on its tensor: the search's edges between state ids (no torch).

Each state's shape-free moves (``_moves``, ``_permutes``, ``_merged_moves``; shared by
the planner's contexts of one mesh) become :class:`~._encoding.Edge`\\ s here: priced on
the context's tensor (``_price.step_price`` times the move's tie-breaking factor),
within its memory bound, and memoized per state in the context's tables. An all_permute
through a permute hub is two edges (into the hub, then out of it to each target), which
:func:`permutes` adds up for tables; general all_permutes come from ``_general``.
"""

from __future__ import annotations

import itertools
import math

from ._encoding import Edge
from ._general import general_permutes
from ._merged_moves import merged_moves
from ._moves import single_moves
from ._permutes import hub_member_count, hub_members, hubs_of
from ._price import step_price

__all__ = [
    "successors",
    "singles",
    "merges",
    "permutes",
    "hub_edges",
    "hub_member_edges",
    "permute_floor",
]


def successors(ctx, i: int) -> tuple:
    """Every edge from state ``i``; goal-free. In the order the search relaxes them
    (single-dim steps, merged steps, permutes), so that of two moves to one state at one
    price, a table keeps the search's."""
    out = singles(ctx, i) + merges(ctx, i) + permutes(ctx, i)
    return out + general_permutes(ctx, i) if ctx.general else out


def singles(ctx, i: int) -> tuple:
    """The single-dim edges from state ``i``."""
    out = ctx.singles.get(i)
    if out is None:
        shared = ctx.moves
        moves = shared.get(
            shared.singles, ctx.moves_key, ctx.states[i], lambda s: single_moves(ctx, s)
        )
        out = ctx.singles[i] = _priced(ctx, i, moves)
    return out


def _priced(ctx, i: int, moves: tuple) -> tuple:
    """Edges from state ``i``: its shape-free ``moves`` priced on the context's tensor,
    within its memory bound."""
    nbytes = ctx.local_bytes
    b_in = nbytes[i]
    bound, ids, intern, coefs, copy = ctx.bound, ctx.ids, ctx.intern, ctx.coefs, ctx.copy
    out = []
    for t, dims, collective, n_send, scaled, touch, tie in moves:
        j = ids.get(t)
        if j is None:
            j = intern(t)
        b_out = nbytes[j]
        if bound is None or b_in + b_out <= bound:
            c = step_price(coefs(dims, collective, n_send), b_in, b_out, scaled, copy) * tie
            out.append(Edge(c, j, dims, collective, n_send, scaled, touch))
    return tuple(out)


def merges(ctx, i: int) -> tuple:
    """The merged edges from state ``i``: like-kind collectives over every dim of an
    alias at once (``()`` on a mesh without aliases). Under a memory bound only the
    merged step's own input and output must fit, not the states its chain passes
    through."""
    if not ctx.aliases:
        return ()
    out = ctx.merged.get(i)
    if out is None:
        shared = ctx.moves
        moves = shared.get(
            shared.merged, ctx.merges_key, ctx.states[i], lambda s: merged_moves(ctx, s)
        )
        out = ctx.merged[i] = _priced(ctx, i, moves)
    return out


def permutes(ctx, i: int) -> tuple:
    """The all_permute edges from state ``i``, each priced as the two halves of its way
    through a permute hub (:func:`hub_edges`, :func:`hub_member_edges`) add up."""
    out = ctx.permutes.get(i)
    if out is None:
        out = ctx.permutes[i] = tuple(
            Edge(first.price + second.price, *second[1:])
            for first in hub_edges(ctx, i)
            for second in hub_member_edges(ctx, first.target, first.dims, first.n_send)
        )
    return out


def hub_edges(ctx, i: int) -> tuple:
    """The edges from state ``i`` into the permute hubs it reaches (their targets: hub
    nodes): the first half of each all_permute's price (its launch and its input)."""
    out = ctx.hub_edges.get(i)
    if out is None:
        b_in = ctx.local_bytes[i]
        bound = ctx.bound
        shared = ctx.moves
        hubs = shared.get(shared.hubs, ctx.permutes_key, ctx.states[i], lambda s: hubs_of(ctx, s))
        found = []
        for hub, dims, n_send, tie in hubs:
            c = ctx.coefs(dims, "all_permute", n_send)
            # under a memory bound a hub's members depend on the input's size
            node = (hub,) if bound is None else (hub, b_in)
            price = (c.fixed + c.per_in * b_in) * tie
            found.append(Edge(price, node, dims, "all_permute", n_send, False, None))
        out = ctx.hub_edges[i] = tuple(found)
    return out


def hub_member_edges(ctx, node: tuple, dims, n_send, room: float = math.inf) -> tuple | None:
    """The edges out of a permute hub node (:func:`hub_edges`): to every state its
    all_permutes reach, the second half of their prices (the output); None when they
    are more than ``room`` (and not generated yet)."""
    out = ctx.hub_members.get(node)
    if out is None:
        hub = node[0]
        c_out = ctx.coefs(dims, "all_permute", n_send).per_out
        bound = ctx.bound
        b_in = node[1] if bound is not None else 0
        ids, intern, nbytes = ctx.ids, ctx.intern, ctx.local_bytes
        shared = ctx.moves
        listed = shared.peek(shared.hub_members, ctx.permutes_key, hub) is not None
        if room < math.inf and not listed and hub_member_count(ctx, hub) > room:
            return None  # (counted, not listed)
        targets = shared.get(
            shared.hub_members, ctx.permutes_key, hub, lambda h: hub_members(ctx, h)
        )
        if len(targets) > room:
            return None
        found = []
        for t, tie in targets:
            j = ids.get(t)
            if j is None:
                j = intern(t)
            b_out = nbytes[j]
            if bound is None or b_in + b_out <= bound:
                found.append(Edge(c_out * b_out * tie, j, dims, "all_permute", n_send, False, None))
        out = ctx.hub_members[node] = tuple(found)
    return out


def permute_floor(ctx, i: int) -> float:
    """A lower bound on the price of every all_permute from state ``i`` (inf: none)."""
    f = ctx.permute_floors.get(i)
    if f is None:
        codes = ctx.states[i][0]
        sharded = [m for m in ctx.active if type(codes[m]) is tuple]
        b_in = ctx.local_bytes[i]
        sizes = ctx.sizes
        f = min(
            (
                ctx.price(g, "all_permute", sizes[g[0]] * sizes[g[1]], b_in, 0)
                for g in itertools.combinations(sharded, 2)
            ),
            default=math.inf,
        )
        ctx.permute_floors[i] = f
    return f

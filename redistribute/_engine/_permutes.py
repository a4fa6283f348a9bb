"""All_permutes between states sharded by the same mesh dims, through permute hubs (no torch).

A state with ``k`` sharding mesh dims may permute into nearly every state with those
dims sharding (thousands with StridedShards or 3-D tensors on 4-D meshes), and many
states share those targets. So a permute's way is split in two at a *hub*, the choice of
which order prefixes it keeps (:func:`hubs_of`): the state pays the launch and its input
into the hub, the hub the output into each target (:func:`hub_members`). Every permute
passes through exactly one hub of its source, the hub's targets are generated once and
relaxed once per search (not once per source), and a plan table prices each permute as
its two halves add up (``_price.permute_price``), so tables, searches and plans shared
across sizes agree. Shape-free: a planner's contexts of one mesh share them
(``SharedMoves.hubs``, ``SharedMoves.hub_members``).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

from ._price import hub_key, suffix_mask, tie

__all__ = ["Hub", "hubs_of", "hub_members"]


class Hub(NamedTuple):
    """A permute hub a state reaches: the hub's ``key`` (:func:`hubs_of`), the mesh dims
    its permutes exchange pieces over, their group's size and the tie-breaking factor of
    the way in."""

    key: tuple
    dims: tuple[int, ...]
    n_send: int
    tie: float


def hubs_of(ctx, state) -> tuple:
    r"""The permute hubs ``state`` reaches, as shape-free :class:`Hub`\ s. An all_permute keeps which mesh dims shard (and every other dim's
    placement); per tensor dim the old and new shard orders share a prefix (mesh dims
    and placements), and the mesh dims after it (at least two, over every tensor dim)
    exchange pieces. A hub stands for one such choice of prefixes: its key is the
    state with those dims blanked (-1), the prefixes and, per tensor dim, the entry
    after the prefix (``-1``: none), which a target must not repeat (else its
    common prefix with ``state`` is longer). Every permute out of ``state`` passes
    through exactly one of its hubs, and states sharing a hub share its targets."""
    codes, chains = state
    if sum(1 for m in ctx.active if type(codes[m]) is tuple) < 2:
        return ()
    out = []
    groups = ctx.groups
    for ks in itertools.product(*(range(len(chain) + 1) for chain in chains)):
        mask = suffix_mask(chains, ks)
        if not mask & (mask - 1):
            continue  # no exchange, or a single-dim step
        hub = hub_key(codes, chains, ks, mask)
        g = groups.get(mask)
        if g is None:
            dims = tuple(m for m in range(len(ctx.sizes)) if mask >> m & 1)
            g = groups[mask] = (dims, math.prod(ctx.sizes[m] for m in dims))
        out.append(Hub(hub, g[0], g[1], tie(state, hub)))
    return tuple(out)


def hub_members(ctx, hub) -> tuple:
    """The states a permute hub leads to (shape-free ``(state, tie factor)``): its
    blanked mesh dims take every shard placement and, per tensor dim, every order
    after the prefix that does not start with the hub's entry there."""
    base, prefixes, nexts = hub
    free = [m for m, c in enumerate(base) if c == -1]
    orders: dict = {}  # tensor dims of the free mesh dims -> their orders (below)
    out = []
    for assign in itertools.product(ctx.shards, repeat=len(free)):
        codes = list(base)
        for m, c in zip(free, assign, strict=True):
            codes[m] = c
        codes = tuple(codes)
        key = tuple([c[0] for c in assign])
        per = orders.get(key)
        if per is None:
            per = orders[key] = _hub_orders(ctx.moves, free, key, prefixes, nexts)
        options = []
        for entry in per:
            m0 = entry[2]
            if m0 >= 0 and codes[m0] == entry[3]:
                opts = entry[1]
                if opts is None:
                    # the orders not starting with m0 (after the prefix)
                    k = entry[4]
                    opts = entry[1] = [chain for chain in entry[0] if chain[k] != m0]
            else:
                opts = entry[0]
            if not opts:
                break
            options.append(opts)
        else:
            for chains in itertools.product(*options):
                t = (codes, chains)
                out.append((t, tie(hub, t)))
    return tuple(out)


def hub_member_count(ctx, hub) -> int:
    """How many states :func:`hub_members` lists for ``hub``, counted without listing
    them (one product per shard assignment of the hub's blanked mesh dims)."""
    base, prefixes, nexts = hub
    free = [m for m, c in enumerate(base) if c == -1]
    orders: dict = {}
    total = 0
    for assign in itertools.product(ctx.shards, repeat=len(free)):
        key = tuple([c[0] for c in assign])
        per = orders.get(key)
        if per is None:
            per = orders[key] = _hub_orders(ctx.moves, free, key, prefixes, nexts)
        code_of = dict(zip(free, assign, strict=True))
        n = 1
        for entry in per:
            every, m0, c0, k = entry[0], entry[2], entry[3], entry[4]
            if m0 >= 0 and code_of.get(m0, base[m0]) == c0:
                n *= sum(1 for chain in every if chain[k] != m0)
            else:
                n *= len(every)
            if not n:
                break
        total += n
    return total


def _hub_orders(shared, free: list, dims: tuple, prefixes: tuple, nexts: tuple) -> list:
    """Per tensor dim ``d``, the orders a permute hub's targets may take when its free
    mesh dims ``free`` shard the tensor dims ``dims``: ``[every order, those not starting
    with the mesh dim m0 (None until asked for), m0, c0, prefix length]``, the latter for
    a target whose ``m0`` has the placement ``c0`` (the hub's entry after the prefix,
    ``nexts[d]``: else its common prefix with the source would be longer); ``m0 = -1``
    when no order can start with it. Each entry is shared by the hubs with the same
    prefix, members and entry after it (``shared.orders``, a :class:`~._context.SharedMoves`)."""
    members: list = [[] for _ in prefixes]
    for m, d in zip(free, dims, strict=True):
        members[d].append(m)
    memo = shared.orders
    per = []
    for prefix, nxt, mine in zip(prefixes, nexts, members, strict=True):
        key = (prefix, nxt, *mine)
        entry = memo.get(key)
        if entry is None:
            every = [prefix + order for order in itertools.permutations(mine)]
            if nxt != -1 and nxt[0] in mine:
                entry = [every, None, nxt[0], nxt[1], len(prefix)]
            else:
                entry = [every, every, -1, None, 0]
            shared.keep(memo, key, entry)
        per.append(entry)
    return per

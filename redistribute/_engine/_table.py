"""All-pairs plan tables for small state spaces (no torch).

When every spec a search context can reach is few (at most :data:`MAX_STATES`: meshes of
up to three active dims, four-dim meshes over 2-D tensors with one Partial op), the
context's whole state graph is built in a canonical order from the search's own
transitions (every single-dim step and every valid ``all_permute``, with the same
tie-broken prices and memory bound); Floyd-Warshall gives the minimum price between any
two states, and a plan walks from the source, always taking the transition that leads
on most cheaply.

Prices are tie-broken (``_price.tie``), so each pair has one cheapest plan: the walk
returns exactly what the A* search returns. That makes the table a pure speed-up, built
lazily once a context has planned :func:`lazy_pairs` pairs (more for bigger state
spaces), whatever each process planned before. Building takes 0.1-8 ms on 1-3-D meshes
over 2-D tensors and 60-250 ms for the 4-D ones (261-536 states); a walk then costs a
few microseconds per step.
"""

from __future__ import annotations

import collections
import itertools
import math
from typing import TYPE_CHECKING

from meshplan.errors import PlanError

from ._edges import successors
from ._encoding import SUMAVG, R, mixable, state_order
from ._goals import admits, is_pattern

if TYPE_CHECKING:  # numpy is imported when a table is built, not with the planner
    import numpy as np

__all__ = ["MAX_STATES", "TABLE_MODES", "Table", "Tables", "lazy_pairs", "state_count", "walk"]

MAX_STATES = 640
"""Largest state space given a table; bigger contexts are always planned by A* search."""


def lazy_pairs(states: int) -> int:
    """How many pairs a context of ``states`` states plans by search before building its
    table: about as many as make the searches cost what the table does (a rent-or-buy
    rule; a table costs about ``states / 8`` searches: 0.5-0.9 ms vs 0.1-0.6 ms on a
    2-D mesh, 60-250 ms vs 0.5-2 ms (a warm context) on a 4-D one), at least 2 and at
    most 64.

    >>> lazy_pairs(18), lazy_pairs(92), lazy_pairs(536)
    (2, 11, 64)
    """
    return min(64, max(2, states // 8))


class Table:
    """A context's states (ctx ids in canonical order), transitions and all-pairs prices."""

    __slots__ = ("ids", "index", "edges", "dist", "hop", "admitted")

    def __init__(self, ids: list, edges: list, dist: np.ndarray, hop: np.ndarray):
        self.ids = ids  # row -> ctx state id
        self.index = {i: row for row, i in enumerate(ids)}  # ctx state id -> row
        self.edges = edges  # row -> ((price, row of target, edge), ...)
        self.dist = dist  # dist[a, b]: minimum price from row a to row b (inf: none)
        self.hop = hop  # hop[a, b]: the edge of row a a cheapest plan to b takes first
        self.admitted: dict = {}  # pattern goal id -> the rows it admits (``walk``)


def _codes(ctx):
    """Every assignment of placement codes to mesh dims the context can hold, in order."""
    options = (R,) + tuple(ctx.ptargets) + tuple(ctx.shards)
    active = ctx.active
    base = [R] * len(ctx.sizes)
    for combo in itertools.product(options, repeat=len(active)):
        codes = list(base)
        for m, c in zip(active, combo, strict=True):
            codes[m] = c
        codes = tuple(codes)
        if all(mixable(codes, c) for c in combo if type(c) is int and c != R):
            yield codes


def _members(ctx, codes) -> list[list[int]]:
    return [
        [m for m in ctx.active if type(codes[m]) is tuple and codes[m][0] == d]
        for d in range(ctx.ndim)
    ]


def state_count(ctx) -> int:
    """How many states the context has (code assignments times shard orders)."""
    if len(ctx.active) > 4:
        return MAX_STATES + 1  # never tabled: 5+ active dims make too big a table
    return _count(len(ctx.active), tuple(ctx.ptargets), tuple(ctx.shards), ctx.ndim)


def _count(n_active: int, ops: tuple, shards: tuple, ndim: int) -> int:
    """The states of :func:`_states` counted without listing them: per way of giving the
    active mesh dims placement codes, the product over tensor dims of the orders of the
    mesh dims sharding it (``k!`` for ``k`` of them), summed over the ways whose Partial
    ops mix (one op, or sum and avg). By mesh dim, the ways grouped by how many mesh dims
    shard each tensor dim and which ops they use so far."""
    ways: dict = {((0,) * ndim, frozenset()): 1}
    for _ in range(n_active):
        nxt: dict = collections.defaultdict(int)
        for (ks, used), n in ways.items():
            nxt[(ks, used)] += n  # Replicate
            for op in ops:
                nxt[(ks, used | {op})] += n
            for d, _ in shards:
                nxt[(ks[:d] + (ks[d] + 1,) + ks[d + 1 :], used)] += n
        ways = nxt
    total = 0
    for (ks, used), n in ways.items():
        if len(used) <= 1 or used <= _SUMAVG_SET:
            total += n * math.prod(math.factorial(k) for k in ks)
    return total


_SUMAVG_SET = frozenset(SUMAVG)


def _states(ctx):
    for codes in _codes(ctx):
        for chains in itertools.product(*(itertools.permutations(m) for m in _members(ctx, codes))):
            yield codes, tuple(chains)


def _build(ctx) -> Table:
    import numpy as np  # Floyd-Warshall only: not loaded until a table is built

    ids = [ctx.intern(s) for s in _states(ctx)]
    index = {i: row for row, i in enumerate(ids)}
    n = len(ids)
    # the search's edges, with the same tie-broken prices: (price, target row, edge)
    edges = [
        tuple((e.price, index[e.target], e) for e in successors(ctx, i) if e.target != i)
        for i in ids
    ]
    dist = np.full((n, n), np.inf)
    np.fill_diagonal(dist, 0.0)
    for a, out in enumerate(edges):
        row = dist[a]
        for c, b, _ in out:
            if c < row[b]:
                row[b] = c
    for k in range(n):
        np.minimum(dist, dist[:, k, None] + dist[None, k, :], out=dist)
    # per row, the first edge (in the row's order) that leads on most cheaply to each row
    hop = np.zeros((n, n), dtype=np.int32)
    for a, out in enumerate(edges):
        if out:
            prices = np.array([e[0] for e in out])
            targets = np.array([e[1] for e in out])
            hop[a] = np.argmin(prices[:, None] + dist[targets, :], axis=0)
    return Table(ids, edges, dist, hop)


#: the bytes of tables kept (least recently used dropped first): a table of ``n`` states
#: holds two ``n x n`` arrays (12 bytes an entry) and its edges (about 150 bytes each).
#: A count of 32 tables thrashed on Llama-3 70B's 105 contexts (783 builds, 25 s, where
#: all 105 tables take 23 MB)
KEEP_BYTES = 256 << 20


def table_bytes(tab: Table) -> int:
    """About how many bytes ``tab`` holds."""
    n = len(tab.ids)
    return 12 * n * n + 150 * sum(len(out) for out in tab.edges)


TABLE_MODES = ("lazy", "eager", "off")
"""When a context builds its table: after :func:`lazy_pairs` pairs planned by search, at
once, or never (``Planner(tables=...)``)."""


class Tables:
    """The plan tables of a planner's contexts (the most recently used, within
    :data:`KEEP_BYTES`),
    built as ``mode`` (one of :data:`TABLE_MODES`) says; ``lock``: the planner's."""

    def __init__(self, lock, mode: str = "lazy") -> None:
        self.lock = lock
        self.mode = mode
        self._tables: collections.OrderedDict = collections.OrderedDict()
        self._bytes = 0

    def __contains__(self, ctx) -> bool:
        return ctx in self._tables

    def table(self, ctx, *, after: int | None = None) -> Table | None:
        """The context's table, or None: while it has planned at most ``after`` pairs
        (default: as the mode says; a search is cheaper than a table for a few), or when
        its state space exceeds :data:`MAX_STATES`. Call with ``ctx.lock`` held."""
        if ctx.tabled is False:
            return None
        with self.lock:
            tab = self._tables.get(ctx)
            if tab is not None:
                self._tables.move_to_end(ctx)
                return tab
        if after is None and self.mode == "off":
            return None
        if ctx.tabled is None:
            n = state_count(ctx)
            ctx.tabled = n <= MAX_STATES
            if not ctx.tabled:
                return None
            ctx.lazy = lazy_pairs(n)
        if after is None:
            after = ctx.lazy if self.mode == "lazy" else 0
        ctx.planned += 1
        if ctx.planned <= after:
            return None
        tab = _build(ctx)
        with self.lock:
            old = self._tables.pop(ctx, None)
            if old is not None:  # (built twice at once: the first one's bytes go)
                self._bytes -= table_bytes(old)
            self._tables[ctx] = tab
            self._bytes += table_bytes(tab)
            while self._bytes > KEEP_BYTES and len(self._tables) > 1:
                self._bytes -= table_bytes(self._tables.popitem(last=False)[1])
        return tab

    def built(self, ctx) -> Table | None:
        """The context's table if it has been built (no counting, no building)."""
        if not ctx.tabled:
            return None
        with self.lock:
            return self._tables.get(ctx)

    def clear(self) -> None:
        with self.lock:
            self._tables.clear()
            self._bytes = 0


def _admitted(ctx, tab: Table, goal: int) -> list:
    """The rows of the states the pattern goal ``goal`` admits (memoized on the table)."""
    found = tab.admitted.get(goal)
    if found is None:
        pattern = ctx.states[goal]
        found = tab.admitted[goal] = [
            row for row, i in enumerate(tab.ids) if admits(pattern, ctx.states[i])
        ]
    return found


def walk(ctx, tab: Table, start: int, goal):
    """The cheapest plan from state ``start`` to ``goal`` (ctx ids; or a tuple of them, to
    the nearest), as :func:`search` returns it: ``(price, [(state, transition, next)])``,
    or None when unreachable."""
    a = tab.index[start]
    goals = (goal,) if type(goal) is int else goal
    if is_pattern(ctx.states[goals[0]]):
        # patterns (``_goals.unreduced_goal``, ``class_goal``): the nearest state one admits
        rows = [row for g in goals for row in _admitted(ctx, tab, g)]
    else:
        rows = [tab.index[g] for g in goals]
    if len(rows) == 1:
        b = rows[0]
    else:  # the nearest; of several at one price, the first in ``state_order`` (as a search)
        states, ids = ctx.states, tab.ids
        b = min(rows, key=lambda x: (float(tab.dist[a, x]), state_order(states[ids[x]])))
    total = float(tab.dist[a, b])
    if total == math.inf:
        return None
    ids, edges = tab.ids, tab.edges
    hop = tab.hop
    moves = []
    here = a
    for _ in range(len(ids)):
        if here == b:
            return total, moves
        step = edges[here][hop.item(here, b)]
        moves.append((ids[here], step[2], step[2].target))
        here = step[1]
    raise PlanError(f"the plan table of {ctx.mesh} loops from {ctx.states[start]}", value=start)

"""The search's lower bound of a plan's price: :class:`Bounds` (no torch).

A context's :class:`Bounds` (``Context.bounds``) holds what the bound reads, set once
from the context, and its memo tables. Its :meth:`Bounds.heuristic` is the least of the
per-mesh-dim bound (``_dim_bound``) and, where general permutes are moves, the bound of
plans taking one (``_general_bound``); both are lower bounds of every plan, so A* with
it returns a minimum (``tests/redistribute/test_heuristic.py``).

Attributes read from the context: ``ctx``, ``states`` (its interned states, the same
list), ``coefs``, ``mesh``, ``model``, ``sizes``, ``active``, ``shape``, ``tiny``,
``empty``, ``itemsize``, ``total_bytes``, ``ptargets``, ``launch``, ``local_launch``,
``copy``, ``per_collective``, ``aliases``, ``merge_dims``.

Set here, per mesh dim ``m`` unless said (links: a collective's fastest on ``m``, or
on an alias holding it when the profile gives aliases links of their own):

* ``alpha_log[m]``: the least latency of a collective on it times ``log2`` of its size;
  ``alpha_floor``, ``latency_floor``: the least of those, and of one hop, over the dims;
* ``dim_bw[m]``, ``fastest``: its fastest link (bytes/s), and the fastest of all;
  ``widest_group``: the most ranks one gathering collective spans; ``missing_rate``:
  the least price the model charges a byte received (seconds);
* ``weights[m]``: :class:`DimWeights`, seconds per byte of the smallest local tensor
  a collective on it can run on; ``gather_alpha[m]``, ``reduce_alpha[m]``: the latency
  of a gather and of a reduction; ``reduce_twice``: an all_reduce's second half of hops
  is not in ``reduce_alpha``;
* ``detour[m]``, ``detour_floor``, ``detour_items[m]``: what sharding a dim replicated in
  source and target for a while costs (a slice, and a gather to undo it, as an item of
  the gather sequence: ``_sequence``);
* merged steps' allowances: ``widest`` (dims one merged collective may serve),
  ``alias_shares[m]`` (``(bit mask of an alias holding m, r)``: a merged reduction moves
  ``r`` of what its dims' own reductions would), ``gather_share[m]``, ``alias_reach[m]``
  (bit mask of the dims it shares an alias with).

Memo tables: ``h`` ((state, goal) -> heuristic, the search's), ``kept`` ((state, goal)
-> :meth:`Bounds.kept_bound`), ``goal_info``, ``covers``, ``red_memo``, ``group_memo``,
``apart_memo``, ``relabel_memo``, ``pieces``/``piece_list``/``state_pieces``/``overlap``
(``_bound_parts``), ``most_missing_memo``, ``cut_memo``, ``permute_bytes``
(``_general_bound``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .._collectives import COLLECTIVES, MERGEABLE
from .._links import group_link
from .._profile import Link
from ._bound_parts import kept_dim_bound
from ._dim_bound import dim_bound
from ._general_bound import general_bound, general_kept_bound

__all__ = ["Bounds", "DimWeights"]


class DimWeights(NamedTuple):
    """Seconds per byte of the smallest local tensor a collective on a mesh dim can run
    on, by what it does."""

    gather: float  # (n-1) x its input
    reduce: float  # (n-1)/n x its input, plus the reduction
    reshard: float  # another shard placement: (n-1)/n x, plus a copy
    all_reduce: float  # 2 (n-1)/n x its input, plus the reduction


class Bounds:
    """The lower bounds of a context's plans (see the module doc for its attributes)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.states = ctx.states
        self.coefs = ctx.coefs
        self.mesh = ctx.mesh
        self.model = ctx.model
        self.sizes = ctx.sizes
        self.active = ctx.active
        self.shape = ctx.shape
        self.tiny = ctx.tiny
        self.empty = ctx.empty
        self.itemsize = ctx.itemsize
        self.total_bytes = ctx.total_bytes
        self.ptargets = ctx.ptargets
        self.launch = ctx.launch
        self.local_launch = ctx.local_launch
        self.copy = ctx.copy
        self.per_collective = ctx.per_collective
        self.aliases = ctx.aliases
        self.merge_dims = ctx.merge_dims
        self.general = ctx.general
        self._clear_memos()
        self._set_alias_allowances()
        own = _collective_links(self.model, self.mesh, len(self.sizes), self.aliases)
        best = [
            Link(min(x.latency_s for x in d.values()), max(x.bytes_per_s for x in d.values()))
            for d in own
        ]
        self._set_links(best)
        self._set_weights(own, best)
        self._set_detours()

    def _set_alias_allowances(self) -> None:
        """The heuristic's allowances for merged steps: ``widest``, ``alias_shares``,
        ``gather_share``, ``alias_reach``."""
        # one collective may serve ``widest`` dims
        self.widest = max((len(d) for _, d in self.aliases), default=1)
        # a merged reduction over an alias's N ranks moves (N-1)/N of its input, ``r`` of
        # what its dims' single-dim reductions would move on that input; but it runs with
        # every dim of the alias Partial, so on an input none of them splits (the
        # heuristic's ``reduce_weight``). Per mesh dim: (bit mask of the alias, r) of
        # each alias holding it
        self.alias_shares: list = [() for _ in self.sizes]
        # a gather on an alias dim: a merged all_gather moves no fewer bytes than its dims'
        # gathers one after another; a shard made Partial and all-reduced in a merged
        # step moves at least 2r of what its gather would
        self.gather_share = [1.0] * len(self.sizes)
        # per mesh dim, the bit mask of the dims it shares an alias with (itself included)
        self.alias_reach = [0] * len(self.sizes)
        for _, dims in self.aliases:
            n = math.prod(self.sizes[m] for m in dims)
            shares = sum((self.sizes[m] - 1) / self.sizes[m] for m in dims)
            r = min(1.0, ((n - 1) / n) / shares)
            mask = sum(1 << m for m in dims)
            for m in dims:
                self.alias_shares[m] += ((mask, r),)
                self.alias_reach[m] |= mask
                self.gather_share[m] = min(self.gather_share[m], 2.0 * r)

    def _set_links(self, best: list) -> None:
        """Latency and bandwidth floors from each mesh dim's fastest link (``best``):
        ``alpha_log``, ``alpha_floor``, ``latency_floor``, ``widest_group``, ``dim_bw``,
        ``fastest``, ``missing_rate``."""
        sizes, active = self.sizes, self.active
        self.alpha_log = tuple(
            best[m].latency_s * math.log2(n) if n > 1 else 0.0 for m, n in enumerate(sizes)
        )
        # the least latency of any collective (one on a single mesh dim, at least)
        self.alpha_floor = min([self.alpha_log[m] for m in active] or [0.0])
        # the least latency of one hop of any collective (a general permute's, at least)
        self.latency_floor = min([best[m].latency_s for m in active] or [0.0])
        # the most ranks one gathering collective spans (a dim, or an alias's dims)
        self.widest_group = max(
            [sizes[m] for m in active]
            + [math.prod(sizes[m] for m in dims) for _, dims in self.aliases]
            or [2]
        )
        self.dim_bw = tuple(link.bytes_per_s for link in best)
        self.fastest = max([self.dim_bw[m] for m in active] or [1.0])
        # what the first rank lacks, in seconds per byte at least: the model charges an
        # all_to_all or all_permute (k-1)/k of its output, however much of it a rank
        # receives, so a byte received may cost as little as (k-1)/k of one on the link
        self.missing_rate = min([(sizes[m] - 1) / sizes[m] for m in active] or [1.0]) / self.fastest

    def _set_weights(self, own: list, best: list) -> None:
        """Per mesh dim, seconds per byte of the smallest local tensor a collective on it
        can run on (``weights``), and the latencies of a gather and of a reduction
        (``gather_alpha``, ``reduce_alpha``, ``reduce_twice``)."""
        # gather: (n-1) x its input; reduce: (n-1)/n x its input, plus the reduction;
        # other shard change: (n-1)/n x, plus a copy; all_reduce: 2 (n-1)/n x, plus the
        # reduction. Where a profile gives collectives links of their own, a gather runs
        # as an all_gather or (of a shard made Partial) an all_reduce, a reduction as a
        # reduce_scatter or an all_reduce, an all_reduce as itself: each bound takes the
        # faster of the links that can serve it (the same link everywhere otherwise)
        hw = self.model.profile
        self.weights = []
        self.gather_alpha = []  # latency (times log2 of the dim's size) of a gather
        self.reduce_alpha = []  # ... of a reduction
        # An all_reduce moves 2 (n-1)/n of its input in twice the hops; so does a
        # reduce_scatter on a backend that runs it as one (``reduce_scatter_via_all_reduce``)
        via = hw.reduce_scatter_via_all_reduce
        for m, n in enumerate(self.sizes):
            bw = best[m].bytes_per_s
            ag, rs, ar = own[m]["all_gather"], own[m]["reduce_scatter"], own[m]["all_reduce"]
            f = (n - 1) / n if n > 1 else 0.0
            rs_bw = rs.bytes_per_s / 2 if via else rs.bytes_per_s
            self.weights.append(
                DimWeights(
                    (n - 1) / max(ag.bytes_per_s, ar.bytes_per_s),
                    f / max(rs_bw, ar.bytes_per_s / 2) + f / hw.reduce_bytes_per_s,
                    f / bw + self.copy,
                    2 * f / ar.bytes_per_s + f / hw.reduce_bytes_per_s,
                )
            )
            log_n = math.log2(n) if n > 1 else 0.0
            self.gather_alpha.append(min(ag.latency_s, 2 * ar.latency_s) * log_n)
            # (an all_reduce's second half of hops, where it must be one, the heuristic
            # adds: ``reduce_twice``)
            self.reduce_alpha.append(min(rs.latency_s, ar.latency_s) * log_n * (2 if via else 1))
        self.reduce_twice = not via

    def _set_detours(self) -> None:
        """What temporarily sharding a dim replicated in source and target costs: a slice
        and a gather (``detour``, ``detour_floor``, ``detour_items``)."""
        hw = self.model.profile
        # (on an alias dim the gather may ride in a merged step, at no launch of its own)
        gather = hw.launch_s + self.per_collective
        self.detour = [
            hw.local_launch_s + (0.0 if m in self.merge_dims else gather + self.alpha_log[m])
            for m in range(len(self.sizes))
        ]
        self.detour_floor = min(self.detour) if self.detour else 0.0
        # the gather that ends a detour, as an item of the heuristic's gather sequence
        # (``_sequence``); on an alias dim it may ride a merged step, which moves no
        # fewer bytes than the dims' gathers one after another (``gather_share``)
        self.detour_items = [
            ((self.weights[m][0] * self.gather_share[m], n, -1, 0),)
            for m, n in enumerate(self.sizes)
        ]

    def _clear_memos(self) -> None:
        self.h: dict = {}
        self.kept: dict = {}
        self.goal_info: dict = {}
        self.covers: dict = {}
        self.red_memo: dict = {}
        self.group_memo: dict = {}
        self.apart_memo: dict = {}
        self.relabel_memo: dict = {}
        self.pieces: dict = {}
        self.piece_list: list = []
        self.state_pieces: dict = {}
        self.overlap: dict = {}
        self.most_missing_memo: dict = {}
        self.cut_memo: dict = {}
        self.permute_bytes = None

    def clear(self) -> None:
        """Forget the memo tables (the context's states start over)."""
        self._clear_memos()

    def heuristic(self, state: int, goal: int) -> float:
        """A lower bound on the price of any plan from ``state`` to ``goal`` (ids): the
        least of the per-dim bound and, where general permutes are moves, the bound of
        plans taking one."""
        h = dim_bound(self, state, goal)
        if self.general:
            g = general_bound(self, state, goal, h)
            if g < h:
                return g
        return h

    def kept_bound(self, state: int, goal: int) -> float:
        """A lower bound on the price from any state an all_permute out of ``state`` leads
        to, to ``goal`` (ids)."""
        h = kept_dim_bound(self, state, goal)
        if self.general:
            g = general_kept_bound(self, state, goal)
            if g < h:
                return g
        return h


def _collective_links(model, mesh, ndim: int, aliases) -> list:
    """Per mesh dim, each collective's link (a profile may give each its own). A step
    merged onto an alias runs on the alias's links when the profile has them
    (``flattened``): on each of its dims, a collective's link is the faster of the dim's
    and the alias's, so the bounds hold for every step."""
    own = [{kind: group_link(model, mesh, (m,), kind) for kind in COLLECTIVES} for m in range(ndim)]
    for _, dims in aliases:
        for kind in MERGEABLE:
            link = group_link(model, mesh, dims, kind)
            for m in dims:
                mine = own[m][kind]
                own[m][kind] = Link(
                    min(mine.latency_s, link.latency_s), max(mine.bytes_per_s, link.bytes_per_s)
                )
    return own

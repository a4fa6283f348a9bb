"""The plan search: A* over encoded specs with an admissible heuristic (no torch).

States are ``(codes, chains)``: one code per mesh dim (``0`` Replicate, ``1..4``
Partial sum/avg/max/min, ``(tensor_dim, split_factor)`` for Shard (split factor 1) and
StridedShard) and, per tensor dim, the mesh dims sharding it in application order.
A :class:`Context` holds, per (mesh, shape, dtype, cost model, placement universe,
memory bound, objective, merging), the tables every search on it shares: interned
states (ids), their padded local bytes, their transitions and prices, heuristic values
per goal.

Transitions (see ``meshplan.redistribute._planner`` for the rules) are generated per
state, goal-free and memoized, the single-dim steps and permutes as shape-free moves that
every context of the mesh and placement universe shares (a context prices them on its
tensor): single-dim steps, validity checked structurally (a mesh
dim leaves an order from its end and joins one at its end) or, for tiny dims and
StridedShards, exactly on index intervals (``_exact``); every valid all_permute,
generated only once the search reaches a lower bound of their rank, through *permute
hubs*; and the steps merged onto the mesh's aliases (the ends of like-kind single-dim
chains over an alias's dims that are one valid step: ``_merge._valid_merge``'s rules, by
the structural rule or on index intervals per tensor dim), shape-free too. Each price
carries the tie-breaking factor of :func:`_tie`.

A state with ``k`` sharding mesh dims may permute into nearly every state with those
dims sharding (thousands with StridedShards or 3-D tensors on 4-D meshes), and many
states share those targets. So a permute's way is split in two at a hub, the choice of
which order prefixes it keeps (``Context._hubs_of``): the state pays the launch and its
input into the hub, the hub the output into each target. Every permute passes through
exactly one hub of its source, the hub's targets are generated once and relaxed once per
search (not once per source), and a plan table prices each permute as its two halves add
up, so tables, searches and plans shared across sizes agree.

The heuristic (``_heuristic``) is a lower bound of the remaining price: launches and
latency of the collectives each mesh dim still needs, local launches, and a bandwidth
floor. The search prunes commuting steps taken in
the costlier order, never turns a dim Partial that the goal does not hold (unless a
merged step may reduce it with an alias's other dims), and evaluates the heuristic
lazily.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading

from meshplan.placement import dtype_itemsize

from ._cost import (
    COLLECTIVES,
    FLATTENED,
    Link,
    chain_extent,
    collective_weight,
    group_link,
)
from ._encoding import MERGEABLE, alias_dims
from ._exact import (
    _smallest_piece,
    even_steps,
    exact_covers,
    links,
    piece_classes,
    tiny_dims,
)
from ._general import general_bound, general_kept_bound, general_permutes
from ._heuristic import ANY, SHARD_ANY, SUMAVG, R, _Bounds
from ._problem import Problem
from ._price import (
    _hub_key,
    _prefix_length,
    _suffix_mask,
    _tie,
    price_coefficients,
    step_price,
)

__all__ = [
    "R",
    "SUMAVG",
    "Context",
    "SharedMoves",
    "search",
    "mixable",
    "price_coefficients",
    "step_price",
]

_SUMAVG = SUMAVG


# -- the search context ---------------------------------------------------------------------

# A transition: (price, next_state, mesh_dims, collective, n_send, scaled, touch). ``touch``
# lists the tensor dims whose shard orders a structural single-dim step changes (its mesh
# dim leaves the end of one order and joins the end of another); None for other steps.


class Context(_Bounds):
    """Everything a search needs that depends on the mesh/tensor/model, not on the pair:
    built from a :class:`~._problem.Problem`; ``moves``: the shape-free moves it shares
    with the other contexts of its planner (:class:`SharedMoves`)."""

    def __init__(self, problem: Problem, moves: SharedMoves):
        mesh, shape, dtype, model = problem.mesh, problem.shape, problem.dtype, problem.model
        shards, ptargets, bound = problem.shards, problem.ptargets, problem.bound
        objective, merge = problem.objective, problem.merge
        self.problem = problem
        self.moves = moves
        self.mesh = mesh
        self.sizes = mesh.shape
        self.active = tuple(m for m, n in enumerate(mesh.shape) if n > 1)
        self.shape = shape
        self.ndim = len(shape)
        self.dtype = dtype
        self.itemsize = dtype_itemsize(dtype)
        self.model = model
        self.shards = shards
        self.ptargets = ptargets
        self.bound = bound
        self.objective = objective
        self.strided = any(c[1] > 1 for c in shards)
        self.empty = 0 in shape
        # tensor dims where a mesh dim may leave or join the middle of an order: tiny
        # dims (some order of mesh dims leaves a piece empty) and dims with StridedShards
        # (an SS may encode an order); such moves are checked exactly, and the heuristic
        # ignores order positions there. A tensor without elements takes every such move
        # (no rank holds or needs an element: ``_exact``)
        self.tiny = tiny_dims(shape, mesh.shape, shards)
        # keys of the shape-free moves (:class:`SharedMoves`)
        # this context shares with others on the mesh: a tiny dim's moves depend on its
        # length, unless every shard order chunks it evenly (-2: a multiple of its
        # ``even_steps``, where every exact check answers alike)
        self._permutes_key = (self.sizes, self.active, shards, self.ndim)
        even = even_steps(self.sizes, self.ndim, shards)
        self._moves_key = self._permutes_key + (
            ptargets,
            tuple(
                -1 if not t else -2 if length and length % step == 0 else length
                for length, t, step in zip(shape, self.tiny, even, strict=True)
            ),
        )
        # the memo tables below are shared by every search on this context: one at a time
        self.lock = threading.Lock()
        self.tabled = None  # whether a plan table fits (``_table``), once known
        self.family = False  # its family of sizes (``_family.family_of``), once known
        self.planned = 0  # pairs planned by search, towards building the table
        self.lazy = 0  # how many (``_table.lazy_pairs``), once the table is known to fit
        self._ids: dict = {}  # state -> id (states are hashed once, then ids are used)
        self.states: list = []
        self._nbytes: list = []
        self._ext: dict = {}
        self._succ: dict = {}  # state -> its single-dim transitions
        self._perms: dict = {}  # state -> its all_permute transitions (for tables)
        self._general: dict = {}  # state -> its general all_permutes (``_general``)
        self._most_missing: dict = {}  # (state, goal, reduce) -> ``_general.most_missing``
        self._permute_floor = None  # ``_general.permute_bytes_floor``, once known
        self._cut: dict = {}  # ``_general.cut_floor``'s memo
        self.general = len(self.active) >= 2  # whether searches take general permutes
        self._hubs: dict = {}  # state -> its transitions into permute hubs
        self._members: dict = {}  # permute hub node -> its transitions out
        self._floor: dict = {}  # state -> lower bound of their prices
        self._merge_floors: dict = {}  # state -> lower bound of its merged steps' prices
        self._coef: dict = {}
        self._overlap: dict = {}
        self._pieces: dict = {}  # (tensor dim, order, placements) -> piece id
        self._piece_list: list = []  # piece id -> the first rank's index intervals
        self._state_pieces: dict = {}  # state -> its piece ids (``_pieces_of``)
        self._exacts: dict = {}  # ``_exact``'s answers
        self._relabel_memo: dict = {}  # the heuristic's ``_may_relabel`` answers
        self._goal_info: dict = {}
        self._h: dict = {}
        self._kept_bounds: dict = {}  # (state, goal) -> ``kept_bound`` (permutes out of it)
        self._covers: dict = {}  # the heuristic's collective counts (``_cover``)
        self._red_memo: dict = {}  # the heuristic's reduction weights (``_reduce_weight``)
        self._group_memo: dict = {}  # the heuristic's re-shard groups (``_group``)
        self._apart_memo: dict = {}  # the heuristic's collectives apart (``_apart``)
        self._groups: dict = {}  # bit mask of mesh dims -> (dims, ranks in their group)
        self._kept: dict = {}  # (prev, step into state, state) -> successors kept by the
        # commuting-steps reduction (independent of the goal)
        hw = model.profile
        self.launch = hw.launch_s
        self.local_launch = hw.local_launch_s
        self.copy = 1.0 / hw.copy_bytes_per_s
        self._set_aliases(merge)
        # per mesh dim, each collective's link (a profile may give each its own), and the
        # fastest of them: the bounds below hold for every step. A step merged onto an
        # alias runs on the alias's links when the profile has them (``flattened``): on
        # each of its dims, a collective's link is the faster of the dim's and the alias's
        own = [
            {kind: group_link(model, mesh, (m,), kind) for kind in COLLECTIVES}
            for m in range(mesh.ndim)
        ]
        for _, dims in self.aliases:
            for kind in FLATTENED:
                link = group_link(model, mesh, dims, kind)
                for m in dims:
                    mine = own[m][kind]
                    own[m][kind] = Link(
                        min(mine.latency_s, link.latency_s), max(mine.bytes_per_s, link.bytes_per_s)
                    )
        best = [
            Link(min(x.latency_s for x in d.values()), max(x.bytes_per_s for x in d.values()))
            for d in own
        ]
        self.alpha_log = tuple(
            best[m].latency_s * math.log2(n) if n > 1 else 0.0 for m, n in enumerate(mesh.shape)
        )
        # the least latency of any collective (one on a single mesh dim, at least)
        self.alpha_floor = min([self.alpha_log[m] for m in self.active] or [0.0])
        # the least latency of one hop of any collective (a general permute's, at least)
        self.latency_floor = min([best[m].latency_s for m in self.active] or [0.0])
        # the most ranks one gathering collective spans (a dim, or an alias's dims)
        self.widest_group = max(
            [self.sizes[m] for m in self.active]
            + [math.prod(self.sizes[m] for m in dims) for _, dims in self.aliases]
            or [2]
        )
        self.dim_bw = tuple(link.bytes_per_s for link in best)
        self.fastest = max([self.dim_bw[m] for m in self.active] or [1.0])
        # what the first rank lacks, in seconds per byte at least: the model charges an
        # all_to_all or all_permute (k-1)/k of its output, however much of it a rank
        # receives, so a byte received may cost as little as (k-1)/k of one on the link
        self.missing_rate = (
            min([(self.sizes[m] - 1) / self.sizes[m] for m in self.active] or [1.0]) / self.fastest
        )
        self.total_bytes = self.itemsize * math.prod(shape)
        # the "collectives" objective: each collective costs more than any plan's time
        self.per_collective = (
            collective_weight(model, mesh, self.total_bytes) if objective == "collectives" else 0.0
        )
        # per mesh dim, seconds per byte of the smallest local tensor a collective on it
        # can run on: (gather: (n-1) x its input; reduce: (n-1)/n x its input, plus the
        # reduction; other shard change: (n-1)/n x, plus a copy; all_reduce: 2 (n-1)/n x,
        # plus the reduction)
        # Where a profile gives collectives links of their own, a gather runs as an
        # all_gather or (of a shard made Partial) an all_reduce, a reduction as a
        # reduce_scatter or an all_reduce, an all_reduce as itself: each bound takes the
        # faster of the links that can serve it (the same link everywhere otherwise)
        self.weights = []
        self.gather_alpha = []  # latency (times log2 of the dim's size) of a gather
        self.reduce_alpha = []  # ... of a reduction
        # An all_reduce moves 2 (n-1)/n of its input in twice the hops; so does a
        # reduce_scatter on a backend that runs it as one (``reduce_scatter_via_all_reduce``)
        via = hw.reduce_scatter_via_all_reduce
        for m, n in enumerate(mesh.shape):
            bw = best[m].bytes_per_s
            ag, rs, ar = own[m]["all_gather"], own[m]["reduce_scatter"], own[m]["all_reduce"]
            f = (n - 1) / n if n > 1 else 0.0
            rs_bw = rs.bytes_per_s / 2 if via else rs.bytes_per_s
            self.weights.append(
                (
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
        # temporarily sharding a dim replicated in source and target: a slice and a gather
        # (on an alias dim the gather may ride in a merged step, at no launch of its own)
        gather = hw.launch_s + self.per_collective
        self.detour = [
            hw.local_launch_s + (0.0 if m in self.merge_dims else gather + self.alpha_log[m])
            for m in range(mesh.ndim)
        ]
        self.detour_floor = min(self.detour) if self.detour else 0.0
        # the gather that ends a detour, as an item of the heuristic's gather sequence
        # (``_Bounds._orders``); on an alias dim it may ride a merged step, which moves no
        # fewer bytes than the dims' gathers one after another (``gather_share``)
        self.detour_items = [
            ((self.weights[m][0] * self.gather_share[m], n, -1, 0),)
            for m, n in enumerate(mesh.shape)
        ]

    def _set_aliases(self, merge: bool) -> None:
        """The mesh's aliases a merged step can run on (none unless ``merge``), and what
        they weaken in the heuristic."""

        self.aliases = tuple(
            (name, dims)
            for name, dims in (alias_dims(self.mesh).items() if merge else ())
            if len(dims) > 1 and all(self.sizes[m] > 1 for m in dims)
        )
        self.merge_dims = frozenset(m for _, dims in self.aliases for m in dims)
        self._merges: dict = {}
        # the shape-free merged moves (``SharedMoves.merged``) depend on the aliases' dims too
        self._merges_key = (self._moves_key, tuple(dims for _, dims in self.aliases))
        # the heuristic's allowances for merged steps: one collective may serve ``widest``
        # dims
        self.widest = max((len(d) for _, d in self.aliases), default=1)
        # a merged reduction over an alias's N ranks moves (N-1)/N of its input, ``r`` of
        # what its dims' single-dim reductions would move on that input; but it runs with
        # every dim of the alias Partial, so on an input none of them splits (the
        # heuristic's ``_reduce_weight``). Per mesh dim: (bit mask of the alias, r) of
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

    def _trim(self) -> None:
        # bound the memo tables (a long-lived process plans many pairs on one context);
        # only between searches, as ids must stay stable during one
        if len(self.states) > 200000:
            self._ids.clear()
            self.states.clear()
            self._nbytes.clear()
            self._succ.clear()
            self._perms.clear()
            self._general.clear()
            self._most_missing.clear()
            self._cut.clear()
            self._hubs.clear()
            self._members.clear()
            self._floor.clear()
            self._merge_floors.clear()
            self._overlap.clear()
            self._pieces.clear()
            self._piece_list.clear()
            self._state_pieces.clear()
            self._exacts.clear()
            self._relabel_memo.clear()
            self._goal_info.clear()
            self._red_memo.clear()
            self._group_memo.clear()
            self._apart_memo.clear()
            self._h.clear()
            self._kept_bounds.clear()
            self._kept.clear()
            self._merges.clear()

    def intern(self, state) -> int:
        i = self._ids.get(state)
        if i is None:
            i = self._ids[state] = len(self.states)
            self.states.append(state)
            codes, chains = state
            b = self.itemsize
            for d, chain in enumerate(chains):
                # (a pattern's orders, ``is_pattern``: its bytes are never asked)
                b *= self.extent(d, chain, codes) if type(chain) is tuple else self.shape[d]
            self._nbytes.append(b)
        return i

    # sizes
    def extent(self, d: int, chain: tuple, codes: tuple) -> int:
        key = (d, chain, tuple(codes[m][1] for m in chain)) if self.strided else (d, chain)
        e = self._ext.get(key)
        if e is None:
            sizes = self.sizes
            kinds = tuple((sizes[m], codes[m][1]) for m in chain)
            e = self._ext[key] = chain_extent(self.shape[d], kinds)
        return e

    def nbytes(self, i: int) -> int:
        return self._nbytes[i]

    def price(self, dims, collective, n_send, b_in, b_out, scaled=False) -> float:
        return step_price(self._coefs(dims, collective, n_send), b_in, b_out, scaled, self.copy)

    def _coefs(self, dims, collective, n_send) -> tuple[float, float, float]:
        key = (dims, collective, n_send)
        c = self._coef.get(key)
        if c is None:
            c = self._coef[key] = price_coefficients(
                self.model, self.mesh, dims, collective, n_send, self.per_collective
            )
        return c

    # transitions
    def successors(self, i: int):
        """Every transition from state ``i`` (see the tuple layout above); goal-free. In
        the order :func:`search` relaxes them (single-dim steps, merged steps, permutes),
        so that of two moves to one state at one price, a table keeps the search's."""
        out = self.singles(i) + self.merges(i) + self.permutes(i)
        return out + general_permutes(self, i) if self.general else out

    def heuristic(self, state, goal) -> float:
        """A lower bound on the price of any plan from ``state`` to ``goal`` (ids): the
        least of the per-dim bound (``_heuristic``) and, where general permutes are
        moves, the bound of plans taking one (``_general``)."""
        h = _Bounds.heuristic(self, state, goal)
        if self.general:
            g = general_bound(self, state, goal)
            if g < h:
                return g
        return h

    def kept_bound(self, state, goal) -> float:
        """A lower bound on the price from any state an all_permute out of ``state`` leads
        to, to ``goal`` (ids): ``_heuristic``'s, or one of plans taking a general permute."""
        h = _Bounds.kept_bound(self, state, goal)
        if self.general:
            g = general_kept_bound(self, state, goal)
            if g < h:
                return g
        return h

    def singles(self, i: int):
        """The single-dim transitions from state ``i``."""
        out = self._succ.get(i)
        if out is None:
            moves = self.moves.get(self.moves.singles, self._moves_key, self.states[i], self._successors)
            out = self._succ[i] = self._priced(i, moves)
        return out

    def permutes(self, i: int):
        """The all_permute transitions from state ``i``, each priced as the two halves of
        its way through a permute hub (:meth:`hub_moves`, :meth:`hub_members`) add up."""
        out = self._perms.get(i)
        if out is None:
            out = self._perms[i] = tuple(
                (first + second[0],) + second[1:]
                for first, node, dims, _, n_send in self.hub_moves(i)
                for second in self.hub_members(node, dims, n_send)
            )
        return out

    def _hub_list(self, i: int) -> tuple:
        return self.moves.get(self.moves.hubs, self._permutes_key, self.states[i], self._hubs_of)

    def hub_moves(self, i: int):
        """The transitions from state ``i`` into the permute hubs it reaches: the first
        half of each all_permute's price (its launch and its input)."""
        out = self._hubs.get(i)
        if out is None:
            b_in = self._nbytes[i]
            bound = self.bound
            found = []
            for hub, dims, n_send, tie in self._hub_list(i):
                c = self._coefs(dims, "all_permute", n_send)
                # under a memory bound a hub's members depend on the input's size
                node = (hub,) if bound is None else (hub, b_in)
                found.append(((c[0] + c[1] * b_in) * tie, node, dims, "all_permute", n_send))
            out = self._hubs[i] = tuple(found)
        return out

    def hub_members(self, node: tuple, dims, n_send):
        """The transitions out of a permute hub node (:meth:`hub_moves`): to every state
        its all_permutes reach, the second half of their prices (the output)."""
        out = self._members.get(node)
        if out is None:
            hub = node[0]
            c_out = self._coefs(dims, "all_permute", n_send)[2]
            bound = self.bound
            b_in = node[1] if bound is not None else 0
            ids, intern, nbytes = self._ids, self.intern, self._nbytes
            found = []
            for t, tie in self.moves.get(
                self.moves.hub_members, self._permutes_key, hub, self._hub_members
            ):
                j = ids.get(t)
                if j is None:
                    j = intern(t)
                b_out = nbytes[j]
                if bound is None or b_in + b_out <= bound:
                    found.append((c_out * b_out * tie, j, dims, "all_permute", n_send, False, None))
            out = self._members[node] = tuple(found)
        return out

    def _priced(self, i: int, moves: tuple) -> tuple:
        """Transitions (see the tuple layout above) from state ``i``: its shape-free
        ``moves`` priced on this context's tensor, within its memory bound."""
        b_in = self._nbytes[i]
        bound, ids, intern, nbytes = self.bound, self._ids, self.intern, self._nbytes
        coef, coefs, copy = self._coef, self._coefs, self.copy
        out = []
        for t, dims, collective, n_send, scaled, touch, tie in moves:
            j = ids.get(t)
            if j is None:
                j = intern(t)
            b_out = nbytes[j]
            if bound is None or b_in + b_out <= bound:
                c = coef.get((dims, collective, n_send)) or coefs(dims, collective, n_send)
                c = step_price(c, b_in, b_out, scaled, copy) * tie
                out.append((c, j, dims, collective, n_send, scaled, touch))
        return tuple(out)

    def merges(self, i: int):
        """The merged steps from state ``i``: like-kind collectives over every dim of an
        alias at once (``()`` on a mesh without aliases)."""
        if not self.aliases:
            return ()
        out = self._merges.get(i)
        if out is None:
            out = self._merges[i] = self._priced_merges(i)
        return out

    def _priced_merges(self, i: int) -> tuple:
        # under a memory bound only the merged step's own input and output must fit, not
        # the states its chain passes through
        b_in = self._nbytes[i]
        bound, ids, intern, nbytes = self.bound, self._ids, self.intern, self._nbytes
        out = []
        moves = self.moves.get(self.moves.merged, self._merges_key, self.states[i], self._merged)
        for t, dims, kind, n_send, scaled, tie in moves:
            j = ids.get(t)
            if j is None:
                j = intern(t)
            b_out = nbytes[j]
            if bound is not None and b_in + b_out > bound:
                continue
            c = self.price(dims, kind, n_send, b_in, b_out, scaled) * tie
            out.append((c, j, dims, kind, n_send, scaled, None))
        return tuple(out)

    def _merged(self, state) -> tuple:
        """The shape-free merged moves out of ``state``: ``(next_state, dims, collective,
        n_send, scaled, tie factor)``. A merged step ends where a chain of like-kind
        single-dim steps over the alias's dims (in any order) ends; it is a move when it
        is one valid step (``_merge``'s rules). Chains are shape-free (``_chain_moves``),
        and so is the check at their ends: on a tensor dim that is not tiny, every link
        leaves an order from its end and joins one at its end, so the orders keep a common
        prefix and differ only in the step's dims after it (the structural rule)."""

        codes = state[0]
        out = []
        for _, dims in self.aliases:
            # a merged step moves each of its dims once: from Partial (all_reduce,
            # reduce_scatter) or from a shard (all_gather, all_to_all)
            if all(type(codes[m]) is tuple for m in dims):
                kinds = ("all_gather", "all_to_all")
            elif all(type(codes[m]) is int and codes[m] != R for m in dims):
                kinds = ("all_reduce", "reduce_scatter")
            else:
                continue
            for kind in MERGEABLE:
                if kind not in kinds:
                    continue
                for end in self._chain_ends(state, dims, (1 << len(dims)) - 1, kind):
                    if end == state or not self._valid_merge(state, end, dims, kind):
                        continue
                    n_send = 1
                    if kind in ("all_gather", "all_to_all"):
                        n_send = math.prod(self.sizes[m] for m in dims if type(codes[m]) is tuple)
                    scaled = kind in ("all_reduce", "reduce_scatter") and any(
                        codes[m] == 2 for m in dims
                    )
                    out.append((end, dims, kind, n_send, scaled, _tie(state, end)))
        return tuple(out)

    def _chain_ends(self, state, dims: tuple, left: int, kind: str) -> tuple:
        """Where chains of single-dim ``kind`` collectives out of ``state`` end that move
        each of the alias dims ``dims`` picked by the bit mask ``left`` once, in any order.

        Shape-free and shared (``SharedMoves.chain_ends``): the states a chain passes through are the
        same for many starts (each link changes its mesh dim's placement and no other, so
        a state tells which dims moved), and the ends from there are found once. A start
        with ``k`` dims left has up to ``k!`` chains to each end; each link is followed
        once per state it leaves, not once per chain."""
        if not left:
            return (state,)
        key = (self._merges_key, state, dims, left, kind)
        memo = self.moves.chain_ends
        ends = memo.get(key)
        if ends is None:
            found: dict = {}
            for t, (m,), *_ in self._chain_moves(state, dims, kind):
                bit = 1 << dims.index(m)
                if left & bit:
                    for end in self._chain_ends(t, dims, left & ~bit, kind):
                        found[end] = None
            if len(memo) >= _MOVES_KEPT:
                memo.clear()
            ends = memo[key] = tuple(found)
        return ends

    def _chain_moves(self, state, dims: tuple, kind: str) -> tuple:
        """The single-dim ``kind`` collectives on ``dims`` out of ``state`` (shape-free,
        unbounded): the links of the chains a merged step stands for."""
        only = (dims, kind)
        return self.moves.get(
            self.moves.chain_moves,
            (self._moves_key, only),
            state,
            lambda s: self._successors(s, only),
        )

    def _valid_merge(self, a, b, dims: tuple, kind: str) -> bool:
        """Whether a merged ``kind`` over ``dims`` takes state ``a`` to the chain end ``b``
        in one valid step (shape-free: see :meth:`_merged`)."""
        if kind == "all_reduce":
            return all(type(a[0][m]) is int and a[0][m] != R for m in dims) and all(
                b[0][m] == R for m in dims
            )
        return self._valid_moving_merge(a, b, dims, kind, shape_free=True)

    def _valid_moving_merge(self, a, b, dims: tuple, kind: str, shape_free=False) -> bool:
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
            elif type(c) is not tuple or (
                (n != R) if kind == "all_gather" else (type(n) is not tuple)
            ):
                return False
        if self.empty:
            return True  # no rank holds or needs an element
        sizes = self.sizes
        group = tuple(sorted(dims))
        for d, (x, y) in enumerate(zip(chains, new_chains, strict=True)):
            k = _prefix_length(codes, x, new_codes, y)
            if all(m in dims for m in x[k:]) and all(m in dims for m in y[k:]):
                continue
            if shape_free and not self.tiny[d]:
                return False
            src = links(sizes, codes, x)
            dst = links(sizes, new_codes, y)
            if not exact_covers(self.shape[d], src, dst, group):
                return False
        return True

    def merges_floor(self, i: int) -> float:
        """A lower bound on the price of every merged step from state ``i`` (inf: none):
        over the aliases whose dims are all sharded (a merged all_gather or all_to_all) or
        all Partial (all_reduce, reduce_scatter), the step's price on this input and the
        least output any step can have (the tensor split over every dim sharded here and
        the alias's)."""
        f = self._merge_floors.get(i)
        if f is None:
            codes = self.states[i][0]
            b_in = self._nbytes[i]
            split = math.prod(self.sizes[m] for m in self.active if type(codes[m]) is tuple)
            f = math.inf
            for _, dims in self.aliases:
                if all(type(codes[m]) is tuple for m in dims):
                    n = math.prod(self.sizes[m] for m in dims)
                    kinds = (("all_gather", n), ("all_to_all", n))
                elif all(type(codes[m]) is int and codes[m] != R for m in dims):
                    kinds = (("all_reduce", 1), ("reduce_scatter", 1))
                else:
                    continue
                least = self.total_bytes / (split * math.prod(self.sizes[m] for m in dims))
                for kind, n_send in kinds:
                    c = self._coefs(dims, kind, n_send)
                    v = c[0] + c[1] * b_in + c[2] * least
                    if v < f:
                        f = v
            self._merge_floors[i] = f
        return f

    def permute_floor(self, i: int) -> float:
        """A lower bound on the price of every all_permute from state ``i`` (inf: none)."""
        f = self._floor.get(i)
        if f is None:
            codes = self.states[i][0]
            sharded = [m for m in self.active if type(codes[m]) is tuple]
            b_in = self._nbytes[i]
            f = min(
                (
                    self.price(g, "all_permute", self.sizes[g[0]] * self.sizes[g[1]], b_in, 0)
                    for g in itertools.combinations(sharded, 2)
                ),
                default=math.inf,
            )
            self._floor[i] = f
        return f

    def _hubs_of(self, state) -> tuple:
        """The permute hubs ``state`` reaches, as shape-free ``(hub, mesh dims, group size,
        tie factor)``. An all_permute keeps which mesh dims shard (and every other dim's
        placement); per tensor dim the old and new shard orders share a prefix (mesh dims
        and placements), and the mesh dims after it (at least two, over every tensor dim)
        exchange pieces. A hub stands for one such choice of prefixes: its key is the
        state with those dims blanked (-1), the prefixes and, per tensor dim, the entry
        after the prefix (``-1``: none), which a target must not repeat (else its
        common prefix with ``state`` is longer). Every permute out of ``state`` passes
        through exactly one of its hubs, and states sharing a hub share its targets."""
        codes, chains = state
        if sum(1 for m in self.active if type(codes[m]) is tuple) < 2:
            return ()
        out = []
        groups = self._groups
        for ks in itertools.product(*(range(len(chain) + 1) for chain in chains)):
            mask = _suffix_mask(chains, ks)
            if not mask & (mask - 1):
                continue  # no exchange, or a single-dim step
            hub = _hub_key(codes, chains, ks, mask)
            g = groups.get(mask)
            if g is None:
                dims = tuple(m for m in range(len(self.sizes)) if mask >> m & 1)
                g = groups[mask] = (dims, math.prod(self.sizes[m] for m in dims))
            out.append((hub, g[0], g[1], _tie(state, hub)))
        return tuple(out)

    def _hub_members(self, hub) -> tuple:
        """The states a permute hub leads to (shape-free ``(state, tie factor)``): its
        blanked mesh dims take every shard placement and, per tensor dim, every order
        after the prefix that does not start with the hub's entry there."""
        base, prefixes, nexts = hub
        free = [m for m, c in enumerate(base) if c == -1]
        orders: dict = {}  # tensor dims of the free mesh dims -> their orders (below)
        out = []
        for assign in itertools.product(self.shards, repeat=len(free)):
            codes = list(base)
            for m, c in zip(free, assign, strict=True):
                codes[m] = c
            codes = tuple(codes)
            key = tuple([c[0] for c in assign])
            per = orders.get(key)
            if per is None:
                per = orders[key] = _hub_orders(free, key, prefixes, nexts)
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
                    out.append((t, _tie(hub, t)))
        return tuple(out)

    def _successors(self, state, only=None):
        """The single-dim steps out of ``state``, as shape-free moves (``_priced``); with
        ``only = (mesh dims, collective)``, just those collectives on those dims (the
        same moves, in the same order)."""
        codes, chains = state
        out: list = []
        sizes = self.sizes
        want_dims, kind = only if only is not None else (None, None)

        def add(dims, collective, t, touch, n_send=1, scaled=False):
            out.append((t, dims, collective, n_send, scaled, touch, _tie(state, t)))

        for m in self.active:
            if want_dims is not None and m not in want_dims:
                continue
            a = codes[m]
            dims = (m,)
            if a == R:
                if kind is not None:
                    continue  # local steps only
                for code in self.shards:
                    for t, touch in self._inserted(state, codes, chains, m, code):
                        add(dims, None, t, touch)
                for op in self.ptargets:
                    if mixable(codes, op):
                        add(dims, None, (_put(codes, m, op), chains), ())
            elif type(a) is int:
                scaled = a == 2
                if kind is None or kind == "all_reduce":
                    add(dims, "all_reduce", (_put(codes, m, R), chains), (), 1, scaled)
                if kind is None or kind == "reduce_scatter":
                    for code in self.shards:
                        for t, touch in self._inserted(state, codes, chains, m, code):
                            add(dims, "reduce_scatter", t, touch, 1, scaled)
                if a in _SUMAVG and kind is None:
                    for op in self.ptargets:
                        if op in _SUMAVG and op != a:
                            add(dims, None, (_put(codes, m, op), chains), ())
            elif kind is None or kind == "all_gather" or kind == "all_to_all":
                d = a[0]
                chain = chains[d]
                last = chain[-1] == m
                rest = chain[:-1] if last else tuple(x for x in chain if x != m)
                n = sizes[m]
                removed = _put(chains, d, rest)
                gone = (_put(codes, m, R), removed)
                if last or self._exact(state, d, gone, rest, m):
                    touch = (d,) if last else None
                    if kind is None or kind == "all_gather":
                        add(dims, "all_gather", gone, touch, n)
                    if kind is None:
                        for op in self.ptargets:
                            if mixable(codes, op):
                                add(dims, None, (_put(codes, m, op), removed), touch)
                    others_ok = True
                else:
                    others_ok = False
                if kind == "all_gather":
                    continue
                for code in self.shards:
                    if code == a or (code[0] != d and not others_ok):
                        continue
                    for t, touch in self._inserted(state, codes, removed, m, code, last):
                        if touch is not None and code[0] != d:
                            touch = (d, code[0]) if last else None
                        add(dims, "all_to_all", t, touch, n)
                if kind is None and self.tiny[d]:
                    for t in self._relabels(state, m, d):
                        add(dims, None, t, None)
        return tuple(out)

    def _relabels(self, state, m: int, d: int) -> list:
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
        found = self._exacts.get(key)
        if found is None:
            found = self._exacts[key] = self._relabels_uncached(codes, chain, m, d)
        return [(_put(codes, m, code), _put(chains, d, c)) for code, c in found]

    def _relabels_uncached(self, codes, chain, m: int, d: int) -> list:
        options = [c for c in self.shards if c[0] == d and c != codes[m]]
        if self.empty:  # no rank holds an element: every relabel keeps the (empty) pieces
            return [(code, c) for code in options for c in itertools.permutations(chain)]
        dims = tuple(sorted(chain))
        codes_of_d = tuple([c for c in self.shards if c[0] == d])
        sig_of, members = piece_classes(self.shape[d], dims, self.sizes, codes_of_d)
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

    def _inserted(self, state, codes, chains, m, code, last=True):
        """``(state, touch)`` where mesh dim ``m`` takes shard ``code``, joining its tensor
        dim's order last (valid when ``m`` left its old order from the end), or, for tiny
        dims, anywhere the exact check allows."""
        d = code[0]
        base = chains[d]
        new_codes = _put(codes, m, code)
        t = (new_codes, _put(chains, d, base + (m,)))
        old = codes[m]
        same_dim = type(old) is tuple and old[0] == d
        if last or not same_dim:
            yield t, (d,)
        elif self._exact(state, d, t, base + (m,), m):
            yield t, None
        if self.tiny[d]:
            for i in range(len(base)):
                new_chain = base[:i] + (m,) + base[i:]
                t = (new_codes, _put(chains, d, new_chain))
                if self._exact(state, d, t, new_chain, m):
                    yield t, None

    def _exact(self, state, d, new_state, new_chain, m) -> bool:
        """Whether mesh dim ``m`` may leave or join the middle of tensor dim ``d``'s order
        (a tiny dim), taking ``state`` to ``new_state`` (``new_chain`` its order of ``d``):
        the exact check on index intervals, memoized on what it reads."""
        if not self.tiny[d]:
            return False
        if self.empty:
            return True  # no rank holds or needs an element
        chain = state[1][d]
        if self.strided:
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
        ok = self._exacts.get(key)
        if ok is None:
            ok = self._exacts[key] = self._exact_uncached(state, d, new_state, new_chain, m)
        return ok

    def _exact_uncached(self, state, d, new_state, new_chain, m) -> bool:
        codes, chains = state
        new_codes = new_state[0]
        src = links(self.sizes, codes, chains[d])
        dst = links(self.sizes, new_codes, new_chain)
        length = self.shape[d]
        if all(sf == 1 for _, _, sf in src + dst) and (
            _smallest_piece(length, tuple(n for _, n, _ in src)) > 0
            and _smallest_piece(length, tuple(n for _, n, _ in dst)) > 0
        ):
            # plain shards, no empty piece: each rank's pieces are disjoint runs that only
            # the structural moves keep inside its group's holdings
            return False
        return exact_covers(length, src, dst, m)


_MOVES_KEPT = 100000  # entries per memo before it starts over


class SharedMoves:
    """Shape-free moves out of states, shared by the contexts of one mesh and placement
    universe (tensor shapes, dtypes, cost models, memory bounds): a context prices them
    on its tensor (``Context._priced``). Each memo is keyed by ``(context key, state)``:

    * ``singles``: single-dim steps, ``(next_state, mesh_dims, collective, n_send, scaled,
      touch, tie factor)``;
    * ``hubs``: a state's permute hubs (``Context._hubs_of``), ``hub_members``: a hub's
      targets (``Context._hub_members``);
    * ``merged``: the steps merged onto the mesh's aliases (``Context._merged``, keyed by
      the aliases' dims too), built from ``chain_moves`` (single-dim collectives on an
      alias's dims) and ``chain_ends`` (where chains of them end).
    """

    __slots__ = ("singles", "hubs", "hub_members", "chain_moves", "chain_ends", "merged")

    def __init__(self) -> None:
        self.singles: dict = {}
        self.hubs: dict = {}
        self.hub_members: dict = {}
        self.chain_moves: dict = {}
        self.chain_ends: dict = {}
        self.merged: dict = {}

    def get(self, memo: dict, prefix: tuple, state, generate) -> tuple:
        """The moves out of ``state`` in ``memo`` under the context's key ``prefix``,
        generated (``generate(state)``) the first time any context asks."""
        key = (prefix, state)
        moves = memo.get(key)
        if moves is None:
            if len(memo) >= _MOVES_KEPT:
                memo.clear()
            moves = memo[key] = generate(state)
        return moves

    def clear(self) -> None:
        for name in self.__slots__:
            getattr(self, name).clear()


def _hub_orders(free: list, dims: tuple, prefixes: tuple, nexts: tuple) -> list:
    """Per tensor dim ``d``, the orders a permute hub's targets may take when its free
    mesh dims ``free`` shard the tensor dims ``dims``: ``[every order, those not starting
    with the mesh dim m0 (None until asked for), m0, c0, prefix length]``, the latter for
    a target whose ``m0`` has the placement ``c0`` (the hub's entry after the prefix,
    ``nexts[d]``: else its common prefix with the source would be longer); ``m0 = -1``
    when no order can start with it."""
    per = []
    for d, (prefix, nxt) in enumerate(zip(prefixes, nexts, strict=True)):
        members = [m for m, x in zip(free, dims, strict=True) if x == d]
        every = [prefix + order for order in itertools.permutations(members)]
        if nxt != -1 and nxt[0] in members:
            per.append([every, None, nxt[0], nxt[1], len(prefix)])
        else:
            per.append([every, every, -1, None, 0])
    return per


def _put(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1 :]


def mixable(codes, op) -> bool:
    for c in codes:
        if type(c) is int and c != R and c != op and not (c in _SUMAVG and op in _SUMAVG):
            return False
    return True


def search(ctx: Context, start: int, goal):
    """A* from state ``start`` to ``goal`` (ids; or a tuple of them, states of one layout,
    the first to reach ends the search); ``(cost, [(state, transition, next)])``.

    With several goals the heuristic is the least of theirs (a lower bound of the price to
    the nearest, consistent as each is), so the first goal taken from the queue is the
    cheapest to reach.

    Prices carry the tie-breaking factor of :func:`_tie`, so the minimum is unique: the
    search and a plan table (``_table``) find the same plan. Partial-order reduction:
    when two structural single-dim steps on different mesh dims and different shard
    orders commute, only the cheaper order is kept, so independent steps are not tried
    in every order.
    """
    heuristic = ctx.heuristic
    kept_bound = ctx.kept_bound
    hmemo = ctx._h
    singles = ctx.singles
    states = ctx.states

    goals = (goal,) if type(goal) is int else tuple(goal)
    goal = goals[0] if len(goals) == 1 else goals
    # (the goals differ only in how they say shards: their Partial dims are the same)
    goal_codes = states[goals[0]][0]
    # a pattern (``unreduced_goal``, ``class_goal``) is every state it admits
    pattern = is_pattern(states[goals[0]])
    kept_memo = ctx._kept
    kept_bounds = ctx._kept_bounds
    merges_on = bool(ctx.aliases)
    merge_dims = ctx.merge_dims
    general = ctx.general
    general_floor = ctx.launch + ctx.per_collective + ctx.latency_floor
    copy = ctx.copy

    def h_of(i):
        key = (i, goal)
        h = hmemo.get(key)
        if h is None:
            h = hmemo[key] = min([heuristic(i, g) for g in goals])
        return h

    memo: dict = {start: h_of(start)}
    best = {start: 0.0}
    parent: dict = {start: None}
    counter = itertools.count()
    heap = [(memo[start], 0.0, 0, start)]
    closed = set()
    done: dict = {}  # permute hub -> the cost it was expanded at
    push = heapq.heappush

    def relax(i, g, h, succ, floor=0.0):
        # (``floor``: a lower bound of the rest from every state of ``succ``)
        for trans in succ:
            c, t = trans[0], trans[1]
            if trans[3] is None and trans[6] == () and len(trans[2]) == 1:
                # Replicate -> Partial, or sum <-> avg, on a mesh dim the goal keeps
                # un-Partial: whatever reduces it later could have run without it (unless
                # it is reduced in a step merged onto an alias, the only one there may be)
                m = trans[2][0]
                b = goal_codes[m]
                if (type(b) is not int or b <= R) and m not in merge_dims:
                    continue
            ng = g + c
            old = best.get(t)
            if old is None or ng < old:
                best[t] = ng
                parent[t] = (i, trans)
                ht = memo.get(t)
                if ht is None:
                    ht = h - c if h - c > floor else floor
                push(heap, (ng + ht, -ng, next(counter), t))
                closed.discard(t)

    one = len(goals) == 1 and not pattern
    reached = limit = None  # goals reached at the least price, and that price
    while heap:
        key, neg_g, _, i = heapq.heappop(heap)
        if reached is not None and key > limit:
            break
        g = -neg_g
        if type(i) is tuple:
            # a permute hub, reached at ``g`` with ``key - g`` a lower bound of the rest
            if g <= best[i] and done.get(i, math.inf) > g:
                done[i] = g
                source, via = parent[i]
                kept = kept_bounds.get((source, goal))
                if kept is None:
                    kept = kept_bounds[(source, goal)] = min([kept_bound(source, x) for x in goals])
                relax(i, g, key - g, ctx.hub_members(i, via[2], via[4]), kept)
            continue
        if type(i) is _Merges:
            i = i.state
            if g <= best[i]:
                relax(i, g, memo[i], ctx.merges(i))
            continue
        if type(i) is _General:
            i = i.state
            if g <= best[i]:
                relax(i, g, memo[i], general_permutes(ctx, i))
            continue
        if i < 0:
            # the all_permutes of state ~i, queued when it was expanded (at a lower bound
            # of their rank), generated only now: first into their hubs
            i = ~i
            if g <= best[i]:
                relax(i, g, memo[i], ctx.hub_moves(i))
            continue
        if i in closed or g > best[i]:
            continue
        # lazy heuristic: a state was queued under h(parent) - step price (a lower bound
        # of its own, by consistency); evaluate it only now, re-queue if it ranks later
        h = memo.get(i)
        if h is None:
            h = memo[i] = h_of(i)
            if g + h > key:
                push(heap, (g + h, neg_g, next(counter), i))
                continue
        if i in goals or (pattern and any(admits(states[x], states[i]) for x in goals)):
            if one:
                return g, _path(parent, i)
            # of several goals reached at this very price (a tie the tie-breaking factors
            # lost to rounding), the first in ``state_order`` wins, as in a table walk
            if reached is None:
                reached, limit = [], g
            reached.append(i)
            closed.add(i)
            continue
        closed.add(i)
        via = parent[i]
        succ = singles(i)
        if via is not None and via[1][6] is not None and len(via[1][2]) == 1:
            # the single-dim steps the commuting-steps reduction keeps
            kkey = (via[0], via[1][1], via[1][2], via[1][3], i)
            succ = kept_memo.get(kkey)
            if succ is None:
                succ = kept_memo[kkey] = _commute_filter(ctx, via[0], via[1], singles(i))
        relax(i, g, h, succ)
        if merges_on:
            # the merged steps of state i, generated only once a plan through one may
            # still be the cheapest (``merges_floor``)
            floor = ctx.merges_floor(i)
            if floor < math.inf:
                push(heap, (g + (floor if floor > h else h), neg_g, next(counter), _Merges(i)))
        floor = ctx.permute_floor(i)
        if floor < math.inf:
            # every permute leads to a state ranked at least this
            push(heap, (g + (floor if floor > h else h), neg_g, next(counter), ~i))
        if general:
            # the general permutes of state i, generated only once one may still be on
            # the cheapest plan (each costs at least a launch, a hop and a copy)
            floor = general_floor + ctx.nbytes(i) * copy
            push(heap, (g + (floor if floor > h else h), neg_g, next(counter), _General(i)))
    if reached is None:
        return None
    i = min(reached, key=lambda x: state_order(states[x]))
    return limit, _path(parent, i)


def _path(parent: dict, i: int) -> list:
    """The moves ``[(state, transition, next)]`` of the search's way to state ``i``."""
    moves = []
    while parent[i] is not None:
        prev, trans = parent[i]
        if type(prev) is tuple:
            # through a permute hub: one all_permute, its two halves' prices summed
            prev, first = parent[prev]
            trans = (first[0] + trans[0],) + trans[1:]
        moves.append((prev, trans, i))
        i = prev
    moves.reverse()
    return moves


def state_order(state: tuple) -> tuple:
    """A total order of states (codes mix ints and tuples, which do not compare): of goals
    reached at one price, the least in it is the plan's end (search and table walk)."""
    codes, chains = state
    return (tuple((0, c, 0) if type(c) is int else (1,) + c for c in codes), chains)


def unreduced_goal(goal_state: tuple, shape: tuple) -> tuple:
    """The search goal of a plan to ``goal_state`` on a tensor of ``shape`` without
    elements. Along a tensor dim of length 0 every rank holds nothing however mesh dims
    shard it, so any state with the goal's Partial dims (and ops) and its shard orders of
    the other tensor dims holds the target's layout, whatever its remaining mesh dims do
    but Partial. As a state: ANY for the codes of those mesh dims (Replicate or sharding
    a dim of length 0 in the goal), and None for the orders of the dims of length 0
    (:func:`admits`)."""
    codes, chains = goal_state
    free = {m for d, chain in enumerate(chains) if shape[d] == 0 for m in chain}
    return (
        tuple(ANY if c == R or m in free else c for m, c in enumerate(codes)),
        tuple(None if shape[d] == 0 else chain for d, chain in enumerate(chains)),
    )


def class_goal(goal_state: tuple, ways: dict) -> tuple:
    """The search goal standing for every state of the layout of ``goal_state`` (a big goal
    class, ``_planner._goal_class``): ``ways`` gives per tiny tensor dim ``d`` the
    ``(placements, order)`` of its mesh dims (placements by sorted mesh dim) that chunk it
    as ``goal_state`` does, and the class is every choice of one per dim. As a state: the
    code ``SHARD_ANY - d`` for those mesh dims (any shard placement of ``d``, for the
    heuristic) and the frozen set of ways for ``d``'s order (:func:`admits`).

    >>> class_goal((((0, 1), (0, 1)), ((0, 1),)), {0: [(((0, 1), (0, 1)), (0, 1)),
    ...                                                  (((0, 1), (0, 1)), (1, 0))]})
    ((-3, -3), (frozenset({(((0, 1), (0, 1)), (0, 1)), (((0, 1), (0, 1)), (1, 0))}),))
    """
    codes, chains = list(goal_state[0]), list(goal_state[1])
    for d, options in ways.items():
        for m in chains[d]:
            codes[m] = SHARD_ANY - d
        chains[d] = frozenset(options)
    return tuple(codes), tuple(chains)


def is_pattern(state: tuple) -> bool:
    """Whether ``state`` is a goal pattern (:func:`unreduced_goal`, :func:`class_goal`)."""
    return any(type(chain) is not tuple for chain in state[1])


def admits(goal: tuple, state: tuple) -> bool:
    """Whether ``state`` is one of those the pattern ``goal`` stands for: its codes, where
    a goal code ANY takes any but a Partial (and a SHARD_ANY code any, its order decides),
    and its shard orders, where a goal order None takes any, and a set of ways (of
    :func:`class_goal`) the state's placements and order of that tensor dim if it holds
    them."""
    codes = state[0]
    for g, c in zip(goal[0], codes, strict=True):
        if g == ANY:
            if type(c) is int and c != R:
                return False
        elif g != c and not (type(g) is int and g <= SHARD_ANY):
            return False
    for g, chain in zip(goal[1], state[1], strict=True):
        if g is None or g == chain:
            continue
        if type(g) is tuple:
            return False
        if (tuple([codes[m] for m in sorted(chain)]), chain) not in g:
            return False
    return True


class _Merges:
    """A search queue entry: the merged steps of ``state``, generated when it is popped."""

    __slots__ = ("state",)

    def __init__(self, state: int):
        self.state = state


class _General:
    """A search queue entry: the general permutes of ``state``, generated when it is popped."""

    __slots__ = ("state",)

    def __init__(self, state: int):
        self.state = state


def _commute_filter(ctx: Context, prev: int, x: tuple, succ: tuple) -> tuple:
    """The transitions of ``succ`` (from the state ``x`` led to out of ``prev``) that the
    partial-order reduction keeps: a structural single-dim step ``y`` after ``x`` on another
    mesh dim and other shard orders is dropped when ``y`` then ``x`` is cheaper (on a tie,
    when ``y`` moves the lower mesh dim)."""
    states, nbytes, price, intern, bound = ctx.states, ctx._nbytes, ctx.price, ctx.intern, ctx.bound
    mx = x[2][0]
    touch_x = x[6]
    pc, pch = states[prev]
    out = []
    for trans in succ:
        if trans[6] is not None and len(trans[2]) == 1:
            my = trans[2][0]
            touch_y = trans[6]
            if my != mx and not any(d in touch_x for d in touch_y):
                # the same two steps the other way round: y from prev, then x
                t = trans[1]
                codes_t, chains_t = states[t]
                q_codes = pc[:my] + (codes_t[my],) + pc[my + 1 :]
                q_chains = tuple(chains_t[d] if d in touch_y else pch[d] for d in range(len(pch)))
                cy, cx = codes_t[my], codes_t[mx]
                legal = (type(cy) is not int or cy == R or mixable(pc, cy)) and (
                    type(cx) is not int or cx == R or mixable(q_codes, cx)
                )
                if legal:
                    q = intern((q_codes, q_chains))
                    bp, bq, bt = nbytes[prev], nbytes[q], nbytes[t]
                    if bound is None or (bp + bq <= bound and bq + bt <= bound):
                        q_state = states[q]
                        alt = price(trans[2], trans[3], trans[4], bp, bq, trans[5]) * _tie(
                            states[prev], q_state
                        ) + price(x[2], x[3], x[4], bq, bt, x[5]) * _tie(q_state, states[t])
                        here = x[0] + trans[0]
                        if alt < here or (alt == here and my < mx):
                            continue
        out.append(trans)
    return tuple(out)

"""The search context: what every plan between specs of one :class:`~._problem.Problem`
shares (no torch).

A :class:`Context` interns the states its searches meet (each state gets an id, and its
padded local bytes are computed once), prices steps on its tensor, and keeps the memo
tables of the moves out of each state (``_edges``) and of the search's bound
(``_bounds.Bounds``, its ``bounds``). A planner keeps one per problem
(``Planner.context``); every search or table walk on it holds its ``lock``.

Attributes, set once from the problem:

* ``problem``, and its fields ``mesh``, ``shape``, ``dtype``, ``model``, ``shards``,
  ``ptargets``, ``bound``, ``objective``;
* ``sizes`` (the mesh's shape), ``active`` (its dims of size > 1), ``ndim``, ``itemsize``,
  ``total_bytes`` (the tensor's), ``empty`` (the tensor has no element), ``strided`` (the
  universe has StridedShards), ``tiny`` (per tensor dim: a mesh dim may leave or join
  the middle of its order there, checked exactly: ``_exact.tiny_dims``);
* ``launch``, ``local_launch`` (seconds per collective / local step), ``copy`` (seconds
  per byte copied), ``per_collective`` (what the "collectives" objective adds to each);
* ``aliases`` (``(name, mesh dims)`` of each alias a merged step may run on: none
  without merging), ``merge_dims`` (their mesh dims), ``general`` (whether searches take
  general all_permutes, ``_general``);
* ``moves`` (the planner's :class:`SharedMoves`) and the keys this context reads them
  under (``permutes_key``, ``moves_key``, ``merges_key``);
* for the planner: ``tabled``, ``planned``, ``lazy`` (``_table.Tables``) and ``family``
  (``_family.family_of``, False until known).

Memo tables (each ``dict`` keyed by state id unless said): ``singles``, ``permutes``,
``hub_edges``, ``merged``, ``generals`` (priced moves, ``_edges``); ``hub_members``
(permute hub node -> its edges out); ``permute_floors``, ``merge_floors``; ``exacts``
(the exact checks' answers, ``_moves``); ``kept`` (the commuting-steps reduction's,
``_search``); ``groups`` (bit mask of mesh dims -> (dims, ranks)).
"""

from __future__ import annotations

import math
import threading

from meshplan.placement import dtype_itemsize

from .._aliases import alias_dims
from .._cost import collective_weight
from .._sizes import chain_extent
from ._bounds import Bounds
from ._exact import even_steps, tiny_dims
from ._price import Coefficients, price_coefficients, step_price
from ._problem import Problem

__all__ = ["Context", "SharedMoves"]

_MOVES_KEPT = 100000  # entries per shared-moves memo before it starts over
_STATES_KEPT = 200000  # states a context interns before its memo tables start over


class SharedMoves:
    """Shape-free moves out of states, shared by the contexts of a planner with one mesh
    and placement universe (tensor shapes, dtypes, cost models, memory bounds); a context
    prices them on its tensor (``_edges``). Each memo maps ``(context key, state)`` to:

    * ``singles``: the single-dim steps (:class:`~._encoding.Move`, ``_moves``);
    * ``hubs``: the state's permute hubs, ``hub_members``: a hub's targets (``_permutes``),
      built from ``orders`` (per tensor dim, the shard orders a hub's targets may take);
    * ``merged``: the steps merged onto the mesh's aliases (``_merged_moves``, keyed by the
      aliases' dims too), built from ``chain_moves`` (single-dim collectives on an
      alias's dims) and ``chain_ends`` (where chains of them end).
    """

    __slots__ = ("singles", "hubs", "hub_members", "orders", "chain_moves", "chain_ends", "merged")

    def __init__(self) -> None:
        self.singles: dict = {}
        self.hubs: dict = {}
        self.hub_members: dict = {}
        self.orders: dict = {}
        self.chain_moves: dict = {}
        self.chain_ends: dict = {}
        self.merged: dict = {}

    def get(self, memo: dict, prefix: tuple, state, generate) -> tuple:
        """The moves out of ``state`` in ``memo`` under the context's key ``prefix``,
        generated (``generate(state)``) the first time any context asks."""
        key = (prefix, state)
        moves = memo.get(key)
        if moves is None:
            moves = self.keep(memo, key, generate(state))
        return moves

    def peek(self, memo: dict, prefix: tuple, state):
        """The moves out of ``state`` in ``memo`` if generated already, else None."""
        return memo.get((prefix, state))

    def keep(self, memo: dict, key, value):
        """Store ``value`` under ``key`` in ``memo`` (one of this object's), which starts
        over when full; ``value``."""
        if len(memo) >= _MOVES_KEPT:
            memo.clear()
        memo[key] = value
        return value

    def clear(self) -> None:
        for name in self.__slots__:
            getattr(self, name).clear()


class Context:
    """Everything a search needs that depends on the problem, not on the pair (see the
    module doc for its attributes)."""

    def __init__(self, problem: Problem, moves: SharedMoves):
        self.problem = problem
        self.moves = moves
        self.expanded = 0  # moves its searches generated
        mesh, shape, shards = problem.mesh, problem.shape, problem.shards
        self.mesh = mesh
        self.shape = shape
        self.dtype = problem.dtype
        self.model = model = problem.model
        self.shards = shards
        self.ptargets = ptargets = problem.ptargets
        self.bound = problem.bound
        self.objective = problem.objective
        self.sizes = sizes = mesh.shape
        self.active = tuple(m for m, n in enumerate(sizes) if n > 1)
        self.ndim = len(shape)
        self.itemsize = dtype_itemsize(problem.dtype)
        self.total_bytes = self.itemsize * math.prod(shape)
        self.strided = any(c[1] > 1 for c in shards)
        self.empty = 0 in shape
        self.tiny = tiny_dims(shape, sizes, shards)
        hw = model.profile
        self.launch = hw.launch_s
        self.local_launch = hw.local_launch_s
        self.copy = 1.0 / hw.copy_bytes_per_s
        self.per_collective = (
            collective_weight(model, mesh, self.total_bytes)
            if problem.objective == "collectives"
            else 0.0
        )
        self.aliases = tuple(
            (name, dims)
            for name, dims in (alias_dims(mesh).items() if problem.merge else ())
            if len(dims) > 1 and all(sizes[m] > 1 for m in dims)
        )
        self.merge_dims = frozenset(m for _, dims in self.aliases for m in dims)
        self.general = len(self.active) >= 2
        # the keys of the shared moves: a tiny dim's moves depend on its length, unless
        # every shard order chunks it evenly (-2: a multiple of its ``even_steps``, where
        # every exact check answers alike); merged moves on the aliases' dims too
        self.permutes_key = (sizes, self.active, shards, self.ndim)
        even = even_steps(sizes, self.ndim, shards)
        self.moves_key = self.permutes_key + (
            ptargets,
            tuple(
                -1 if not t else -2 if length and length % step == 0 else length
                for length, t, step in zip(shape, self.tiny, even, strict=True)
            ),
        )
        self.merges_key = (self.moves_key, tuple(dims for _, dims in self.aliases))
        self.lock = threading.Lock()
        self.tabled = None  # whether a plan table fits (``_table``), once known
        self.family = False  # its family of sizes (``_family.family_of``), once known
        self.planned = 0  # pairs planned by search, towards building the table
        self.lazy = 0  # how many (``_table.lazy_pairs``), once the table is known to fit
        self.ids: dict = {}  # state -> id
        self.states: list = []  # id -> state
        self.local_bytes: list = []  # id -> padded local bytes
        self._extents: dict = {}
        self._coefs: dict = {}
        self.singles: dict = {}
        self.permutes: dict = {}
        self.hub_edges: dict = {}
        self.hub_members: dict = {}
        self.merged: dict = {}
        self.generals: dict = {}
        self.general_orders: dict = {}  # (``_general._orders_like``)
        self.permute_floors: dict = {}
        self.merge_floors: dict = {}
        self.exacts: dict = {}
        self.kept: dict = {}
        self.groups: dict = {}
        self.bounds = Bounds(self)

    def trim(self) -> None:
        """Start the memo tables over when they grew large (a long-lived process plans
        many pairs on one context); only between searches, as ids must stay stable
        during one."""
        if len(self.states) <= _STATES_KEPT:
            return
        self.ids.clear()
        self.states.clear()
        self.local_bytes.clear()
        for memo in (
            self.singles,
            self.permutes,
            self.hub_edges,
            self.hub_members,
            self.merged,
            self.generals,
            self.permute_floors,
            self.merge_floors,
            self.exacts,
            self.kept,
        ):
            memo.clear()
        self.bounds.clear()

    def intern(self, state) -> int:
        """The id of ``state`` (given on first sight)."""
        i = self.ids.get(state)
        if i is None:
            i = self.ids[state] = len(self.states)
            self.states.append(state)
            codes, chains = state
            b = self.itemsize
            for d, chain in enumerate(chains):
                # (a pattern's orders, ``_goals.is_pattern``: its bytes are never asked)
                b *= self.extent(d, chain, codes) if type(chain) is tuple else self.shape[d]
            self.local_bytes.append(b)
        return i

    def extent(self, d: int, chain: tuple, codes: tuple) -> int:
        """The padded length of tensor dim ``d`` on a rank when ``chain`` shards it."""
        key = (d, chain, tuple(codes[m][1] for m in chain)) if self.strided else (d, chain)
        e = self._extents.get(key)
        if e is None:
            sizes = self.sizes
            kinds = tuple((sizes[m], codes[m][1]) for m in chain)
            e = self._extents[key] = chain_extent(self.shape[d], kinds)
        return e

    def nbytes(self, i: int) -> int:
        """The padded local bytes of state ``i``."""
        return self.local_bytes[i]

    def coefs(self, dims, collective, n_send) -> Coefficients:
        """The price coefficients of a step (``_price.price_coefficients``)."""
        key = (dims, collective, n_send)
        c = self._coefs.get(key)
        if c is None:
            c = self._coefs[key] = price_coefficients(
                self.model, self.mesh, dims, collective, n_send, self.per_collective
            )
        return c

    def price(self, dims, collective, n_send, b_in, b_out, scaled=False) -> float:
        """The price of a step on ``b_in`` bytes in and ``b_out`` out (no tie factor)."""
        return step_price(self.coefs(dims, collective, n_send), b_in, b_out, scaled, self.copy)

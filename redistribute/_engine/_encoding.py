"""Specs as the search's states, and the search's moves between them (no torch).

A :class:`State` is ``(codes, chains)``:

* ``codes``, one per mesh dim: :data:`R` (0) for Replicate; :data:`SUM`, :data:`AVG`,
  :data:`MAX`, :data:`MIN` (1..4) for Partial of that op; ``(tensor dim, split factor)``
  for a shard, split factor 1 for a plain ``Shard`` and more for a ``StridedShard``.
  So ``type(code) is int`` tells a Replicate or Partial code from a shard, and
  ``code > R`` a Partial one. A search goal may be a *pattern* standing for many states
  (``_goals``): its codes may also be :data:`ANY` (any placement but Partial) or
  ``SHARD_ANY - d`` (any shard of tensor dim ``d``), both below ``R``.
* ``chains``, one per tensor dim: the mesh dims sharding it in shard order (the first
  chunks the whole dim, each next one the piece before it). A pattern's chain may be
  None (any order) or a frozenset of ways (``_goals.class_goal``).

Equal specs encode alike, so states compare and hash as the specs do; a State is a
tuple, and the plain tuples the move generators build compare and hash as States.

The search moves along two kinds of records: a :class:`Move` (shape-free: what a step
does to a state, shared by every tensor shape of a mesh) and an :class:`Edge` (a move
priced on one context's tensor, between the ids the context interns states as).

>>> from meshplan.layout import Mesh
>>> from meshplan.placement import Partial, Shard
>>> mesh = Mesh.create((2, 2))
>>> encode(Spec(mesh, (Shard(0), Partial("avg")), (4, 4)))
State(codes=((0, 1), 2), chains=((0,), ()))
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from meshplan.errors import PlanError
from meshplan.layout import FrozenMap
from meshplan.layout._frozen import int_keyed_map
from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard

__all__ = [
    "R",
    "SUM",
    "AVG",
    "MAX",
    "MIN",
    "SUMAVG",
    "ANY",
    "SHARD_ANY",
    "is_partial",
    "is_wildcard",
    "State",
    "Move",
    "Edge",
    "encode",
    "decode",
    "universe",
    "mixable",
    "put",
]

R = 0
"""The code of Replicate."""
SUM, AVG, MAX, MIN = 1, 2, 3, 4
"""The codes of Partial("sum"), ("avg"), ("max") and ("min")."""
SUMAVG = (SUM, AVG)
"""The Partial codes that mix (a sum and an avg reduce as one sum, then a scale)."""
ANY = -2
"""A pattern's code for "any placement but Partial" (``_goals.unreduced_goal``)."""
SHARD_ANY = -3
"""A pattern's code for "any shard of tensor dim d" is ``SHARD_ANY - d``
(``_goals.class_goal``)."""



def is_partial(code) -> bool:
    """Whether a mesh dim's ``code`` is a Partial one (:data:`SUM` to :data:`MIN`).

    >>> is_partial(AVG), is_partial(R), is_partial((0, 1))
    (True, False, False)
    """
    return type(code) is int and code > R


def is_wildcard(code) -> bool:
    """Whether ``code`` is a pattern's: :data:`ANY`, or ``SHARD_ANY - d``.

    >>> is_wildcard(ANY), is_wildcard(SHARD_ANY - 1), is_wildcard(R)
    (True, True, False)
    """
    return type(code) is int and code < R

_OPS = ("sum", "avg", "max", "min")
_OP_CODE = {op: i + 1 for i, op in enumerate(_OPS)}


class State(NamedTuple):
    """A spec as the search holds it (see the module doc)."""

    codes: tuple
    chains: tuple


class Move(NamedTuple):
    """A step out of a state, shape-free (shared by the contexts of one mesh and
    placement universe; a context prices it on its tensor)."""

    target: tuple  # the state it leads to
    dims: tuple[int, ...]  # its mesh dims
    collective: str | None  # None: a local step
    n_send: int  # ranks of its group that send (the cost model's fan-in)
    scaled: bool  # it writes its output once more (an avg reduced as a sum, then scaled)
    touch: tuple | None  # the tensor dims whose orders a structural single-dim step
    # changes (its mesh dim leaves the end of one order, joins the end of another); None
    # for every other step (the commuting-steps reduction skips those)
    tie: float  # its tie-breaking factor (``_price.tie``)


class Edge(NamedTuple):
    """A move priced on a context's tensor: the search's transition between state ids
    (``target`` a permute hub's node for the first half of an all_permute)."""

    price: float
    target: object  # a state id (int), or a permute hub node (a tuple)
    dims: tuple[int, ...]
    collective: str | None
    n_send: int
    scaled: bool
    touch: tuple | None


def _code(p) -> object:
    match p:
        case Replicate():
            return R
        case Partial(op=op):
            return _OP_CODE[op]
        case StridedShard(dim=d, split_factor=sf):
            return (d, sf)
        case Shard(dim=d):
            return (d, 1)
    raise PlanError(f"unknown placement {p!r}", value=p)


@functools.cache
def _placement(code) -> object:
    if code == R:
        return Replicate()
    if type(code) is int:
        return Partial(_OPS[code - 1])
    d, sf = code
    return Shard(d) if sf == 1 else StridedShard(d, sf)


def encode(spec: Spec) -> State:
    """The state of ``spec``."""
    codes = tuple(_code(p) for p in spec.placements)
    chains = tuple(spec.order(d) for d in range(spec.ndim))
    return State(codes, chains)


def decode(template: Spec, state: tuple) -> Spec:
    """The Spec of ``state`` for the tensor and mesh of ``template``.

    >>> from meshplan.layout import Mesh
    >>> a = Spec(Mesh.create((2, 2)), (Replicate(), Replicate()), (4, 4))
    >>> print(decode(a, (((0, 1), (0, 1)), ((1, 0), ()))))
    f32[4,4](S(0)[1,0] S(0))
    """
    codes, chains = state
    return Spec(
        template.mesh, _placements(codes), template.shape, template.dtype, _order_map(chains)
    )


@functools.lru_cache(maxsize=4096)
def _placements(codes: tuple) -> tuple:
    return tuple(_placement(c) for c in codes)


@functools.lru_cache(maxsize=4096)
def _order_map(chains: tuple) -> FrozenMap:
    """The shard-order map of a state's chains (frozen: specs share it)."""
    return int_keyed_map({d: c for d, c in enumerate(chains) if c})


def universe(src: Spec, dst: Spec) -> tuple[tuple, tuple]:
    """The shard codes (every Shard, the StridedShards of ``src``/``dst``) and Partial op
    codes a plan between them searches."""
    return universe_of(encode(src).codes, encode(dst).codes, src.ndim)


@functools.lru_cache(maxsize=4096)
def universe_of(codes_a: tuple, codes_b: tuple, ndim: int) -> tuple[tuple, tuple]:
    """:func:`universe` of the codes of two states of a tensor of ``ndim`` dims.

    >>> universe_of(((0, 1), 2), ((1, 3), R), 2)
    (((0, 1), (1, 1), (1, 3)), (2,))
    """
    shards = [(d, 1) for d in range(ndim)]
    for c in codes_a + codes_b:
        if type(c) is tuple and c[1] > 1 and c not in shards:
            shards.append(c)
    ops = sorted({c for c in codes_a + codes_b if type(c) is int and c != R})
    return tuple(shards), tuple(ops)


def mixable(codes, op) -> bool:
    """Whether a mesh dim may turn Partial ``op`` beside ``codes`` (a spec's Partial dims
    hold one op, or sum and avg)."""
    for c in codes:
        if type(c) is int and c != R and c != op and not (c in SUMAVG and op in SUMAVG):
            return False
    return True


def put(t: tuple, i: int, v) -> tuple:
    """``t`` with item ``i`` replaced by ``v``."""
    return t[:i] + (v,) + t[i + 1 :]


def state_order(state: tuple) -> tuple:
    """A total order of states (codes mix ints and tuples, which do not compare): of goals
    reached at one price, the least in it is the plan's end (search and table walk)."""
    codes, chains = state
    return (tuple((0, c, 0) if type(c) is int else (1,) + c for c in codes), chains)

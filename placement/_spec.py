"""The :class:`Spec` value: a tensor's global shape and dtype, laid out on a mesh."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError
from meshplan.layout import FrozenMap, Mesh
from meshplan.layout._frozen import EMPTY_MAP, identity_first_eq
from meshplan.layout._ints import as_int

from ._canonical import (
    canonical_order,
    canonical_placements,
    check_partial_ops,
    check_shape,
    is_canonical_shape,
    placement_facts,
    read_order,
    read_placements,
)
from ._pspec import PartitionSpec, pspec_entries, pspec_of
from ._text import format_placements
from ._types import (
    DTYPES,
    Partial,
    Placement,
    Replicate,
    dtype_name,
    dtype_short,
    global_shape,
)

__all__ = ["Spec", "format_spec", "from_partition_spec", "partition_spec"]


@identity_first_eq
@attrs.frozen(init=False, repr=False)
class Spec:
    """How a tensor of ``shape`` and ``dtype`` lies on ``mesh``: one placement per mesh dim.

    ``shard_order`` maps each sharded tensor dim to the mesh dims that shard it, in the
    order they apply (each chunks the piece the previous one produced); it defaults to
    ascending mesh dims and may be given partially, with names or indices.

    Canonical form (equivalent specs compare equal): negative tensor dims are
    normalized; a placement on a size-1 mesh dim becomes ``Replicate()``;
    ``StridedShard(d, 1)`` becomes ``Shard(d)``; ``shard_order`` is stored in full, for
    every sharded tensor dim, with mesh dim indices.

    >>> from meshplan.placement import Shard
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> s = Spec(mesh, (Shard(0), Shard(-2)), (8, 4), shard_order={0: ("tp", "dp")})
    >>> s.placements, dict(s.shard_order)
    ((Shard(0), Shard(0)), {0: (1, 0)})
    >>> str(s)
    'f32[8,4](S(0)[1,0] S(0))'
    >>> Spec(mesh, (Shard(0), Replicate()), (8, 4)) == Spec(mesh, [Shard(-2), Replicate()], [8, 4])
    True
    """

    mesh: Mesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    dtype: str = "float32"
    shard_order: FrozenMap[int, tuple[int, ...]] = EMPTY_MAP
    _hash: int = attrs.field(init=False, eq=False, repr=False)

    @_hash.default
    def _hash_of_fields(self) -> int:  # every spec is hashed (dict keys, caches): once
        return hash((self.mesh, self.placements, self.shape, self.dtype, self.shard_order))

    def __init__(
        self,
        mesh: Mesh,
        placements: Sequence[Placement],
        shape: Sequence[int],
        dtype: Any = "float32",
        shard_order: Mapping[Any, Any] | None = EMPTY_MAP,
    ) -> None:
        if type(placements) is not tuple:
            placements = read_placements(placements)
        checked = is_canonical_shape(shape)
        if not checked:
            shape = global_shape(shape)
        given = read_order(shard_order)
        if not isinstance(mesh, Mesh):
            raise PlacementError(f"Spec needs a Mesh, got {mesh!r}", value=mesh)
        if not checked:
            check_shape(shape)
        if type(dtype) is not str or dtype not in DTYPES:
            dtype = dtype_name(dtype)
        ndim = len(shape)
        placements = canonical_placements(mesh, placements, ndim)
        default, ops = placement_facts(placements)
        if ops:
            check_partial_ops(placements, ops, dtype)
        order = canonical_order(mesh, default, given, ndim)
        self.__attrs_init__(mesh, placements, shape, dtype, order)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # rebuilt through the constructor, so the loading process hashes it afresh
        return (Spec, (self.mesh, self.placements, self.shape, self.dtype, self.shard_order))

    # -- facts ------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        """Number of tensor dims."""
        return len(self.shape)

    def order(self, tensor_dim: int) -> tuple[int, ...]:
        """The mesh dims that shard ``tensor_dim`` (negative counts from the end), in the
        order they apply.

        >>> from meshplan.placement import Shard
        >>> s = Spec(Mesh.create((2, 2)), (Shard(1), Shard(1)), (4, 8), shard_order={1: (1, 0)})
        >>> s.order(1), s.order(-1), s.order(0)
        ((1, 0), (1, 0), ())
        """
        if type(tensor_dim) is int:
            got = self.shard_order.get(tensor_dim)
            if got is not None:
                return got
        return self.shard_order.get(self.tensor_dim(tensor_dim), ())

    def tensor_dim(self, d: int) -> int:
        """``d`` as a tensor dim in ``[0, ndim)`` (negative counts from the end).

        Raises :class:`PlacementError` for anything else.
        """
        n = len(self.shape)
        i = as_int(d)
        if i is None or not -n <= i < n:
            raise PlacementError(
                f"{d!r} is not a tensor dim of {self}; use a dim in [{-n}, {n})", value=d
            )
        return i % n

    @property
    def partial_dims(self) -> tuple[int, ...]:
        """Mesh dims holding a :class:`Partial`."""
        return tuple(i for i, p in enumerate(self.placements) if isinstance(p, Partial))

    @property
    def is_partial(self) -> bool:
        return any(isinstance(p, Partial) for p in self.placements)

    @property
    def is_replicated(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.placements)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @classmethod
    def from_partition_spec(
        cls,
        mesh: Mesh,
        pspec: Any,
        shape: Sequence[int],
        partial: Mapping[Any, str] | None = None,
        dtype: Any = "float32",
    ) -> Spec:
        """A spec from the JAX view: per tensor dim the mesh dims sharding it (major first).

        Arguments in the order of ``Spec(mesh, placements, shape)``; the older order
        ``(mesh, shape, pspec)`` is still accepted.

        >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
        >>> s = Spec.from_partition_spec(mesh, (("dp", "tp"), None), (8, 4))
        >>> s.placements, s.partition_spec()
        ((Shard(0), Shard(0)), PartitionSpec(('dp', 'tp'), None))
        """
        return from_partition_spec(mesh, pspec, shape, partial, dtype)

    def partition_spec(self):
        """The JAX view of this spec (raises for ``StridedShard``); see :class:`PartitionSpec`."""
        return partition_spec(self)

    def with_placements(
        self,
        placements: Sequence[Placement],
        shard_order: Mapping[int, Sequence[Any]] | None = None,
    ) -> Spec:
        """The same tensor and mesh with other placements (and shard order)."""
        return Spec(self.mesh, placements, self.shape, self.dtype, shard_order or {})

    def __str__(self) -> str:
        return format_spec(self)

    def __repr__(self) -> str:
        order = {d: o for d, o in self.shard_order.items() if list(o) != sorted(o)}
        extra = f", shard_order={order!r}" if order else ""
        return (
            f"Spec(mesh={self.mesh!r}, placements={self.placements!r}, shape={self.shape!r}, "
            f"dtype={self.dtype!r}{extra})"
        )


def from_partition_spec(
    mesh: Mesh,
    pspec: Any,
    shape: Sequence[int],
    partial: Mapping[Any, str] | None = None,
    dtype: Any = "float32",
) -> Spec:
    """Build a :class:`Spec` from the JAX view (see the module docs).

    Arguments come in the order of ``Spec(mesh, placements, shape)``: the mesh, how the
    tensor is split, its global shape. ``pspec`` is a :class:`PartitionSpec` or a plain
    sequence of entries (``None``, a mesh dim name or index, or a tuple of them, major
    first); it may be shorter than the tensor's rank (the rest is unsharded).
    ``partial`` maps mesh dims to reduce ops; when omitted, a :class:`PartitionSpec`'s
    own ``partial`` is used. The older order ``(mesh, shape, pspec)`` is still accepted
    (told apart by the values: a shape is ints, a pspec names mesh dims).

    >>> mesh = Mesh.create((2, 2, 2), ("dp", "tp", "cp"))
    >>> s = from_partition_spec(mesh, (("tp", "dp"), None), (8, 4), partial={"cp": "sum"})
    >>> print(s)
    f32[8,4](S(0)[1,0] S(0) P(sum))
    >>> s == from_partition_spec(mesh, (8, 4), (("tp", "dp"), None), partial={"cp": "sum"})
    True
    """
    placements, shape, order = pspec_entries(mesh, pspec, shape, partial)
    return Spec(mesh, placements, shape, dtype, order)


def partition_spec(spec: Spec) -> PartitionSpec:
    """The JAX view of ``spec``: mesh dim names per tensor dim, plus partial mesh dims.

    Raises :class:`~meshplan.errors.PlacementError` for a ``StridedShard`` (no JAX
    counterpart).

    >>> from meshplan.placement import Shard
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> partition_spec(Spec(mesh, (Shard(1), Partial("avg")), (4, 6)))
    PartitionSpec(None, 'dp', partial={'tp': 'avg'})
    """
    if not isinstance(spec, Spec):
        raise PlacementError(f"partition_spec takes a Spec, got {spec!r}", value=spec)
    return pspec_of(spec)


def format_spec(spec: Spec) -> str:
    """``f32[8,4](S(0) R P(sum))``: dtype, global shape, placements (with shard order).

    >>> from meshplan.placement import Shard
    >>> print(format_spec(Spec(Mesh.create((2, 2)), (Shard(0), Partial()), (8, 4))))
    f32[8,4](S(0) P(sum))
    """
    if not isinstance(spec, Spec):
        raise PlacementError(f"format_spec takes a Spec, got {spec!r}", value=spec)
    shape = ",".join(map(str, spec.shape))
    return f"{dtype_short(spec.dtype)}[{shape}]({format_placements(spec.placements, spec.shard_order)})"

"""The :class:`Spec` value: a tensor's global shape and dtype, laid out on a mesh."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError
from meshplan.layout import FrozenMap, Mesh
from meshplan.layout._frozen import EMPTY_MAP, identity_first_eq, int_keyed_map
from meshplan.layout._ints import as_int, int_or_same

from ._pspec import PartitionSpec, pspec_entries, pspec_of
from ._text import format_placements
from ._types import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    dtype_name,
    dtype_short,
    global_shape,
)

__all__ = ["Spec", "format_spec", "from_partition_spec", "partition_spec"]

_MAX_SIZE = 2**63 - 1  # torch sizes are int64


def _placements(value: Iterable[Any]) -> tuple[Any, ...]:
    if isinstance(value, str):
        raise PlacementError(
            f"placements {value!r} is a string; parse it with parse_placements first",
            value=value,
        )
    if not isinstance(value, Iterable):
        raise PlacementError(
            f"placements {value!r} is not a sequence; give one placement per mesh dim",
            value=value,
        )
    try:
        return tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise PlacementError(
            f"placements {value!r} is not a sequence; give one placement per mesh dim",
            value=value,
        ) from None


def _order(value: Any) -> Any:
    if isinstance(value, FrozenMap):
        return value
    if value is None:
        return {}
    try:
        return {
            int_or_same(d): tuple(int_or_same(m) for m in ms)
            if isinstance(ms, list | tuple)
            else ms
            for d, ms in dict(value).items()
        }
    except (TypeError, ValueError):
        raise PlacementError(
            f"shard_order {value!r} is not a mapping tensor dim -> mesh dims; write e.g. "
            "{0: ('tp', 'dp')}",
            value=value,
        ) from None


@identity_first_eq
@attrs.frozen(repr=False, cache_hash=True)
class Spec:
    """How a tensor of ``shape`` and ``dtype`` lies on ``mesh``: one placement per mesh dim.

    ``shard_order`` maps each sharded tensor dim to the mesh dims that shard it, in the
    order they apply (each chunks the piece the previous one produced); it defaults to
    ascending mesh dims and may be given partially, with names or indices.

    Canonical form (equivalent specs compare equal): negative tensor dims are
    normalized; a placement on a size-1 mesh dim becomes ``Replicate()``;
    ``StridedShard(d, 1)`` becomes ``Shard(d)``; ``shard_order`` is stored in full, for
    every sharded tensor dim, with mesh dim indices.

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
    placements: tuple[Placement, ...] = attrs.field(converter=_placements)
    shape: tuple[int, ...] = attrs.field(converter=global_shape)
    dtype: str = "float32"
    shard_order: FrozenMap[int, tuple[int, ...]] = attrs.field(default=EMPTY_MAP, converter=_order)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.mesh, Mesh):
            raise PlacementError(f"Spec needs a Mesh, got {self.mesh!r}", value=self.mesh)
        for s in self.shape:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise PlacementError(
                    f"global shape {self.shape!r} has size {s!r}; sizes must be ints >= 0",
                    value=self.shape,
                )
            if s > _MAX_SIZE:
                raise PlacementError(
                    f"global shape {self.shape!r} has size {s!r}, beyond int64; torch sizes "
                    f"are at most {_MAX_SIZE} (2**63 - 1)",
                    value=self.shape,
                )
        if self.numel() > _MAX_SIZE:
            raise PlacementError(
                f"global shape {self.shape!r} holds {self.numel()} elements, beyond int64; a "
                f"torch tensor holds at most {_MAX_SIZE} (2**63 - 1): use smaller sizes",
                value=self.shape,
            )
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        placements = _canonical_placements(self.mesh, self.placements, len(self.shape))
        object.__setattr__(self, "placements", placements)
        _check_partial_ops(placements, self.dtype)
        order = _canonical_order(self.mesh, placements, self.shard_order, len(self.shape))
        object.__setattr__(self, "shard_order", order)

    # -- facts ------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        """Number of tensor dims."""
        return len(self.shape)

    def order(self, tensor_dim: int) -> tuple[int, ...]:
        """The mesh dims that shard ``tensor_dim`` (negative counts from the end), in the
        order they apply.

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


def _canonical_placements(
    mesh: Mesh, placements: tuple[Any, ...], ndim: int
) -> tuple[Placement, ...]:
    if len(placements) != mesh.ndim:
        raise PlacementError(
            f"{len(placements)} placements {tuple(map(str, placements))} for a {mesh.ndim}-D "
            f"mesh {mesh.names!r}; give one placement per mesh dim",
            value=placements,
        )
    out: list[Placement] = []
    for i, p in enumerate(placements):
        match p:
            case Shard(dim=d) | StridedShard(dim=d):
                if not -ndim <= d < ndim:
                    raise PlacementError(
                        f"{p!r} on mesh dim {mesh.names[i]!r} shards tensor dim {d}, out of "
                        f"range for a {ndim}-D tensor; use a dim in [{-ndim}, {ndim})",
                        value=p,
                    )
                if mesh.shape[i] == 1:
                    out.append(_REPLICATE)
                elif d >= 0 and (
                    type(p) is Shard or (type(p) is StridedShard and p.split_factor > 1)
                ):
                    out.append(p)  # canonical already (a frozen value: shared)
                elif isinstance(p, StridedShard) and p.split_factor > 1:
                    d %= ndim
                    out.append(StridedShard(d, p.split_factor))
                else:
                    out.append(Shard(d % ndim))
            case Replicate():
                out.append(p)
            case Partial():
                out.append(_REPLICATE if mesh.shape[i] == 1 else p)
            case _:
                hint = " (convert torch placements with from_torch)" if _from_torch(p) else ""
                raise PlacementError(
                    f"{p!r} on mesh dim {mesh.names[i]!r} is not a meshplan placement; use "
                    f"Shard, StridedShard, Replicate or Partial{hint}",
                    value=p,
                )
    return tuple(out)


_REPLICATE = Replicate()


def _from_torch(p: object) -> bool:
    return type(p).__module__.startswith("torch")


def _check_partial_ops(placements: tuple[Placement, ...], dtype: str) -> None:
    ops = {p.op for p in placements if isinstance(p, Partial)}
    if len(ops) > 1 and ops != {"sum", "avg"}:
        raise PlacementError(
            f"placements {tuple(map(str, placements))} mix Partial ops {sorted(ops)!r}; one "
            "spec may reduce with one op (only sum and avg mix): reduce one of them first",
            value=placements,
        )
    if dtype == "bool" and "avg" in ops:
        raise PlacementError(
            f"placements {tuple(map(str, placements))} average bool values, which have no "
            "average; use Partial('max') (any) or Partial('min') (all), or another dtype",
            value=placements,
        )
    if dtype.startswith("complex") and ops & {"max", "min"}:
        raise PlacementError(
            f"placements {tuple(map(str, placements))} reduce {dtype} values with "
            f"{sorted(ops & {'max', 'min'})!r}, but complex numbers have no order; use "
            "Partial('sum') or Partial('avg')",
            value=placements,
        )


def _canonical_order(
    mesh: Mesh, placements: tuple[Placement, ...], given: Mapping[Any, Any], ndim: int
) -> FrozenMap[int, tuple[int, ...]]:
    sharding: dict[int, list[int]] = {}
    for i, p in enumerate(placements):
        if isinstance(p, Shard | StridedShard):
            sharding.setdefault(p.dim, []).append(i)
    order: dict[int, tuple[int, ...]] = {d: tuple(v) for d, v in sharding.items()}
    seen: set[int] = set()
    listed_ones: set[int] = set()
    for key, dims in dict(given).items():
        if isinstance(key, bool) or not isinstance(key, int) or not -ndim <= key < ndim:
            raise PlacementError(
                f"shard_order key {key!r} is not a tensor dim of a {ndim}-D tensor; use a "
                f"dim in [{-ndim}, {ndim})",
                value=given,
            )
        d = key % ndim
        if d in seen:
            raise PlacementError(
                f"shard_order {dict(given)!r} gives tensor dim {d} twice (as {key!r} and "
                "another key); give each dim once",
                value=given,
            )
        seen.add(d)
        if isinstance(dims, int | str):
            dims = (dims,)
        if isinstance(dims, set | frozenset) and len(dims) > 1:
            raise PlacementError(
                f"shard_order {dict(given)!r} maps tensor dim {key!r} to the set {dims!r}, "
                "which has no order; give a tuple, e.g. ('tp', 'dp')",
                value=given,
            )
        if not isinstance(dims, Iterable):
            raise PlacementError(
                f"shard_order {dict(given)!r} maps tensor dim {key!r} to {dims!r}; map it to "
                "a tuple of mesh dims (names or indices)",
                value=given,
            )
        dims = tuple(dims)
        try:
            idx = tuple(mesh.dim_index(m) for m in dims)
        except ValueError as e:
            raise PlacementError(f"shard_order {dict(given)!r}: {e}", value=given) from None
        # mesh dims of size 1 carry no sharding: drop them (canonical form), but each
        # may be listed once, for one tensor dim
        ones = [m for m in idx if mesh.shape[m] == 1]
        twice = [m for m in ones if m in listed_ones]
        listed_ones.update(ones)
        want = sharding.get(d, [])
        kept = tuple(m for m in idx if mesh.shape[m] != 1)
        if len(set(idx)) != len(idx) or twice or sorted(kept) != sorted(want):
            raise PlacementError(
                f"shard_order for tensor dim {d} is {tuple(dims)!r}, but the mesh dims "
                f"sharding it are {tuple(mesh.names[m] for m in want)!r}; the order must list "
                "each of them exactly once (it may neither omit nor invent a mesh dim)",
                value=given,
            )
        if kept:
            order[d] = kept
    return int_keyed_map(dict(sorted(order.items())))


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

    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> partition_spec(Spec(mesh, (Shard(1), Partial("avg")), (4, 6)))
    PartitionSpec(None, 'dp', partial={'tp': 'avg'})
    """
    if not isinstance(spec, Spec):
        raise PlacementError(f"partition_spec takes a Spec, got {spec!r}", value=spec)
    return pspec_of(spec)


def format_spec(spec: Spec) -> str:
    """``f32[8,4](S(0) R P(sum))``: dtype, global shape, placements (with shard order).

    >>> print(format_spec(Spec(Mesh.create((2, 2)), (Shard(0), Partial()), (8, 4))))
    f32[8,4](S(0) P(sum))
    """
    if not isinstance(spec, Spec):
        raise PlacementError(f"format_spec takes a Spec, got {spec!r}", value=spec)
    shape = ",".join(map(str, spec.shape))
    return f"{dtype_short(spec.dtype)}[{shape}]({format_placements(spec.placements, spec.shard_order)})"

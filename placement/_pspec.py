"""The JAX view of a spec: per tensor dim, the mesh dim names that shard it (no torch).

``PartitionSpec(("dp", "tp"), None)`` says tensor dim 0 is split over ``dp`` and then,
inside each ``dp`` block, over ``tp`` (``dp`` major, like JAX); dim 1 is whole. Mesh
dims named nowhere replicate, unless ``partial`` names them with a reduce op. The
order of names in an entry is the spec's shard order for that tensor dim, so the two
views convert losslessly. ``StridedShard`` has no JAX counterpart: converting a spec
that uses it raises :class:`~meshplan.errors.PlacementError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError
from meshplan.layout import FrozenMap, Mesh
from meshplan.layout._ints import int_or_same

from ._types import REDUCE_OPS, Partial, Placement, Replicate, Shard, StridedShard, global_shape

__all__ = ["PartitionSpec", "pspec_entries", "pspec_of"]

Entry = tuple[Any, ...] | None


def _entry(value: Any) -> Entry:
    if value is None:
        return None
    value = int_or_same(value)
    if isinstance(value, str | int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        items = tuple(int_or_same(v) for v in value)
        for item in items:
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise PlacementError(
                    f"partition spec entry {value!r} holds {item!r}; entries are None, a "
                    "mesh dim name, or a tuple of mesh dim names",
                    value=value,
                )
        return items or None
    raise PlacementError(
        f"partition spec entry {value!r} is not None, a mesh dim name or a tuple of names",
        value=value,
    )


def _entries(value: Any) -> tuple[Entry, ...]:
    if isinstance(value, PartitionSpec):
        return value.dims
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise PlacementError(
            f"a partition spec is a sequence with one entry per tensor dim, got {value!r}; "
            "write e.g. (('dp', 'tp'), None)",
            value=value,
        )
    return tuple(_entry(v) for v in value)


def _partial(value: Any) -> FrozenMap:
    if value is None:
        return FrozenMap()
    if not isinstance(value, Mapping):
        raise PlacementError(
            f"partial must map mesh dim names to reduce ops, got {value!r}; write e.g. "
            "{'cp': 'sum'}",
            value=value,
        )
    for op in value.values():
        if op not in REDUCE_OPS:
            raise PlacementError(
                f"partial {dict(value)!r} uses unknown reduce op {op!r}; use one of {REDUCE_OPS!r}",
                value=value,
            )
    return FrozenMap(value)


@attrs.frozen(repr=False)
class PartitionSpec(Sequence):
    """Per tensor dim, the mesh dims that shard it (major first), plus partial mesh dims.

    Entries are stored canonically: ``None`` for an unsharded dim, otherwise a tuple
    of names (a single name ``"dp"`` becomes ``("dp",)``). It is a sequence of its
    entries, like JAX's ``PartitionSpec``.

    >>> p = PartitionSpec(("dp", "tp"), "cp", None, partial={"ep": "sum"})
    >>> p
    PartitionSpec(('dp', 'tp'), 'cp', None, partial={'ep': 'sum'})
    >>> len(p), p[1], p == PartitionSpec(("dp", "tp"), ("cp",), None, partial={"ep": "sum"})
    (3, ('cp',), True)
    """

    dims: tuple[Entry, ...]
    partial: FrozenMap[Any, str]

    def __init__(self, *dims: Any, partial: Mapping[Any, str] | None = None) -> None:
        self.__attrs_init__(tuple(_entry(d) for d in dims), _partial(partial))

    def __getitem__(self, index):
        return self.dims[index]

    def __len__(self) -> int:
        return len(self.dims)

    def __iter__(self):
        return iter(self.dims)

    def __repr__(self) -> str:
        parts = []
        for e in self.dims:
            parts.append("None" if e is None else repr(e[0]) if len(e) == 1 else repr(e))
        if self.partial:
            parts.append(f"partial={dict(self.partial)!r}")
        return f"PartitionSpec({', '.join(parts)})"

    __str__ = __repr__


def _is_int(value: Any) -> bool:
    return isinstance(int_or_same(value), int) and not isinstance(value, bool)


def _shape_like(value: Any) -> bool:
    """An int, or a sequence of ints (what a global shape is; a pspec of indices too)."""
    if _is_int(value):
        return True
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes | PartitionSpec)
        and all(_is_int(v) for v in value)
    )


def _indices_of(mesh: Mesh, value: Any) -> bool:
    """Whether ``value`` (ints) reads as a pspec of distinct mesh dim indices."""
    items = [int_or_same(v) for v in value]
    return all(-mesh.ndim <= i < mesh.ndim for i in items) and len(
        {i % mesh.ndim for i in items}
    ) == len(items)


def _in_order(mesh: Mesh, pspec: Any, shape: Any) -> tuple[Any, Any]:
    """``(pspec, shape)``, swapped when they came in the older order ``(shape, pspec)``.

    The older order is recognized by the values: a shape is ints, a pspec holds names,
    ``None``s or tuples. Where both are ints, the one that reads as distinct mesh dim
    indices is the pspec; if both do, the order cannot be told and a PlacementError
    asks to wrap the pspec in a :class:`PartitionSpec`.
    """
    if isinstance(pspec, PartitionSpec) or isinstance(shape, PartitionSpec):
        return (shape, pspec) if isinstance(shape, PartitionSpec) else (pspec, shape)
    if not isinstance(pspec, Sequence) or isinstance(pspec, str | bytes):
        return shape, pspec  # an int or an iterator: a shape, in the older order
    if not _shape_like(pspec):
        return pspec, shape
    if not _shape_like(shape):
        return shape, pspec
    if _is_int(shape):
        return shape, pspec  # (shape=8 is no pspec either; the shape check names it)
    first, second = _indices_of(mesh, pspec), _indices_of(mesh, shape)
    if first and second and tuple(pspec) != tuple(shape):
        raise PlacementError(
            f"from_partition_spec got {pspec!r} and {shape!r}: both read as a partition "
            "spec of mesh dim indices and as a global shape, so their order is unclear; "
            f"wrap the partition spec: PartitionSpec(*{pspec!r})",
            value=(pspec, shape),
        )
    return (pspec, shape) if first or not second else (shape, pspec)


def pspec_entries(
    mesh: Mesh, pspec: Any, shape: Any, partial: Mapping[Any, str] | None
) -> tuple[list[Placement], tuple[int, ...], dict[int, tuple[int, ...]]]:
    """The placements, global shape and shard order a partition spec gives (the arguments
    of ``Spec``; see :func:`meshplan.placement.from_partition_spec`)."""
    if not isinstance(mesh, Mesh):
        raise PlacementError(f"from_partition_spec takes a Mesh, got {mesh!r}", value=mesh)
    pspec, shape = _in_order(mesh, pspec, shape)
    entries = _entries(pspec)
    if partial is None and isinstance(pspec, PartitionSpec):
        partial = pspec.partial
    partial_map = _partial(partial)
    shape = global_shape(shape)
    ndim = len(shape)
    if len(entries) > ndim:
        raise PlacementError(
            f"partition spec {pspec!r} has {len(entries)} entries for a {ndim}-D tensor of "
            f"shape {shape!r}; give at most one entry per tensor dim",
            value=pspec,
        )
    placements: list[Placement] = [Replicate()] * mesh.ndim
    owner: dict[int, str] = {}
    order: dict[int, tuple[int, ...]] = {}

    def claim(name: Any, what: str) -> int:
        try:
            m = mesh.dim_index(name)
        except ValueError as e:
            raise PlacementError(f"partition spec {pspec!r}: {e}", value=name) from None
        if m in owner:
            raise PlacementError(
                f"mesh dim {mesh.names[m]!r} is used twice ({owner[m]} and {what}) in "
                f"partition spec {pspec!r} with partial {dict(partial_map)!r}; a mesh dim "
                "shards at most one tensor dim, or is partial",
                value=name,
            )
        owner[m] = what
        return m

    for d, entry in enumerate(entries):
        if entry is None:
            continue
        dims = tuple(claim(name, f"tensor dim {d}") for name in entry)
        for m in dims:
            placements[m] = Shard(d)
        order[d] = dims
    for name, op in partial_map.items():
        placements[claim(name, f"partial {op!r}")] = Partial(op)
    return placements, shape, order


def pspec_of(spec: Any) -> PartitionSpec:
    """The JAX view of a ``Spec`` (see :func:`meshplan.placement.partition_spec`)."""
    names = spec.mesh.names
    for m, p in enumerate(spec.placements):
        if isinstance(p, StridedShard):
            raise PlacementError(
                f"{p!r} on mesh dim {names[m]!r} of {spec} has no partition-spec form (a "
                "partition spec only splits dims into contiguous blocks); use the placements "
                "(DTensor view), or redistribute to Shard first",
                value=p,
            )
    dims = tuple(
        tuple(names[m] for m in spec.order(d)) if spec.order(d) else None for d in range(spec.ndim)
    )
    partial = {names[m]: spec.placements[m].op for m in spec.partial_dims}
    return PartitionSpec(*dims, partial=partial)

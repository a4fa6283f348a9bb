"""Mesh aliases as the mesh dims they flatten (steps merged onto an alias run over those)."""

from __future__ import annotations

import functools

from meshplan.errors import PlanError
from meshplan.layout import Axis, FrozenMap, Mesh

__all__ = ["alias_dims", "alias_named"]


@functools.lru_cache(maxsize=1024)
def alias_dims(mesh: Mesh) -> FrozenMap:
    """Each alias of ``mesh`` as the mesh dims it flattens (in flattening order).

    Raises :class:`PlanError` for an alias that is not a flattening of mesh dims.

    >>> m = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
    >>> dict(alias_dims(m))
    {'ac': (0, 2)}
    """
    found: dict[str, tuple[int, ...]] = {}
    for name, axis in mesh.aliases.items():
        dims = _flattened_dims(mesh, axis)
        if dims is None:
            raise PlanError(
                f"alias {name!r} of {mesh} ({axis}) does not flatten any of its mesh dims "
                f"{mesh.names!r}; register aliases with mesh.flatten(dims, name)",
                value=name,
            )
        found[name] = dims
    return FrozenMap(found)


def _flattened_dims(mesh: Mesh, axis) -> tuple[int, ...] | None:
    """The mesh dims (of size > 1, slowest first) whose flattening is ``axis``, or None.

    Found from the fastest dim outwards: after dims of sizes multiplying to ``p``, the next
    one is the dim whose ``j``-th offset is the axis's ``(j * p)``-th, for every ``j`` (mesh
    dims never share an offset but 0, so at most one fits). O(dims^2 * size), where
    trying every ordered subset of dims was factorial in them.
    """
    axes = mesh.layout.axes
    size = axis.size()
    if size == 1:
        ones = [d for d in range(mesh.ndim) if axes[d].size() == 1]
        return (ones[0],) if ones else None
    left = [d for d in range(mesh.ndim) if axes[d].size() > 1]
    order: list[int] = []
    p = 1
    while p < size:
        fit = next(
            (
                d
                for d in left
                if size % (p * axes[d].size()) == 0
                and all(axes[d].offset(j) == axis.offset(j * p) for j in range(axes[d].size()))
            ),
            None,
        )
        if fit is None:
            return None
        order.append(fit)
        left.remove(fit)
        p *= axes[fit].size()
    dims = tuple(reversed(order))
    if Axis.from_modes(m for d in dims for m in axes[d].modes) != axis:
        return None
    return dims


def alias_named(mesh: Mesh, dims: tuple[int, ...]) -> str:
    """The (first) alias of ``mesh`` flattening exactly ``dims``, in that order."""
    for name, adims in alias_dims(mesh).items():
        if adims == dims:
            return name
    raise PlanError(f"no alias of {mesh} flattens mesh dims {dims}", value=dims)

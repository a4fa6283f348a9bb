"""Reading a mesh's arguments, and the invariants every :class:`Mesh` keeps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from meshplan.errors import MeshError

from ._axis import Axis, complement
from ._frozen import FrozenMap, frozen_map
from ._ints import as_int, brief
from ._mesh_layout import MeshLayout
from ._ranks import RankMap, short_repr

__all__ = ["MAX_WORLD", "alias_map", "check_mesh", "mesh_shape", "names_of", "sequence_of"]


def names_of(value: Iterable[str] | str) -> tuple[str, ...]:
    """Dim names: one string, or a sequence of them (checked by :func:`check_mesh`)."""
    if isinstance(value, str):
        return (value,)
    return sequence_of(value, "names")


def sequence_of(value: Iterable, what: str) -> tuple:
    """An ordered sequence argument as a tuple; strings, sets and scalars are refused."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise MeshError(f"{what} must be a sequence, got {value!r}", value=value)
    if isinstance(value, set | frozenset):
        raise MeshError(
            f"{what} must be an ordered sequence (a tuple or list), got the set {value!r}",
            value=value,
        )
    try:
        return tuple(value)
    except TypeError:  # e.g. a 0-d array
        raise MeshError(f"{what} must be a sequence, got {value!r}", value=value) from None


def alias_map(value) -> FrozenMap:
    """A mesh's aliases (a mapping of names to axes, or None) as a :class:`FrozenMap`."""
    if value is None:
        return FrozenMap()
    if not isinstance(value, Mapping):
        raise MeshError(
            f"a mesh's aliases are a mapping of names to Axis values, got {value!r}", value=value
        )
    return frozen_map(value)


MAX_WORLD = 2**31 - 1
"""The most ranks a mesh may hold: torch.distributed ranks are 32-bit ints."""


def mesh_shape(value) -> tuple[int, ...]:
    """A mesh shape as a tuple of ints >= 1 (an int, or a sequence of ints; numpy ints too)."""
    if isinstance(value, str | bytes):
        raise MeshError(f"a mesh shape is an int or a sequence of ints, got {brief(value)}", value=value)
    one = as_int(value)  # an int, a numpy int or a 0-d array
    items = (one,) if one is not None else (value,) if isinstance(value, bool) else None
    if items is None:
        items = sequence_of(value, "a mesh shape")
    out = []
    for s in items:
        size = as_int(s)
        if size is None or size < 1:
            raise MeshError(
                f"mesh shape {brief(value)} has size {brief(s)}; every size must be an int >= 1",
                value=value,
            )
        out.append(size)
    return tuple(out)


def check_mesh(
    layout: MeshLayout,
    ranks: RankMap,
    names: tuple[str, ...],
    aliases: FrozenMap[str, Axis],
    device_type: str,
) -> None:
    """Raise :class:`MeshError` unless the fields make a mesh: one distinct name per dim,
    dims and aliases that tile the rank map without overlap, a device type."""
    if not isinstance(layout, MeshLayout):
        raise MeshError(f"layout must be a MeshLayout, got {layout!r}", value=layout)
    ndim = layout.ndim
    if len(names) != ndim:
        raise MeshError(
            f"mesh of shape {layout.shape} needs {ndim} dim names, got "
            f"{len(names)}: {names!r}; give one name per dim",
            value=names,
        )
    if not isinstance(device_type, str) or not device_type:
        raise MeshError(
            f"device_type must be a non-empty string such as 'cpu' or 'cuda', got "
            f"{device_type!r}",
            value=device_type,
        )
    for n in names:
        if not isinstance(n, str) or not n:
            raise MeshError(
                f"mesh dim names must be non-empty strings, got {n!r} in {names!r}",
                value=n,
            )
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise MeshError(
            f"duplicate mesh dim names {dup!r} in {names!r}; give each dim its own name",
            value=names,
        )
    world = len(ranks)
    if not layout.is_injective():
        raise MeshError(
            f"mesh layout {layout} overlaps: two coordinates name the same rank; "
            "mesh dims must not share ranks",
            value=layout,
        )
    try:
        complement(layout.modes(), world)
    except MeshError:
        raise MeshError(
            f"mesh layout {layout} does not tile the {world} ranks of the rank map "
            f"{short_repr(ranks)}: its dims must cover the map in whole instances "
            f"without interleaving; pass a rank map whose length is a multiple of "
            f"{layout.numel()} (or a layout built by slicing a mesh over it)",
            value=layout,
        ) from None
    for alias, axis in aliases.items():
        if not isinstance(alias, str) or not alias:
            raise MeshError(
                f"alias names must be non-empty strings, got {alias!r}", value=alias
            )
        if not isinstance(axis, Axis):
            raise MeshError(f"alias {alias!r} must map to an Axis, got {axis!r}", value=axis)
        if alias in names:
            raise MeshError(
                f"alias {alias!r} clashes with a mesh dim name of {names!r}; "
                "pick another alias or dim name",
                value=alias,
            )
        if not axis.is_injective():
            raise MeshError(
                f"alias {alias!r} has the overlapping layout {axis}; an alias must not "
                "name a rank twice",
                value=axis,
            )
        try:
            complement(axis.modes, world)
        except MeshError:
            raise MeshError(
                f"alias {alias!r} has the layout {axis}, which does not tile the "
                f"{world} ranks of the rank map; flatten dims of this mesh instead",
                value=axis,
            ) from None

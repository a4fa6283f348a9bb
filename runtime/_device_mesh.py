"""Reading a torch ``DeviceMesh``: its :class:`~meshplan.layout.Mesh` and its process groups.

:func:`mesh_from_device_mesh` (also ``Mesh.from_device_mesh``) reads a ``DeviceMesh`` --
root, submesh or flattened mesh -- as a :class:`~meshplan.layout.Mesh` with the same dim
names and the same rank group along every dim; the root's flattened dims
(``dm[dims]._flatten(name)``) become aliases. :func:`device_mesh_groups` lists the torch
process group the ``DeviceMesh`` holds for every dim and flattened dim (what
``ProcessGroups.from_device_mesh`` adopts).

Both need attributes torch keeps private (``_layout``, ``_rank_map``,
``_flatten_mapping``, ``_get_root_mesh``); this module is the only place meshplan reads
them. It imports torch only when called.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import MeshError
from meshplan.layout import Axis, Mesh, MeshLayout

__all__ = ["device_mesh_groups", "mesh_from_device_mesh"]


def _is_device_mesh(value: Any) -> bool:
    from torch.distributed.device_mesh import DeviceMesh

    return isinstance(value, DeviceMesh)


def _axis(flat: Any) -> Axis:
    """A torch ``_FlatLayout`` (sizes and strides, possibly nested) as an :class:`Axis`."""
    return Axis.from_modes(tuple(flat.sizes_and_strides))


def _names_of(dm: Any) -> tuple[str, ...]:
    names = dm.mesh_dim_names
    return tuple(names) if names else tuple(f"d{i}" for i in range(dm.ndim))


def mesh_from_device_mesh(device_mesh: Any) -> Mesh:
    """The :class:`Mesh` of a torch ``DeviceMesh``: same names, same groups along every dim.

    A root mesh keeps its rank map; a submesh (``dm["tp"]``) or a flattened mesh
    (``dm["dp", "tp"]._flatten("dp_tp")``) becomes the submesh family of the root's mesh
    (the root's rank map, so ``groups()`` lists every instance). Flattened dims of the
    root become aliases (those lying within a submesh's dims stay on it). A mesh without
    dim names gets ``d0, d1, ...``.

    >>> mesh_from_device_mesh("dp")
    Traceback (most recent call last):
    ...
    meshplan.errors.MeshError: Mesh.from_device_mesh needs a torch DeviceMesh, got 'dp'; build a Mesh with Mesh.create(...) instead
    """
    if not _is_device_mesh(device_mesh):
        raise MeshError(
            f"Mesh.from_device_mesh needs a torch DeviceMesh, got {device_mesh!r}; build a "
            "Mesh with Mesh.create(...) instead",
            value=device_mesh,
        )
    root = device_mesh._get_root_mesh()
    ranks = tuple(int(r) for r in root._rank_map.tolist())
    root_names = _names_of(root)
    aliases = {name: _axis(flat._layout[0]) for name, flat in root._flatten_mapping.items()}
    whole = Mesh(
        MeshLayout(tuple(_axis(a) for a in root._layout)),
        ranks,
        root_names,
        aliases,
        root.device_type,
    )
    if device_mesh is root:
        return whole
    layout = MeshLayout(tuple(_axis(a) for a in device_mesh._layout))
    names = _names_of(device_mesh)
    try:
        sub = whole[names]
    except MeshError:
        sub = None
    if sub is not None and sub.layout == layout:
        return sub
    # a submesh whose names do not slice the root (renamed or unnamed dims)
    return Mesh(layout, ranks, names, {}, root.device_type)


def device_mesh_groups(device_mesh: Any) -> dict[str, Any]:
    """The torch process group ``device_mesh`` holds for each of its dims, then for each
    flattened dim of its root, keyed by the names ``mesh_from_device_mesh`` gives them."""
    named = bool(device_mesh.mesh_dim_names)
    found = {
        name: device_mesh.get_group(name if named else i)
        for i, name in enumerate(_names_of(device_mesh))
    }
    root = device_mesh._get_root_mesh()
    for alias, flat in root._flatten_mapping.items():
        found[alias] = flat.get_group()
    return found

"""torch interop: DeviceMesh <-> Mesh, DTensor <-> Sharded, and DTensor redistribution.

A torch program adopts meshplan one piece at a time through these conversions:

* ``Mesh.from_device_mesh`` (:func:`mesh_from_device_mesh`, defined in
  :mod:`meshplan.runtime._device_mesh`) reads a ``DeviceMesh`` as a
  :class:`~meshplan.layout.Mesh`, and ``ProcessGroups.from_device_mesh`` hands meshplan
  the ``DeviceMesh``'s own process groups. :func:`to_device_mesh` goes back.
* :func:`from_dtensor` and :func:`to_dtensor` convert one rank's view of a DTensor to a
  :class:`~meshplan.placement.Sharded` and back, keeping the local tensor as it is.
* :func:`redistribute_dtensor` moves a DTensor to other placements with a meshplan plan
  (differentiable, like ``DTensor.redistribute``).

Reading a ``DeviceMesh``'s layout, flattened dims and groups needs attributes torch
keeps private; :mod:`meshplan.runtime._device_mesh` is the only place meshplan reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from meshplan.errors import MeshError, PlacementError, RuntimeShellError
from meshplan.layout import Mesh, MeshLayout
from meshplan.placement import Partial, Replicate, Shard, Sharded, Spec, StridedShard
from meshplan.placement._torch_compat import from_torch, to_torch

from ._device_mesh import mesh_from_device_mesh
from ._groups import ProcessGroups

_MESHPLAN_PLACEMENTS = (Shard, StridedShard, Replicate, Partial)

__all__ = [
    "from_dtensor",
    "mesh_from_device_mesh",
    "redistribute_dtensor",
    "to_device_mesh",
    "to_dtensor",
]


# -- Mesh -> DeviceMesh ------------------------------------------------------------------


def _is_row_major_root(mesh: Mesh) -> bool:
    return mesh.layout == MeshLayout.row_major(mesh.shape) and len(mesh.ranks) == mesh.size()


def _alias_dims(mesh: Mesh, name: str) -> tuple[str, ...] | None:
    """Mesh dims (in order) whose flattening is the alias ``name``, if any."""
    for k in range(1, mesh.ndim + 1):
        for dims in itertools.permutations(mesh.names, k):
            if mesh.layout.collapse([mesh.names.index(d) for d in dims]) == mesh.aliases[name]:
                return dims
    return None


def to_device_mesh(mesh: Mesh, *, groups: ProcessGroups | None = None) -> Any:
    """A torch ``DeviceMesh`` with ``mesh``'s names, groups and flattened aliases.

    Needs ``torch.distributed`` initialized, and is called on every rank of the world
    (torch creates one process group per dim and per alias). With ``groups`` (a
    :class:`ProcessGroups` of ``mesh``) the DeviceMesh uses those process groups for its
    dims instead of creating new ones (``DeviceMesh.from_group``); aliases are then
    left out (torch's ``_flatten`` would create new groups; flatten on the result if
    needed). Every alias must be the flattening of some of the mesh's dims.
    """
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, Mesh):
        raise MeshError(f"to_device_mesh needs a meshplan Mesh, got {mesh!r}", value=mesh)
    names = tuple(mesh.names)
    for alias in mesh.aliases:
        if _alias_dims(mesh, alias) is None:
            raise MeshError(
                f"alias {alias!r} of {mesh} ({mesh.aliases[alias]}) is not the flattening of "
                "any of its dims, and a torch DeviceMesh only knows flattened dims; drop it "
                "or flatten whole dims",
                value=alias,
            )
    if groups is not None:
        if not isinstance(groups, ProcessGroups) or groups.mesh.groups() != mesh.groups():
            raise RuntimeShellError(
                f"groups must be the ProcessGroups of {mesh}, got {groups!r}", value=groups
            )
        if not _is_row_major_root(mesh):
            raise RuntimeShellError(
                f"to_device_mesh(groups=...) needs a root mesh (row-major over its whole "
                f"rank map), got {mesh}; convert the root and slice the DeviceMesh",
                value=mesh,
            )
        pgs = [groups.get(name).pg for name in names]
        return DeviceMesh.from_group(
            pgs if len(pgs) > 1 else pgs[0],
            mesh.device_type,
            torch.tensor(list(mesh.ranks), dtype=torch.int).reshape(mesh.shape),
            mesh_dim_names=names,
        )
    if _is_row_major_root(mesh):
        dm = DeviceMesh(
            mesh.device_type,
            torch.tensor(list(mesh.ranks), dtype=torch.int).reshape(mesh.shape),
            mesh_dim_names=names,
        )
    else:
        # a submesh family: torch builds these from a layout over the root's rank map
        from torch.distributed._mesh_layout import _MeshLayout

        layout = _MeshLayout.from_sizes_strides(
            tuple(a.sizes for a in mesh.layout.axes), tuple(a.strides for a in mesh.layout.axes)
        )
        dm = DeviceMesh(
            mesh.device_type,
            _layout=layout,
            _rank_map=torch.tensor(list(mesh.ranks), dtype=torch.int),
            mesh_dim_names=names,
        )
    for alias in sorted(mesh.aliases):
        dims = _alias_dims(mesh, alias)
        assert dims is not None  # checked above
        if list(dims) != sorted(dims, key=names.index):
            raise MeshError(
                f"alias {alias!r} of {mesh} flattens the dims {dims!r} out of mesh order, "
                "which a torch DeviceMesh cannot slice (torch 2.13 needs ascending dims); "
                "drop the alias or flatten the dims in mesh order",
                value=alias,
            )
        dm[dims]._flatten(alias)
    return dm


# -- DTensor <-> Sharded -------------------------------------------------------------------


def _torch_dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _spec_of(dt: Any, mesh: Mesh | None = None) -> Spec:
    mesh = mesh_from_device_mesh(dt.device_mesh) if mesh is None else mesh
    tspec = dt._spec
    order = None
    if not tspec.use_strided_shard_as_shard_order and tspec.shard_order:
        order = {e.tensor_dim: tuple(e.mesh_dims) for e in tspec.shard_order}
    return from_torch(
        dt.placements, mesh, tuple(dt.shape), _torch_dtype_name(dt.dtype), shard_order=order
    )


def from_dtensor(dtensor: Any, *, mesh: Mesh | None = None) -> Sharded:
    """The calling rank's part of ``dtensor`` as a :class:`Sharded` (its local tensor as is).

    Shard, Replicate, Partial (sum/avg/max/min) and ``_StridedShard`` (read literally,
    as ``distribute_tensor`` places data) convert without loss; an explicit torch shard
    order becomes the spec's shard order. ``mesh`` (the result of
    ``Mesh.from_device_mesh(dtensor.device_mesh)``) saves converting the mesh again.
    The local tensor is ``dtensor.to_local()``: gradients flow through.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(dtensor, DTensor):
        raise PlacementError(
            f"from_dtensor needs a torch DTensor, got {type(dtensor).__name__}; wrap a "
            "local tensor with Sharded(local, spec, rank) instead",
            value=dtensor,
        )
    import torch.distributed as dist

    spec = _spec_of(dtensor, mesh)
    return Sharded(dtensor.to_local(), spec, dist.get_rank())


def _check_same_mesh(spec: Spec, device_mesh: Any) -> None:
    theirs = mesh_from_device_mesh(device_mesh)
    if theirs.shape != spec.mesh.shape or any(
        theirs.groups(i) != spec.mesh.groups(i) for i in range(spec.mesh.ndim)
    ):
        raise PlacementError(
            f"device mesh {device_mesh} (as {theirs}) does not group ranks as the mesh of "
            f"{spec} does; pass the DeviceMesh the spec's mesh came from, or "
            "to_device_mesh(spec.mesh)",
            value=device_mesh,
        )


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def to_dtensor(sharded: Sharded, device_mesh: Any = None) -> Any:
    """A torch DTensor with ``sharded``'s local tensor, placements and global shape.

    ``device_mesh`` must group ranks as ``sharded.spec.mesh`` does (names may differ);
    without it one is made with :func:`to_device_mesh` (which creates process groups).
    A non-default shard order is written as torch 2.13's ``_StridedShard`` encoding,
    which is exact only for even sizes: otherwise this raises a PlacementError. The
    local tensor is passed as is (``DTensor.from_local``: gradients flow through).
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(sharded, Sharded):
        raise PlacementError(
            f"to_dtensor needs a meshplan Sharded, got {type(sharded).__name__}; build one "
            "with Sharded(local, spec, rank)",
            value=sharded,
        )
    spec = sharded.spec
    if device_mesh is None:
        device_mesh = to_device_mesh(spec.mesh)
    else:
        _check_same_mesh(spec, device_mesh)
    placements = to_torch(spec)
    return DTensor.from_local(
        sharded.local,
        device_mesh,
        placements,
        run_check=False,
        shape=torch.Size(spec.shape),
        stride=_contiguous_strides(spec.shape),
    )


# -- redistribution of DTensors --------------------------------------------------------------


def _grad_placements(grad: Sequence[Any], src: Sequence[Any]) -> tuple[Any, ...]:
    """Where a gradient goes back to: ``src``'s placements, except that a Partial source
    dim takes a Replicate gradient unless the gradient itself is Partial there (as
    ``DTensor.redistribute``'s backward does: a reduced gradient is never split again)."""
    from torch.distributed.tensor import Replicate as TReplicate

    return tuple(
        TReplicate() if s.is_partial() and not g.is_partial() else s
        for g, s in zip(grad, src, strict=True)
    )


class _RedistributeDTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, dtensor, placements, groups, options):  # type: ignore[override]
        from meshplan.redistribute import plan

        from ._run import run

        src = _spec_of(dtensor, groups.mesh)
        dst = from_torch(placements, groups.mesh, src.shape, src.dtype)
        local = run(plan(src, dst, **options), dtensor.to_local(), groups)
        ctx.src_placements = tuple(dtensor.placements)
        ctx.groups = groups
        ctx.options = options
        return to_dtensor(Sharded(local, dst, groups.rank), dtensor.device_mesh)

    @staticmethod
    def backward(ctx: Any, grad):  # type: ignore[override]
        if grad is None:
            return None, None, None, None
        target = _grad_placements(grad.placements, ctx.src_placements)
        out = _RedistributeDTensor.apply(grad, target, ctx.groups, ctx.options)
        return out, None, None, None


def _torch_placement(p: Any, placements: Sequence[Any]) -> Any:
    """``p`` as a torch placement: meshplan's own are converted, others must be torch's."""
    from torch.distributed.tensor.placement_types import Placement as TorchPlacement

    if isinstance(p, _MESHPLAN_PLACEMENTS):
        return to_torch((p,))[0]
    if not isinstance(p, TorchPlacement):
        kind = type(p)
        raise PlacementError(
            f"placements {tuple(placements)!r}: {p!r} is a {kind.__module__}.{kind.__qualname__}, "
            "neither a torch placement (torch.distributed.tensor.Shard, Replicate, Partial, "
            "_StridedShard) nor a meshplan one (meshplan.placement.Shard, StridedShard, "
            "Replicate, Partial); give one of those per mesh dim",
            value=p,
        )
    return p


def redistribute_dtensor(
    dtensor: Any,
    placements: Sequence[Any],
    *,
    groups: ProcessGroups | None = None,
    cost_model: Any = None,
    merge: bool = True,
    max_local_bytes: int | None = None,
) -> Any:
    """``dtensor.redistribute(placements=...)``, planned and run by meshplan; differentiable.

    ``placements`` are torch placements (``Shard``, ``_StridedShard``, ``Replicate``,
    ``Partial``) or meshplan's own (:class:`~meshplan.placement.Shard`, ...), which are
    converted with :func:`~meshplan.placement.to_torch`. The plan is meshplan's (:func:`meshplan.redistribute.plan`: uneven
    merged gathers, all_to_all on gloo, Partial to Partial); the groups are the DTensor's
    mesh's own (:meth:`ProcessGroups.from_device_mesh`) unless ``groups`` is given. The
    backward pass moves the gradient to the source placements (a Partial source dim gets
    a Replicate gradient) with a meshplan plan too, and is itself differentiable.
    Without ``cost_model`` it plans with the groups' options
    (``groups.plan_options()``: by default their backend's).
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(dtensor, DTensor):
        raise PlacementError(
            f"redistribute_dtensor needs a torch DTensor, got {type(dtensor).__name__}; for "
            "a local tensor use meshplan.runtime.redistribute(local, src, dst, groups)",
            value=dtensor,
        )
    if isinstance(placements, str) or not isinstance(placements, Sequence):
        raise PlacementError(
            f"placements must be a sequence of torch placements, one per mesh dim, got "
            f"{placements!r}",
            value=placements,
        )
    if len(placements) != dtensor.device_mesh.ndim:
        raise PlacementError(
            f"{len(placements)} placements {tuple(placements)!r} for a "
            f"{dtensor.device_mesh.ndim}-dim device mesh; give one per mesh dim",
            value=placements,
        )
    placements = tuple(_torch_placement(p, placements) for p in placements)
    if groups is None:  # (pass groups= to reuse one, warmed up once on NCCL)
        groups = ProcessGroups.from_device_mesh(dtensor.device_mesh, warm_up=False)
    options = {
        **groups.plan_options(cost_model),
        "merge": merge,
        "max_local_bytes": max_local_bytes,
    }
    return _RedistributeDTensor.apply(dtensor, tuple(placements), groups, options)

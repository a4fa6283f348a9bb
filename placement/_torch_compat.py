"""Lossless conversion to and from torch DTensor placements (torch imported lazily).

torch 2.13 has two ways to say in which order mesh dims shard a tensor dim: an
explicit ``shard_order`` (a tuple of ``ShardOrderEntry(tensor_dim, mesh_dims)`` on its
internal ``DTensorSpec``), and an encoding into the placements themselves, where a
mesh dim that shards "out of order" becomes ``_StridedShard(dim, split_factor)`` with
``split_factor`` the product of the sizes of the later mesh dims that shard before
it. Read literally (as ``distribute_tensor`` and
``compute_local_shape_and_global_offset`` do), that encoding places data exactly as
the order says only when sizes divide evenly; otherwise torch's own readings
disagree. meshplan keeps the two apart: :class:`~meshplan.placement.StridedShard` is
always the literal placement, and a shard order is always an order. Conversions
either keep every bit of meaning or raise :class:`~meshplan.errors.PlacementError`.

This module imports without torch; its functions import torch when called.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.layout._ints import brief

from ._local import dim_intervals
from ._spec import Spec
from ._types import Partial, Placement, Replicate, Shard, StridedShard

__all__ = ["to_torch", "to_torch_shard_order", "from_torch"]

_ORDER_MODES = ("strided", "separate")


def _torch_types():
    from torch.distributed.tensor import Partial as TPartial
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard

    return TShard, _StridedShard, TReplicate, TPartial


def _is_default(order: Sequence[int]) -> bool:
    return list(order) == sorted(order)


def _order_of(placements: Sequence[Placement], given: Mapping[Any, Any] | None):
    """Tensor dim -> mesh dims, for bare placements (no mesh to resolve names against)."""
    sharding: dict[int, list[int]] = {}
    for m, p in enumerate(placements):
        if isinstance(p, Shard | StridedShard):
            sharding.setdefault(p.dim, []).append(m)
    order = {d: tuple(ms) for d, ms in sharding.items()}
    try:
        items = dict(given or {}).items()
    except (TypeError, ValueError):
        raise PlacementError(
            f"shard_order {given!r} is not a mapping tensor dim -> mesh dims; write e.g. "
            "{0: (1, 0)}",
            value=given,
        ) from None
    for d, ms in items:
        ms = (ms,) if isinstance(ms, int) else tuple(ms) if isinstance(ms, list | tuple) else ms
        if not isinstance(ms, tuple):
            ms = (ms,)
        ints = all(isinstance(m, int) and not isinstance(m, bool) for m in ms)
        if not ints or d not in sharding or sorted(ms) != sharding[d]:
            raise PlacementError(
                f"shard_order {dict(given or {})!r} gives tensor dim {d!r} the mesh dims "
                f"{ms!r}, but placements {tuple(map(str, placements))} shard it on "
                f"{tuple(sharding.get(d, ()))!r}; list each of them exactly once, by index",
                value=given,
            )
        order[d] = ms
    return order


def _same_layout(a: Spec, b: Spec, tensor_dim: int) -> tuple[int, ...] | None:
    """None when ``a`` and ``b`` agree along ``tensor_dim``; else a coordinate where not."""
    dims = sorted(set(a.order(tensor_dim)) | set(b.order(tensor_dim)))
    coord = [0] * a.mesh.ndim
    for values in itertools.product(*(range(a.mesh.shape[m]) for m in dims)):
        for m, v in zip(dims, values, strict=True):
            coord[m] = v
        if dim_intervals(a, coord, tensor_dim) != dim_intervals(b, coord, tensor_dim):
            return tuple(coord)
    return None


def _encode(spec: Spec, tensor_dim: int) -> dict[int, Placement]:
    """torch 2.13's _StridedShard encoding of ``spec``'s order along ``tensor_dim``."""
    order = spec.order(tensor_dim)
    out: dict[int, Placement] = {}
    for idx, m in enumerate(order):
        p = spec.placements[m]
        if not isinstance(p, Shard):
            raise PlacementError(
                f"{spec} shards tensor dim {tensor_dim} in order "
                f"{tuple(spec.mesh.names[i] for i in order)!r} and with {p!r} on mesh dim "
                f"{spec.mesh.names[m]!r}; torch encodes a shard order with _StridedShard, so "
                "it cannot hold both. Use order='separate' with to_torch_shard_order(spec)",
                value=spec,
            )
        sf = math.prod(spec.mesh.shape[i] for i in order[:idx] if i > m)
        out[m] = StridedShard(tensor_dim, sf) if sf > 1 else Shard(tensor_dim)
    return out


def _describe(spec: Spec, coord: tuple[int, ...], tensor_dim: int) -> str:
    return f"{list(dim_intervals(spec, coord, tensor_dim))}"


def _placements_and_orders(value: Any, shard_order: Any) -> tuple[Spec | None, list, dict]:
    """``(spec or None, placements, shard orders)`` of a Spec, or of bare meshplan
    placements with an optional ``shard_order``; a PlacementError for anything else."""
    if isinstance(value, Spec):
        if shard_order is not None:
            raise PlacementError(
                f"{value} carries its own shard order; pass shard_order only with bare placements",
                value=shard_order,
            )
        return value, list(value.placements), dict(value.shard_order)
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise PlacementError(
            f"expected a Spec or a sequence of meshplan placements, got {brief(value)}",
            value=value,
        )
    try:
        placements = list(value)
    except TypeError:  # an iterable that refuses to iterate (a 0-d tensor)
        raise PlacementError(
            f"expected a Spec or a sequence of meshplan placements, got {brief(value)}",
            value=value,
        ) from None
    for p in placements:
        if not isinstance(p, Shard | StridedShard | Replicate | Partial):
            raise PlacementError(
                f"{brief(p)} in {brief(value)} is not a meshplan placement (Shard, StridedShard, "
                "Replicate or Partial)",
                value=p,
            )
    return None, placements, _order_of(placements, shard_order)


def to_torch(
    value: Spec | Sequence[Placement],
    shard_order: Mapping[int, Sequence[int]] | None = None,
    *,
    order: str = "strided",
) -> tuple[Any, ...]:
    """torch DTensor placements for a spec (or for bare meshplan placements).

    ``Shard``, ``StridedShard``, ``Replicate`` and ``Partial`` map to torch's
    ``Shard``, ``_StridedShard``, ``Replicate`` and ``Partial``; read literally (as
    ``distribute_tensor`` does) they place data exactly as meshplan does. A
    non-default shard order is encoded as torch 2.13 does, with ``_StridedShard``
    (``order="strided"``, needs a :class:`Spec`), and only where that encoding is exact
    for the spec's shape: otherwise this raises. With ``order="separate"`` the
    placements stay plain and the order is for :func:`to_torch_shard_order` to carry.

    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> to_torch(Spec(mesh, (Shard(0), Partial("avg")), (8,)))
    (Shard(dim=0), Partial(avg))
    >>> to_torch(Spec(mesh, (Shard(0), Shard(0)), (8,), shard_order={0: (1, 0)}))
    (_StridedShard(dim=0, sf=2), Shard(dim=0))
    """
    if order not in _ORDER_MODES:
        raise PlacementError(f"order must be one of {_ORDER_MODES!r}, got {order!r}", value=order)
    spec, placements, orders = _placements_and_orders(value, shard_order)
    reordered = sorted(d for d, ms in orders.items() if not _is_default(ms))
    if reordered and order == "strided":
        if spec is None:
            raise PlacementError(
                f"placements {tuple(map(str, placements))} with shard order "
                f"{ {d: orders[d] for d in reordered}!r}: encoding an order as _StridedShard "
                "needs the mesh and shape (pass a Spec), or use order='separate' with "
                "to_torch_shard_order",
                value=shard_order,
            )
        for d in reordered:
            encoded = _encode(spec, d)
            literal = [encoded.get(m, p) for m, p in enumerate(placements)]
            literal_spec = Spec(spec.mesh, literal, spec.shape, spec.dtype)
            bad = _same_layout(spec, literal_spec, d)
            if bad is not None:
                raise PlacementError(
                    f"torch 2.13 encodes the shard order of {spec} (tensor dim {d}: "
                    f"{tuple(spec.mesh.names[m] for m in spec.order(d))!r}) as "
                    f"{tuple(map(str, literal))}, but with size {spec.shape[d]} (uneven) "
                    f"torch reads that differently: at mesh coordinate {bad} the order "
                    f"holds {_describe(spec, bad, d)} and torch's placements "
                    f"{_describe(literal_spec, bad, d)}. Use order='separate' with "
                    "to_torch_shard_order(spec), or redistribute to the default order",
                    value=spec,
                )
            placements = literal
    TShard, TStrided, TReplicate, TPartial = _torch_types()
    out = []
    for p in placements:
        match p:
            case StridedShard(dim=d, split_factor=sf):
                out.append(TStrided(d, split_factor=sf))
            case Shard(dim=d):
                out.append(TShard(d))
            case Replicate():
                out.append(TReplicate())
            case Partial(op=op):
                out.append(TPartial(op))
    return tuple(out)


def to_torch_shard_order(
    value: Spec | Sequence[Placement], shard_order: Mapping[int, Sequence[int]] | None = None
) -> tuple[Any, ...]:
    """torch's explicit shard order: ``ShardOrderEntry(tensor_dim, mesh_dims)`` per sharded dim.

    Goes with ``to_torch(value, order="separate")`` into torch's
    ``DTensorSpec(mesh, placements, shard_order=...)``.

    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> to_torch_shard_order(Spec(mesh, (Shard(0), Shard(0)), (8,), shard_order={0: (1, 0)}))
    (ShardOrderEntry(tensor_dim=0, mesh_dims=(1, 0)),)
    """
    from torch.distributed.tensor._dtensor_spec import ShardOrderEntry

    orders = _placements_and_orders(value, shard_order)[2]
    return tuple(ShardOrderEntry(tensor_dim=d, mesh_dims=tuple(orders[d])) for d in sorted(orders))


def _from_torch_placement(p: Any) -> Placement:
    TShard, TStrided, TReplicate, TPartial = _torch_types()
    kind = type(p)
    if kind is TShard:
        return Shard(int(p.dim))
    if kind is TStrided:
        sf = p.split_factor
        if not isinstance(sf, int):
            raise PlacementError(
                f"{p!r} has a symbolic split factor {sf!r}; meshplan needs a concrete int",
                value=p,
            )
        return StridedShard(int(p.dim), sf)
    if kind is TReplicate:
        return Replicate()
    if kind is TPartial:
        try:
            return Partial(p.reduce_op)
        except PlacementError as e:
            raise PlacementError(f"torch {brief(p)}: {e}", value=p) from None
    raise PlacementError(
        f"torch placement {brief(p)} ({kind.__name__}) has no meshplan counterpart; converting "
        "it would lose what it means. Redistribute it to Shard, _StridedShard, Replicate "
        "or Partial(sum/avg/max/min) first",
        value=p,
    )


def _torch_order(value: Any) -> dict[int, tuple[Any, ...]]:
    if value is None:
        return {}
    try:
        if isinstance(value, Mapping):
            return {d: (ms,) if isinstance(ms, int | str) else tuple(ms) for d, ms in value.items()}
        out: dict[int, tuple[Any, ...]] = {}
        for entry in value:
            d, ms = entry
            out[operator.index(d)] = tuple(ms)
        return out
    except (TypeError, ValueError):
        raise PlacementError(
            f"shard_order {value!r} is not a shard order: give torch's ShardOrderEntry "
            "tuples, (tensor_dim, mesh_dims) pairs, or a mapping tensor dim -> mesh dims",
            value=value,
        ) from None


def _mesh_of(mesh: Any) -> Mesh:
    if isinstance(mesh, Mesh):
        return mesh
    # a torch DeviceMesh (duck-typed): its rank tensor is the row-major rank map
    ranks_tensor = getattr(mesh, "mesh", None)
    if ranks_tensor is not None and hasattr(ranks_tensor, "tolist"):
        names = getattr(mesh, "mesh_dim_names", None)
        return Mesh.create(
            tuple(ranks_tensor.shape),
            tuple(names) if names else None,
            ranks=ranks_tensor.flatten().tolist(),
            device_type=getattr(mesh, "device_type", "cpu"),
        )
    raise PlacementError(
        f"from_torch needs a meshplan Mesh (or a torch DeviceMesh), got {mesh!r}", value=mesh
    )


def _decode(placements: list[Placement], mesh: Mesh, tensor_dim: int) -> tuple[int, ...]:
    """The shard order torch 2.13 reads from _StridedShard split factors along one dim."""
    seq: list[int] = []
    for m in reversed(range(len(placements))):
        p = placements[m]
        if not isinstance(p, Shard | StridedShard) or p.dim != tensor_dim:
            continue
        sf = p.split_factor if isinstance(p, StridedShard) else 1
        for i in range(len(seq) + 1):
            if math.prod(mesh.shape[j] for j in seq[:i]) == sf:
                seq.insert(i, m)
                break
        else:
            raise PlacementError(
                f"placements {tuple(map(str, placements))} do not encode a shard order of "
                f"tensor dim {tensor_dim} on mesh {mesh}: no order gives {p} its split "
                f"factor {sf}. Read them literally (decode_order=False)",
                value=tuple(placements),
            )
    return tuple(seq)


def from_torch(
    placements: Iterable[Any],
    mesh: Any = None,
    shape: Sequence[int] | None = None,
    dtype: Any = "float32",
    *,
    shard_order: Any = None,
    decode_order: bool | Collection[int] = False,
) -> Spec | tuple[tuple[Placement, ...], dict[int, tuple[Any, ...]]]:
    """meshplan placements (a :class:`Spec` when ``mesh`` and ``shape`` are given) from torch's.

    ``_StridedShard`` is read literally, as torch's ``distribute_tensor`` and
    ``compute_local_shape_and_global_offset`` read it, unless ``decode_order`` (True,
    or a collection of tensor dims) asks to read it as torch 2.13's encoding of a
    shard order (as torch's ``DTensorSpec`` does); decoding raises where the two
    readings place data differently (uneven sizes) or where no order fits.
    ``shard_order`` takes torch's explicit order (``ShardOrderEntry`` tuples, or a
    mapping tensor dim -> mesh dims). Without ``mesh`` and ``shape`` the result is
    ``(placements, shard_order)``.

    >>> from torch.distributed.tensor import Shard as TShard, Replicate as TReplicate
    >>> from torch.distributed.tensor.placement_types import _StridedShard
    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> print(from_torch([TShard(0), TReplicate()], mesh, (8, 4)))
    f32[8,4](S(0) R)
    >>> pl = [_StridedShard(0, split_factor=2), TShard(0)]
    >>> print(from_torch(pl, mesh, (8,)))
    f32[8](SS(0,2) S(0))
    >>> print(from_torch(pl, mesh, (8,), decode_order=True))
    f32[8](S(0)[1,0] S(0))
    """
    converted = [_from_torch_placement(p) for p in _torch_placements(placements, decode_order)]
    given = _torch_order(shard_order)
    if mesh is None and shape is None:
        if decode_order:
            raise PlacementError(
                "decode_order needs the mesh and shape (torch's encoding depends on mesh "
                "sizes); pass mesh= and shape=",
                value=decode_order,
            )
        return tuple(converted), dict(_order_of(converted, given))
    if mesh is None or shape is None:
        raise PlacementError(
            "from_torch needs both mesh and shape for a Spec (or neither for bare "
            f"placements); got mesh={mesh!r}, shape={shape!r}",
            value=(mesh, shape),
        )
    mesh = _mesh_of(mesh)
    shape = tuple(shape)
    literal = Spec(mesh, converted, shape, dtype, given)
    if decode_order is False:
        return literal
    dims = _decoded_dims(literal, decode_order)
    return _decoded(literal, converted, dims, given, shard_order)


def _torch_placements(placements: Any, decode_order: Any) -> list:
    """``from_torch``'s placements as a list, its arguments checked."""
    if isinstance(placements, str) or not isinstance(placements, Iterable):
        raise PlacementError(
            f"from_torch takes a sequence of torch placements, got {placements!r}",
            value=placements,
        )
    if not isinstance(decode_order, bool) and (
        isinstance(decode_order, str) or not isinstance(decode_order, Collection)
    ):
        raise PlacementError(
            f"decode_order is True, False or a collection of tensor dims, got {decode_order!r}",
            value=decode_order,
        )
    try:
        return list(placements)
    except TypeError:  # not iterable, or a 0-d tensor
        raise PlacementError(
            f"from_torch takes a sequence of torch placements, got {brief(placements)}",
            value=placements,
        ) from None


def _decoded_dims(literal: Spec, decode_order: Any) -> set[int]:
    """The tensor dims whose ``_StridedShard`` placements ``decode_order`` asks to read as
    a shard order (True: every dim a StridedShard shards)."""
    shape = literal.shape
    ndim = len(shape)
    if decode_order is True:
        return {p.dim for p in literal.placements if isinstance(p, StridedShard)}
    dims = set()
    for d in decode_order:
        if isinstance(d, bool) or not isinstance(d, int) or not -ndim <= d < ndim:
            raise PlacementError(
                f"decode_order names {d!r}, not a tensor dim of shape {shape!r}",
                value=decode_order,
            )
        dims.add(d % ndim)
    return dims


def _decoded(literal: Spec, converted: list, dims: set[int], given, shard_order: Any) -> Spec:
    """``literal`` with the StridedShards of ``dims`` read as torch 2.13's encoding of a
    shard order; raises where that places data otherwise than the literal reading."""
    mesh, shape, ndim = literal.mesh, literal.shape, len(literal.shape)
    placements_now = list(literal.placements)
    orders = dict(literal.shard_order)
    for d in sorted(dims):
        if any(d == (k % ndim) for k in given):
            raise PlacementError(
                f"tensor dim {d} has both an explicit shard_order and decode_order; torch "
                "allows one or the other",
                value=shard_order,
            )
        if not any(isinstance(p, StridedShard) and p.dim == d for p in placements_now):
            continue
        seq = _decode(list(literal.placements), mesh, d)
        orders[d] = seq
        for m in seq:
            placements_now[m] = Shard(d)
    decoded = Spec(mesh, placements_now, shape, literal.dtype, orders)
    for d in sorted(dims):
        bad = _same_layout(decoded, literal, d)
        if bad is not None:
            raise PlacementError(
                f"torch 2.13 reads {tuple(map(str, converted))} as shard order "
                f"{ {d: decoded.order(d)}!r}, but for size {shape[d]} (uneven) its "
                f"distribute_tensor places data otherwise: at mesh coordinate {bad} the "
                f"order holds {_describe(decoded, bad, d)}, the literal placements "
                f"{_describe(literal, bad, d)}. Say which is meant: decode_order=False for "
                "the literal reading, or an explicit shard_order",
                value=tuple(placements_now),
            )
    return decoded

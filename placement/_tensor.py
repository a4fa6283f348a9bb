"""Pure functions over tensor values: ``shard`` and ``unshard`` for all ranks at once."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import torch

from meshplan.errors import PlacementError
from meshplan.layout._ints import as_int, brief
from meshplan.layout._mesh import first_instance
from meshplan.layout._ranks import short_repr

from ._local import Intervals, check_coordinate, local_intervals
from ._spec import Spec
from ._types import Partial, Replicate

__all__ = ["shard", "shard_one", "unshard", "gather_index", "partial_keeps", "reduction_dtype"]


def gather_index(intervals: Intervals, device=None) -> torch.Tensor:
    """The global indices of a list of intervals, as a 1-D int64 tensor."""
    if isinstance(intervals, str) or not isinstance(intervals, Iterable):
        raise PlacementError(
            f"gather_index takes (start, stop) intervals, got {intervals!r}", value=intervals
        )
    intervals = tuple(intervals)
    for iv in intervals:
        ok = isinstance(iv, tuple | list) and len(iv) == 2
        ok = ok and all(type(x) is int or as_int(x) is not None for x in iv)
        if not (ok and 0 <= iv[0] <= iv[1]):
            raise PlacementError(
                f"gather_index takes (start, stop) intervals with 0 <= start <= stop, got "
                f"{brief(iv)}",
                value=intervals,
            )
    try:
        if not intervals:
            return torch.empty(0, dtype=torch.long, device=device)
        return torch.cat([torch.arange(a, b, device=device) for a, b in intervals])
    except (TypeError, ValueError, RuntimeError) as e:  # a device torch does not know
        raise PlacementError(
            f"gather_index: device={device!r:.80} is not a torch device ({e})", value=device
        ) from None


def _select(tensor: torch.Tensor, per_dim: tuple[Intervals, ...]) -> torch.Tensor:
    out = tensor
    for d, ivs in enumerate(per_dim):
        if ivs == ((0, tensor.shape[d]),):
            continue
        if len(ivs) == 1:
            a, b = ivs[0]
            out = out.narrow(d, a, b - a)
        else:
            out = out.index_select(d, gather_index(ivs, tensor.device))
    return out


def partial_keeps(spec: Spec, coordinate: tuple[int, ...]) -> bool:
    """Whether a rank keeps the value (True) or holds the op's neutral part (False).

    meshplan's canonical partial split of a replicated value: along ``Partial("sum")``
    dims only coordinate 0 keeps the value, the others hold zeros (exact for every
    dtype); along ``avg``/``max``/``min`` dims every rank keeps the value.
    """
    _check_spec(spec)
    coordinate = check_coordinate(spec, coordinate)
    return all(
        coordinate[i] == 0
        for i, p in enumerate(spec.placements)
        if isinstance(p, Partial) and p.op == "sum"
    )


def shard_one(tensor: torch.Tensor, spec: Spec, rank: int) -> torch.Tensor:
    """Rank ``rank``'s local tensor for ``spec`` (one entry of :func:`shard`).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import StridedShard
    >>> spec = Spec(Mesh.create(2), (StridedShard(0, 2),), (8,), "int64")
    >>> shard_one(torch.arange(8), spec, 1)
    tensor([2, 3, 6, 7])
    """
    _check_tensor(tensor, spec)
    return _local(tensor, spec, rank)


def _local(tensor: torch.Tensor, spec: Spec, rank: int) -> torch.Tensor:
    local = _select(tensor, local_intervals(spec, rank)).contiguous()
    if spec.is_partial and not partial_keeps(spec, spec.mesh.coordinate(rank)):
        return torch.zeros_like(local)
    # never hand out the input or a view of it: callers may write to their local tensor
    # (asked of the tensors, not their storage, which traced and simulated tensors lack)
    if local is tensor or local._base is not None:
        return local.clone()
    return local


def shard(tensor: torch.Tensor, spec: Spec) -> dict[int, torch.Tensor]:
    """Every rank's local tensor for ``spec``: rank -> contiguous local tensor.

    Partial dims get meshplan's canonical split (see :func:`partial_keeps`).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> spec = Spec(Mesh.create(2), (Shard(0),), (3,), "int64")
    >>> shard(torch.arange(3), spec)
    {0: tensor([0, 1]), 1: tensor([2])}
    """
    _check_tensor(tensor, spec)
    return {rank: _local(tensor, spec, rank) for rank in first_instance(spec.mesh)}


def unshard(
    locals_: dict[int, torch.Tensor], spec: Spec, *, check: bool = True
) -> torch.Tensor:
    """The global tensor from every rank's local tensor (Partial dims are reduced).

    A rank outside the mesh is refused; for a sliced mesh (a family of submeshes) the
    first instance's locals are read and those of the other instances ignored. Ranks
    that differ only along ``Replicate`` mesh dims hold one block: with ``check`` (the
    default) their locals must agree (NaNs agreeing with NaNs) or a
    :class:`PlacementError` names the two ranks; ``check=False`` reads the replica of
    the lowest coordinate and skips the comparison.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Partial
    >>> spec = Spec(Mesh.create(2), (Partial("max"),), (2,), "int64")
    >>> unshard({0: torch.tensor([1, 5]), 1: torch.tensor([4, 2])}, spec)
    tensor([4, 5])
    """
    _check_spec(spec)
    if not isinstance(locals_, Mapping):
        raise PlacementError(
            f"unshard takes a mapping rank -> local tensor, got {type(locals_).__name__}",
            value=locals_,
        )
    ranks = first_instance(spec.mesh)
    missing = [r for r in ranks if r not in locals_]
    if missing:
        raise PlacementError(
            f"unshard needs every rank's local tensor; missing ranks {missing[:8]!r}",
            value=missing,
        )
    for r in locals_:
        if as_int(r) is None or spec.mesh.coordinate(r) is None:
            raise PlacementError(
                f"unshard got a local tensor for rank {r!r}, which is not in the mesh of "
                f"{spec} (ranks {short_repr(spec.mesh.ranks)}); pass only the mesh's ranks",
                value=r,
            )
    first = locals_[ranks[0]]
    pdims = spec.partial_dims
    rdims = [i for i, p in enumerate(spec.placements) if isinstance(p, Replicate)]
    parts: dict[tuple[int, ...], torch.Tensor] = {}
    for rank in ranks:
        coord = spec.mesh.coordinate(rank)
        assert coord is not None  # every rank of the first instance is in the mesh
        per_dim = local_intervals(spec, rank)
        local = locals_[rank]
        if not isinstance(local, torch.Tensor):
            raise PlacementError(
                f"rank {rank}'s local is a {type(local).__name__}, not a torch.Tensor",
                value=rank,
            )
        name = str(local.dtype).removeprefix("torch.")
        if name != spec.dtype:
            raise PlacementError(
                f"rank {rank}'s local tensor is {name}, but {spec} holds {spec.dtype}; "
                "convert the locals or build the spec with their dtype",
                value=rank,
            )
        want = tuple(sum(b - a for a, b in ivs) for ivs in per_dim)
        if tuple(local.shape) != want:
            raise PlacementError(
                f"rank {rank}'s local tensor has shape {tuple(local.shape)}, but {spec} "
                f"gives it {want}",
                value=rank,
            )
        if any(coord[i] for i in rdims):  # a replica of a block read before
            if check:
                held = list(coord)
                for i in rdims:
                    held[i] = 0
                source = spec.mesh.rank_at(held, at=ranks[0])
                _check_replica(spec, rank, source, locals_[source], local)
            continue
        key = tuple(coord[i] for i in pdims)
        if key not in parts:
            parts[key] = torch.zeros(spec.shape, dtype=first.dtype, device=first.device)
        _place(parts[key], per_dim, local)
    if not pdims:
        return parts[()]
    ops = {spec.placements[i].op for i in pdims}
    dtype = first.dtype
    wide = reduction_dtype(dtype)
    if wide != dtype:
        parts = {k: v.to(wide) for k, v in parts.items()}
    if ops == {"max"}:
        return torch.stack([parts[k] for k in sorted(parts)]).amax(0).to(dtype)
    if ops == {"min"}:
        return torch.stack([parts[k] for k in sorted(parts)]).amin(0).to(dtype)
    return _sum_avg(parts, [spec.placements[i].op == "avg" for i in pdims]).to(dtype)


def _check_replica(
    spec: Spec, rank: int, source: int, held: torch.Tensor, local: torch.Tensor
) -> None:
    """Raise unless ``local`` (rank ``rank``'s) equals ``held`` (rank ``source``'s), the
    replica it copies."""
    if torch.equal(held, local):
        return
    if (held.is_floating_point() or held.is_complex()) and bool(
        ((held == local) | (held.isnan() & local.isnan())).all()
    ):
        return
    raise PlacementError(
        f"rank {rank}'s local tensor differs from rank {source}'s, which it replicates in "
        f"{spec}: replicas must hold equal values; fix the ranks that diverged, or pass "
        "check=False to read the first replica",
        value=rank,
    )


def reduction_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype Partial values of ``dtype`` are reduced in (by ``unshard``, the simulator
    and ``run``): their own, but float64 for 8-bit floats, which have no arithmetic (their
    sums are exact there; the result rounds back once).

    >>> reduction_dtype(torch.float8_e4m3fn), reduction_dtype(torch.int16)
    (torch.float64, torch.int16)
    """
    return torch.float64 if dtype.is_floating_point and dtype.itemsize == 1 else dtype


def _sum_avg(parts: dict[tuple[int, ...], torch.Tensor], is_avg: list[bool]) -> torch.Tensor:
    """Sum over the sum dims, then average over the avg dims.

    The average is taken as ``first + sum(other - first) / n``: equal to the plain mean,
    and exact when the parts agree (as meshplan's canonical split makes them), in every
    dtype. Integers divide with floor, like ``sum // n``.
    """
    groups: dict[tuple[int, ...], torch.Tensor] = {}
    for key in sorted(parts):
        part = parts[key]
        if part.dtype == torch.bool:
            part = part.to(torch.int64)
        avg_key = tuple(c for c, a in zip(key, is_avg, strict=True) if a)
        groups[avg_key] = groups[avg_key] + part if avg_key in groups else part.clone()
    values = [groups[k] for k in sorted(groups)]
    base = values[0]
    if len(values) == 1:
        return base
    if base.is_floating_point() or base.is_complex():
        delta = sum((v - base for v in values[1:]), torch.zeros_like(base))
        return base + delta / len(values)
    # integers: the differences in int64, so unsigned and narrow types do not wrap (the
    # floor of the true mean)
    wide = base.to(torch.int64)
    delta = sum((v.to(torch.int64) - wide for v in values[1:]), torch.zeros_like(wide))
    return (wide + delta // len(values)).to(base.dtype)


def _place(target: torch.Tensor, per_dim: tuple[Intervals, ...], local: torch.Tensor) -> None:
    if local.numel() == 0:
        return
    # Write box by box: the local tensor is the cartesian product of per-dim intervals.
    local_starts = [list(itertools.accumulate([0] + [b - a for a, b in ivs])) for ivs in per_dim]
    for box in itertools.product(*[range(len(ivs)) for ivs in per_dim]):
        dst = target
        src = local
        for d, k in enumerate(box):
            a, b = per_dim[d][k]
            dst = dst.narrow(d, a, b - a)
            src = src.narrow(d, local_starts[d][k], b - a)
        dst.copy_(src)


def _check_spec(spec) -> None:
    if not isinstance(spec, Spec):
        raise PlacementError(f"expected a Spec, got {spec!r}", value=spec)


def _check_tensor(tensor: torch.Tensor, spec: Spec) -> None:
    _check_spec(spec)
    if not isinstance(tensor, torch.Tensor):
        raise PlacementError(
            f"expected a torch.Tensor, got {type(tensor).__name__}; convert it with "
            "torch.as_tensor(...)",
            value=tensor,
        )
    if tuple(tensor.shape) != spec.shape:
        raise PlacementError(
            f"tensor of shape {tuple(tensor.shape)} does not match {spec} (shape {spec.shape})",
            value=tuple(tensor.shape),
        )
    name = str(tensor.dtype).removeprefix("torch.")
    if name != spec.dtype:
        raise PlacementError(
            f"tensor dtype {name} does not match spec dtype {spec.dtype}; build the spec with "
            f"dtype={name!r} or convert the tensor",
            value=name,
        )

"""Loading sharded tensors: any rank's part of each saved tensor, under any target spec.

A load reads the index, intersects the target rank's boxes with the saved chunks
(:func:`~meshplan.checkpoint.plan_reads`) and copies only the overlapping parts; with
``verify=True`` (the default) every chunk it touches is read whole once and its checksum
checked, with ``verify=False`` only the needed slices are read. Before a rank allocates
its local tensors, every chunk it reads is checked against its shard file's header. A
load with ``groups`` exchanges one thing: its outcome, so that when one rank's load
fails every rank raises (:mod:`._agree`); it reads no data from other ranks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import torch

from meshplan.errors import CheckpointError
from meshplan.layout._ints import as_bool
from meshplan.layout._mesh import first_instance
from meshplan.placement import Sharded, Spec, local_shape
from meshplan.placement._tensor import partial_keeps

from ._agree import agree
from ._encoding import REAL_VIEW, recorded_checksum, restored
from ._files import reading
from ._header import Header, read_header
from ._index import ChunkRecord, Metadata, TensorMeta, missing_tensor
from ._index_json import checkpoint_path
from ._plan import check_target, plan_reads
from ._ranks import check_groups, resolve_rank

__all__ = ["load", "load_all"]


class _Reader:
    """Open shard files lazily; hand out verified chunks or raw slices."""

    def __init__(self, directory: str, verify: bool) -> None:
        self.directory = directory
        self.verify = verify
        self.stack = contextlib.ExitStack()
        self.handles: dict[str, Any] = {}
        self.cache: dict[tuple[str, str], torch.Tensor] = {}
        self.headers: dict[str, Header] = {}

    def close(self) -> None:
        self.cache.clear()
        self.headers.clear()
        self.stack.close()

    def check(self, meta: TensorMeta, rec: ChunkRecord) -> None:
        """Raise unless ``rec``'s shard file header holds its box whole (before any
        allocation or read: see :mod:`._header`)."""
        header = self.headers.get(rec.file)
        if header is None:
            header = self.headers[rec.file] = read_header(self.directory, meta, rec)
        header.check(meta, rec)

    def _open(self, meta: TensorMeta, rec: ChunkRecord) -> Any:
        from safetensors import safe_open

        handle = self.handles.get(rec.file)
        if handle is None:
            full = os.path.join(self.directory, rec.file)
            self.check(meta, rec)  # a regular file, holding this entry whole
            try:
                handle = self.stack.enter_context(safe_open(full, framework="pt", device="cpu"))
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(
                    f"shard file {rec.file!r} (tensor {meta.key!r}) is not readable "
                    f"safetensors: {e}",
                    value=rec.file,
                ) from None
            self.handles[rec.file] = handle
        return handle

    def _whole(self, meta: TensorMeta, rec: ChunkRecord) -> torch.Tensor:
        cached = self.cache.get((rec.file, rec.name))
        if cached is not None:
            return cached
        handle = self._open(meta, rec)
        try:
            tensor = handle.get_tensor(rec.name)
        except Exception as e:
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} cannot be read from {rec.file!r}: {e}",
                value=rec.file,
            ) from None
        tensor = restored(tensor, meta)
        self._check_form(meta, rec, tuple(tensor.shape), tensor.dtype)
        got = recorded_checksum(tensor, meta, rec)
        if got != rec.checksum:
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} in {rec.file!r} is corrupt: checksum "
                f"{got} != {rec.checksum} recorded in the index",
                value=rec.file,
            )
        self.cache[(rec.file, rec.name)] = tensor
        return tensor

    def _check_form(
        self, meta: TensorMeta, rec: ChunkRecord, shape: tuple[int, ...], dtype: torch.dtype
    ) -> None:
        if shape != rec.sizes or dtype != getattr(torch, meta.dtype):
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} in {rec.file!r} holds "
                f"{str(dtype).removeprefix('torch.')}{list(shape)}, but the index says "
                f"{meta.dtype}{list(rec.sizes)}; the checkpoint is damaged",
                value=rec.file,
            )

    def piece(self, meta: TensorMeta, rec: ChunkRecord, offsets, sizes) -> torch.Tensor:
        index = tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))
        if self.verify or not index:
            return self._whole(meta, rec)[index]
        handle = self._open(meta, rec)
        try:
            view = handle.get_slice(rec.name)
            shape = tuple(view.get_shape())
            if getattr(torch, meta.dtype) in REAL_VIEW:
                shape = shape[:-1] if shape[-1:] == (2,) else shape + (0,)
            if shape != rec.sizes:
                self._check_form(meta, rec, shape, getattr(torch, meta.dtype))
            return restored(view[index], meta)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} cannot be read from {rec.file!r}: {e}",
                value=rec.file,
            ) from None

    def forget(self) -> None:
        self.cache.clear()


def _load_one(reader: _Reader, meta: TensorMeta, spec: Spec, rank: int) -> Sharded:
    dtype = getattr(torch, spec.dtype)
    shape = local_shape(spec, rank)
    reads = plan_reads(meta, spec, rank)
    for read in reads:  # the files hold what the index says: the sizes below are real
        reader.check(meta, meta.chunks[read.chunk])
    if spec.is_partial and not partial_keeps(spec, spec.mesh.coordinate(rank)):
        return Sharded(torch.zeros(shape, dtype=dtype), spec, rank)
    local = torch.empty(shape, dtype=dtype)
    for read in reads:
        rec = meta.chunks[read.chunk]
        src = reader.piece(meta, rec, read.source.offsets, read.source.sizes)
        if src.dtype != dtype or tuple(src.shape) != read.source.sizes:
            reader._check_form(meta, rec, tuple(src.shape), src.dtype)
        index = tuple(
            slice(o, o + n) for o, n in zip(read.target.offsets, read.target.sizes, strict=True)
        )
        local[index] = src
    return Sharded(local, spec, rank)


def _on_device(value: Sharded, device: Any) -> Sharded:
    if device is None:
        return value
    try:
        return value.with_local(value.local.to(device))
    except (RuntimeError, TypeError, AssertionError) as e:
        raise CheckpointError(
            f"cannot place the loaded tensors on device={device!r}: {e}; pass a device "
            "this process has (e.g. 'cpu', or 'cuda' after torch.cuda.set_device)",
            value=device,
        ) from None


def _check_targets(targets: Any, meta: Metadata, directory: str) -> None:
    if not isinstance(targets, Mapping):
        raise CheckpointError(
            f"targets must map tensor names to Specs, got {type(targets)!r}", value=targets
        )
    for key, spec in targets.items():
        if key not in meta.tensors:
            raise missing_tensor(key, meta.tensors, f" at {directory!r}")
        check_target(meta.tensors[key], spec, repr(directory))


def _verify_flag(verify: Any) -> bool:
    flag = as_bool(verify)
    if flag is None:
        raise CheckpointError(
            f"verify must be True or False, got {verify!r}; pass verify=False to skip the "
            "checksums",
            value=verify,
        )
    return flag


def load(
    path: str | os.PathLike[str],
    targets: Mapping[str, Spec],
    groups: Any = None,
    *,
    rank: int | None = None,
    verify: bool = True,
    device: str | torch.device | None = None,
) -> dict[str, Sharded]:
    """Load the calling rank's part of each tensor, resharded to its target spec.

    ``targets`` maps tensor names to the specs to load them as: any mesh, world size,
    placements, shard order or StridedShard, as long as the global shape and dtype are
    the saved ones (Partial targets get meshplan's canonical split). The rank comes
    from ``groups`` (a :class:`~meshplan.runtime.ProcessGroups`) or ``rank=``. Only
    chunks overlapping this rank's boxes are read; with ``verify`` each is read whole
    once and its checksum checked. ``device`` places the local tensors (default: the
    CPU; e.g. ``"cuda"`` for a training loop on NCCL).

    With ``groups``, every rank of ``groups.mesh`` calls ``load``, and the ranks agree on
    its outcome (one all-gather of a small message, no data): if any rank's load fails
    (a truncated or missing shard, a bad target), every rank raises, the failing one
    its own error and the others a :class:`CheckpointError` quoting it, so no rank goes
    on to a collective the others never reach. With ``rank=`` no collective runs.
    A load while another process saves into ``path`` gets the checkpoint committed
    when it started, whole.

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> path = tempfile.mkdtemp()
    >>> one = Spec(Mesh.create(1), (Replicate(),), (2, 3), "int64")
    >>> from meshplan.checkpoint import save
    >>> _ = save({"w": Sharded(torch.arange(6).reshape(2, 3), one, 0)}, path)
    >>> load(path, {"w": Spec(Mesh.create(3), (Shard(1),), (2, 3), "int64")}, rank=2)["w"].local
    tensor([[2],
            [5]])
    """
    verify = _verify_flag(verify)
    directory = checkpoint_path(path)
    if groups is None:
        with reading(directory) as meta:  # its files stay while others save (see _files)
            return _load_rank(directory, meta, targets, groups, rank, verify, device)
    check_groups(groups)
    try:
        with reading(directory) as meta:
            out = _load_rank(directory, meta, targets, groups, rank, verify, device)
        error = None
    except Exception as e:  # every rank learns of it below
        out, error = {}, e
    agree(groups, directory, error)
    return out


def _load_rank(
    directory: str, meta: Metadata, targets: Any, groups: Any, rank: Any, verify: bool, device: Any
) -> dict[str, Sharded]:
    _check_targets(targets, meta, directory)
    rank = resolve_rank(targets, groups, rank)
    reader = _Reader(directory, verify)
    try:
        out = {}
        for key, spec in targets.items():
            if not spec.mesh.contains(rank):
                raise CheckpointError(
                    f"rank {rank} is not in the mesh of target {key!r} ({spec.mesh}); load "
                    "only the tensors whose mesh holds this rank",
                    value=key,
                )
            out[key] = _on_device(_load_one(reader, meta.tensors[key], spec, rank), device)
            reader.forget()
        return out
    finally:
        reader.close()


def load_all(
    path: str | os.PathLike[str],
    targets: Mapping[str, Spec],
    *,
    verify: bool = True,
    device: str | torch.device | None = None,
) -> dict[int, dict[str, Sharded]]:
    """Load every rank's part in one process: ``{rank: {key: Sharded}}`` (on ``device``).

    Ranks are those of each target's mesh (the first instance of a sliced mesh); each
    saved chunk is read (and verified) once per tensor, whatever the number of ranks.

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, StridedShard
    >>> path = tempfile.mkdtemp()
    >>> one = Spec(Mesh.create(1), (Replicate(),), (4,), "int64")
    >>> from meshplan.checkpoint import save
    >>> _ = save({"w": Sharded(torch.arange(4), one, 0)}, path)
    >>> got = load_all(path, {"w": Spec(Mesh.create(2), (StridedShard(0, 2),), (4,), "int64")})
    >>> got[0]["w"].local, got[1]["w"].local
    (tensor([0, 2]), tensor([1, 3]))
    """
    verify = _verify_flag(verify)
    directory = checkpoint_path(path)
    with reading(directory) as meta:  # its files stay while others save (see _files)
        _check_targets(targets, meta, directory)
        return _load_ranks(directory, meta, targets, verify, device)


def _load_ranks(
    directory: str, meta: Metadata, targets: Mapping[str, Spec], verify: bool, device: Any
) -> dict[int, dict[str, Sharded]]:
    reader = _Reader(directory, verify)
    out: dict[int, dict[str, Sharded]] = {}
    try:
        for key, spec in targets.items():
            mesh = spec.mesh
            first = first_instance(mesh)
            for rank in first:
                one = _load_one(reader, meta.tensors[key], spec, rank)
                out.setdefault(rank, {})[key] = _on_device(one, device)
            reader.forget()
        return out
    finally:
        reader.close()

"""Loading sharded tensors: any rank's part of each saved tensor, under any target spec.

A load reads the index, intersects the target rank's boxes with the saved chunks
(:func:`~meshplan.checkpoint.plan_reads`) and copies only the overlapping parts; with
``verify=True`` (the default) every chunk it touches is read whole once and its checksum
checked, with ``verify=False`` only the needed slices are read. A load with ``groups``
checks each chunk once among the ranks reading it (:func:`shared_checks`), and learns
in its closing agreement whether every rank shared the checks out alike; when not (the
ranks loaded different targets, or different checkpoints committed meanwhile), each
rank checks what it skipped and the ranks agree once more. Before a rank allocates
its local tensors, every chunk it reads is checked against its shard file's header. A
load with ``groups`` exchanges one thing: its outcome, so that when one rank's load
fails every rank raises (:mod:`._agree`); it reads no data from other ranks.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from ._plan import check_target, plan_reads, verifiers
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
        # chunks read without their checksum: another rank checks them (see load)
        self.skipped: dict[tuple[str, str], tuple[TensorMeta, ChunkRecord]] = {}

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

    def piece(
        self, meta: TensorMeta, rec: ChunkRecord, offsets, sizes, check: bool = True
    ) -> torch.Tensor:
        """The box ``offsets``/``sizes`` of chunk ``rec``: cut from the whole chunk, read
        and checked once, when the reader verifies and ``check``; else read alone."""
        index = tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))
        if (self.verify and check) or not index:
            return self._whole(meta, rec)[index]
        if self.verify:
            self.skipped[(rec.file, rec.name)] = (meta, rec)
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


def _load_one(
    reader: _Reader,
    meta: TensorMeta,
    spec: Spec,
    rank: int,
    checkers: tuple[int | None, ...] | None = None,
) -> Sharded:
    """Rank ``rank``'s local tensor of ``spec``; with ``checkers`` (per chunk, the rank
    that checks it: :func:`~meshplan.checkpoint._plan.verifiers`) a verifying reader
    checks only the chunks that fall to ``rank`` and reads just the slices of the others."""
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
        check = checkers is None or checkers[read.chunk] == rank
        src = reader.piece(meta, rec, read.source.offsets, read.source.sizes, check)
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
    once and its checksum checked. With ``groups`` the checks are shared out: each chunk
    is checked by one of the ranks reading it, which reads it whole, and the others
    read only their slices of it; a chunk found corrupt fails the load on every rank
    (below). ``device`` places the local tensors (default: the CPU; e.g. ``"cuda"`` for
    a training loop on NCCL).

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
            return _load_rank(directory, meta, targets, groups, rank, verify, device)[0]
    check_groups(groups)
    with contextlib.ExitStack() as held:
        skipped: list[tuple[TensorMeta, ChunkRecord]] = []
        token = None
        try:
            meta = held.enter_context(reading(directory))  # claimed until the ranks agree
            _check_targets(targets, meta, directory)
            checkers = shared_checks(meta, targets, groups) if verify else {}
            token = _token(meta, targets, checkers)
            out, skipped = _load_rank(
                directory, meta, targets, groups, rank, verify, device, checkers
            )
            error = None
        except Exception as e:  # every rank learns of it below
            out, error = {}, e
        if agree(groups, directory, error, token):
            return out
        # the ranks shared the checks out differently (other targets, or another
        # checkpoint committed between their reads): each checks what it skipped
        try:
            _check_chunks(directory, verify, skipped)
            error = None
        except Exception as e:
            out, error = {}, e
        agree(groups, directory, error)
        return out


SHARE_BUDGET = 1 << 16
"""Ranks times saved chunks, summed over a load's tensors, up to which a load with
``groups`` shares its checksum checks out among the ranks (past it, tensors are
checked whole by every rank reading them: working out who reads what would cost more)."""


def shared_checks(meta: Metadata, targets: Any, groups: Any) -> dict[str, tuple[int | None, ...]]:
    """Per target key, the rank that checks each saved chunk (see
    :func:`~meshplan.checkpoint._plan.verifiers`): for targets on the groups' whole mesh
    that are not Partial, while their ranks times chunks stay within ``SHARE_BUDGET``;
    other keys are checked by every rank reading them."""
    ranks = first_instance(groups.mesh)
    every = set(ranks)
    out: dict[str, tuple[int | None, ...]] = {}
    spent = 0
    if not isinstance(targets, Mapping):
        return out
    for key, spec in targets.items():
        saved = meta.tensors.get(key)
        if saved is None or not isinstance(spec, Spec) or spec.is_partial:
            continue
        if spec.mesh.size() != len(ranks) or set(first_instance(spec.mesh)) != every:
            continue
        spent += len(ranks) * len(saved.chunks)
        if spent > SHARE_BUDGET:
            break
        out[key] = verifiers(saved, spec, ranks)
    return out


def _token(meta: Metadata, targets: Any, checkers: Mapping[str, Any]) -> str | None:
    """What every rank must share for the checks it skipped to be made elsewhere: the
    checkpoint read (its files), the targets and who checks what."""
    if not checkers:
        return None
    text = repr(
        (meta.files, sorted((k, repr(v)) for k, v in targets.items()), sorted(checkers.items()))
    )
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _check_chunks(
    directory: str, verify: bool, chunks: list[tuple[TensorMeta, ChunkRecord]]
) -> None:
    """Read and check the checksums of ``chunks`` (each whole)."""
    reader = _Reader(directory, verify)
    try:
        for meta, rec in chunks:
            reader._whole(meta, rec)
            reader.forget()
    finally:
        reader.close()


def _load_rank(
    directory: str,
    meta: Metadata,
    targets: Any,
    groups: Any,
    rank: Any,
    verify: bool,
    device: Any,
    checkers: Mapping[str, tuple[int | None, ...]] | None = None,
) -> tuple[dict[str, Sharded], list[tuple[TensorMeta, ChunkRecord]]]:
    """This rank's loaded tensors, and the chunks it read without checking them."""
    _check_targets(targets, meta, directory)
    rank = resolve_rank(targets, groups, rank)
    checkers = {} if checkers is None else checkers
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
            one = _load_one(reader, meta.tensors[key], spec, rank, checkers.get(key))
            out[key] = _on_device(one, device)
            reader.forget()
        return out, list(reader.skipped.values())
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

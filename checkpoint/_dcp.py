"""torch DCP checkpoints: read one into any meshplan spec, and convert a meshplan one to DCP.

A ``torch.distributed.checkpoint`` directory (``.metadata`` plus ``__<rank>_<n>.distcp``
files) records, per tensor, its global shape, dtype and the boxes ("chunks") its
writers saved. :func:`read_dcp_metadata` reads that record as a meshplan
:class:`~meshplan.checkpoint.Metadata`, so the same pure box intersection that loads
meshplan checkpoints (:func:`plan_reads`) decides which slice of which saved chunk fills
which part of a rank's local tensor -- for any target spec, mesh or world size, including
StridedShard and non-default shard orders (which DCP's own loader cannot place).
:func:`load_dcp` reads those slices for one rank (no collective, no process group
needed); :func:`load_dcp_all` does it for every rank in one process, reading each saved
chunk once. :func:`convert_to_dcp` writes a meshplan checkpoint as a DCP directory, so a
torch program can load it with ``dcp.load``.

An untrusted or damaged DCP directory fails with a :class:`CheckpointError` naming the
file and the tensor, in time and memory proportional to its files: ``.metadata`` is
unpickled with an allow-list (DCP's metadata classes, ``torch.Size``, dtypes, layouts,
memory formats, paths), so it runs no code, and checked field by field before use
(``_dcp_index``: repeated chunk records, chunks that do not tile a tensor, storage
entries sharing bytes); each chunk is read from a regular file only, its archive's CRC-32s
checked, and loaded with ``torch.load(weights_only=True)`` (``_dcp_data``, which also
says what no check can catch).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from meshplan.errors import CheckpointError
from meshplan.layout import Mesh
from meshplan.layout._mesh import first_instance
from meshplan.placement import Replicate, Sharded, Spec, local_shape
from meshplan.placement._tensor import partial_keeps

from ._dcp_data import open_data_file, read_chunk
from ._dcp_index import DcpIndex, dcp_index
from ._index import Metadata, missing_tensor
from ._index_json import MAX_INDEX_BYTES, checkpoint_path, read_metadata, read_small_file
from ._load import load_all
from ._plan import check_target, plan_reads
from ._ranks import resolve_rank

__all__ = ["convert_to_dcp", "load_dcp", "load_dcp_all", "read_dcp_metadata"]


def _read_index(directory: str) -> DcpIndex:
    """The checked index of the DCP checkpoint ``directory``: its ``.metadata`` (a regular
    file under the size cap) unpickled with an allow-list of classes
    (:func:`._dcp_pickle.load_metadata`, so a hostile file runs no code) and checked field
    by field (:func:`._dcp_index.dcp_index`)."""
    from ._dcp_pickle import load_metadata

    path = os.path.join(directory, ".metadata")
    if not os.path.lexists(path):
        raise CheckpointError(
            f"{directory!r} is not a torch DCP checkpoint (no .metadata file); a meshplan "
            "checkpoint loads with meshplan.checkpoint.load",
            value=directory,
        )
    try:
        data = read_small_file(path, MAX_INDEX_BYTES, "DCP metadata")
    except OSError as e:
        raise CheckpointError(
            f"the DCP metadata of {directory!r} cannot be read: {e}", value=directory
        ) from None
    return dcp_index(load_metadata(data, directory), directory, len(data))


def read_dcp_metadata(path: str | os.PathLike[str]) -> Metadata:
    """What a torch DCP checkpoint holds: per tensor its global shape, dtype and saved boxes.

    Non-tensor entries (pickled objects) are left out. Each chunk record names the data
    file holding it and ``<key>#<n>``; its checksum field is ``"dcp:zip-crc32"`` (DCP keeps
    a CRC-32 per record of each chunk's archive, checked when the chunk is read). The
    metadata is checked first: field types, chunks that tile each tensor, one storage entry
    per chunk, no two sharing bytes; a damaged or hostile file raises a
    :class:`~meshplan.errors.CheckpointError` naming the tensor and the field.
    """
    return _read_index(checkpoint_path(path)).meta


def _narrow(t: torch.Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    for d, (o, n) in enumerate(zip(offsets, sizes, strict=True)):
        t = t.narrow(d, o, n)
    return t


def _check_targets(targets: Any, meta: Metadata, directory: str) -> None:
    if not isinstance(targets, Mapping):
        raise CheckpointError(
            f"targets must map tensor names to Specs, got {type(targets)!r}", value=targets
        )
    for key, spec in targets.items():
        if key not in meta.tensors:
            raise missing_tensor(key, meta.tensors, f" in the DCP checkpoint {directory!r}")
        check_target(meta.tensors[key], spec, repr(directory))


def _load_ranks(
    directory: str, targets: Mapping[str, Spec], ranks_of: Any, device: Any
) -> dict[int, dict[str, Sharded]]:
    index = _read_index(directory)
    meta = index.meta
    _check_targets(targets, meta, directory)
    out: dict[int, dict[str, Sharded]] = {}
    reads: dict[tuple[str, int], list] = {}  # (key, chunk) -> (local view, box of the chunk)
    for key, spec in targets.items():
        dtype = getattr(torch, spec.dtype)
        for rank in ranks_of(key, spec):
            local = torch.zeros(local_shape(spec, rank), dtype=dtype)
            keeps = not spec.is_partial or partial_keeps(spec, spec.mesh.coordinate(rank))
            if keeps:
                for read in plan_reads(meta.tensors[key], spec, rank):
                    view = _narrow(local, read.target.offsets, read.target.sizes)
                    reads.setdefault((key, read.chunk), []).append((view, read.source))
            out.setdefault(rank, {})[key] = local
    by_file: dict[str, list[tuple[str, int]]] = {}
    for chunk in reads:
        by_file.setdefault(index.stored[chunk].file, []).append(chunk)
    for file, chunks in sorted(by_file.items()):  # each file opened once, each chunk read once
        fd, size = open_data_file(directory, file, chunks[0][0])
        try:
            for key, c in sorted(chunks, key=lambda kc: index.stored[kc].offset):
                record = meta.tensors[key].chunks[c]
                saved = read_chunk(
                    fd, size, directory, key, record, index.stored[key, c], meta.tensors[key].dtype
                )
                for view, box in reads[key, c]:
                    view.copy_(_narrow(saved, box.offsets, box.sizes))
                del saved
        finally:
            os.close(fd)
    return {
        rank: {
            key: Sharded(local if device is None else local.to(device), targets[key], rank)
            for key, local in locals_.items()
        }
        for rank, locals_ in out.items()
    }


def load_dcp(
    path: str | os.PathLike[str],
    targets: Mapping[str, Spec],
    groups: Any = None,
    *,
    rank: int | None = None,
    device: str | torch.device | None = None,
) -> dict[str, Sharded]:
    """Load the calling rank's part of tensors of a torch DCP checkpoint, in any target spec.

    Like :func:`~meshplan.checkpoint.load`: ``targets`` maps names to specs (any mesh,
    world size, placements, shard order or StridedShard; the saved global shape and
    dtype), the rank comes from ``groups`` or ``rank=`` (or is the only rank of 1-rank
    targets: one process loads whole tensors), only the saved chunks overlapping this
    rank's boxes are read, and no collective runs. ``device`` places the local tensors
    (default: CPU).
    """
    directory = checkpoint_path(path)
    if not isinstance(targets, Mapping):
        raise CheckpointError(
            f"targets must map tensor names to Specs, got {type(targets)!r}", value=targets
        )
    me = resolve_rank(targets, groups, rank)
    for key, spec in targets.items():
        if isinstance(spec, Spec) and not spec.mesh.contains(me):
            raise CheckpointError(
                f"rank {me} is not in the mesh of target {key!r} ({spec.mesh}); load only "
                "the tensors whose mesh holds this rank",
                value=key,
            )
    got = _load_ranks(directory, targets, lambda key, spec: (me,), device)
    return got.get(me, {})


def load_dcp_all(
    path: str | os.PathLike[str],
    targets: Mapping[str, Spec],
    *,
    device: str | torch.device | None = None,
) -> dict[int, dict[str, Sharded]]:
    """Load every rank's part of a DCP checkpoint in one process: ``{rank: {key: Sharded}}``.

    Ranks are those of each target's mesh (the first instance of a sliced mesh).
    """
    directory = checkpoint_path(path)
    return _load_ranks(directory, targets, lambda key, spec: first_instance(spec.mesh), device)


def convert_to_dcp(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    keys: Any = None,
) -> None:
    """Write the meshplan checkpoint at ``path`` as a torch DCP checkpoint at ``out``.

    Runs in one process (no process group): each tensor (all of them, or ``keys``) is
    assembled whole on the CPU, so this needs memory for the checkpoint's tensors. A
    torch program then reads ``out`` with ``torch.distributed.checkpoint.load`` into
    tensors or DTensors of any placements.
    """
    import torch.distributed.checkpoint as dcp

    directory = checkpoint_path(path)
    meta = read_metadata(directory)
    names = sorted(meta.tensors) if keys is None else list(keys)
    for key in names:
        if key not in meta.tensors:
            raise missing_tensor(key, meta.tensors, f" at {directory!r}")
    one = Mesh.create(1)
    targets = {
        key: Spec(one, (Replicate(),), meta.tensors[key].shape, meta.tensors[key].dtype)
        for key in names
    }
    state = {key: s.local for key, s in load_all(directory, targets)[0].items()}
    os.makedirs(os.fspath(out), exist_ok=True)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(out)), no_dist=True)

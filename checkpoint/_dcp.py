"""torch DCP checkpoints: read one into any meshplan spec, and convert a meshplan one to DCP.

A ``torch.distributed.checkpoint`` directory (``.metadata`` plus ``__<rank>_<n>.distcp``
files) records, per tensor, its global shape, dtype and the boxes ("chunks") its
writers saved. :func:`read_dcp_metadata` reads that record through DCP's public
``FileSystemReader`` as a meshplan :class:`~meshplan.checkpoint.Metadata`, so the same
pure box intersection that loads meshplan checkpoints (:func:`plan_reads`) decides which
slice of which saved chunk fills which part of a rank's local tensor -- for any target
spec, mesh or world size, including StridedShard and non-default shard orders (which
DCP's own loader cannot place). :func:`load_dcp` reads those slices for one rank with
DCP's reader (no collective, no process group needed); :func:`load_dcp_all` does it for
every rank in one process. :func:`convert_to_dcp` writes a meshplan checkpoint as a DCP
directory, so a torch program can load it with ``dcp.load``.

Reading a DCP directory never runs its pickle unrestricted: ``.metadata`` is unpickled
with an allow-list (DCP's metadata classes, ``torch.Size``, dtypes, layouts, memory
formats, paths), so an untrusted checkpoint cannot run code before it is checked; the
tensor data is read by DCP's reader (``torch.load(weights_only=True)``).
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

from ._index import ChunkRecord, Metadata, TensorMeta, missing_tensor
from ._index_json import MAX_INDEX_BYTES, _file, checkpoint_path, read_metadata, read_small_file
from ._load import load_all
from ._plan import check_target, plan_reads
from ._ranks import resolve_rank

__all__ = ["convert_to_dcp", "load_dcp", "load_dcp_all", "read_dcp_metadata"]

_NO_CHECKSUM = "dcp:none"  # DCP records no checksum per chunk


def _dcp_reader(directory: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(directory)


def _dcp_metadata(directory: str, reader: Any) -> Any:
    """The DCP ``Metadata`` of ``directory``, unpickled with an allow-list of classes
    (:func:`._dcp_pickle.load_metadata`): a hostile ``.metadata`` runs no code."""
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
    meta = load_metadata(data, directory)
    for info in (getattr(meta, "storage_data", None) or {}).values():
        name = getattr(info, "relative_path", None)
        try:
            _file(name)
        except ValueError:
            raise CheckpointError(
                f"the DCP metadata of {directory!r} places data in {name!r:.80}, outside the "
                "checkpoint directory; the checkpoint is damaged or hostile",
                value=name,
            ) from None
    if getattr(meta, "storage_meta", None) is not None:
        meta.storage_meta.load_id = getattr(reader, "load_id", None)
    return meta


def _as_metadata(dcp_meta: Any, directory: str) -> Metadata:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    tensors = {}
    for key, item in dcp_meta.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            continue  # bytes (pickled objects): not tensors
        dtype = str(item.properties.dtype).removeprefix("torch.")
        chunks = []
        for c in item.chunks:
            chunks.append(
                ChunkRecord(tuple(c.offsets), tuple(c.sizes), directory, key, _NO_CHECKSUM)
            )
        tensors[key] = TensorMeta(key, tuple(item.size), dtype, tuple(chunks))
    return Metadata(tensors)


def read_dcp_metadata(path: str | os.PathLike[str]) -> Metadata:
    """What a torch DCP checkpoint holds: per tensor its global shape, dtype and saved boxes.

    Non-tensor entries (pickled objects) are left out. Chunk records name the checkpoint
    directory as their file (DCP keeps its own file map) and carry no checksum.
    """
    directory = checkpoint_path(path)
    return _as_metadata(_dcp_metadata(directory, _dcp_reader(directory)), directory)


def _load_planner(targets: dict[Any, torch.Tensor]) -> Any:
    from torch.distributed.checkpoint.planner import LoadPlanner

    class _IntoViews(LoadPlanner):
        """Hands DCP's reader the local-tensor view each read fills (the reads are ours)."""

        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            pass

        def create_local_plan(self):
            raise NotImplementedError  # the plan is made by meshplan

        def create_global_plan(self, global_plan):
            return global_plan

        def finish_plan(self, central_plan):
            return central_plan

        def load_bytes(self, read_item, value):
            raise CheckpointError(f"unexpected bytes entry {read_item.dest_index.fqn!r}")

        def resolve_tensor(self, read_item):
            return targets[read_item]

        def commit_tensor(self, read_item, tensor):
            pass

    return _IntoViews()


def _read_items(meta: TensorMeta, spec: Spec, rank: int, local: torch.Tensor):
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    out = {}
    for i, read in enumerate(plan_reads(meta, spec, rank)):
        rec = meta.chunks[read.chunk]
        item = ReadItem(
            type=LoadItemType.TENSOR,
            dest_index=MetadataIndex(meta.key, torch.Size(read.target.offsets), i),
            dest_offsets=torch.Size(read.target.offsets),
            storage_index=MetadataIndex(meta.key, torch.Size(rec.offsets)),
            storage_offsets=torch.Size(read.source.offsets),
            lengths=torch.Size(read.source.sizes),
        )
        view = local
        for d, (o, n) in enumerate(zip(read.target.offsets, read.target.sizes, strict=True)):
            view = view.narrow(d, o, n)
        out[item] = view
    return out


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
    from torch.distributed.checkpoint.planner import LoadPlan

    reader = _dcp_reader(directory)
    dcp_meta = _dcp_metadata(directory, reader)
    meta = _as_metadata(dcp_meta, directory)
    _check_targets(targets, meta, directory)
    reader.set_up_storage_reader(dcp_meta, True)
    out: dict[int, dict[str, Sharded]] = {}
    views: dict[Any, torch.Tensor] = {}
    for key, spec in targets.items():
        dtype = getattr(torch, spec.dtype)
        for rank in ranks_of(key, spec):
            local = torch.zeros(local_shape(spec, rank), dtype=dtype)
            keeps = not spec.is_partial or partial_keeps(spec, spec.mesh.coordinate(rank))
            if keeps:
                for item, view in _read_items(meta.tensors[key], spec, rank, local).items():
                    views[(rank, item)] = view
            out.setdefault(rank, {})[key] = local
    for rank in out:
        mine = {item: view for (r, item), view in views.items() if r == rank}
        if mine:
            reader.read_data(LoadPlan(list(mine)), _load_planner(mine)).wait()
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

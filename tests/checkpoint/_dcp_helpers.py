"""Real torch DCP checkpoints of any tiling, written in one process (no process group).

``dcp.save`` in one process writes one chunk per tensor; :func:`save_dcp_tiled` saves each
box of a tiling as its own entry and then rewrites ``.metadata`` so those entries are the
chunks of one tensor, exactly as a multi-rank save records them (a chunk per writer, keyed
by its offsets). :func:`rewrite_metadata` lets a test damage the metadata's fields.
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable, Mapping, Sequence

import torch

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


def _part(x: torch.Tensor, box: Box) -> torch.Tensor:
    view = x
    for d, (o, n) in enumerate(zip(*box, strict=True)):
        view = view.narrow(d, o, n)
    return view.clone()


def save_dcp_tiled(path: str, tensors: Mapping[str, tuple[torch.Tensor, Sequence[Box]]]) -> None:
    """Save each tensor as the DCP chunks ``boxes`` (a tiling, or deliberately not one)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    parts = {
        f"{key}@{i}": _part(x, box)
        for key, (x, boxes) in tensors.items()
        for i, box in enumerate(boxes)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(parts, storage_writer=dcp.FileSystemWriter(path), no_dist=True)

    def relabel(meta):
        storage = {}
        for index, info in meta.storage_data.items():
            key, i = index.fqn.rsplit("@", 1)
            offsets = tensors[key][1][int(i)][0]
            storage[MetadataIndex(key, torch.Size(offsets))] = info
        entries = {}
        for key, (x, boxes) in tensors.items():
            props = meta.state_dict_metadata[f"{key}@0"].properties
            chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in boxes]
            entries[key] = TensorStorageMetadata(props, torch.Size(x.shape), chunks)
        meta.state_dict_metadata = entries
        meta.storage_data = storage
        meta.planner_data = None

    rewrite_metadata(path, relabel)


def rewrite_metadata(path: str, change: Callable[[object], object]) -> None:
    """Unpickle ``path``'s ``.metadata`` (a trusted test file), ``change`` it, write it back."""
    name = os.path.join(path, ".metadata")
    with open(name, "rb") as f:
        meta = pickle.load(f)
    out = change(meta)
    with open(name, "wb") as f:
        pickle.dump(meta if out is None else out, f)


def grid_boxes(shape: Sequence[int], cuts: Sequence[Sequence[int]]) -> list[Box]:
    """The boxes of the grid that cuts dim ``d`` of ``shape`` at ``cuts[d]``."""
    import itertools

    spans = []
    for n, points in zip(shape, cuts, strict=True):
        edges = [0, *sorted(set(points) - {0, n}), n]
        spans.append(list(zip(edges, edges[1:], strict=False)))
    return [
        (tuple(lo for lo, _ in cell), tuple(hi - lo for lo, hi in cell))
        for cell in itertools.product(*spans)
    ]

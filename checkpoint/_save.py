"""Saving sharded tensors: ``save`` from each rank, or ``save_all`` from one process.

The entry points of a save. A blocking save writes and commits before it returns
(:mod:`._protocol`); ``save(..., blocking=False)`` hands the state to
:func:`~meshplan.checkpoint.save_async`, which copies the rank's boxes and runs the same
protocol in the background.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from meshplan.errors import CheckpointError
from meshplan.layout._ints import as_bool
from meshplan.placement import Sharded

from ._async import save_async
from ._index import Metadata
from ._index_json import checkpoint_path
from ._protocol import save_distributed, save_local, save_sole
from ._ranks import check_groups
from ._write import check_state

__all__ = ["save", "save_all"]


def save(
    state: Mapping[str, Sharded],
    path: str | os.PathLike[str],
    groups: Any = None,
    *,
    blocking: bool = True,
) -> Any:
    """Save one rank's sharded tensors to the checkpoint directory ``path``; return its index.

    With ``blocking=False`` it returns once this rank's boxes are copied to CPU buffers,
    with a :class:`~meshplan.checkpoint.SaveHandle` whose ``wait()`` gives the index: the
    write and the commit run in the background, on a process group of their own (see
    :func:`~meshplan.checkpoint.save_async`).

    With ``groups`` (a :class:`~meshplan.runtime.ProcessGroups`), every rank of
    ``groups.mesh`` calls ``save`` with its own state; each writes only the boxes it owns
    (one writer per replica), all wait for each other, and the rank at mesh coordinate 0
    commits the index. On a mesh over part of the world the other ranks call ``save``
    too (with any state, e.g. ``{}``): they only take part in creating the mesh's process
    group, as every rank must in torch, and get None. Without ``groups`` the calling
    process is the only writer: it writes every box its values hold, which must cover
    each tensor (a replicated tensor, a one-rank mesh); use :func:`save_all` for all ranks
    of a mesh in one process. Partial values are refused (reduce them first). Shard files are safetensors, one per writing rank;
    every chunk records a crc32 checksum of its bytes and its place (tensor name, box).

    Saves into one directory may run at once (several jobs, or a retry racing a slow
    save): each commits a complete checkpoint atomically and the last commit wins; no
    save removes a file of the committed checkpoint or of another save still running,
    and files of killed saves are swept by the next commit (see
    :mod:`meshplan.checkpoint._files`). If a collective fails mid-save (a peer died or
    timed out), every surviving rank raises a :class:`CheckpointError` whose
    ``committed`` attribute says what is on disk: True when the new checkpoint was
    committed, False when the previous one is kept.

    >>> import tempfile, torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Spec
    >>> spec = Spec(Mesh.create(2), (Replicate(),), (3,), "int64")
    >>> path = tempfile.mkdtemp()
    >>> meta = save({"w": Sharded(torch.arange(3), spec, 0)}, path)
    >>> meta["w"].chunks[0].offsets, meta["w"].chunks[0].sizes
    ((0,), (3,))
    >>> from meshplan.checkpoint import load
    >>> load(path, {"w": spec}, rank=1)["w"].local
    tensor([0, 1, 2])
    """
    flag = as_bool(blocking)
    if flag is None:
        raise CheckpointError(
            f"blocking must be True or False, got {blocking!r}; pass blocking=False for a "
            "save that overlaps the next steps",
            value=blocking,
        )
    if not flag:
        return save_async(state, path, groups)
    directory = checkpoint_path(path)
    if groups is None:
        return save_sole(state, directory)
    check_groups(groups)
    return save_distributed(state, directory, groups)


def save_all(states: Mapping[int, Mapping[str, Sharded]], path: str | os.PathLike[str]) -> Metadata:
    """Save every rank's state from one process: ``{rank: {key: Sharded}}``; return the index.

    The same files and index as a multi-process :func:`save`.

    >>> import tempfile, torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard, Spec, shard
    >>> spec = Spec(Mesh.create(2), (Shard(0),), (4,), "int64")
    >>> states = {r: {"w": Sharded(t, spec, r)} for r, t in shard(torch.arange(4), spec).items()}
    >>> path = tempfile.mkdtemp()
    >>> len(save_all(states, path)["w"].chunks)
    2
    """
    if not isinstance(states, Mapping):
        raise CheckpointError(
            f"save_all needs a mapping rank -> state, got {type(states)!r}", value=states
        )
    directory = checkpoint_path(path)
    for rank, state in states.items():
        check_state(state, rank)
    return save_local({r: dict(s) for r, s in states.items()}, directory, sole=False)

"""Writing one rank's part of a save: its owned boxes, into one new safetensors file.

Each writing rank copies the boxes it owns (one owner per replica; every box of a
StridedShard or uneven-shard-order local tensor) to contiguous host tensors, and writes
them into a file of its own under a fresh name (``shard-<rank>-<save id>``), first to a
temporary name and then renamed: a file of the committed checkpoint is never touched.
It returns the records the index will hold for them; committing is for the caller.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from meshplan.errors import CheckpointError
from meshplan.placement import Sharded, Spec

from ._encoding import digest_text, place_seed, stored
from ._files import STATE_DIR, Claim, shard_name, write_safetensors
from ._index import ChunkRecord
from ._plan import local_boxes, writes

__all__ = ["Entry", "check_state", "claim", "make_dir", "owned", "to_host", "write_rank"]


Entry = tuple[str, Spec, "ChunkRecord | None"]  # key, the spec it is saved in, chunk


def check_state(state: Any, rank: int | None) -> None:
    """Raise unless ``state`` maps names to savable Sharded values (of ``rank``, if given).

    >>> check_state({"a#0": None}, None)
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: state key 'a#0' must be a non-empty string without '#'
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"a checkpoint state must map names to Sharded values, got {type(state)!r}",
            value=state,
        )
    for key, value in state.items():
        if not isinstance(key, str) or not key or "#" in key:
            raise CheckpointError(
                f"state key {key!r} must be a non-empty string without '#'", value=key
            )
        if not isinstance(value, Sharded):
            raise CheckpointError(
                f"state[{key!r}] is {type(value).__name__}, not a Sharded; wrap local tensors "
                "with meshplan.placement.Sharded(local, spec, rank)",
                value=value,
            )
        if value.local.is_meta:
            raise CheckpointError(
                f"state[{key!r}] is a meta-device tensor: it holds no data to save; "
                "materialize it first (e.g. module.to_empty(device=...) and initialize it)",
                value=key,
            )
        if rank is not None and value.rank != rank:
            raise CheckpointError(
                f"state[{key!r}] belongs to rank {value.rank}, but it is saved as rank {rank}'s",
                value=value,
            )
        if value.spec.is_partial:
            raise CheckpointError(
                f"state[{key!r}] is partial ({value.spec}): its value is not held by any rank; "
                "redistribute it to Replicate/Shard placements (a reduction) before saving",
                value=key,
            )


def make_dir(directory: str) -> None:
    """Create the checkpoint directory (and its parents) unless it exists."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(
            f"checkpoint path {directory!r} is a file, not a directory; pass a directory "
            "(a new one, or one holding a checkpoint)",
            value=directory,
        )
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CheckpointError(
            f"cannot create the checkpoint directory {directory!r}: {e}; pass a path you can "
            "write to",
            value=directory,
        ) from None


@contextlib.contextmanager
def claim(directory: str, save_id: str, tag: str) -> Iterator[Claim]:
    """Hold a claim of save ``save_id`` (its files are then never swept)."""
    try:
        held = Claim(directory, save_id, tag).__enter__()
    except OSError as e:
        raise CheckpointError(
            f"cannot mark a save in {directory!r} ({e}); pass a directory you can write to",
            value=directory,
        ) from None
    try:
        yield held
    finally:
        held.__exit__(None, None, None)


def owned(spec: Spec, rank: int, sole: bool):
    """The boxes of ``spec`` that ``rank`` writes (``sole``: the caller is the only
    writer of this tensor, so it writes every box it holds)."""
    return local_boxes(spec, rank) if sole or writes(spec, rank) else ()


def write_rank(
    entries: Mapping[str, Sharded], rank: int, directory: str, save_id: str, sole: bool = False
) -> list[Entry]:
    """Write rank ``rank``'s owned boxes into one new file; return (key, spec, record)."""
    file = shard_name(rank, save_id)
    tensors: dict[str, torch.Tensor] = {}
    spans: dict[int, list[tuple[int, int]]] = {}  # storage -> byte ranges of its pieces
    out = []
    pieces = []
    for key in sorted(entries):
        value = entries[key]
        local = value.local.detach()
        for i, box in enumerate(owned(value.spec, rank, sole)):
            piece = local
            for d, (lo, n) in enumerate(zip(box.local_offsets, box.chunk.sizes, strict=True)):
                if n != local.shape[d]:
                    piece = piece.narrow(d, lo, n)
            pieces.append((key, value.spec, i, box, piece))
    seeds: dict[str, int] = {}
    for (key, spec, i, box, _), piece in zip(pieces, to_host([p[4] for p in pieces]), strict=True):
        piece = _unshared(piece, spans)
        name = f"{key}#{i}"
        tensors[name] = stored(piece)  # the same bytes as piece
        seeds[name] = place_seed(key, box.chunk.offsets, tuple(piece.shape))
        out.append((key, spec, box, name))
    if not tensors:
        return []
    final = os.path.join(directory, file)
    tmp = os.path.join(directory, STATE_DIR, f"{save_id}-{rank}.tmp")
    try:
        # the checksums are taken as the bytes are written (continuing from each
        # box's place): what checksum(piece, key=, offsets=) gives, without a second pass
        crcs = write_safetensors(tensors, tmp, {"format": "pt", "rank": str(rank)}, seeds)
        os.replace(tmp, final)
    except BaseException as e:
        with contextlib.suppress(OSError):  # a failed save leaves no partial file behind
            os.remove(tmp)
        if not isinstance(e, OSError):
            raise
        raise CheckpointError(f"cannot write shard file {final!r}: {e}", value=final) from None
    records: list[Entry] = []
    for key, spec, box, name in out:
        digest = digest_text(crcs[name], boxed=True)
        records.append(
            (key, spec, ChunkRecord(box.chunk.offsets, box.chunk.sizes, file, name, digest))
        )
    return records


def to_host(pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous CPU copies of ``pieces`` (CPU pieces copied only when not contiguous).

    Pieces on an accelerator are copied into pinned host buffers, all queued at once
    (``non_blocking``: the copies overlap each other and the device's queued work), then
    waited for once: one synchronization per file instead of one blocking pageable copy
    per box.
    """
    out: list[torch.Tensor] = []
    devices = set()
    for piece in pieces:
        if piece.device.type == "cpu":
            out.append(piece.contiguous())
            continue
        host = torch.empty(piece.shape, dtype=piece.dtype, pin_memory=True)
        host.copy_(piece, non_blocking=True)
        devices.add(piece.device)
        out.append(host)
    for device in devices:  # the host buffers are complete once the device is done
        getattr(torch, device.type).synchronize(device)
    return out


def _unshared(piece: torch.Tensor, spans: dict[int, list[tuple[int, int]]]) -> torch.Tensor:
    """``piece``, or a copy of it when its bytes overlap a piece kept before (one tensor
    under two keys: tied weights; safetensors refuses tensors that share memory).
    ``spans`` holds, per storage, the byte ranges of the pieces kept so far."""
    if not piece.numel():
        return piece
    start = piece.data_ptr()
    stop = start + piece.numel() * piece.element_size()
    kept = spans.setdefault(piece.untyped_storage().data_ptr(), [])
    if any(a < stop and start < b for a, b in kept):
        return piece.clone()  # a storage of its own, which nothing else shares
    kept.append((start, stop))
    return piece

"""A shard file's header, checked against the index before a load allocates or reads.

A shard file is safetensors: an 8-byte little-endian header length, a JSON header naming
each entry's dtype, shape and byte range, then the bytes. The index alone cannot be
trusted to size a load (a tampered index may declare terabytes, a shard file may be cut
short), so before a load allocates its local tensors, every chunk it will read is checked
against its file's header: the entry exists, holds the recorded box in the recorded dtype,
and its bytes lie inside the file. Only regular files are opened (a FIFO would block).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from typing import Any

import torch

from meshplan.errors import CheckpointError

from ._encoding import REAL_VIEW
from ._files import safetensors_code
from ._index import ChunkRecord, TensorMeta

__all__ = ["Header", "read_header"]

# safetensors itself refuses headers above 100 MB
_MAX_HEADER = 100_000_000


class Header:
    """The parsed header of one shard file: its entries and where the bytes start."""

    def __init__(self, file: str, entries: dict[str, Any], data_start: int, size: int) -> None:
        self.file = file
        self.entries = entries
        self.data_start = data_start
        self.size = size
        ends = [
            e["data_offsets"][1]
            for e in entries.values()
            if isinstance(e, dict)
            and isinstance(e.get("data_offsets"), list)
            and len(e["data_offsets"]) == 2
            and type(e["data_offsets"][1]) is int
        ]
        self.end = data_start + max(ends, default=0)  # where the file's last entry ends

    def check(self, meta: TensorMeta, rec: ChunkRecord) -> None:
        """Raise unless the entry ``rec.name`` holds ``rec``'s box of ``meta``, whole."""
        dtype = getattr(torch, meta.dtype)
        held = REAL_VIEW.get(dtype, dtype)
        shape = list(rec.sizes) + ([2] if dtype in REAL_VIEW else [])
        where = f"chunk {rec.name!r} of tensor {meta.key!r} in {rec.file!r}"
        entry = self.entries.get(rec.name)
        if not isinstance(entry, dict):
            raise CheckpointError(
                f"{where}: the shard file's header has no entry {rec.name!r}; the checkpoint "
                "is damaged",
                value=rec.file,
            )
        code, got, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if code != safetensors_code(held) or got != shape:
            raise CheckpointError(
                f"{where}: the shard file's header says {code}{got}, but the index records "
                f"{meta.dtype}{list(rec.sizes)}; the checkpoint is damaged",
                value=rec.file,
            )
        want = math.prod(shape) * held.itemsize
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not all(type(v) is int for v in span)
            or span[1] - span[0] != want
            or span[0] < 0
        ):
            raise CheckpointError(
                f"{where}: the shard file's header gives it the byte range {span!r:.80}, not "
                f"{want} bytes; the checkpoint is damaged",
                value=rec.file,
            )
        if max(self.data_start + span[1], self.end) > self.size:
            raise CheckpointError(
                f"{where}: its file's entries end at {max(self.data_start + span[1], self.end)}, "
                f"but the file has "
                f"{self.size} bytes: the shard file is truncated; the checkpoint is damaged",
                value=rec.file,
            )


def read_header(directory: str, meta: TensorMeta, rec: ChunkRecord) -> Header:
    """The header of ``rec``'s shard file in ``directory`` (a regular file, read at once)."""
    path = os.path.join(directory, rec.file)
    what = f"shard file {rec.file!r} of tensor {meta.key!r}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise CheckpointError(
            f"{what} is missing from {directory!r}; the checkpoint is incomplete", value=rec.file
        ) from None
    except OSError as e:
        raise CheckpointError(f"{what} cannot be opened: {e}", value=rec.file) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(
                f"{what} is not a regular file; a checkpoint holds regular files only: "
                "replace it with the file it should be",
                value=rec.file,
            )
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 <= n <= min(info.st_size - 8, _MAX_HEADER):
            raise CheckpointError(
                f"{what} is truncated or not safetensors (its header length {n} does not fit "
                f"its {info.st_size} bytes); the checkpoint is damaged",
                value=rec.file,
            )
        text = f.read(n)
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(
            f"{what} has a malformed header ({type(e).__name__}); the checkpoint is damaged",
            value=rec.file,
        ) from None
    if not isinstance(entries, dict):
        raise CheckpointError(
            f"{what} has a malformed header (not an object); the checkpoint is damaged",
            value=rec.file,
        )
    return Header(rec.file, entries, 8 + n, info.st_size)

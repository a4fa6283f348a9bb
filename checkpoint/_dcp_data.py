"""Reading one saved chunk of a torch DCP checkpoint: refused at once, or the right tensor.

DCP's ``FileSystemWriter`` stores each chunk as a ``torch.save`` archive (a zip of stored,
uncompressed records) at an offset of a data file; ``.metadata`` records the offset and
length. Reading a chunk here:

* opens its data file without blocking and only if it is a regular file, checked before
  opening (``os.stat``) and on the open descriptor (``os.fstat``, so a FIFO swapped in
  between is refused too): a FIFO, a device or a directory never hangs or feeds a load;
* refuses a chunk whose bytes lie past the file's end (a truncated file) before reading;
* checks the archive: it starts at the recorded offset, holds stored records only (no
  decompression, so memory stays the chunk's size), a small ``data.pkl``, and every
  record's CRC-32 (written by ``torch.save``; a record whose CRC is 0 was saved with
  ``compute_crc32=False`` and has no checksum to check);
* loads it with ``torch.load(weights_only=True)`` and checks it is a dense tensor of the
  dtype and sizes the metadata records.

So a flipped byte anywhere in a chunk's archive, tensor bytes included, is caught by its
CRC-32. What no check can catch: two chunks of one shape and dtype whose storage entries
were swapped consistently (each archive is whole, its CRCs right), or data saved without
CRCs and then damaged inside tensor bytes. Every failure is a :class:`CheckpointError`
naming the file, the tensor and the chunk.
"""

from __future__ import annotations

import io
import os
import stat
import zipfile

import torch

from meshplan.errors import CheckpointError

from ._dcp_index import Stored
from ._index import ChunkRecord
from ._index_json import _kind

__all__ = ["MAX_PICKLE_BYTES", "open_data_file", "read_chunk"]

MAX_PICKLE_BYTES = 1 << 16  # a saved tensor's data.pkl takes ~150 bytes


def open_data_file(directory: str, file: str, key: str) -> tuple[int, int]:
    """Open ``file`` of ``directory`` (holding tensor ``key``): its descriptor and size."""
    path = os.path.join(directory, file)
    what = f"{file!r} of the DCP checkpoint {directory!r} (data of tensor {key!r})"
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
            fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
            info = os.fstat(fd)
            mode = info.st_mode
            if stat.S_ISREG(mode):
                return fd, info.st_size
            os.close(fd)
    except OSError as e:
        raise CheckpointError(
            f"{what} cannot be read: {e.strerror or e}; the checkpoint is incomplete (copy "
            "every file of the save)",
            value=path,
        ) from None
    raise CheckpointError(
        f"{what} is not a regular file ({_kind(mode)}); a DCP checkpoint holds regular files "
        "only: replace it with the file it should be",
        value=path,
    )


def _read(fd: int, offset: int, length: int) -> bytes:
    parts, got = [], 0
    while got < length:
        part = os.pread(fd, min(length - got, 1 << 30), offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _check_archive(blob: bytes, where: str) -> None:
    """Refuse an archive that is not one whole, stored ``torch.save`` zip with right CRCs."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(blob))
        records = archive.infolist()
        if not records or min(r.header_offset for r in records) != 0:
            raise zipfile.BadZipFile("the archive does not start at the recorded offset")
        for r in records:
            if r.compress_type != zipfile.ZIP_STORED or r.compress_size != r.file_size:
                raise zipfile.BadZipFile(f"record {r.filename!r} is compressed")
            if r.filename.endswith("/data.pkl") and r.file_size > MAX_PICKLE_BYTES:
                raise zipfile.BadZipFile(f"record {r.filename!r} holds {r.file_size} bytes")
            if r.CRC:  # 0: saved without checksums
                with archive.open(r) as f:
                    while f.read(1 << 20):
                        pass
    except CheckpointError:
        raise
    except Exception as e:  # zipfile raises BadZipFile, ValueError, OSError, EOFError, ...
        raise CheckpointError(f"{where} is damaged: {type(e).__name__}: {e}", value=where) from None


def read_chunk(
    fd: int, size: int, directory: str, key: str, record: ChunkRecord, at: Stored, dtype: str
) -> torch.Tensor:
    """The tensor of chunk ``record`` of tensor ``key``, stored ``at`` the open file ``fd``
    of ``size`` bytes, checked (module docstring) to be of ``dtype`` and its sizes."""
    where = (
        f"chunk {record.name!r} (offsets {record.offsets!r}) of tensor {key!r}, bytes "
        f"{at.offset}..{at.offset + at.length} of {at.file!r} in the DCP checkpoint {directory!r}"
    )
    if at.offset + at.length > size:
        raise CheckpointError(
            f"{where} lies past the file's end ({size} bytes): the data file is truncated",
            value=at.file,
        )
    blob = _read(fd, at.offset, at.length)
    if len(blob) != at.length:
        raise CheckpointError(f"{where}: the data file is truncated", value=at.file)
    _check_archive(blob, where)
    try:
        tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        text = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(
            f"{where} cannot be loaded: {type(e).__name__}: {text:.200}"
        ) from None
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        raise CheckpointError(
            f"{where} holds {type(tensor).__name__}, not a dense tensor", value=at.file
        )
    got = str(tensor.dtype).removeprefix("torch.")
    if got != dtype or tuple(tensor.shape) != record.sizes:
        raise CheckpointError(
            f"{where} holds a {got}{list(tensor.shape)} tensor where the metadata records "
            f"{dtype}{list(record.sizes)}; the checkpoint is damaged",
            value=at.file,
        )
    return tensor

"""A checkpoint directory's files: shard files, claims of live saves, the commit lock, sweeping.

Concurrent saves into one directory: each save commits a complete checkpoint atomically
and the last commit wins; no save ever removes a file of the committed index or of a
save still running. Three mechanisms make that so:

* Every save has an id (16 hex digits) that names its shard files
  (``shard-<rank>-<id>.safetensors``), and every process taking part in it holds a
  *claim* while it runs: ``.meshplan/<id>.<tag>.claim``, exclusively locked
  (``flock``). The operating system drops the lock when the process exits or is killed,
  so a save is live exactly while some claim of its id is locked: there are no stale
  locks to time out.
* Committing (replacing ``index.json``) and sweeping happen under one directory lock,
  ``.meshplan/commit.lock``, so a sweep always reads the index that is current.
* A load claims the saves its index names (:func:`reading`) until it has read them, so
  a reader gets the checkpoint committed when it started, whole, while others save.
* A sweep removes what is neither named by the current index nor owned by a live save:
  shard files of superseded or crashed saves, their temp files, dead claims.

Shard files are written by meshplan itself (the safetensors format: a little-endian
header length, a JSON header, the raw bytes), first under ``.meshplan/<id>-<rank>.tmp``
and then renamed into place: no temp file under a name meshplan does not own, and every
file is created with the process's umask like ``index.json``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import struct
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import torch

from meshplan.errors import CheckpointError

from ._crc import FAST, crc32
from ._index import INDEX_NAME, Metadata
from ._index_json import metadata_from_json, read_index, read_metadata

__all__ = [
    "STATE_DIR",
    "Claim",
    "commit_lock",
    "discard_save",
    "is_live",
    "new_save_id",
    "reading",
    "save_id_of",
    "safetensors_code",
    "shard_name",
    "sweep_locked",
    "write_safetensors",
]

STATE_DIR = ".meshplan"
_SHARD = re.compile(r"^shard-(\d+)-([0-9a-f]+)\.safetensors(\.tmp)?$")
_TEMP = re.compile(r"^([0-9a-f]+)[-.].*\.tmp$")
_CLAIM = re.compile(r"^([0-9a-f]+)\.([^.]+)\.claim$")
_LEGACY_INDEX_TMP = re.compile(rf"^\.{re.escape(INDEX_NAME)}\..*\.tmp$")


def new_save_id() -> str:
    """A fresh save id: 16 hex digits."""
    return uuid.uuid4().hex[:16]


def shard_name(rank: int, save_id: str) -> str:
    """The shard file of ``rank`` in save ``save_id``."""
    return f"shard-{rank:05d}-{save_id}.safetensors"


def state_dir(directory: str) -> str:
    return os.path.join(directory, STATE_DIR)


# -- locks --------------------------------------------------------------------------------

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock(fd: int, blocking: bool) -> bool:
        mode = msvcrt.LK_LOCK if blocking else msvcrt.LK_NBLCK
        try:
            msvcrt.locking(fd, mode, 1)
        except OSError:
            if blocking:
                raise
            return False
        return True

else:
    import fcntl

    def _lock(fd: int, blocking: bool) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


@contextlib.contextmanager
def commit_lock(directory: str) -> Iterator[None]:
    """Hold the directory's commit lock (blocks while another process commits or sweeps)."""
    os.makedirs(state_dir(directory), exist_ok=True)
    fd = _open(os.path.join(state_dir(directory), "commit.lock"))
    try:
        _lock(fd, blocking=True)
        yield
    finally:
        os.close(fd)  # closing drops the lock


class Claim:
    """The mark of a live save: ``.meshplan/<save_id>.<tag>.claim``, locked while held.

    Used as a context manager; leaving it removes the claim file.
    """

    def __init__(self, directory: str, save_id: str, tag: str) -> None:
        self.path = os.path.join(state_dir(directory), f"{save_id}.{tag}.claim")
        self.fd: int | None = None

    def __enter__(self) -> Claim:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            fd = _open(self.path)
            _lock(fd, blocking=True)
            # a sweep may have removed the file between open and lock (it locks a claim
            # only to remove a dead one): then lock a fresh file
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.remove(self.path)
            os.close(self.fd)
            self.fd = None


def _claim_dead(path: str) -> bool:
    """Whether the claim file at ``path`` is not held by any process (it is then removed)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        if not _lock(fd, blocking=False):
            return False
        with contextlib.suppress(OSError):
            os.remove(path)
        return True
    finally:
        os.close(fd)


def is_live(directory: str, save_id: str, tag: str | None = None) -> bool:
    """Whether some process still holds a claim of save ``save_id`` (of ``tag`` only, if
    given) in ``directory``."""
    try:
        names = os.listdir(state_dir(directory))
    except FileNotFoundError:
        return False
    live = False
    for name in names:
        m = _CLAIM.match(name)
        if m and m.group(1) == save_id and (tag is None or m.group(2) == tag):
            live = not _claim_dead(os.path.join(state_dir(directory), name)) or live
    return live


def wait_until_done(directory: str, save_id: str, tag: str, timeout: float) -> bool:
    """Wait until no process holds the claim ``save_id.tag``; False on timeout."""
    deadline = time.monotonic() + timeout
    while is_live(directory, save_id, tag):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# -- readers ------------------------------------------------------------------------------


def save_id_of(file: str) -> str | None:
    """The save id in a shard file's name, or None for a name meshplan does not own."""
    m = _SHARD.match(file)
    return m.group(2) if m else None


@contextlib.contextmanager
def reading(directory: str) -> Iterator[Metadata]:
    """Read the committed index and keep its files while the block runs.

    The reader claims every save the index names (``.meshplan/<id>.r<random>.claim``),
    then reads the index again: if it is unchanged, no sweep can have removed its files
    (a sweep follows the commit that replaces an index, and respects claims), and none
    will until the block ends, so the reader gets that checkpoint whole however many
    saves commit meanwhile. If the index changed, it claims the new one. In a directory
    it cannot write to (where no save can run either), it reads without claims.
    """
    where = os.path.join(directory, INDEX_NAME)
    text = read_index(directory)
    for _ in range(_READ_ATTEMPTS):
        meta = metadata_from_json(text, where)
        ids = sorted({i for i in map(save_id_of, meta.files) if i is not None})
        with contextlib.ExitStack() as held:
            try:
                tag = f"r{uuid.uuid4().hex[:12]}"
                for save_id in ids:
                    held.enter_context(Claim(directory, save_id, tag))
            except OSError:  # a read-only directory: no save runs in it either
                held.close()
                yield meta
                return
            again = read_index(directory)
            if again == text:
                yield meta
                return
        text = again
    raise CheckpointError(
        f"the checkpoint at {directory!r} was replaced {_READ_ATTEMPTS} times while it was "
        "being opened; load again once the saves into it slow down",
        value=directory,
    )


_READ_ATTEMPTS = 100


def discard_save(directory: str, save_id: str, ranks: Iterable[int]) -> None:
    """Remove the files save ``save_id`` wrote for ``ranks`` (shard files, temp files, its
    index temp) unless the committed index names them: the cleanup of a failed save."""
    try:
        committed = any(save_id_of(f) == save_id for f in read_metadata(directory).files)
    except CheckpointError:
        committed = False
    if committed:
        return
    staging = state_dir(directory)
    paths = [os.path.join(staging, f"{save_id}.index.tmp")]
    for rank in ranks:
        paths.append(os.path.join(directory, shard_name(rank, save_id)))
        paths.append(os.path.join(staging, f"{save_id}-{rank}.tmp"))
    for path in paths:
        with contextlib.suppress(OSError):
            os.remove(path)


# -- sweeping -----------------------------------------------------------------------------


def sweep_locked(directory: str, keep: frozenset[str] | None = None) -> None:
    """Remove files of dead saves; the caller holds :func:`commit_lock`.

    ``keep``: the shard files of the current index (read from disk when None; if it
    cannot be read, no shard file is removed, only temp files and dead claims).
    """
    if keep is None:
        try:
            keep = frozenset(read_metadata(directory).files)
        except CheckpointError:
            keep = None
    live: dict[str, bool] = {}

    def dead(save_id: str) -> bool:
        if save_id not in live:
            live[save_id] = is_live(directory, save_id)
        return not live[save_id]

    for name in _listdir(directory):
        m = _SHARD.match(name)
        stale = False
        if m:
            owned = name in keep if keep is not None else True
            stale = (m.group(3) is not None or not owned) and dead(m.group(2))
        elif _LEGACY_INDEX_TMP.match(name):
            stale = True  # written under the commit lock, which this process holds
        if stale:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))
    staging = state_dir(directory)
    for name in _listdir(staging):
        m = _TEMP.match(name)
        if m and dead(m.group(1)):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(staging, name))
        elif (c := _CLAIM.match(name)) is not None and c.group(1) not in live:
            _claim_dead(os.path.join(staging, name))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


# -- shard files --------------------------------------------------------------------------

# safetensors' dtype names
_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.complex64: "C64",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}
for _name, _code in (("float8_e4m3fnuz", "F8_E4M3FNUZ"), ("float8_e5m2fnuz", "F8_E5M2FNUZ")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code


def safetensors_code(dtype: torch.dtype) -> str | None:
    """safetensors' name of ``dtype`` (``"F32"``), or None when it cannot hold it."""
    return _DTYPES.get(dtype)


def write_safetensors(
    tensors: Mapping[str, torch.Tensor],
    path: str,
    metadata: Mapping[str, str],
    seeds: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Write ``tensors`` (contiguous CPU tensors) to ``path`` in the safetensors format,
    streaming their bytes (no copy of the whole file in memory), and fsync it; return,
    per tensor, the crc32 of its bytes continued from ``seeds[name]`` (0 when absent).

    The checksums are computed while the file is being synced to disk (on a thread of
    their own), so they add no time to a save whose disk is slower than its CPU.

    >>> import tempfile, zlib
    >>> from safetensors.torch import load_file
    >>> path = os.path.join(tempfile.mkdtemp(), "x.safetensors")
    >>> crcs = write_safetensors({"a": torch.arange(3), "b": torch.ones(2, 2)}, path, {"k": "v"})
    >>> load_file(path)["a"]
    tensor([0, 1, 2])
    >>> crcs["a"] == zlib.crc32(torch.arange(3).numpy().tobytes())
    True
    """
    seeds = {} if seeds is None else seeds
    header: dict[str, object] = {}
    names = sorted(tensors)
    offset = 0
    for name in names:
        t = tensors[name]
        code = _DTYPES.get(t.dtype)
        if code is None:
            raise CheckpointError(
                f"tensor {name!r} has dtype {t.dtype}, which safetensors cannot hold; "
                "convert it before saving",
                value=name,
            )
        if sys.byteorder != "little" and t.element_size() > 1:  # pragma: no cover
            raise CheckpointError(
                "safetensors files are little-endian; this host is big-endian", value=name
            )
        n = t.numel() * t.element_size()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:  # created with the umask, like index.json
        f.write(struct.pack("<Q", len(text)) + text)
        views = []
        writer = _Writeback(f, offset)
        for name in names:
            t = tensors[name]
            data = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else None
            if data is not None:
                writer.write(data)
            views.append((name, data))
        f.flush()
        if offset < _OVERLAP_BYTES:  # checksums of a small file cost less than a thread
            crcs = {name: _crc32(data, int(seeds.get(name, 0))) for name, data in views}
            os.fsync(f.fileno())
            return crcs
        # the fsync waits on the disk, the checksums on the CPU: run them side by side
        # (both release the GIL), so the checksums add no time when the disk is slower
        with ThreadPoolExecutor(1) as pool:
            synced = pool.submit(os.fsync, f.fileno())
            crcs = {name: _crc32(data, int(seeds.get(name, 0))) for name, data in views}
            synced.result()
    return crcs


class _Writeback:
    """Writes a big file's bytes in pieces and has the kernel start writing each piece to
    disk as soon as it is written (Linux's ``sync_file_range``), so that the closing
    fsync waits only for the last pieces: the disk works while later pieces are copied.
    Elsewhere, or for a small file, it writes as one ``write`` does."""

    PIECE = 4 << 20

    def __init__(self, f, nbytes: int) -> None:
        self.f = f
        self.start = _sync_file_range() if nbytes >= 2 * self.PIECE else None
        self.done = 0  # bytes of the file whose writeback has started

    def write(self, data: memoryview) -> None:
        if self.start is None:
            self.f.write(data)
            return
        for lo in range(0, len(data), self.PIECE):
            self.f.write(data[lo : lo + self.PIECE])
            self.f.flush()
            end = self.f.tell()
            if end - self.done >= self.PIECE:
                self.start(self.f.fileno(), self.done, end - self.done, _SYNC_FILE_RANGE_WRITE)
                self.done = end


_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the range's dirty pages, do not wait


@functools.cache
def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # pragma: no cover - a libc without it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


# from this many bytes on, the checksums run beside the fsync (ISA-L's take ~1 ms per
# 16 MB: less than a thread's start and its turn on a busy host, up to far larger files)
_OVERLAP_BYTES = 1 << 26 if FAST else 1 << 18


def _crc32(data: memoryview | None, seed: int) -> int:
    return seed if data is None else crc32(data, seed)

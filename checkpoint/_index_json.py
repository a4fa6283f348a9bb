"""The index's JSON form: its text, its parsing and checks, and a directory's committed index.

``index.json`` is the commit record of a checkpoint directory: a save writes it last, in
one atomic rename, and a load trusts nothing it does not name. Its text is stable (keys
and chunks in a fixed order); reading it checks everything a load relies on before any
data is read: the format and version, every record's fields, chunks that lie inside
their tensor and tile it exactly once, file names inside the checkpoint, and one entry
of a shard file per record.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable

from meshplan.errors import CheckpointError

from ._index import (
    INDEX_NAME,
    VERSION,
    ChunkRecord,
    Metadata,
    TensorMeta,
    check_dtype_name,
    check_tiles,
    ints_of,
)
from ._spec_json import spec_from_doc, spec_to_doc

__all__ = [
    "FORMAT",
    "MAX_INDEX_BYTES",
    "checkpoint_path",
    "metadata_from_json",
    "metadata_to_json",
    "read_index",
    "read_metadata",
    "read_small_file",
]

FORMAT = "meshplan.checkpoint"
# The largest index read: about a million chunk records (a save writes one per box).
MAX_INDEX_BYTES = 256 << 20


def metadata_to_json(meta: Metadata) -> str:
    """The index text for ``meta`` (stable: keys and chunks in a fixed order)."""
    if not isinstance(meta, Metadata):
        raise CheckpointError(
            f"metadata_to_json writes a Metadata, got {type(meta).__name__} {meta!r:.80}",
            value=meta,
        )
    doc = {
        "format": FORMAT,
        "version": meta.version,
        "tensors": {
            key: {
                "shape": list(t.shape),
                "dtype": t.dtype,
                **({} if t.spec is None else {"spec": spec_to_doc(t.spec)}),
                "chunks": [
                    {
                        "offsets": list(c.offsets),
                        "sizes": list(c.sizes),
                        "file": c.file,
                        "name": c.name,
                        "checksum": c.checksum,
                    }
                    for c in t.chunks
                ],
            }
            for key, t in sorted(meta.tensors.items())
        },
    }
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def _file(value: object) -> str:
    """A chunk's file name from the index: a relative path inside the checkpoint."""
    parts = value.replace("\\", "/").split("/") if isinstance(value, str) else []
    if not parts or os.path.isabs(value) or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"file {value!r} is not a file name inside the checkpoint")
    return value


def _index_doc(text: str | bytes, where: str) -> dict:
    """The JSON document of index text (str or UTF-8 bytes)."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(
                f"{where} is not UTF-8 text ({e}); the index is damaged", value=where
            ) from None
    if not isinstance(text, str):
        raise CheckpointError(
            f"index text must be a str or bytes, got {type(text).__name__} {text!r:.80}; pass "
            f"the contents of {INDEX_NAME}",
            value=text,
        )
    try:
        doc = json.loads(text)
    except RecursionError:
        raise CheckpointError(
            f"{where} nests too deeply to be a {FORMAT} index; the index is damaged", value=where
        ) from None
    except ValueError as e:
        raise CheckpointError(f"{where} is not valid JSON ({e}); the index is damaged") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a {FORMAT} index", value=where)
    version = doc.get("version")
    if type(version) is not int or version != VERSION:  # not True, not 1.0
        raise CheckpointError(
            f"{where} has index version {version!r}; this meshplan reads version {VERSION} "
            "(an int)",
            value=version,
        )
    if not isinstance(doc.get("tensors"), dict):
        raise CheckpointError(
            f"{where} is malformed (its 'tensors' is {doc.get('tensors')!r:.80}, not an "
            "object); the index is damaged",
            value=where,
        )
    return doc


def _tensor_meta(key: str, t: object) -> TensorMeta:
    """One tensor's entry of the index document (raises the errors the caller reports)."""
    chunks = [
        ChunkRecord(c["offsets"], c["sizes"], _file(c["file"]), c["name"], c["checksum"])
        for c in t["chunks"]
    ]
    shape, dtype = ints_of("shape")(t["shape"]), t["dtype"]
    check_dtype_name(dtype)
    spec = spec_from_doc(t["spec"], shape, dtype) if "spec" in t else None
    return TensorMeta(key, shape, dtype, chunks, spec)


def metadata_from_json(text: str | bytes, where: str = INDEX_NAME) -> Metadata:
    """Parse and check index text; raise :class:`CheckpointError` naming what is wrong.

    >>> m = metadata_from_json(metadata_to_json(Metadata({"w": TensorMeta("w", (0,), "int64", ())})))
    >>> m["w"].shape
    (0,)
    """
    doc = _index_doc(text, where)
    tensors: dict[str, TensorMeta] = {}
    for key, t in doc["tensors"].items():
        try:
            meta = _tensor_meta(key, t)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            kind = "" if isinstance(e, CheckpointError) else f"{type(e).__name__}: "
            raise CheckpointError(
                f"{where} is malformed at tensor {key!r} ({kind}{e}); the index is damaged",
                value=key,
            ) from None
        check_tiles(meta, f" in {where}")
        tensors[key] = meta
    _check_unique_entries(tensors.values(), where)
    return Metadata(tensors)


def _check_unique_entries(metas: Iterable[TensorMeta], where: str) -> None:
    """Raise unless every chunk record names its own entry of its shard file (two records
    of one entry would read the same bytes for two boxes)."""
    seen: dict[tuple[str, str], str] = {}
    for meta in metas:
        for c in meta.chunks:
            other = seen.get((c.file, c.name))
            if other is not None:
                raise CheckpointError(
                    f"{where}: entry {c.name!r} of {c.file!r} is recorded twice (tensors "
                    f"{other!r} and {meta.key!r}); each saved box has its own entry, so the "
                    "index is damaged",
                    value=(c.file, c.name),
                )
            seen[(c.file, c.name)] = meta.key


def checkpoint_path(path: object) -> str:
    """``path`` (a str, bytes or os.PathLike) as a str; raise CheckpointError for any other
    value or an empty path.

    >>> checkpoint_path(b"ckpt")
    'ckpt'
    >>> checkpoint_path("")
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: the checkpoint path is empty; ...
    """
    try:
        raw = os.fspath(path)  # type: ignore[arg-type]
    except TypeError:
        raise CheckpointError(
            f"a checkpoint path must be a str or os.PathLike naming a directory, got "
            f"{type(path).__name__} {path!r:.80}; pass e.g. 'checkpoints/step-100'",
            value=path,
        ) from None
    text = os.fsdecode(raw)
    if not text:
        raise CheckpointError(
            "the checkpoint path is empty; pass a directory (e.g. '.' for the current one)",
            value=path,
        )
    if "\0" in text:
        raise CheckpointError(
            f"checkpoint path {text!r} holds a NUL character; pass a real directory path",
            value=path,
        )
    return text


def read_metadata(path: str | os.PathLike[str]) -> Metadata:
    """The committed index of the checkpoint at ``path`` (shapes, dtypes, saved specs, chunks).

    Raises :class:`CheckpointError` when ``path`` has no index (never committed, or a
    save crashed before its first commit) or the index is damaged.

    >>> import tempfile
    >>> read_metadata(tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: no checkpoint at ...: index.json is missing ...
    """
    directory = checkpoint_path(path)
    return metadata_from_json(read_index(directory), os.path.join(directory, INDEX_NAME))


def read_index(directory: str) -> bytes:
    """The bytes of ``directory``'s committed index (a regular file, of a sane size)."""
    index = os.path.join(directory, INDEX_NAME)
    try:
        return read_small_file(index, MAX_INDEX_BYTES, "the index")
    except FileNotFoundError:
        raise CheckpointError(
            f"no checkpoint at {directory!r}: {INDEX_NAME} is missing (the checkpoint was "
            "never committed, or its save did not finish); save again or pick another path",
            value=directory,
        ) from None
    except OSError as e:
        raise CheckpointError(
            f"cannot read {index!r}: {e}; pass the checkpoint's directory", value=index
        ) from None


def read_small_file(path: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, refusing at once (``CheckpointError``) a
    FIFO, a device, a directory or a file of more than ``limit`` bytes.

    Opened without blocking (a FIFO with no writer would block ``open`` forever) and
    checked on the open descriptor, so a symlink to ``/dev/zero`` is refused too.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(
                f"{path!r} ({what}) is not a regular file ({_kind(info.st_mode)}); a "
                "checkpoint holds regular files only: replace it with the file it should be",
                value=path,
            )
        if info.st_size > limit:
            raise CheckpointError(
                f"{path!r} ({what}) is larger than {limit} bytes ({info.st_size}); no "
                "meshplan checkpoint writes one that large, so the file is damaged",
                value=path,
            )
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while being read
        raise CheckpointError(
            f"{path!r} ({what}) is larger than {limit} bytes; the file is damaged", value=path
        )
    return data


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"

"""The checkpoint index: frozen metadata values and their JSON form (no torch).

A checkpoint is a directory holding shard files (safetensors, one per writing rank and
save) and one ``index.json``. The index is the commit record: it lists, per tensor key,
the global shape, the dtype and every saved chunk (a box of the global tensor, the file
and the name it is stored under, and a checksum of its bytes). Files the index does not
name are not part of the checkpoint.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable

import attrs

from meshplan.errors import CheckpointError
from meshplan.layout import FrozenMap
from meshplan.placement import DTYPES, Chunk

__all__ = [
    "FORMAT",
    "INDEX_NAME",
    "VERSION",
    "ChunkRecord",
    "Metadata",
    "TensorMeta",
    "check_tiles",
    "metadata_from_json",
    "metadata_to_json",
    "read_metadata",
]

FORMAT = "meshplan.checkpoint"
VERSION = 1
INDEX_NAME = "index.json"


def _ints(value: Iterable[int]) -> tuple[int, ...]:
    out = tuple(value)
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{list(out)!r} holds {v!r}, not an int")
    return out


@attrs.frozen
class ChunkRecord:
    """One saved box of a tensor: where it lies globally and where its bytes are.

    ``name`` is the tensor name inside the safetensors ``file`` (a path relative to the
    checkpoint directory); ``checksum`` is ``"crc32:<8 hex digits>"`` of the box's bytes
    in row-major order.

    >>> r = ChunkRecord((2, 0), (2, 4), "shard-00001-ab.safetensors", "w#0", "crc32:0000abcd")
    >>> r.box, r.numel()
    (Chunk(offsets=(2, 0), sizes=(2, 4)), 8)
    """

    offsets: tuple[int, ...] = attrs.field(converter=_ints)
    sizes: tuple[int, ...] = attrs.field(converter=_ints)
    file: str
    name: str
    checksum: str

    @property
    def box(self) -> Chunk:
        return Chunk(self.offsets, self.sizes)

    def numel(self) -> int:
        return math.prod(self.sizes)


def _chunks(value: Iterable[ChunkRecord]) -> tuple[ChunkRecord, ...]:
    return tuple(value)


@attrs.frozen
class TensorMeta:
    """A saved tensor: its global ``shape``, ``dtype`` name and ``chunks`` (which tile it).

    >>> t = TensorMeta("w", (4,), "float32", ())
    >>> t.numel(), t.ndim
    (4, 1)
    """

    key: str
    shape: tuple[int, ...] = attrs.field(converter=_ints)
    dtype: str
    chunks: tuple[ChunkRecord, ...] = attrs.field(converter=_chunks)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)


@attrs.frozen
class Metadata:
    """Everything ``index.json`` says: tensor key -> :class:`TensorMeta`.

    >>> m = Metadata({"w": TensorMeta("w", (2,), "int64", ())})
    >>> sorted(m.tensors), m.files
    (['w'], ())
    """

    tensors: FrozenMap[str, TensorMeta] = attrs.field(converter=FrozenMap)
    version: int = VERSION

    @property
    def files(self) -> tuple[str, ...]:
        """The shard files the index refers to, sorted."""
        return tuple(sorted({c.file for t in self.tensors.values() for c in t.chunks}))

    def __getitem__(self, key: str) -> TensorMeta:
        return self.tensors[key]


def check_tiles(meta: TensorMeta, where: str = "") -> None:
    """Raise unless ``meta``'s chunks lie inside the tensor and cover it exactly once.

    Checked by volume and disjointness (on the grid of the chunks' own boundaries, or
    pairwise for irregular ones), so a chunk missing, doubled or out of bounds is caught
    before any data is read, however many chunks there are.

    >>> check_tiles(TensorMeta("w", (4,), "int64", [ChunkRecord((0,), (3,), "f", "w#0", "")]))
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: tensor 'w': saved chunks cover 3 of 4 elements; ...
    """
    for c in meta.chunks:
        if (
            len(c.offsets) != meta.ndim
            or len(c.sizes) != meta.ndim
            or any(
                o < 0 or s < 0 or o + s > n
                for o, s, n in zip(c.offsets, c.sizes, meta.shape, strict=True)
            )
        ):
            raise CheckpointError(
                f"tensor {meta.key!r}{where}: chunk {c.name!r} in {c.file!r} at offsets "
                f"{c.offsets!r} sizes {c.sizes!r} lies outside shape {meta.shape!r}; the index "
                "is damaged",
                value=c,
            )
    covered = sum(c.numel() for c in meta.chunks)
    if covered != meta.numel():
        raise CheckpointError(
            f"tensor {meta.key!r}{where}: saved chunks cover {covered} of {meta.numel()} "
            "elements; every element must be saved exactly once (did every rank call save?)",
            value=meta.key,
        )
    boxes = [c for c in meta.chunks if c.numel()]
    # volumes agree, so the chunks tile the tensor exactly when no two overlap
    pair = _overlap_on_grid(boxes, meta.ndim)
    if pair is None:
        pair = _overlap_by_sweep(boxes, meta.ndim)
    if pair:
        a, b = pair
        raise CheckpointError(
            f"tensor {meta.key!r}{where}: chunks {a.name!r} ({a.file!r}) and "
            f"{b.name!r} ({b.file!r}) overlap; the index is damaged",
            value=meta.key,
        )


_GRID_CELLS = 1 << 22


def _overlap_on_grid(boxes: list, ndim: int):
    """Two overlapping boxes, ``()`` when none overlap, or None when the grid of the boxes'
    own boundaries has more than ``_GRID_CELLS`` cells (each box then marks its cells of a
    counter array: O(boxes + cells))."""
    import numpy as np

    if len(boxes) < 2:
        return ()
    cuts = []
    for d in range(ndim):
        points = sorted({c.offsets[d] for c in boxes} | {c.offsets[d] + c.sizes[d] for c in boxes})
        cuts.append({v: i for i, v in enumerate(points)})
    if math.prod(len(c) - 1 for c in cuts) > _GRID_CELLS:
        return None
    owner = np.full(tuple(len(c) - 1 for c in cuts), -1, dtype=np.int64)
    for k, c in enumerate(boxes):
        block = owner[
            tuple(
                slice(cut[o], cut[o + z])
                for cut, o, z in zip(cuts, c.offsets, c.sizes, strict=True)
            )
        ]
        taken = block[block >= 0]
        if taken.size:
            return boxes[int(taken[0])], c
        block[...] = k
    return ()


def _overlap_by_sweep(boxes: list, ndim: int):
    """Two overlapping boxes or ``()``: pairwise, along the first dim in order."""
    boxes = sorted(boxes, key=lambda c: c.offsets)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if ndim and b.offsets[0] >= a.offsets[0] + a.sizes[0]:
                break
            if all(
                max(ao, bo) < min(ao + az, bo + bz)
                for ao, az, bo, bz in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
            ):
                return a, b
    return ()


# -- JSON ---------------------------------------------------------------------------


def metadata_to_json(meta: Metadata) -> str:
    """The index text for ``meta`` (stable: keys and chunks in a fixed order)."""
    doc = {
        "format": FORMAT,
        "version": meta.version,
        "tensors": {
            key: {
                "shape": list(t.shape),
                "dtype": t.dtype,
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


def metadata_from_json(text: str, where: str = INDEX_NAME) -> Metadata:
    """Parse and check index text; raise :class:`CheckpointError` naming what is wrong.

    >>> m = metadata_from_json(metadata_to_json(Metadata({"w": TensorMeta("w", (0,), "int64", ())})))
    >>> m["w"].shape
    (0,)
    """
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{where} is not valid JSON ({e}); the index is damaged") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a {FORMAT} index", value=where)
    if doc.get("version") != VERSION:
        raise CheckpointError(
            f"{where} has index version {doc.get('version')!r}; this meshplan reads version "
            f"{VERSION}",
            value=doc.get("version"),
        )
    tensors: dict[str, TensorMeta] = {}
    try:
        for key, t in doc["tensors"].items():
            chunks = [
                ChunkRecord(c["offsets"], c["sizes"], _file(c["file"]), c["name"], c["checksum"])
                for c in t["chunks"]
            ]
            for c in chunks:
                if not isinstance(c.name, str) or not isinstance(c.checksum, str):
                    raise ValueError(f"chunk {c.name!r} has a name or checksum that is no string")
            meta = TensorMeta(key, t["shape"], t["dtype"], chunks)
            if meta.dtype not in DTYPES:
                raise CheckpointError(
                    f"{where}: tensor {key!r} has unknown dtype {meta.dtype!r}", value=meta.dtype
                )
            check_tiles(meta, f" in {where}")
            tensors[key] = meta
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(
            f"{where} is malformed ({type(e).__name__}: {e}); the index is damaged"
        ) from None
    return Metadata(tensors)


def read_metadata(path: str | os.PathLike[str]) -> Metadata:
    """The committed index of the checkpoint at ``path`` (shapes, dtypes, chunks).

    Raises :class:`CheckpointError` when ``path`` has no index (never committed, or a
    save crashed before its first commit) or the index is damaged.

    >>> import tempfile
    >>> read_metadata(tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: no checkpoint at ...: index.json is missing ...
    """
    index = os.path.join(os.fspath(path), INDEX_NAME)
    try:
        with open(index, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise CheckpointError(
            f"no checkpoint at {os.fspath(path)!r}: {INDEX_NAME} is missing (the checkpoint was "
            "never committed, or its save did not finish); save again or pick another path",
            value=os.fspath(path),
        ) from None
    except OSError as e:
        raise CheckpointError(f"cannot read {index!r}: {e}", value=index) from None
    return metadata_from_json(text, index)

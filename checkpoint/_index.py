"""The checkpoint index: frozen metadata values and the check that chunks tile (no torch).

A checkpoint is a directory holding shard files (safetensors, one per writing rank and
save) and one ``index.json``. The index is the commit record: it lists, per tensor key,
the global shape, the dtype and every saved chunk (a box of the global tensor, the file
and the name it is stored under, and a checksum of its bytes). Files the index does not
name are not part of the checkpoint.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable

import attrs

from meshplan.errors import CheckpointError, MissingTensorError
from meshplan.layout import FrozenMap
from meshplan.layout._ints import as_int, brief
from meshplan.placement import DTYPES, Chunk, Spec

__all__ = [
    "INDEX_NAME",
    "VERSION",
    "ChunkRecord",
    "Metadata",
    "MissingTensorError",
    "TensorMeta",
    "check_dtype_name",
    "check_tiles",
    "ints_of",
    "missing_tensor",
]

VERSION = 1
INDEX_NAME = "index.json"


_MAX_SIZE = 2**63 - 1  # torch sizes and offsets are int64


def missing_tensor(key: object, known: Iterable[str], where: str) -> MissingTensorError:
    """The error for tensor ``key`` missing from the checkpoint ``where``, listing ``known``."""
    known = list(known)
    more = " ..." if len(known) > 10 else ""
    return MissingTensorError(
        f"tensor {key!r} is not in the checkpoint{where} (it holds {known[:10]!r}{more}); "
        "pass one of its keys",
        value=key,
    )


def ints_of(what: str) -> Callable[[Iterable[int]], tuple[int, ...]]:
    """A converter to a tuple of ints in ``[0, 2**63)`` (numpy ints too; not bools)."""

    def convert(value: Iterable[int]) -> tuple[int, ...]:
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise CheckpointError(f"{what} {brief(value)} is not a sequence of ints", value=value)
        try:
            items = tuple(value)
        except TypeError:  # a 0-d tensor or array
            raise CheckpointError(
                f"{what} {brief(value)} is not a sequence of ints", value=value
            ) from None
        out = []
        for v in items:
            i = as_int(v)
            if i is None or not 0 <= i <= _MAX_SIZE:
                raise CheckpointError(
                    f"{what} {brief(list(items))} holds {brief(v)}; every entry must be an int >= 0 "
                    "(and below 2**63)",
                    value=value,
                )
            out.append(i)
        return tuple(out)

    return convert


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

    offsets: tuple[int, ...] = attrs.field(converter=ints_of("offsets"))
    sizes: tuple[int, ...] = attrs.field(converter=ints_of("sizes"))
    file: str = attrs.field(validator=lambda i, a, v: _text("chunk file", v))
    name: str = attrs.field(validator=lambda i, a, v: _text("chunk name", v))
    checksum: str = attrs.field(validator=lambda i, a, v: _text("chunk checksum", v))

    @property
    def box(self) -> Chunk:
        return Chunk(self.offsets, self.sizes)

    def numel(self) -> int:
        return math.prod(self.sizes)


def _text(what: str, value: object) -> None:
    if not isinstance(value, str):
        raise CheckpointError(
            f"{what} {value!r} is no string; a record's key, dtype, file, name and checksum "
            "are strings",
            value=value,
        )


def check_dtype_name(value: object) -> None:
    """Raise unless ``value`` names a dtype a checkpoint holds (``"float32"``, ...)."""
    _text("dtype", value)
    if value not in DTYPES:
        raise CheckpointError(
            f"unknown dtype {value!r}; a saved tensor's dtype is one of {sorted(DTYPES)}",
            value=value,
        )


def _chunks(value: Iterable[ChunkRecord]) -> tuple[ChunkRecord, ...]:
    if not isinstance(value, Iterable) or isinstance(value, str | bytes):
        raise CheckpointError(
            f"chunks {brief(value)} must be a sequence of ChunkRecords", value=value
        )
    try:
        out = tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise CheckpointError(
            f"chunks {brief(value)} must be a sequence of ChunkRecords", value=value
        ) from None
    for c in out:
        if not isinstance(c, ChunkRecord):
            raise CheckpointError(f"chunks hold {c!r}, which is not a ChunkRecord", value=c)
    return out


def _saved_spec(meta: TensorMeta, attribute: object, spec: object) -> None:
    if spec is None:
        return
    if not isinstance(spec, Spec):
        raise CheckpointError(
            f"tensor {meta.key!r}: spec {spec!r:.80} is not a meshplan Spec (or None)", value=spec
        )
    if (spec.shape, spec.dtype) != (meta.shape, meta.dtype):
        raise CheckpointError(
            f"tensor {meta.key!r} is {meta.dtype}{list(meta.shape)} but its saved spec {spec} "
            "describes another tensor; record the spec the tensor was saved in",
            value=spec,
        )


@attrs.frozen
class TensorMeta:
    """A saved tensor: its global ``shape``, ``dtype`` name, ``chunks`` (which tile it) and
    the ``spec`` it was saved in (mesh, placements, shard order; None in indexes written
    before specs were recorded, and for torch DCP checkpoints).

    >>> t = TensorMeta("w", (4,), "float32", ())
    >>> t.numel(), t.ndim, t.spec
    (4, 1, None)
    """

    key: str = attrs.field(validator=lambda i, a, v: _text("tensor key", v))
    shape: tuple[int, ...] = attrs.field(converter=ints_of("shape"))
    dtype: str = attrs.field(validator=lambda i, a, v: check_dtype_name(v))
    chunks: tuple[ChunkRecord, ...] = attrs.field(converter=_chunks)
    spec: Spec | None = attrs.field(default=None, validator=_saved_spec)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def __str__(self) -> str:
        """``key: f32[8,4](S(0) S(1)) on (2,4) (dp, tp), 8 chunks``."""
        if self.spec is None:
            shape = ",".join(map(str, self.shape))
            laid = f"{self.dtype}[{shape}] (spec not recorded)"
        else:
            m = self.spec.mesh
            laid = f"{self.spec} on {m.shape} ({', '.join(m.names)})"
        return f"{self.key}: {laid}, {len(self.chunks)} chunks"


@attrs.frozen
class Metadata:
    """Everything ``index.json`` says: tensor key -> :class:`TensorMeta` (``str`` lists them).

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

    def __str__(self) -> str:
        return "\n".join(str(t) for _, t in sorted(self.tensors.items()))

    def __getitem__(self, key: str) -> TensorMeta:
        """The saved tensor ``key``; a :class:`MissingTensorError` (a ``KeyError`` too)
        naming the keys there are when it is absent."""
        try:
            return self.tensors[key]
        except (KeyError, TypeError):  # TypeError: an unhashable key
            raise missing_tensor(key, self.tensors, "") from None


def check_tiles(meta: TensorMeta, where: str = "") -> None:
    """Raise unless ``meta``'s chunks lie inside the tensor and cover it exactly once.

    Checked by volume, then by counting the chunks' corners (linear in the number of
    chunks; the overlapping pair is then looked for on the grid of the chunks' own
    boundaries, or pairwise), so a chunk missing, doubled or out of bounds is caught
    before any data is read, however many chunks there are.

    >>> check_tiles(TensorMeta("w", (4,), "int64", [ChunkRecord((0,), (3,), "f", "w#0", "")]))
    Traceback (most recent call last):
    ...
    meshplan.errors.CheckpointError: tensor 'w': saved chunks cover 3 of 4 elements; ...
    """
    if not isinstance(meta, TensorMeta):
        raise CheckpointError(f"check_tiles reads a TensorMeta, got {meta!r:.80}", value=meta)
    if not isinstance(where, str):
        raise CheckpointError(f"check_tiles: where={where!r:.80} is no string", value=where)
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
    tiles = _tiles_by_corners(boxes, meta.shape)
    if tiles:
        return
    pair = _overlap_on_grid(boxes, meta.ndim)
    if pair is None:  # bounded when the corners have decided already
        pair = _overlap_by_sweep(boxes, meta.ndim, _SWEEP_PAIRS if tiles is False else None)
    if not pair and tiles is None:
        return
    if pair:
        a, b = pair
        what = f"chunks {a.name!r} ({a.file!r}) and {b.name!r} ({b.file!r}) overlap"
    else:  # too many chunks to name two of them in bounded time
        what = f"two of its {len(boxes)} chunks overlap"
    raise CheckpointError(
        f"tensor {meta.key!r}{where}: {what}; the index is damaged", value=meta.key
    )


def _tiles_by_corners(boxes: list, shape: tuple[int, ...]) -> bool | None:
    """Whether ``boxes`` cover the box ``shape`` exactly once, in O(boxes * 2**dims)
    (None when more than ``_CORNER_DIMS`` dims are cut).

    A box's indicator function is the signed sum of the orthants at its corners (sign
    ``(-1)**k`` for a corner taking the upper bound in ``k`` dims), and a function has one
    such expansion: the boxes tile ``shape`` exactly when their corners' signed counts
    equal those of ``shape`` itself. Dims every box spans whole are left out (they
    multiply both sides alike).
    """
    if not boxes:
        return True  # the volumes agree: an empty tensor
    dims = [
        d for d in range(len(shape)) if any(c.offsets[d] or c.sizes[d] != shape[d] for c in boxes)
    ]
    if len(dims) > _CORNER_DIMS:
        return None  # the grid or the sweep decides

    # corners in itertools.product order (lower bound first in each dim), with their signs
    signs = [(-1) ** sum(bits) for bits in itertools.product((0, 1), repeat=len(dims))]
    counts: dict[tuple[int, ...], int] = {}
    get = counts.get
    for c in boxes:
        bounds = [(c.offsets[d], c.offsets[d] + c.sizes[d]) for d in dims]
        for corner, sign in zip(itertools.product(*bounds), signs, strict=True):
            counts[corner] = get(corner, 0) + sign
    whole = dict(zip(itertools.product(*[(0, shape[d]) for d in dims]), signs, strict=True))
    return {k: v for k, v in counts.items() if v} == whole


_CORNER_DIMS = 12
_SWEEP_PAIRS = 1 << 21


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


def _overlap_by_sweep(boxes: list, ndim: int, budget: int | None = None):
    """Two overlapping boxes, or ``()`` when none is found (within ``budget`` pair checks,
    if given): pairwise along the dim with the most distinct offsets, in order."""
    if not ndim:
        return ()
    axis = max(range(ndim), key=lambda d: len({c.offsets[d] for c in boxes}))
    boxes = sorted(boxes, key=lambda c: c.offsets[axis])
    limit = math.inf if budget is None else budget
    checks = 0
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if b.offsets[axis] >= a.offsets[axis] + a.sizes[axis]:
                break
            checks += 1
            if checks > limit:
                return ()
            if all(
                max(ao, bo) < min(ao + az, bo + bz)
                for ao, az, bo, bz in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
            ):
                return a, b
    return ()

"""What each rank writes and reads: pure functions over chunk boxes (no torch).

Writing: a rank's local tensor is a grid of boxes of the global tensor
(:func:`local_boxes`; one box for plain shards, several for StridedShard and uneven
shard orders). Each box is saved as its own chunk, by exactly one of the ranks that
hold it (:func:`writes`). Reading: every box of the target rank is intersected with the
saved chunks (:func:`plan_reads`), giving, per overlap, the slice of the saved chunk and
the slice of the local tensor it fills.
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any

import attrs

from meshplan.errors import CheckpointError
from meshplan.layout._mesh import first_instance
from meshplan.placement import Chunk, Replicate, Spec, local_intervals
from meshplan.placement._local import _box_ints

from ._index import TensorMeta

__all__ = [
    "Box",
    "Read",
    "check_target",
    "intersect",
    "local_boxes",
    "plan_reads",
    "verifiers",
    "writes",
]


@attrs.frozen
class Box:
    """A box of one rank's local tensor: the global ``chunk`` and where it starts locally.

    >>> Box(Chunk((4, 0), (2, 3)), (2, 0)).local
    Chunk(offsets=(2, 0), sizes=(2, 3))
    """

    chunk: Chunk = attrs.field()
    local_offsets: tuple[int, ...] = attrs.field(converter=lambda v: _box_ints(v, "offsets"))

    @chunk.validator
    def _check_chunk(self, attribute: Any, value: Any) -> None:
        if not isinstance(value, Chunk):
            raise CheckpointError(f"Box needs a Chunk, got {value!r:.80}", value=value)

    @property
    def local(self) -> Chunk:
        """The same box in local-tensor coordinates."""
        return Chunk(self.local_offsets, self.chunk.sizes)


@attrs.frozen
class Read:
    """Copy ``source`` (a box within saved chunk number ``chunk``, in that chunk's
    coordinates) into ``target`` (a box of the local tensor).

    >>> Read(0, Chunk((1,), (2,)), Chunk((0,), (2,))).numel()
    2
    """

    chunk: int
    source: Chunk
    target: Chunk

    def numel(self) -> int:
        return self.source.numel()


def intersect(a: Chunk, b: Chunk) -> Chunk | None:
    """The common box of ``a`` and ``b``, or None when they share no element.

    >>> intersect(Chunk((0, 0), (4, 4)), Chunk((2, 3), (4, 4)))
    Chunk(offsets=(2, 3), sizes=(2, 1))
    >>> intersect(Chunk((0,), (2,)), Chunk((2,), (2,))) is None
    True
    """
    for c in (a, b):
        if not isinstance(c, Chunk):
            raise CheckpointError(f"intersect needs two Chunks, got {c!r}", value=c)
    if not len(a.offsets) == len(a.sizes) == len(b.offsets) == len(b.sizes):
        raise CheckpointError(
            f"cannot intersect {a!r} and {b!r}: boxes of one tensor have one length of "
            "offsets and sizes (its number of dims)",
            value=(a, b),
        )
    offsets, sizes = [], []
    for ao, az, bo, bz in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True):
        lo, hi = max(ao, bo), min(ao + az, bo + bz)
        if lo >= hi:
            return None
        offsets.append(lo)
        sizes.append(hi - lo)
    return Chunk(tuple(offsets), tuple(sizes))


def _rank(spec: object, rank: object) -> int:
    """``rank`` as an int (numpy ints too) after checking ``spec`` is a Spec."""
    if not isinstance(spec, Spec):
        raise CheckpointError(f"expected a meshplan.placement.Spec, got {spec!r}", value=spec)
    try:
        out = None if isinstance(rank, bool) else operator.index(rank)  # type: ignore[arg-type]
    except TypeError:
        out = None
    if out is None:
        raise CheckpointError(
            f"rank {rank!r} must be an int: a global rank of the mesh {spec.mesh}", value=rank
        )
    return out


def local_boxes(spec: Spec, rank: int) -> tuple[Box, ...]:
    """Every box rank ``rank`` holds under ``spec``, with its local offsets (storage order).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import StridedShard
    >>> spec = Spec(Mesh.create(2), (StridedShard(0, 2),), (8, 3))
    >>> [(b.chunk.offsets, b.local_offsets) for b in local_boxes(spec, 1)]
    [((2, 0), (0, 0)), ((6, 0), (2, 0))]
    """
    rank = _rank(spec, rank)
    if not spec.mesh.contains(rank):
        raise CheckpointError(
            f"rank {rank} is not in the mesh {spec.mesh} of {spec}; pick a rank of its rank map",
            value=rank,
        )
    return _local_boxes(spec, rank)


@functools.lru_cache(maxsize=4096)
def _local_boxes(spec: Spec, rank: int) -> tuple[Box, ...]:
    per_dim = local_intervals(spec, rank)
    if spec.ndim and any(not ivs for ivs in per_dim):
        return ()
    starts = [list(itertools.accumulate([0] + [b - a for a, b in ivs])) for ivs in per_dim]
    out = []
    for pick in itertools.product(*[range(len(ivs)) for ivs in per_dim]):
        ivs = [per_dim[d][k] for d, k in enumerate(pick)]
        chunk = Chunk(tuple(a for a, _ in ivs), tuple(b - a for a, b in ivs))
        out.append(Box(chunk, tuple(starts[d][k] for d, k in enumerate(pick))))
    return tuple(out)


def writes(spec: Spec, rank: int) -> bool:
    """Whether rank ``rank`` is the one that saves its boxes (replicas are saved once).

    The writer among replicas is the rank at coordinate 0 on every mesh dim that does
    not shard the tensor, in the first instance of a sliced mesh. ``Partial`` specs
    have no writer: their value is not any one rank's local tensor.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> spec = Spec(Mesh.create((2, 2)), (Replicate(), Shard(0)), (4,))
    >>> [writes(spec, r) for r in range(4)]
    [True, True, False, False]
    """
    rank = _rank(spec, rank)
    if spec.is_partial:
        raise CheckpointError(
            f"{spec} holds partial values; redistribute it to Replicate/Shard before saving",
            value=spec,
        )
    mesh = spec.mesh
    coord = mesh.coordinate(rank)
    if coord is None:
        return False
    if any(c and isinstance(p, Replicate) for c, p in zip(coord, spec.placements, strict=True)):
        return False
    if mesh.size() != mesh.world_size:  # a sliced mesh: only its first instance writes
        return rank in first_instance(mesh)
    return True


def check_target(meta: TensorMeta, spec: Spec, where: str) -> None:
    """Raise unless ``spec`` describes the saved tensor (same global shape and dtype)."""
    if not isinstance(meta, TensorMeta):
        raise CheckpointError(f"expected a saved tensor's TensorMeta, got {meta!r}", value=meta)
    if not isinstance(spec, Spec):
        raise CheckpointError(f"target for {meta.key!r} must be a Spec, got {spec!r}", value=spec)
    if spec.shape != meta.shape:
        raise CheckpointError(
            f"tensor {meta.key!r} in {where} has global shape {meta.shape!r}, but the target "
            f"{spec} has shape {spec.shape!r}; load into a spec of the saved shape",
            value=spec,
        )
    if spec.dtype != meta.dtype:
        raise CheckpointError(
            f"tensor {meta.key!r} in {where} has dtype {meta.dtype}, but the target {spec} "
            f"has dtype {spec.dtype}; load into a spec of the saved dtype "
            f"(attrs.evolve(spec, dtype={meta.dtype!r})) and convert the loaded local tensor "
            f"afterwards (.local.to(torch.{spec.dtype}))",
            value=spec,
        )


def plan_reads(meta: TensorMeta, spec: Spec, rank: int) -> tuple[Read, ...]:
    """The copies that fill rank ``rank``'s local tensor under ``spec`` from saved chunks.

    Every element of the local tensor is written by exactly one read when the saved
    chunks tile the tensor (see :func:`~meshplan.checkpoint.check_tiles`).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> from meshplan.checkpoint import ChunkRecord
    >>> saved = TensorMeta("w", (4,), "float32", [
    ...     ChunkRecord((0,), (2,), "a", "w#0", ""), ChunkRecord((2,), (2,), "b", "w#0", "")])
    >>> plan_reads(saved, Spec(Mesh.create(4), (Shard(0),), (4,)), 1)
    (Read(chunk=0, source=Chunk(offsets=(1,), sizes=(1,)), target=Chunk(offsets=(0,), sizes=(1,))),)
    """
    if not isinstance(meta, TensorMeta):
        raise CheckpointError(
            f"plan_reads needs the saved tensor's TensorMeta (e.g. read_metadata(path)[key]), "
            f"got {meta!r}",
            value=meta,
        )
    _rank(spec, rank)
    if spec.shape != meta.shape:
        raise CheckpointError(
            f"tensor {meta.key!r} was saved with global shape {meta.shape!r}, but the target "
            f"{spec} has shape {spec.shape!r}; read into a spec of the saved shape",
            value=spec,
        )
    out = []
    for box in local_boxes(spec, rank):
        for i, rec in enumerate(meta.chunks):
            common = intersect(box.chunk, rec.box)
            if common is None:
                continue
            source = tuple(c - o for c, o in zip(common.offsets, rec.offsets, strict=True))
            target = tuple(
                lo + c - o
                for lo, c, o in zip(
                    box.local_offsets, common.offsets, box.chunk.offsets, strict=True
                )
            )
            out.append(Read(i, Chunk(source, common.sizes), Chunk(target, common.sizes)))
    return tuple(out)


def verifiers(meta: TensorMeta, spec: Spec, ranks: tuple[int, ...]) -> tuple[int | None, ...]:
    """Per saved chunk, the one rank of ``ranks`` (the ranks loading ``spec``) that checks
    its checksum when a load shares the checking out; None for a chunk no rank reads.

    Each chunk goes to one of the ranks that read it anyway, the one with the fewest
    bytes to check so far (ties: the lowest rank), so every byte read is checked once,
    by a rank that reads it, and the ranks share the work. Every rank computes the same.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> from meshplan.checkpoint import ChunkRecord
    >>> saved = TensorMeta("w", (4, 4), "float32", [
    ...     ChunkRecord((r, 0), (1, 4), "f", f"w#{r}", "") for r in range(4)])
    >>> verifiers(saved, Spec(Mesh.create(4), (Shard(1),), (4, 4)), (0, 1, 2, 3))
    (0, 1, 2, 3)
    >>> verifiers(saved, Spec(Mesh.create(4), (Shard(0),), (4, 4)), (0, 1, 2, 3))
    (0, 1, 2, 3)
    """
    readers: list[set[int]] = [set() for _ in meta.chunks]
    chunks = [(rec.offsets, rec.sizes) for rec in meta.chunks]
    for r in ranks:
        for box in local_boxes(spec, r):
            lo, size = box.chunk.offsets, box.chunk.sizes
            for i, (offsets, sizes) in enumerate(chunks):
                if _overlap(lo, size, offsets, sizes):
                    readers[i].add(r)
    bytes_of = dict.fromkeys(ranks, 0)
    out: list[int | None] = []
    for rec, rs in zip(meta.chunks, readers, strict=True):
        if not rs:
            out.append(None)
            continue
        pick = min(rs, key=lambda r: (bytes_of[r], r))
        bytes_of[pick] += rec.numel()
        out.append(pick)
    return tuple(out)


def _overlap(a_lo, a_size, b_lo, b_size) -> bool:
    """Whether two boxes of one tensor share an element (:func:`intersect`, unchecked)."""
    for ao, az, bo, bz in zip(a_lo, a_size, b_lo, b_size):  # noqa: B905 - equal lengths
        if max(ao, bo) >= min(ao + az, bo + bz):
            return False
    return True

"""Local sizes: the largest local tensor a spec gives any rank, padded as collectives pad.

Shards of uneven length differ by rank; a collective pads every rank's buffer to the
longest, so prices and memory bounds read the largest local length per tensor dim,
computed from the mesh's shape in time independent of the number of ranks.
"""

from __future__ import annotations

import functools

from meshplan.placement import Spec, StridedShard, dtype_itemsize
from meshplan.placement._local import chunk_lengths

__all__ = ["chain_extent", "padded_local_bytes"]


@functools.lru_cache(maxsize=65536)
def chain_extent(length: int, kinds: tuple[tuple[int, int], ...]) -> int:
    """The largest local length of a tensor dim of ``length`` sharded by a chain of mesh dims.

    ``kinds`` lists ``(mesh_dim_size, split_factor)`` in shard order (1 for ``Shard``).

    >>> chain_extent(5, ((2, 1), (2, 1))), chain_extent(8, ((2, 2),)), chain_extent(3, ())
    (2, 4, 3)
    """
    lengths = {length}
    for n, sf in kinds:
        nxt: set[int] = set()
        for L in lengths:
            if sf == 1:
                nxt.update(_chunk_lengths(L, n))
            else:
                pieces = chunk_lengths(L, sf)  # (length, count): O(1) in sf
                # a rank's length is constant between the coordinates where some piece's
                # chunks turn short or empty: those (and 0) give every value, O(1) in n
                for c in _chunk_breaks(pieces, n):
                    nxt.add(sum(k * _chunk_length(p, n, c) for p, k in pieces))
        lengths = nxt
    return max(lengths)


def _chunk_length(length: int, parts: int, index: int) -> int:
    size = -(-length // parts)
    start = min(size * index, length)
    return min(start + size, length) - start


def _chunk_lengths(length: int, parts: int) -> tuple[int, ...]:
    """The distinct chunk lengths of ``length`` in ``parts``, in O(1)."""
    return tuple(n for n, _ in chunk_lengths(length, parts))


def _chunk_breaks(pieces, parts: int) -> set[int]:
    """Coordinates (below ``parts``) where the chunk length of some piece changes, and 0."""
    out = {0}
    for p, _ in pieces:
        size = -(-p // parts)
        full = p // size if size else 0
        out.update(c for c in (full, full + 1) if c < parts)
    return out


def _kinds(spec: Spec, tensor_dim: int) -> tuple[tuple[int, int], ...]:
    sizes = spec.mesh.shape
    out = []
    for m in spec.order(tensor_dim):
        p = spec.placements[m]
        out.append((sizes[m], p.split_factor if isinstance(p, StridedShard) else 1))
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def padded_local_bytes(spec: Spec) -> int:
    """Bytes of the largest local tensor of ``spec`` (per dim the longest shard).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> padded_local_bytes(Spec(Mesh.create(4), [Shard(0)], (5, 3)))  # 2 rows x 3 x 4 B
    24
    """
    n = dtype_itemsize(spec.dtype)
    for d, length in enumerate(spec.shape):
        n *= chain_extent(length, _kinds(spec, d))
    return n

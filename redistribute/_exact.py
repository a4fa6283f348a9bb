"""Exact validity checks of single-dim steps on index intervals (no torch).

Used where the structural rules do not decide: tiny tensor dims (some order of mesh
dims leaves a piece empty) and StridedShards.
"""

from __future__ import annotations

import functools
import itertools

from meshplan.placement import Shard, StridedShard, shard_intervals


@functools.lru_cache(maxsize=4096)
def _may_empty(length: int, sizes: tuple[int, ...]) -> bool:
    """Whether some order of some of the mesh dims of ``sizes`` leaves a piece empty."""
    return any(_smallest_piece(length, order) == 0 for order in set(itertools.permutations(sizes)))


@functools.lru_cache(maxsize=65536)
def _smallest_piece(length: int, sizes: tuple[int, ...]) -> int:
    """The shortest piece any rank holds when plain shards of ``sizes`` chunk ``length``."""
    lengths = {length}
    for n in sizes:
        nxt = set()
        for L in lengths:
            size = -(-L // n) if n else 0
            for c in range(n):
                start = min(size * c, L)
                nxt.add(min(start + size, L) - start)
        lengths = nxt
    return min(lengths)


@functools.lru_cache(maxsize=64)
def _placement(sf: int):
    return Shard(0) if sf == 1 else StridedShard(0, sf)


@functools.lru_cache(maxsize=1 << 16)
def _piece(length: int, chain: tuple, coords: tuple) -> frozenset:
    """The indices of a dim of ``length`` held at ``coords`` (one per link of ``chain``)."""
    ivs = ((0, length),) if length else ()
    for (_, n, sf), c in zip(chain, coords, strict=True):
        ivs = shard_intervals(ivs, _placement(sf), n, c)
    return frozenset(i for a, b in ivs for i in range(a, b))


@functools.lru_cache(maxsize=1 << 18)
def exact_covers(length: int, src: tuple, dst: tuple, m: int) -> bool:
    """Exact check along one tensor dim of a step on mesh dim ``m``: every rank's piece under
    ``dst`` lies in what the ranks it reads from hold under ``src`` (those differing only
    in ``m`` when ``m`` shards in ``src``, else the rank itself).

    ``src``/``dst``: the orders as ``((mesh_dim, size, split_factor), ...)``.
    """
    dims = sorted({x for x, _, _ in src} | {x for x, _, _ in dst})
    size = {x: n for x, n, _ in src + dst}
    others = [x for x in dims if x != m]

    def piece(chain, coord):
        return _piece(length, chain, tuple(coord[x] for x, _, _ in chain))

    in_src = any(x == m for x, _, _ in src)
    in_dst = any(x == m for x, _, _ in dst)
    for combo in itertools.product(*(range(size[x]) for x in others)):
        coord = dict(zip(others, combo, strict=True))
        have: set[int] = set()
        for c in range(size[m] if in_src else 1):
            coord[m] = c
            have |= piece(src, coord)
        for c in range(size[m] if in_dst else 1):
            coord[m] = c
            if not piece(dst, coord) <= have:
                return False
    return True

"""Exact validity checks of single-dim steps on index intervals (no torch).

Used where the structural rules do not decide: tiny tensor dims (some order of mesh
dims leaves a piece empty) and StridedShards.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math

from meshplan.placement import Shard, StridedShard, shard_intervals
from meshplan.placement._local import chunk_lengths


@functools.lru_cache(maxsize=4096)
def _may_empty(length: int, sizes: tuple[int, ...]) -> bool:
    """Whether some order of some of the mesh dims of ``sizes`` leaves a piece empty."""
    return any(_smallest_piece(length, order) == 0 for order in set(itertools.permutations(sizes)))


@functools.lru_cache(maxsize=1024)
def tiny_dims(shape: tuple, sizes: tuple, shards: tuple) -> tuple[bool, ...]:
    """Per tensor dim of ``shape``, whether two ways of sharding it (``shards``: the shard
    codes ``(tensor dim, split factor)`` of a placement universe, on a mesh of ``sizes``)
    may hold the same pieces, so that a mesh dim may leave or join the middle of its order
    and another shard placement may say it: a tensor without elements (every piece is
    empty), a dim with StridedShards (an SS may encode an order), or a dim some order of
    the mesh dims leaves a piece of empty.

    >>> tiny_dims((1, 8), (2, 2), ((0, 1), (1, 1))), tiny_dims((8,), (2, 2), ((0, 1), (0, 2)))
    ((True, False), (True,))
    """
    active = tuple(sorted(n for n in sizes if n > 1))
    empty = 0 in shape
    return tuple(
        empty or any(c[0] == d and c[1] > 1 for c in shards) or _may_empty(length, active)
        for d, length in enumerate(shape)
    )


@functools.lru_cache(maxsize=65536)
def _smallest_piece(length: int, sizes: tuple[int, ...]) -> int:
    """The shortest piece any rank holds when plain shards of ``sizes`` chunk ``length``."""
    lengths = {length}
    for n in sizes:
        nxt = set()
        for L in lengths:
            nxt.update(k for k, _ in chunk_lengths(L, n))  # O(1) in n
        lengths = nxt
    return min(lengths)


@functools.lru_cache(maxsize=64)
def _placement(sf: int):
    return Shard(0) if sf == 1 else StridedShard(0, sf)


@functools.lru_cache(maxsize=1 << 16)
def piece(length: int, links: tuple, coords: tuple) -> tuple:
    """The indices of a dim of ``length`` held at ``coords`` (one per link of ``links``,
    each ``(size, split_factor)``), as sorted, disjoint, non-adjacent intervals; built on
    the piece of the links before the last (memoized too: checks share prefixes)."""
    if not links:
        return ((0, length),) if length else ()
    n, sf = links[-1]
    ivs = piece(length, links[:-1], coords[:-1])
    return _merged(shard_intervals(ivs, _placement(sf), n, coords[-1]))


@functools.lru_cache(maxsize=1024)
def piece_classes(length: int, dims: tuple, sizes: tuple, codes: tuple) -> tuple[dict, dict]:
    """Every way the mesh dims ``dims`` (sorted; ``sizes``: the mesh's) may shard a tensor
    dim of ``length`` (a shard code of ``codes`` each, ``(tensor dim, split factor)``, in
    any order), grouped by the pieces the ranks hold: ``((placements, order) -> pieces,
    pieces -> {placements: [orders]})``, with ``placements`` a code per dim of ``dims``
    and the pieces each rank's index intervals (by coordinates on ``dims``). Two ways of
    one group give every rank the very same piece.

    >>> sig_of, members = piece_classes(1, (0, 1), (2, 2), ((0, 1),))
    >>> members[sig_of[((0, 1), (0, 1)), (0, 1)]]  # one row: only rank (0, 0) holds it
    {((0, 1), (0, 1)): [(0, 1), (1, 0)]}
    """
    sig_of: dict = {}
    members: dict = {}
    for own in itertools.product(codes, repeat=len(dims)):
        code_of = dict(zip(dims, own, strict=True))
        for order in itertools.permutations(dims):
            chain_links = tuple([(sizes[x], code_of[x][1]) for x in order])
            where = [order.index(x) for x in dims]
            sig = _held_pieces(length, chain_links, where)
            sig_of[own, order] = sig
            members.setdefault(sig, {}).setdefault(own, []).append(order)
    return sig_of, members


def _held_pieces(length: int, links: tuple, where: list) -> tuple:
    """The non-empty pieces of a dim of ``length`` chunked along ``links``, as sorted
    ``(coordinates, piece)`` pairs with coordinates in the order ``where`` picks from the
    links' (every other coordinate holds nothing). Chunks never grow with the
    coordinate, so past the first empty one along a link all are empty: the walk visits
    at most about ``length`` coordinates per link, however large the mesh dims are."""
    out = []
    coords: list = []

    def walk(k: int) -> None:
        if k == len(links):
            c = tuple(coords)
            out.append((tuple(c[i] for i in where), piece(length, links, c)))
            return
        for c in range(links[k][0]):
            coords.append(c)
            empty = not piece(length, links[: k + 1], tuple(coords))
            if not empty:
                walk(k + 1)
            coords.pop()
            if empty:
                break

    walk(0)
    return tuple(sorted(out))


def _merged(ivs) -> tuple:
    """The union of half-open intervals, as sorted, disjoint, non-adjacent intervals."""
    out: list = []
    for a, b in sorted(ivs):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def _inside(piece: tuple, have: tuple, starts: list) -> bool:
    """Whether every interval of ``piece`` lies in the union ``have`` (``_merged``; its
    intervals' starts ``starts``)."""
    for a, b in piece:
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or have[k][1] < b:
            return False
    return True


@functools.lru_cache(maxsize=1 << 18)
def exact_covers(length: int, src: tuple, dst: tuple, m) -> bool:
    """Exact check along one tensor dim of a step (see :func:`_covers`), on the check's
    canonical form: mesh dims renamed in order of appearance (the answer depends on their
    sizes, split factors and order positions, not their names), and a length every link
    divides evenly taken down to the least such length. An empty dim is covered."""
    if not length:
        return True
    # when every link of both orders divides evenly, each piece at ``k * base`` is the
    # piece at ``base`` scaled by ``k``, and so is every union: the answer is the same
    base = even_base(src, dst)
    if length % base == 0:
        length = base
        if not base & (base - 1):
            return _bits_cover(base.bit_length() - 1, src, dst, (m,) if type(m) is int else m)
    names: dict = {}
    for x, _, _ in src + dst:
        if x not in names:
            names[x] = len(names)
    group = (m,) if type(m) is int else m
    return _covers(
        length,
        tuple((names[x], n, sf) for x, n, sf in src),
        tuple((names[x], n, sf) for x, n, sf in dst),
        tuple(sorted(names[x] for x in group if x in names)),
    )


def links(sizes, codes, chain) -> tuple:
    """A shard order as the exact check reads it: ``(mesh dim, size, split factor)`` per
    mesh dim of ``chain`` (``codes``: each mesh dim's shard code ``(tensor dim, split
    factor)``, ``sizes``: the mesh's)."""
    return tuple([(x, sizes[x], codes[x][1]) for x in chain])


def even_base(src: tuple, dst: tuple) -> int:
    """The least length every link of both orders ``((mesh dim, size, split factor),
    ...)`` divides evenly (the lengths that do are its multiples)."""
    return math.lcm(math.prod(n * sf for _, n, sf in src), math.prod(n * sf for _, n, sf in dst))


@functools.lru_cache(maxsize=1024)
def even_steps(sizes: tuple[int, ...], ndim: int, shards: tuple) -> tuple[int, ...]:
    """Per tensor dim, a length that every shard order of a placement universe (``shards``:
    its shard codes ``(tensor dim, split factor)``) chunks evenly, link by link, and so
    does every multiple of it (``_family``'s sizes): the product ``n`` of the active mesh
    dim sizes ``sizes`` times the least common multiple ``f`` of the dim's StridedShard
    split factors. A link of size ``k`` and split factor ``s`` after links of sizes
    ``k1..kj`` (distinct active mesh dims) chunks a piece of ``L / (k1 ... kj)`` into ``s``
    blocks of ``k`` runs: even when ``k1 ... kj * k * s`` divides ``L``, and it divides
    ``n * f``. Then each piece at ``c * L`` is the piece at ``L`` with every index scaled
    by ``c``, so every exact check answers alike at each multiple.

    >>> even_steps((2, 4), 2, ((0, 1), (1, 1))), even_steps((2, 1, 4), 2, ((0, 1), (1, 1), (0, 2)))
    ((8, 8), (16, 8))
    """
    n = math.prod(k for k in sizes if k > 1)
    return tuple(
        n * math.lcm(*[c[1] for c in shards if c[0] == d and c[1] > 1] or [1]) for d in range(ndim)
    )


def _bit_owners(bits: int, chain: tuple) -> dict:
    """Per mesh dim of ``chain`` (a shard order whose links are all powers of two and
    divide a length of ``2**bits`` evenly), the bits of a global index its coordinate is,
    most significant first (bit 0 is the index's most significant). A link of size
    ``2**a`` and split factor ``2**s`` reads the ``a`` bits after the first ``s`` of those
    no earlier link read: it splits each of ``2**s`` equal blocks of the current piece
    into ``2**a`` runs, and the rank keeps its run of each."""
    free = list(range(bits))
    owners = {}
    for x, n, sf in chain:
        a, s = n.bit_length() - 1, sf.bit_length() - 1
        owners[x] = tuple(free[s : s + a])
        del free[s : s + a]
    return owners


def _bits_cover(bits: int, src: tuple, dst: tuple, group: tuple) -> bool:
    """:func:`_covers` when every link of both orders is a power of two dividing the
    length ``2**bits`` evenly. A rank's piece is the indices whose bits owned by each
    link (:func:`_bit_owners`) spell that mesh dim's coordinate; what its group holds
    under ``src`` fixes only the bits of the mesh dims outside the group, to the rank's
    own coordinates. So every rank's piece under ``dst`` lies in it exactly when each such
    mesh dim owns the very same bits, in the same order, under ``dst`` (any other bits,
    or another order, let some coordinate disagree)."""
    before, after = _bit_owners(bits, src), _bit_owners(bits, dst)
    return all(x in group or n == 1 or after.get(x) == before[x] for x, n, _ in src)


@functools.lru_cache(maxsize=1 << 18)
def _covers(length: int, src: tuple, dst: tuple, group: tuple) -> bool:
    """Exact check along one tensor dim of a step on the mesh dims of ``group`` (one, or
    several: a merged step): every rank's piece under ``dst`` lies in
    what the ranks it reads from hold under ``src`` (those differing only in the step's
    mesh dims that shard this tensor dim in ``src``; a rank's piece does not depend on the
    others).

    ``src``/``dst``: the orders as ``((mesh_dim, size, split_factor), ...)``.

    A step over several mesh dims reads from its whole group, the product of their
    coordinates, and a piece is a product over tensor dims, each depending on its own
    order's mesh dims only: so what the group holds is a product too, and checking each
    tensor dim on its own is exact.
    """
    dims = sorted({x for x, _, _ in src} | {x for x, _, _ in dst})
    size = {x: n for x, n, _ in src + dst}
    others = [x for x in dims if x not in group]
    read = [x for x in group if any(y == x for y, _, _ in src)]
    written = [x for x in group if any(y == x for y, _, _ in dst)]

    src_links = tuple((n, sf) for _, n, sf in src)
    dst_links = tuple((n, sf) for _, n, sf in dst)

    def at(chain, links, coord):
        return piece(length, links, tuple([coord[x] for x, _, _ in chain]))

    for combo in itertools.product(*(range(size[x]) for x in others)):
        coord = dict(zip(others, combo, strict=True))
        held: list = []
        for cs in itertools.product(*(range(size[x]) for x in read)):
            coord.update(zip(read, cs, strict=True))
            held.extend(at(src, src_links, coord))
        have = _merged(held)
        starts = [a for a, _ in have]
        for cs in itertools.product(*(range(size[x]) for x in written)):
            coord.update(zip(written, cs, strict=True))
            if not _inside(at(dst, dst_links, coord), have, starts):
                return False
    return True

"""What each rank holds: intervals, chunks, local shapes and offsets (pure, no torch)."""

from __future__ import annotations

import collections
import itertools
import math

import pytest
from _placement_model import expand, held_indices
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Shard,
    Spec,
    StridedShard,
    global_offset,
    local_chunks,
    local_intervals,
    local_numel,
    local_shape,
    shard_intervals,
)
from meshplan.testing import meshes, specs

SPECS = specs(mesh=meshes(max_dims=3, max_side=4, max_rank_offset=3), max_side=13)


def _ranks(spec):
    return [spec.mesh.rank_at(c) for c in itertools.product(*map(range, spec.mesh.shape))]


@given(SPECS)
def test_local_intervals_match_brute_force_chunking(spec):
    for rank in _ranks(spec):
        coord = spec.mesh.coordinate(rank)
        want = held_indices(spec.placements, spec.mesh.shape, spec.shape, coord, spec.shard_order)
        assert [expand(ivs) for ivs in local_intervals(spec, rank)] == list(want)


@given(SPECS)
def test_local_chunks_of_all_ranks_tile_the_tensor_once_per_replica(spec):
    replicas = math.prod(
        size
        for size, p in zip(spec.mesh.shape, spec.placements, strict=True)
        if not isinstance(p, Shard | StridedShard)
    )
    held: collections.Counter[tuple[int, ...]] = collections.Counter()
    for rank in _ranks(spec):
        chunks = local_chunks(spec, rank)
        assert sum(c.numel() for c in chunks) == local_numel(spec, rank)
        for c in chunks:
            bounds = list(zip(c.offsets, c.sizes, spec.shape, strict=True))
            assert all(o >= 0 and o + s <= n for o, s, n in bounds)
            assert c.numel() > 0
            held.update(itertools.product(*(range(o, o + s) for o, s, _ in bounds)))
    everything = set(itertools.product(*map(range, spec.shape)))
    assert set(held) == everything
    assert set(held.values()) <= {replicas}


@given(SPECS)
def test_local_chunks_are_in_local_storage_order(spec):
    # the local tensor is the row-major cartesian product of per-dim intervals
    for rank in _ranks(spec):
        per_dim = local_intervals(spec, rank)
        chunks = local_chunks(spec, rank)
        if all(per_dim):
            boxes = list(itertools.product(*per_dim))
            assert [c.offsets for c in chunks] == [tuple(a for a, _ in b) for b in boxes]
        else:
            assert chunks == ()


@given(SPECS)
def test_local_shape_and_offset_come_from_the_intervals(spec):
    for rank in _ranks(spec):
        per_dim = local_intervals(spec, rank)
        assert local_shape(spec, rank) == tuple(len(expand(ivs)) for ivs in per_dim)
        offsets = global_offset(spec, rank)
        for d, ivs in enumerate(per_dim):
            assert offsets[d] == (ivs[0][0] if ivs else spec.shape[d])


def test_uneven_shard_follows_torch_chunk_and_empty_shards_sit_at_the_end():
    spec = Spec(Mesh.create(4), (Shard(0),), (5, 2))
    assert [local_shape(spec, r) for r in range(4)] == [(2, 2), (2, 2), (1, 2), (0, 2)]
    assert [global_offset(spec, r) for r in range(4)] == [(0, 0), (2, 0), (4, 0), (5, 0)]
    assert local_chunks(spec, 3) == ()


def test_shard_order_chunks_in_order():
    mesh = Mesh.create((2, 3), ("dp", "tp"))
    spec = Spec(mesh, (Shard(0), Shard(0)), (12,), shard_order={0: ("tp", "dp")})
    # tp splits 12 into thirds, dp halves each third
    assert [local_intervals(spec, r)[0] for r in range(6)] == [
        ((0, 2),), ((4, 6),), ((8, 10),),
        ((2, 4),), ((6, 8),), ((10, 12),),
    ]  # fmt: skip


def test_uneven_shard_order_gives_several_pieces_only_where_strided():
    mesh = Mesh.create((2, 2))
    spec = Spec(mesh, (StridedShard(0, 3), Shard(0)), (7,))
    # split 7 into 3,3,1; each over d0 (2,1 / 2,1 / 1,0); d1 chunks the rank's 5 or 2
    assert local_intervals(spec, 0) == (((0, 2), (3, 4)),)
    assert local_intervals(spec, 1) == (((4, 5), (6, 7)),)
    assert local_intervals(spec, 2) == (((2, 3),),)
    assert local_intervals(spec, 3) == (((5, 6),),)


def test_shard_intervals_on_a_piece():
    assert shard_intervals(((0, 3), (6, 9)), Shard(0), 2, 1) == ((6, 9),)
    assert shard_intervals(((0, 3), (6, 9)), Shard(0), 4, 1) == ((2, 3), (6, 7))
    assert shard_intervals((), StridedShard(0, 2), 2, 0) == ()


def test_rank_outside_the_mesh_raises():
    spec = Spec(Mesh.create(2, ranks=[4, 5]), (Shard(0),), (4,))
    with pytest.raises(PlacementError, match="rank 0 is not in mesh"):
        local_shape(spec, 0)


def test_a_huge_split_factor_costs_what_the_dim_holds():
    # pieces past the dim's length are empty and are not walked one by one
    from meshplan.placement import chunk_bounds, local_shape
    from meshplan.placement._local import chunk_lengths, nonempty_chunks

    spec = Spec(Mesh.create(2), (StridedShard(0, 10**12),), (8, 3))
    assert [local_shape(spec, r) for r in range(2)] == [(8, 3), (0, 3)]
    assert nonempty_chunks(8, 10**12) == 8
    assert chunk_lengths(8, 10**12) == ((1, 8), (0, 10**12 - 8))
    for length in range(12):
        for parts in range(1, 7):
            want = [b - a for a, b in (chunk_bounds(length, parts, j) for j in range(parts))]
            got = [n for n, k in chunk_lengths(length, parts) for _ in range(k)]
            assert got == want and nonempty_chunks(length, parts) == sum(1 for n in want if n)


@given(
    start=st.integers(0, 5),
    length=st.integers(0, 60),
    split_factor=st.integers(1, 80),
    parts=st.integers(1, 6),
    data=st.data(),
)
def test_a_strided_shard_of_one_run_takes_what_chunking_each_piece_gives(
    start, length, split_factor, parts, data
):
    # the one-run fast path against its definition: split into split_factor pieces
    # (torch.chunk), chunk each piece over the parts, concatenate this index's chunks
    index = data.draw(st.integers(0, parts - 1), label="index")
    want: list[int] = []
    for piece in _torch_chunks(list(range(start, start + length)), split_factor):
        chunks = _torch_chunks(piece, parts)
        want += chunks[index] if index < len(chunks) else []
    got = shard_intervals(((start, start + length),), StridedShard(0, split_factor), parts, index)
    assert [i for a, b in got for i in range(a, b)] == want
    assert all(b < c for (_, b), (c, _) in zip(got, got[1:], strict=False))  # runs merged


def _torch_chunks(items: list[int], parts: int) -> list[list[int]]:
    size = -(-len(items) // parts) if items else 0
    return [items[i : i + size] for i in range(0, len(items), size)] if size else []


def test_a_strided_shard_of_a_huge_split_factor_takes_constant_time():
    # regression: the pieces were walked one by one (SS(0, 10**7) of 10**7 rows: 10 s)
    spec = Spec(Mesh.create(2), (StridedShard(0, 2**62),), (10**12,))
    assert local_shape(spec, 0) == (10**12,)
    assert local_shape(spec, 1) == (0,)

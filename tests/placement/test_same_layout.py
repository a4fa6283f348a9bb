"""``same_layout``: two specs that give every rank the same local tensor, whatever way
they say it (a StridedShard against a shard order, above all: torch 2.13 writes a shard
order as StridedShards), against a brute-force oracle over every rank."""

from __future__ import annotations

import math

from hypothesis import event, given
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    local_intervals,
    same_layout,
)
from meshplan.testing import shapes, specs


def _joined(ivs):
    out = []
    for lo, hi in ivs:
        if lo < hi:
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return tuple(out)


def oracle(a: Spec, b: Spec) -> bool:
    """Every rank's indices, in local order, and the Partial mesh dims agree."""
    if (a.mesh, a.shape, a.dtype) != (b.mesh, b.shape, b.dtype):
        return False
    partial = [
        (x, y)
        for x, y in zip(a.placements, b.placements, strict=True)
        if isinstance(x, Partial) or isinstance(y, Partial)
    ]
    if any(x != y for x, y in partial):
        return False
    return all(
        tuple(map(_joined, local_intervals(a, r))) == tuple(map(_joined, local_intervals(b, r)))
        for r in a.mesh.ranks
    )


def strided_form(spec: Spec) -> Spec:
    """``spec``'s shard orders written the way torch 2.13 writes them: default order, and
    on each mesh dim a split factor of the sizes of the dims that precede it in its
    tensor dim's order but come after it on the mesh (read literally, the same pieces
    when every chunk is even)."""
    sizes = spec.mesh.shape
    placements = list(spec.placements)
    for d in range(spec.ndim):
        order = spec.order(d)
        for i, m in enumerate(order):
            sf = math.prod(sizes[x] for x in order[:i] if x > m)
            placements[m] = StridedShard(d, sf) if sf > 1 else Shard(d)
    return Spec(spec.mesh, placements, spec.shape, spec.dtype)


@st.composite
def ordered_specs(draw):
    """Every mesh dim shards tensor dim 0 (length 1-20: many uneven), in a drawn order;
    now and then a mesh dim replicates, or shards dim 1 instead."""
    sizes = tuple(draw(st.lists(st.sampled_from([2, 3, 4]), min_size=2, max_size=3)))
    mesh = Mesh.create(sizes)
    placements = [draw(st.sampled_from([Shard(0)] * 4 + [Shard(1), Replicate()])) for _ in sizes]
    shape = (draw(st.integers(1, 20), label="length"), draw(st.integers(1, 5)))
    orders = {}
    for d in (0, 1):
        dims = [m for m, p in enumerate(placements) if p == Shard(d)]
        if dims:
            orders[d] = tuple(draw(st.permutations(dims), label=f"order of {d}"))
    return Spec(mesh, placements, shape, shard_order=orders)


@given(spec=ordered_specs())
def test_a_shard_order_and_its_strided_form_hold_the_same_layout_exactly_when_chunks_agree(spec):
    other = strided_form(spec)
    want = oracle(spec, other)
    event("same layout" if want else "differs (uneven chunks)")
    assert same_layout(spec, other) == want == same_layout(other, spec)
    even = all(
        n % math.prod(spec.mesh.shape[m] for m in spec.order(d)) == 0
        for d, n in enumerate(spec.shape)
    )
    if even:
        assert want, "an even shape must hold the same pieces in both forms"


@given(a=specs(max_dims=2, max_side=6), data=st.data())
def test_same_layout_agrees_with_every_ranks_pieces(a, data):
    # mostly pairs that differ; empty and size-1 sides make some unlike placements alike
    b = data.draw(specs(mesh=a.mesh, shape=a.shape, dtypes=(a.dtype,)), label="b")
    want = oracle(a, b)
    event(("same" if want else "differs") + (", unequal specs" if a != b else ""))
    assert same_layout(a, b) == want
    assert same_layout(a, a)


@given(shape=shapes(min_dims=1, max_dims=2, max_side=9))
def test_partial_mesh_dims_must_match(shape):
    mesh = Mesh.create((2, 2))
    a = Spec(mesh, (Partial("sum"), Replicate()), shape)
    assert not same_layout(a, Spec(mesh, (Partial("avg"), Replicate()), shape))
    assert not same_layout(a, Spec(mesh, (Replicate(), Replicate()), shape))
    assert not same_layout(a, Spec(mesh, (Replicate(), Partial("sum")), shape))


def test_fsdp_tp_strided_weight_is_the_ordered_weight():
    # FSDP2 x TP: torch's (StridedShard(0, tp), Shard(0)) is Shard(0) twice, tp first
    mesh = Mesh.create((4, 2), ("dp", "tp"))
    ordered = Spec(mesh, (Shard(0), Shard(0)), (4096, 1024), shard_order={0: ("tp", "dp")})
    assert same_layout(Spec(mesh, (StridedShard(0, 2), Shard(0)), (4096, 1024)), ordered)
    assert not same_layout(Spec(mesh, (Shard(0), Shard(0)), (4096, 1024)), ordered)
    # 9 rows: dp's chunks of tp's halves (3, 2) differ from halves of dp's chunks
    uneven = Spec(mesh, (Shard(0), Shard(0)), (9, 4), shard_order={0: (1, 0)})
    assert not same_layout(Spec(mesh, (StridedShard(0, 2), Shard(0)), (9, 4)), uneven)


def test_other_meshes_shapes_or_dtypes_differ():
    mesh = Mesh.create((2, 2))
    a = Spec(mesh, (Shard(0), Replicate()), (4, 4))
    assert not same_layout(a, Spec(Mesh.create((4,)), (Shard(0),), (4, 4)))
    assert not same_layout(a, Spec(mesh, (Shard(0), Replicate()), (4, 2)))
    assert not same_layout(a, Spec(mesh, (Shard(0), Replicate()), (4, 4), "float64"))

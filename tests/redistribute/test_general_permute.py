"""General all_permutes: one step between specs whose ranks hold the same pieces, even when
they shard with other mesh dims (PyTorch PR #162294's AllPermute)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, StridedShard, local_intervals, shard
from meshplan.redistribute import Plan, Step, cost, plan, simulate
from meshplan.redistribute.exchange import permutation, transfers_to


def _delivers(p: Plan) -> bool:
    x = torch.arange(1, 1 + math.prod(p.src.shape), dtype=getattr(torch, p.src.dtype)).reshape(p.src.shape)
    out, want = simulate(p, shard(x, p.src)), shard(x, p.dst)
    return all(torch.equal(out[r], want[r]) for r in want)


def test_a_shard_moved_to_another_mesh_dim_is_one_all_permute():
    mesh = Mesh.create((2, 2), ("a", "b"))
    src = Spec(mesh, [Shard(0), Replicate()], (8, 8))
    dst = Spec(mesh, [Replicate(), Shard(0)], (8, 8))
    p = plan(src, dst)
    assert p.collectives == ("all_permute",) and len(p) == 1
    # it was an all_gather and a slice, 2 us dearer under the default model
    gather = plan(src, Spec(mesh, [Replicate(), Replicate()], (8, 8)))
    assert cost(p).total < cost(gather).total
    assert _delivers(p)


def test_pr_162294_example_3_is_one_all_permute():
    # [32{X,Y}512, 128] -> [32{Z}512, 128] on {X: 4, Y: 4, Z: 16}: 47.8 us as two
    # all_gathers and a slice, 28.6 us as one all_permute
    mesh = Mesh.create((4, 4, 16), ("X", "Y", "Z"))
    src = Spec(mesh, [Shard(0), Shard(0), Replicate()], (512, 128))
    dst = Spec(mesh, [Replicate(), Replicate(), Shard(0)], (512, 128))
    p = plan(src, dst)
    assert p.collectives == ("all_permute",) and p.steps[0].mesh_dims == (0, 1, 2)
    assert abs(cost(p).total - 28.6e-6) < 0.1e-6


def test_the_group_is_the_mesh_dims_after_the_common_prefix():
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c"))
    src = Spec(mesh, [Shard(0), Shard(0), Replicate()], (8, 4), shard_order={0: (0, 1)})
    dst = Spec(mesh, [Shard(0), Replicate(), Shard(0)], (8, 4), shard_order={0: (0, 2)})
    p = plan(src, dst)
    assert p.collectives == ("all_permute",) and p.steps[0].mesh_dims == (1, 2)
    assert _delivers(p)


_MESHES = [(2, 2), (2, 3), (2, 2, 2), (4, 2)]


@st.composite
def _pairs(draw):
    shape_mesh = draw(st.sampled_from(_MESHES))
    mesh = Mesh.create(shape_mesh, tuple("abc"[: len(shape_mesh)]))
    ndim = draw(st.integers(1, 2))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 5, 6, 8, 12])) for _ in range(ndim))

    def spec():
        kinds = [Replicate()] + [Shard(d) for d in range(ndim)] + [StridedShard(0, 2)]
        pl = [draw(st.sampled_from(kinds)) for _ in shape_mesh]
        order = {}
        for d in range(ndim):
            dims = [m for m, p in enumerate(pl) if getattr(p, "dim", None) == d]
            if len(dims) > 1:
                order[d] = tuple(draw(st.permutations(dims)))
        return Spec(mesh, pl, shape, "float64", order)

    return spec(), spec()


@settings(max_examples=200, deadline=None)
@given(_pairs())
def test_a_permutation_of_whole_pieces_delivers_every_target(pair):
    """Wherever each group's target pieces are its source pieces, one to one, the step
    sends each rank one member's whole local tensor (a bijection), and the simulator
    turns the source into the target."""
    src, dst = pair
    mesh = src.mesh
    dims = tuple(range(mesh.ndim))
    group = mesh.groups(dims)[0]
    have = sorted(local_intervals(src, r) for r in group)
    need = sorted(local_intervals(dst, r) for r in group)
    step = Step(dims, src, dst, "all_permute")
    mapping = permutation(step, group)
    assert (mapping is not None) == (have == need)
    if mapping is None:
        return
    assert sorted(mapping.values()) == sorted(group)
    for r in group:
        assert local_intervals(src, mapping[r]) == local_intervals(dst, r)
        assert len(transfers_to(step, r)) <= 1
    assert _delivers(Plan(src, dst, (step,)))


def test_a_rank_that_holds_its_target_keeps_it():
    mesh = Mesh.create((2, 2))
    src = Spec(mesh, [Shard(0), Replicate()], (4,))
    dst = Spec(mesh, [Replicate(), Shard(0)], (4,))
    mapping = permutation(Step((0, 1), src, dst, "all_permute"), (0, 1, 2, 3))
    assert [r for r, s in mapping.items() if r == s] == [0, 3]
    assert mapping[1] == 2 and mapping[2] == 1

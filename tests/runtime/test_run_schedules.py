"""The per-rank wire schedules of ``run``'s all_gather and all_to_all, checked without a world.

A step's schedule says where each rank packs its pieces in the flat send buffer, where
received pieces sit in the receive buffer (both in torch group-rank order, which a
permuted group may reorder), and when the received buffer is the target as it lands
(all_to_all) or becomes it by one view/permute/reshape (all_gather's grid). Here every
rank's buffers are built by hand from its local shard and exchanged as the collective
would, in a random torch group order; each rank must end with its shard of the step's
target spec.
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Spec, shard_one
from meshplan.redistribute import plan
from meshplan.redistribute.exchange import step_group
from meshplan.runtime._run import _from_grid
from meshplan.runtime._schedules import (
    _all_to_all_schedule,
    _gather_grid,
    _gather_schedule,
)
from meshplan.testing import meshes, specs

_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


@st.composite
def _steps(draw, kind: str):
    mesh = draw(meshes(max_dims=3, max_side=3, max_aliases=1))
    src = draw(specs(mesh=mesh, max_dims=2, max_side=9, allow_partial=False))
    dst = draw(specs(mesh=mesh, shape=src.shape, allow_partial=False))
    steps = [s for s in plan(src, dst).steps if s.collective == kind]
    assume(steps)
    step = draw(st.sampled_from(steps))
    assume(not step.src.is_partial and not step.dst.is_partial)
    return step


def _group_orders(draw, step) -> dict[tuple[int, ...], tuple[int, ...]]:
    """A random torch group order for every group of the step: members (coordinate
    order) -> torch group rank of each position."""
    out = {}
    for rank in step.src.mesh.ranks:
        members = step_group(step, rank).ranks
        if members not in out:
            out[members] = tuple(draw(st.permutations(range(len(members)))))
    return out


def _locals(step):
    x = torch.arange(max(1, _numel(step.src.shape)), dtype=torch.float32)
    x = x[: _numel(step.src.shape)].reshape(step.src.shape)
    return x, {r: shard_one(x, step.src, r) for r in step.src.mesh.ranks}


def _index(segs, which: int):
    """The elements segments cover, as an open-mesh index (``which``: 0 the sender's
    side, 1 the receiver's)."""
    idx = [
        torch.tensor(
            [i for seg in sg for i in range(seg[which], seg[which] + seg[2])], dtype=torch.long
        )
        for sg in segs
    ]
    return torch.meshgrid(*idx, indexing="ij") if idx else ()


def _row_major(sched) -> bool:
    """Whether the pieces, by position, sit at the target's block offsets in row-major
    order over the dims the target is split along (e.g. a plain dim-0 concatenation)."""
    block = sched.shapes[0]
    starts = [tuple(sg[0][1] for sg in segs) for _, segs in sorted(sched.pieces)]
    grid = [range(0, t, b) for t, b in zip(sched.target, block, strict=True)]
    return any(block) and starts == list(itertools.product(*grid))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@_SETTINGS
@given(st.data())
def test_all_to_all_buffers_deliver_each_rank_its_target_shard(data):
    step = data.draw(_steps("all_to_all"))
    orders = _group_orders(data.draw, step)
    x, local = _locals(step)
    sends, scheds = {}, {}
    for r in step.src.mesh.ranks:
        members = step_group(step, r).ranks
        sched = scheds[r] = _all_to_all_schedule(step, r, orders[members])
        buf = torch.zeros(sum(sched.send_sizes), dtype=x.dtype)
        for offset, numel, segs in sched.sends:
            buf[offset : offset + numel] = local[r][_index(segs, 0)].reshape(-1)
        sends[r] = buf
    for r in step.src.mesh.ranks:
        members = step_group(step, r).ranks
        order = orders[members]
        me = order[members.index(r)]
        by_group = {order[p]: m for p, m in enumerate(members)}
        chunks = []
        for g in range(len(members)):
            s = scheds[by_group[g]]
            start = sum(s.send_sizes[:me])
            chunks.append(sends[by_group[g]][start : start + s.send_sizes[me]])
        received = torch.cat(chunks) if chunks else torch.zeros(0, dtype=x.dtype)
        sched = scheds[r]
        assert received.numel() == sum(sched.recv_sizes)
        want = shard_one(x, step.dst, r)
        if sched.concat:
            got = received.view(sched.target)
        else:
            got = torch.zeros(sched.target, dtype=x.dtype)
            for offset, numel, segs in sched.recvs:
                block = received[offset : offset + numel]
                got[_index(segs, 1)] = block.view([sum(n for *_, n in sg) for sg in segs])
        assert torch.equal(got, want), (step, r)


@_SETTINGS
@given(st.data())
def test_the_gather_grid_turns_the_gathered_buffer_into_the_target(data):
    step = data.draw(_steps("all_gather"))
    orders = _group_orders(data.draw, step)
    x, local = _locals(step)
    seen_grid = False
    for r in step.src.mesh.ranks:
        members = step_group(step, r).ranks
        order = orders[members]
        grid = _gather_grid(step, r, order)
        sched = _gather_schedule(step, r)
        whole = all(all(len(sg) == 1 and sg[0][0] == 0 for sg in segs) for _, segs in sched.pieces)
        tiles = len(set(sched.shapes)) == 1 and 0 not in sched.shapes[0] and sched.target
        if tiles and whole and order == tuple(range(len(order))) and _row_major(sched):
            # whole equal pieces tiling the target in position order: a grid exists
            assert grid is not None, (step, r)
        if grid is None:
            continue
        seen_grid = True
        by_group = [None] * len(members)
        for p, m in enumerate(members):
            by_group[order[p]] = local[m]
        gathered = torch.cat(by_group)
        got = _from_grid(gathered, grid, sched.target)
        assert torch.equal(got, shard_one(x, step.dst, r)), (step, r)
        assert got.is_contiguous(), (step, r)
    assume(seen_grid)


def test_a_two_by_two_gather_onto_an_alias_is_one_grid():
    mesh = Mesh.create((2, 2), ("a", "b")).flatten(("a", "b"), "ab")
    from meshplan.placement import Replicate, Shard

    src = Spec(mesh, (Shard(0), Shard(1)), (16, 64))
    dst = Spec(mesh, (Replicate(), Replicate()), (16, 64))
    (step,) = plan(src, dst).steps
    assert step.collective == "all_gather"
    assert _gather_grid(step, 0, (0, 1, 2, 3)) == ((2, 2, 8, 32), (0, 2, 1, 3))


def test_a_gather_along_an_inner_dim_gives_a_contiguous_target():
    # regression: gathering (9, 1, 9) pieces along dim 1 reshaped to a strided view of
    # the gathered buffer, not the new contiguous tensor run promises
    mesh = Mesh.create(2, ("a",))
    from meshplan.placement import Replicate, Shard

    src = Spec(mesh, (Shard(1),), (9, 2, 9))
    (step,) = plan(src, Spec(mesh, (Replicate(),), (9, 2, 9))).steps
    grid = _gather_grid(step, 0, (0, 1))
    x = torch.arange(162.0).reshape(9, 2, 9)
    got = _from_grid(torch.cat([shard_one(x, src, r) for r in (0, 1)]), grid, (9, 2, 9))
    assert torch.equal(got, x) and got.is_contiguous()

"""redistribute's backward plans from the gradient's derived layout, and asks where it can't.

A data-parallel step gathers a weight stored ``Shard`` on dp; every rank uses it with its
own batch, so the gradient arrives as a partial sum (``dst_grad=Partial``) and the
backward is one reduce-scatter, landing in the weight's own spec with no hand-written
reduction. A Partial source's gradient is the reduced value's: every piece counts fully
for sum, ``1/n`` for avg, and for max/min the pieces that reached the extreme share it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _shell_cases import groups_for

from meshplan.errors import RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, shard
from meshplan.runtime._autograd import derived_grad_spec, redistribute


def _fsdp_step(w_full, xs):
    from meshplan.redistribute import plan

    rank = dist.get_rank()
    mesh = Mesh.create((4,), ("dp",))
    groups = groups_for(mesh)
    store = Spec(mesh, [Shard(0)], tuple(w_full.shape), "float64")
    full = Spec(mesh, [Replicate()], store.shape, "float64")
    arriving = Spec(mesh, [Partial()], store.shape, "float64")
    w = shard(w_full, store)[rank].clone().requires_grad_()
    gathered = redistribute(w, store, full, groups, dst_grad=arriving)
    loss = torch.tanh(xs[rank] @ gathered).pow(2).sum()  # this rank's share of the loss
    loss.backward()
    back = [s.collective for s in plan(arriving, store).steps]
    return w.grad, back


def test_an_fsdp_weight_gets_its_reduced_gradient_in_its_own_spec(pool4):
    g = torch.Generator().manual_seed(0)
    w_full = torch.randn(8, 5, generator=g, dtype=torch.float64)
    xs = [torch.randn(3, 8, generator=g, dtype=torch.float64) for _ in range(4)]
    ref = w_full.clone().requires_grad_()
    sum(torch.tanh(x @ ref).pow(2).sum() for x in xs).backward()
    store = Spec(Mesh.create((4,), ("dp",)), [Shard(0)], (8, 5), "float64")
    want = shard(ref.grad, store)
    for rank, (grad, back) in enumerate(pool4.run(_fsdp_step, w_full, xs)):
        assert back == ["reduce_scatter"]
        assert torch.allclose(grad, want[rank], rtol=1e-12, atol=1e-12)


def _partial_source(op, pieces, upstream):
    rank = dist.get_rank()
    mesh = Mesh.create((4,), ("a",))
    groups = groups_for(mesh)
    src = Spec(mesh, [Partial(op)], tuple(pieces[0].shape), "float64")
    dst = Spec(mesh, [Replicate()], src.shape, "float64")
    x = pieces[rank].clone().requires_grad_()
    y = redistribute(x, src, dst, groups, dst_grad=dst)  # same loss on every rank
    (y * upstream).sum().backward()
    return x.grad


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_a_partial_sources_gradient_is_the_reduced_values(pool4, op):
    g = torch.Generator().manual_seed(1)
    pieces = [torch.randn(6, generator=g, dtype=torch.float64) for _ in range(4)]
    pieces[2][0] = pieces[1][0] = 5.0  # a tie at the max: shared
    pieces[3][1] = pieces[0][1] = -5.0  # a tie at the min: shared
    upstream = torch.randn(6, generator=g, dtype=torch.float64)
    leaves = [p.clone().requires_grad_() for p in pieces]
    stacked = torch.stack(leaves)
    reduce = {
        "sum": lambda t: t.sum(0),
        "avg": lambda t: t.mean(0),
        "max": lambda t: t.amax(0),
        "min": lambda t: t.amin(0),
    }[op]
    (reduce(stacked) * upstream).sum().backward()
    for rank, grad in enumerate(pool4.run(_partial_source, op, pieces, upstream)):
        assert torch.allclose(grad, leaves[rank].grad, rtol=1e-12, atol=1e-12), (rank, op)


def _undeclared():
    rank = dist.get_rank()
    mesh = Mesh.create((4,), ("dp",))
    src = Spec(mesh, [Shard(0)], (8,), "float64")
    dst = Spec(mesh, [Replicate()], (8,), "float64")
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    try:
        redistribute(x, src, dst, groups_for(mesh))
    except RuntimeShellError as e:
        return str(e)
    return f"rank {rank}: no error"


def test_a_gradient_layout_that_cannot_be_derived_must_be_said(pool4):
    for text in pool4.run(_undeclared):
        assert "dst_grad=" in text


def test_the_derived_layouts():
    mesh = Mesh.create((2, 2))
    assert derived_grad_spec(Spec(mesh, [Shard(0), Shard(1)], (4, 4))) == Spec(
        mesh, [Shard(0), Shard(1)], (4, 4)
    )
    assert derived_grad_spec(Spec(mesh, [Partial("avg"), Shard(1)], (4, 4))) == Spec(
        mesh, [Replicate(), Shard(1)], (4, 4)
    )
    assert derived_grad_spec(Spec(mesh, [Replicate(), Shard(1)], (4, 4))) is None
    assert derived_grad_spec(Spec(Mesh.create((1, 2)), [Replicate(), Shard(1)], (4, 4))) == Spec(
        Mesh.create((1, 2)), [Replicate(), Shard(1)], (4, 4)
    )

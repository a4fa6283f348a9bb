"""redistribute() is differentiable: its gradients are those of the single-process computation.

The convention is DTensor's: a rank's gradient is its local piece of the gradient of the
loss with respect to the *global* value, laid out in the source's gradient spec (a
Partial source gets the gradient of its reduced value, replicated), and a loss held by
every replica counts once. The oracle is torch autograd on the global tensors in the
parent process.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from _shell_cases import groups_for, make_locals, spec_pairs, values, world_meshes
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, shard, unshard
from meshplan.runtime._autograd import grad_spec, redistribute

BATCH = 12
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]  # a failing batch prints its case

# -- tasks (run on every rank) ------------------------------------------------------------


def _grads(cases):
    rank = dist.get_rank()
    out = []
    for src, dst, locals_, upstream in cases:
        groups = groups_for(src.mesh)
        x = locals_[rank].clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = redistribute(x, src, dst, groups, dst_grad=grad_spec(dst))
        g = upstream[rank]
        loss = (y * g).sum() if dst.is_partial else (y * y * g).sum()
        loss.backward()
        out.append((y.detach(), x.grad, y.requires_grad))
    return out


def _expected_grad(src: Spec, dst: Spec, locals_, upstream_global):
    """Single process: the same loss on the global value; each rank's share of its gradient.

    A rank's share is the gradient of the loss with respect to its local piece: the
    reduced value's gradient in src's grad spec, divided by the avg dims' size, and for
    max/min dims kept only where the piece reached the extreme (shared among the ties).
    """
    x = unshard(locals_, src).requires_grad_()
    loss = (x * upstream_global).sum() if dst.is_partial else (x * x * upstream_global).sum()
    loss.backward()
    want = shard(x.grad, grad_spec(src))
    n_avg = 1
    extreme = []
    for m, p in enumerate(src.placements):
        if isinstance(p, Partial) and p.op == "avg":
            n_avg *= src.mesh.shape[m]
        elif isinstance(p, Partial) and p.op in ("max", "min"):
            extreme.append(m)
    if n_avg > 1:
        want = {r: g / n_avg for r, g in want.items()}
    if extreme:
        reduced = [Replicate() if m in extreme else p for m, p in enumerate(src.placements)]
        value_spec = Spec(src.mesh, reduced, src.shape, src.dtype, src.shard_order)
        value = shard(x.detach(), value_spec)
        hit = {r: (locals_[r] == value[r]).to(x.dtype) for r in locals_}
        sums = [Partial("sum") if m in extreme else p for m, p in enumerate(reduced)]
        count_spec = Spec(src.mesh, sums, src.shape, src.dtype, src.shard_order)
        count = shard(unshard(hit, count_spec), value_spec)
        want = {r: want[r] * hit[r] / count[r] for r in want}
    return want


@settings(max_examples=min(settings.default.max_examples, 20), phases=NO_SHRINK)
@given(data=st.data())
def test_redistribute_gradients_match_the_single_process_gradients(pool, data):
    meshes = world_meshes(pool.world_size, part=False)
    pairs = data.draw(
        st.lists(spec_pairs(meshes, dtypes=("float64",)), min_size=BATCH, max_size=BATCH),
        label="cases",
    )
    seed = data.draw(st.integers(0, 2**30), label="seed")
    cases = []
    for i, (src, dst) in enumerate(pairs):
        upstream = values(src.shape, "float64", torch.Generator().manual_seed(seed - i))
        cases.append((src, dst, make_locals(src, seed + i), upstream))
    results = pool.run(_grads, [(s, d, loc, shard(u, grad_spec(d))) for s, d, loc, u in cases])
    for i, (src, dst, locals_, upstream) in enumerate(cases):
        want = _expected_grad(src, dst, locals_, upstream)
        for rank, per_rank in enumerate(results):
            y, grad, tracked = per_rank[i]
            assert tracked
            assert grad.shape == want[rank].shape, (rank, src, dst)
            assert torch.allclose(grad, want[rank], rtol=1e-12, atol=1e-12), (
                f"rank {rank}: {src} -> {dst}: grad {grad} != {want[rank]}"
            )


# -- a training step: shard, matmul, reduce, backward ---------------------------------------


def _train_step(mesh, x, w1, w2, target):
    """A 2-layer MLP with data parallel over dp and tensor parallel (Megatron-style) over tp.

    x: S(0) over dp. w1 column-sharded over tp, so h = x @ w1 is S(0) dp, S(1) tp; w2
    row-sharded over tp, so y = tanh(h) @ w2 is Partial(sum) over tp; redistribute y to
    Replicate, take the full loss on every rank, backward. Parameter gradients hold
    only the rank's data (Partial over dp) and are reduced with redistribute too.
    """
    rank = dist.get_rank()
    groups = groups_for(mesh)
    R, S = Replicate(), Shard
    spec = lambda t, *pl: Spec(mesh, pl, tuple(t.shape), "float64")  # noqa: E731
    x_spec, w1_spec, w2_spec = spec(x, S(0), R), spec(w1, R, S(1)), spec(w2, R, S(0))
    xl = shard(x, x_spec)[rank].requires_grad_()
    w1l = shard(w1, w1_spec)[rank].requires_grad_()
    w2l = shard(w2, w2_spec)[rank].requires_grad_()
    h = torch.tanh(xl @ w1l)  # S(0) dp, S(1) tp
    y_partial = h @ w2l  # S(0) dp, P(sum) tp
    y_spec = Spec(mesh, [S(0), Partial()], (x.shape[0], w2.shape[1]), "float64")
    y_full = Spec(mesh, [R, R], y_spec.shape, "float64")
    y = redistribute(y_partial, y_spec, y_full, groups, dst_grad=y_full)  # same loss everywhere
    loss = ((y - target) ** 2).mean()
    loss.backward()
    # parameter gradients: each rank's share of the batch -> sum over dp
    grads = {}
    for name, local, param_spec in (("w1", w1l, w1_spec), ("w2", w2l, w2_spec)):
        partial = Spec(mesh, [Partial(), param_spec.placements[1]], param_spec.shape, "float64")
        grads[name] = redistribute(local.grad, partial, param_spec, groups)
    # the input gradient: partial over tp (each tp rank contracts its columns)
    x_partial = Spec(mesh, [S(0), Partial()], x_spec.shape, "float64")
    grads["x"] = redistribute(xl.grad, x_partial, x_spec, groups)
    return float(loss), grads


def test_a_sharded_training_step_gives_the_unsharded_gradients(pool8):
    mesh = Mesh.create((2, 4), ("dp", "tp"), ranks=(4, 5, 6, 7, 0, 1, 2, 3))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    w1 = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    w2 = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    target = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    results = pool8.run(_train_step, mesh, x, w1, w2, target)

    xs, w1s, w2s = (t.clone().requires_grad_() for t in (x, w1, w2))
    loss = ((torch.tanh(xs @ w1s) @ w2s - target) ** 2).mean()
    loss.backward()
    specs = {
        "x": Spec(mesh, [Shard(0), Replicate()], x.shape, "float64"),
        "w1": Spec(mesh, [Replicate(), Shard(1)], w1.shape, "float64"),
        "w2": Spec(mesh, [Replicate(), Shard(0)], w2.shape, "float64"),
    }
    full = {"x": xs.grad, "w1": w1s.grad, "w2": w2s.grad}
    for rank, (rank_loss, grads) in enumerate(results):
        assert abs(rank_loss - float(loss)) < 1e-12
        for name, grad in grads.items():
            want = shard(full[name], specs[name])[rank]
            assert torch.allclose(grad, want, rtol=1e-10, atol=1e-12), (rank, name)


def _column_parallel_step(mesh, x, w):
    """y = x @ w with w column-sharded and x batch-sharded: y is S(0) dp, S(1) tp; gather
    y to Replicate and backward a loss on it."""
    rank = dist.get_rank()
    groups = groups_for(mesh)
    xs = Spec(mesh, [Shard(0), Replicate()], tuple(x.shape), "float64")
    ws = Spec(mesh, [Replicate(), Shard(1)], tuple(w.shape), "float64")
    xl = shard(x, xs)[rank].requires_grad_()
    wl = shard(w, ws)[rank].requires_grad_()
    ys = Spec(mesh, [Shard(0), Shard(1)], (x.shape[0], w.shape[1]), "float64")
    full = Spec(mesh, [Replicate(), Replicate()], ys.shape, "float64")
    y = redistribute(xl @ wl, ys, full, groups, dst_grad=full)
    (y.sin().sum()).backward()
    wg = redistribute(wl.grad, Spec(mesh, [Partial(), Shard(1)], ws.shape, "float64"), ws, groups)
    xg = redistribute(xl.grad, Spec(mesh, [Shard(0), Partial()], xs.shape, "float64"), xs, groups)
    return xg, wg


def test_a_column_parallel_matmul_gives_the_unsharded_gradients(pool4):
    mesh = Mesh.create((2, 2), ("dp", "tp"), ranks=(1, 3, 0, 2))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=gen, dtype=torch.float64)  # 5 rows: uneven over dp
    w = torch.randn(4, 3, generator=gen, dtype=torch.float64)  # 3 columns: uneven over tp
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    (xs @ ws).sin().sum().backward()
    for rank, (xg, wg) in enumerate(pool4.run(_column_parallel_step, mesh, x, w)):
        want_x = shard(xs.grad, Spec(mesh, [Shard(0), Replicate()], x.shape, "float64"))[rank]
        want_w = shard(ws.grad, Spec(mesh, [Replicate(), Shard(1)], w.shape, "float64"))[rank]
        assert torch.allclose(xg, want_x, rtol=1e-10, atol=1e-12)
        assert torch.allclose(wg, want_w, rtol=1e-10, atol=1e-12)


# -- double backward ------------------------------------------------------------------------


def _double_backward(src, dst, x, v):
    rank = dist.get_rank()
    groups = groups_for(src.mesh)
    xl = shard(x, src)[rank].requires_grad_()
    y = redistribute(xl, src, dst, groups, dst_grad=dst)
    (g,) = torch.autograd.grad((y**3).sum(), xl, create_graph=True)
    assert g.requires_grad
    (g * shard(v, src)[rank]).sum().backward()
    return g.detach(), xl.grad


def test_double_backward_matches_the_single_process_second_derivative(pool4):
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(2, 0, 3, 1)).flatten(("a", "b"), "ab")
    src = Spec(mesh, [Shard(0), Shard(1)], (5, 3), "float64")
    dst = Spec(mesh, [Replicate(), Replicate()], (5, 3), "float64")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    v = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    xs = x.clone().requires_grad_()
    (g,) = torch.autograd.grad((xs**3).sum(), xs, create_graph=True)
    (g * v).sum().backward()
    for rank, (g_local, gg_local) in enumerate(pool4.run(_double_backward, src, dst, x, v)):
        assert torch.allclose(g_local, shard(g.detach(), src)[rank], rtol=1e-12)
        assert torch.allclose(gg_local, shard(xs.grad, src)[rank], rtol=1e-12)


def _no_grad(src, dst, x):
    rank = dist.get_rank()
    out = redistribute(shard(x, src)[rank], src, dst, groups_for(src.mesh))
    return out.requires_grad, out


def test_a_tensor_without_grad_is_redistributed_without_a_graph(pool4):
    mesh = Mesh.create(4, ("a",))
    src = Spec(mesh, [Shard(0)], (6,), "float32")
    dst = Spec(mesh, [Replicate()], (6,), "float32")
    x = torch.arange(6.0)
    for tracked, out in pool4.run(_no_grad, src, dst, x):
        assert not tracked
        assert torch.equal(out, x)


def _stage_backward_then_world(seed):
    # a mesh over ranks 0, 1 of 4 (a pipeline stage); the other ranks prepare its plan's
    # groups as documented. The backward of R -> S(0) (local) is an all_gather: its group
    # must exist on every rank already, or the world's next group waits under another name
    from meshplan.layout import Mesh as _Mesh
    from meshplan.redistribute import plan
    from meshplan.runtime import ProcessGroups, prepare_groups, run

    rank = dist.get_rank()
    stage = _Mesh.create((2,), (f"tp{seed}",), ranks=(0, 1))
    src = Spec(stage, [Replicate()], (4,), "float64")
    dst = Spec(stage, [Shard(0)], (4,), "float64")
    groups = ProcessGroups(stage, timeout=10.0)
    prepare_groups(plan(src, dst), groups)
    grad = None
    if groups.is_member:
        x = torch.arange(4.0, dtype=torch.float64).requires_grad_()
        redistribute(x, src, dst, groups).sum().backward()
        grad = x.grad.tolist()
    world = _Mesh.create((4,), ("w",))
    total = run(
        plan(
            Spec(world, [Partial()], (1,), "float64"), Spec(world, [Replicate()], (1,), "float64")
        ),
        torch.tensor([float(rank)], dtype=torch.float64),
        ProcessGroups(world, timeout=10.0),
    )
    return grad, float(total)


def test_a_stage_mesh_backward_leaves_the_worlds_groups_in_step(pool4):
    results = pool4.run(_stage_backward_then_world, 1)
    # the gradient of sum(y) lies as x does, replicated: every stage rank holds all ones
    assert [r[1] for r in results] == [6.0] * 4
    assert [r[0] for r in results] == [[1.0] * 4, [1.0] * 4, None, None]

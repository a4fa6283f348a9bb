"""run_program on 4 gloo ranks: dropout draws one mask (every rank's loss is one process's
with the same seed) and a BatchNorm's S(0) running statistics are written back into the
local buffers, as one process's step leaves them."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _shell_cases import groups_for

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.runtime import run_program, run_unsharded
from meshplan.strategy import plan_module, plan_program


def _dropout_step(prog, locals_):
    rank = dist.get_rank()
    groups = groups_for(prog.arg_specs[0].mesh)
    xs = [t[rank].clone().requires_grad_(True) for t in locals_]
    loss = run_program(prog, groups, *xs, seed=7, step=2)
    loss.backward()
    return loss.detach(), [x.grad for x in xs]


def _bn_step(prog, locals_):
    rank = dist.get_rank()
    groups = groups_for(prog.arg_specs[0].mesh)
    mine = [t[rank].clone() for t in locals_]
    for t, g in zip(mine, prog.grad_specs, strict=True):
        t.requires_grad_(g is not None)
    loss = run_program(prog, groups, *mine)
    loss.backward()
    return loss.detach(), [t.detach() for t in mine]


def test_dropout_and_batchnorm_buffers_on_gloo_equal_one_process(pool4):
    torch.manual_seed(0)
    mesh = Mesh.create((4,))
    x, w = torch.randn(8, 5, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)

    def loss_fn(x, w):
        return F.dropout(x @ w, 0.5, True).square().mean()

    prog = plan_program(
        loss_fn,
        Spec(mesh, [Shard(0)], x.shape, "float64"),
        Spec(mesh, [Replicate()], w.shape, "float64"),
    )
    results = pool4.run(
        _dropout_step, prog, [shard(t, s) for t, s in zip((x, w), prog.arg_specs, strict=True)]
    )
    (want,), want_grads = run_unsharded(prog, x, w, seed=7, step=2)
    for loss, _ in results:
        assert torch.allclose(loss, want, rtol=1e-12)
    for a in range(2):
        got = unshard({r: results[r][1][a] for r in range(4)}, prog.grad_specs[a])
        assert torch.allclose(got, want_grads[a], rtol=1e-12, atol=1e-14)

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8)).double()
    b = Spec(mesh, [Shard(0)], (8, 4), "float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mp = plan_module(model, b, specs={"1.running_*": "S(0)"}, forward=lambda m, x: m(x).sum())
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    xb = torch.randn(8, 4, dtype=torch.float64)
    args = mp.arguments(state, xb)
    results = pool4.run(
        _bn_step, mp.program, [shard(t, s) for t, s in zip(args, mp.program.arg_specs, strict=True)]
    )
    want = model(xb).sum()
    for loss, _ in results:
        assert torch.allclose(loss, want.detach(), rtol=1e-12)
    after = mp.named([{r: results[r][1][i] for r in range(4)} for i in range(len(args))])
    for name, t in model.named_buffers():
        assert torch.equal(unshard(after[name], mp.specs[name]), t) or torch.allclose(
            unshard(after[name], mp.specs[name]), t, rtol=1e-12
        ), name

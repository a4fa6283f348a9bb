"""run_program on gloo: loss and every argument's gradient equal single-process autograd.

Programs are planned in the parent (pure), shipped to every rank of a long-lived gloo
pool, run there with ``run_program`` and ``loss.backward()`` — no hand-written reduction
anywhere — and compared with torch autograd of the same function on global tensors.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from _shell_cases import groups_for
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "strategy"))
from _program_cases import arg_specs, build, meshes, planned_transformer, programs, transformer  # noqa: E402

from meshplan.placement import shard, unshard  # noqa: E402
from meshplan.runtime import run_program  # noqa: E402
from meshplan.strategy import ComputeModel, plan_program  # noqa: E402

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]


def _step(cases):
    rank = dist.get_rank()
    out = []
    for prog, locals_ in cases:
        groups = groups_for(prog.arg_specs[0].mesh)
        xs = [
            loc[rank].clone().requires_grad_(g is not None)
            for loc, g in zip(locals_, prog.grad_specs, strict=True)
        ]
        loss = run_program(prog, groups, *xs)
        loss.backward()
        out.append((loss.detach(), [x.grad for x in xs]))
    return out


def _expected(fn, tensors):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
    loss = fn(*leaves)
    loss.backward()
    return loss.detach(), [t.grad for t in leaves]


def _compare(pool, cases):
    """cases: (program, fn, global tensors); every rank's results checked."""
    shipped = [
        (prog, [shard(t, s) for t, s in zip(tensors, prog.arg_specs, strict=True)])
        for prog, _, tensors in cases
    ]
    results = pool.run(_step, shipped)
    for i, (prog, fn, tensors) in enumerate(cases):
        loss, grads = _expected(fn, tensors)
        for rank, per_rank in enumerate(results):
            got_loss, _ = per_rank[i]
            assert torch.allclose(got_loss, loss, rtol=1e-10, atol=1e-12), (rank, got_loss, loss)
        for a, (want, spec) in enumerate(zip(grads, prog.grad_specs, strict=True)):
            if spec is None:
                continue
            got = unshard({r: results[r][i][1][a] for r in range(len(results))}, spec)
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (
                f"argument {a} ({spec}): max error {(got - want).abs().max()}\n{prog.explain()}"
            )


@settings(max_examples=min(settings.default.max_examples, 8), phases=NO_SHRINK, deadline=None)
@given(data=st.data())
def test_random_programs_on_gloo_give_the_single_process_loss_and_gradients(pool, data):
    cases = []
    for k in range(4):
        mesh = data.draw(meshes(pool.world_size), label=f"mesh{k}")
        desc = data.draw(programs(), label=f"program{k}")
        n = data.draw(st.integers(1, 9), label="rows")
        d = data.draw(st.integers(1, 5), label="width")
        specs = data.draw(arg_specs(mesh, n, d, 2), label="specs")
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
        tensors = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in specs]
        fn = build(desc, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = plan_program(fn, *specs, compute=ComputeModel.cpu())
        cases.append((prog, fn, tensors))
    _compare(pool, cases)


@pytest.mark.parametrize("world,shape", [(4, (2, 2)), (8, (2, 2, 2))])
def test_a_two_layer_transformer_on_gloo_matches_single_process_autograd(world, shape, request):
    pool = request.getfixturevalue(f"pool{world}")
    tensors, specs, prog = planned_transformer(shape)  # (planned once: test_program's too)
    _compare(pool, [(prog, functools.partial(transformer), tensors)])


@pytest.mark.parametrize("name,shape", [("encoder", (2, 2)), ("nanogpt", (4,))])
def test_model_families_planned_from_their_modules_match_autograd_on_gloo(pool4, name, shape):
    # torch's nn.TransformerEncoderLayer and a nanoGPT on SDPA (fused q/k/v split),
    # planned with plan_module, every op with a rule
    from _model_families import batch, make, param_specs
    from torch.func import functional_call

    from meshplan.layout import Mesh
    from meshplan.placement import Replicate, Shard, Spec
    from meshplan.strategy import plan_module

    mesh = Mesh.create(shape)
    model = make(name)
    ids, labels = batch()
    b = Spec(mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1), ids.shape, "int64")
    mp = plan_module(model, b, b, specs=param_specs(model, mesh.ndim), strict=True)
    assert mp.program.replicated == 0
    state = {n: t.detach() for n, t in model.named_parameters()}

    def fn(ids, labels, *ts):
        return functional_call(model, dict(zip(mp.names, ts, strict=True)), (ids, labels))

    _compare(pool4, [(mp.program, fn, list(mp.arguments(state, ids, labels)))])


def _tanh_mm(x, w):
    return torch.tanh(x @ w).sum()


def test_a_move_shared_by_forward_and_backward_gives_the_single_process_gradients(pool):
    """An FSDP weight gathered once for the forward mm and the backward's transpose: the
    moved copy kept from forward to backward gives the right gradients."""
    from meshplan.layout import Mesh
    from meshplan.placement import Shard, Spec

    mesh = Mesh.create((pool.world_size,))
    x = Spec(mesh, [Shard(0)], (8, 4), "float64")
    w = Spec(mesh, [Shard(0)], (4, 6), "float64")
    prog = plan_program(_tanh_mm, x, w, compute=ComputeModel.cpu())
    keys = {}
    for op in prog.ops:
        for v, p in zip(op.inputs, op.moves, strict=True):
            if p is not None:
                keys.setdefault((v, p.dst), []).append(op)
    assert any(len(ops) > 1 for ops in keys.values()), prog.explain()
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in (x, w)]
    _compare(pool, [(prog, _tanh_mm, tensors)])


def test_a_plan_recomputing_its_layers_gives_the_single_process_loss_and_gradients(pool4):
    # tensor-parallel residual layers, every layer recomputed in the backward: the
    # recompute repeats the layers' reductions of partial sums on every rank
    from test_recompute import planned, residual, tensors

    program = planned("always", 0.0, True)
    assert program.recomputed
    _compare(pool4, [(program, residual, tensors())])

"""Every single-mesh-dim strategy of every aten rule computes the op, checked in one process.

The calls come from tracing real programs (a two-layer transformer with fused and
written-out attention, layer norms, rms norm, cross-entropy; the model families of
``_model_families``: GPT-2, Llama with rotate_half and complex RoPE, torch's
TransformerEncoderLayer, nanoGPT; small functions for the remaining piece, gather and
factory ops, writes into views and random draws; forward and backward). On
1-D meshes of 2 and 3 ranks, each strategy's inputs are laid out as it says (random
values; Partial inputs as pieces that sum to the value), every rank runs the aten op on
its local pieces as a program would, and the outputs, read back in the strategy's output
layouts, must equal the op on the global tensors.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from _program_cases import transformer, transformer_args

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Spec, local_shape, shard, unshard
from meshplan.runtime._local import run_local
from meshplan.strategy import ComputeModel, RuleSet
from meshplan.strategy.programs._candidates import realize_option
from meshplan.strategy.programs._program import ProgramOp
from meshplan.strategy.programs._trace import trace
from meshplan.strategy.rules._aten import aten_strategies
from meshplan.strategy.rules._random import is_draw

pytestmark = pytest.mark.slow  # exhaustive: every strategy of every traced aten rule


UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided"}


def _norm_model(x, w):
    h = F.rms_norm(x @ w, (x.shape[-1],))
    # casts to float32 and back (Mamba's): a Partial cast piece by piece rounds each piece
    cast = (x @ w).float().square().double()
    out = torch.log_softmax(h, -1).sum() + F.silu(h).mean() + torch.sigmoid(h).amax()
    return out + cast.sum()


def _pieces_model(x, idx, w):
    # unbind / stack / chunk, index and its backward, tril, new_zeros, arange with a step,
    # a padded value, flip (cumsum's backward)
    a, b = x.unbind(1)
    y = torch.stack([a, b.tril()], dim=0) + x.new_zeros(x.shape[1], *x.shape[0:1], x.shape[2])
    p, q = y.chunk(2, dim=2)
    s1, s2 = x.split([1, 1], dim=1)
    y = y + (s1 * s2).transpose(0, 1) + x.new_full((2, 1, 1), 2.0)
    g = w[idx] + w[:, idx[:, 0]].sum()
    r = torch.arange(1, 2 * x.shape[2] + 1, 2, dtype=x.dtype)
    z = F.pad(p * q, (1, 0), value=0.5) @ torch.ones(q.shape[2] + 1, 3, dtype=x.dtype)
    safe = torch.ops.aten._safe_softmax(z, -1)  # (what SDPA with a mask calls)
    return g.sum() + (z.cumsum(1) * r[:3] * safe).sum() + x.flip(0).select(2, 1).sum()


def _writes_model(x, probs):
    # writes into strided views (functionalized: copy, fill, slice/select_scatter,
    # masked_fill, index_put) and every kind of random draw (bernoulli.p of dropout,
    # bernoulli of probabilities, rand/randn factories, normal_/uniform_ on a shape)
    y = x.clone()
    y[:, 1:, ::2] = x[:, :-1, ::2] * 2
    y[:, 0] = 1.5
    y.transpose(0, 2)[1].masked_fill_(y.transpose(0, 2)[1] > 0, 0.5)
    y[torch.arange(0, x.shape[0], 2)] = y[torch.arange(0, x.shape[0], 2)] * 3
    # views functionalization scatters into as diagonal_scatter, as_strided_scatter and
    # (an unfold's window) select_scatter into the unfold, then unfold_backward
    y.diagonal(0, 1, 2).mul_(2.0)
    y.as_strided((x.shape[0], 3, 2), (48, 8, 2), 1).fill_(0.5)
    y.unfold(2, 2, 2)[..., 0] = 3.0
    d = F.dropout(y, 0.5, True) + torch.bernoulli(probs) + torch.rand_like(y)
    d = d + torch.randn(x.shape, dtype=x.dtype) + y.clone().normal_(1.0, 2.0)
    return (d * y.clone().uniform_(-1, 1)).sum() + x.diagonal(0, 0, 2).square().sum()


def _gqa_model(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).square().sum()


def _nets_model(x, w1, w2, wd, img, k, bias, alibi, q, kk, mean, var):
    # the ops of vision, state-space, ALiBi and mixture-of-experts families: conv1d with one
    # group and depthwise (Mamba), conv2d with a bias, a transposed conv, max pooling, batch
    # norm in training (no running statistics) and out of it, softplus, baddbmm, repeat, topk
    h = F.conv1d(x, w1, padding=1) + F.conv1d(x, wd, groups=x.shape[1], padding=1)
    h = F.softplus(h) + F.conv_transpose1d(h, w2.transpose(0, 1)[:, :, :3]).narrow(2, 0, 6)
    y = F.conv2d(img, k, bias, stride=1, padding=1)
    y = F.max_pool2d(F.batch_norm(y, None, None, training=True), 2)
    y = y + F.batch_norm(y, mean.detach(), var.detach().exp(), training=False)
    s = torch.baddbmm(alibi.repeat(2, 1, 1), q, kk, beta=1.0, alpha=0.5)
    top, idx = torch.topk(s, 2, dim=-1)
    return h.square().sum() + y.sum() + (top * idx).sum() + s.softmax(-1).amax()


def _family_case(name):
    from _model_families import batch, make
    from torch.func import functional_call

    model = make(name)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    names = list(state)
    mesh = Mesh.create((1,))
    ids, _ = batch()

    def fn(ids, labels, *ts):
        return functional_call(model, dict(zip(names, ts, strict=True)), (ids, labels))

    specs = [Spec(mesh, [Replicate()], ids.shape, "int64")] * 2
    specs += [
        Spec(mesh, [Replicate()], t.shape, str(t.dtype).removeprefix("torch."))
        for t in state.values()
    ]
    return fn, specs


@functools.cache
def _calls():
    mesh = Mesh.create((1,))
    seen = {}
    cases = []
    for fused in (True, False):
        _, specs = transformer_args(mesh, layers=1)
        cases.append((functools.partial(transformer, layers=1, fused=fused), specs))
    x = Spec(mesh, [Replicate()], (4, 6, 8), "float64")
    w = Spec(mesh, [Replicate()], (8, 8), "float64")
    cases.append((_norm_model, [x, w]))
    cases.append(
        (
            _pieces_model,
            [
                Spec(mesh, [Replicate()], (4, 2, 6), "float64"),
                Spec(mesh, [Replicate()], (5, 2), "int64"),
                Spec(mesh, [Replicate()], (4, 3, 4), "float64"),
            ],
        )
    )
    nets = [
        (2, 4, 6),  # x: (batch, channels, length)
        (4, 4, 3),  # w1
        (4, 4, 3),  # w2
        (4, 1, 3),  # wd: depthwise
        (2, 3, 4, 4),  # img
        (4, 3, 3, 3),  # k
        (4,),  # bias
        (2, 3, 5),  # alibi
        (4, 3, 2),  # q
        (4, 2, 5),  # kk
        (4,),  # running mean
        (4,),  # running var
    ]
    cases.append((_nets_model, [Spec(mesh, [Replicate()], s, "float64") for s in nets]))
    writes = [Spec(mesh, [Replicate()], (4, 6, 8), "float64")] * 2
    cases.append((_writes_model, writes))
    gqa = [Spec(mesh, [Replicate()], (2, h, 4, 2), "float64") for h in (4, 2, 2)]
    cases.append((_gqa_model, gqa))
    for name in ("gpt2", "llama", "llama_complex", "encoder", "nanogpt"):
        cases.append(_family_case(name))
    for fn, specs in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = trace(fn, specs, [s.dtype.startswith(("float", "complex")) for s in specs])
        for node in graph.nodes:
            if node.kind == "call" and aten_strategies(node.call, RuleSet.default()):
                seen.setdefault(node.call, None)
    return tuple(seen)


def _value(meta, gen):
    if meta.dtype in ("int64", "int32"):
        return torch.randint(0, 2, meta.shape, generator=gen)
    if meta.dtype.startswith("complex"):
        return torch.randn(meta.shape, generator=gen, dtype=getattr(torch, meta.dtype))
    if meta.dtype == "bool":
        return torch.randint(0, 2, meta.shape, generator=gen).bool()
    return torch.randn(meta.shape, generator=gen, dtype=getattr(torch, meta.dtype))


def _pieces(local, spec, gen):
    """A Partial(sum) float input as pieces that all differ from zero: the canonical split
    (the value on rank 0, zeros elsewhere) would hide a rule that is not linear in them
    (a cast rounding each piece, a product of two pieces)."""
    (p,) = spec.placements
    if not (isinstance(p, Partial) and p.op == "sum") or not local[0].is_floating_point():
        return local
    noise = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in local.values()]
    noise[-1] = noise[-1] - sum(noise)  # the pieces of zero, added to the canonical split
    return {r: t + noise[r] for r, t in local.items()}


def _cases():
    out = []
    for call in _calls():
        for k in range(len(aten_strategies(call, RuleSet.default()))):
            out.append(pytest.param(call, k, id=f"{call.target}-{k}"))
    return out


@pytest.mark.parametrize("call,k", _cases())
def test_each_strategy_of_each_aten_rule_computes_the_op(call, k):
    strategy = aten_strategies(call, RuleSet.default())[k]
    gen = torch.Generator().manual_seed(k)
    inputs = [_value(m, gen) for m in call.inputs]
    if call.op == "div":  # no integer zero divisors: inf - inf is no test of a layout
        inputs = [t + 1 if not t.is_floating_point() else t for t in inputs]
    # the inputs' rounding: pieces of a float32 sum round as float32 (a cast of float64
    # pieces to float32 does not pass: the float64 sum rounds once)
    tol = max([1e-9] + [100 * torch.finfo(t.dtype).eps for t in inputs if t.is_floating_point()])
    checked = 0
    for n in (2, 3):
        mesh = Mesh.create((n,))
        opt = realize_option(call, mesh, (strategy,), ComputeModel())
        if opt is None:
            continue  # the strategy's constraints do not hold at these sizes
        rep = ProgramOp(
            0,
            call,
            (),
            (),
            tuple(
                None if m is None else Spec(mesh, [Replicate()], m.shape, m.dtype)
                for m in call.outputs
            ),
            (),
            "forward",
        )
        seed = 3 if is_draw(call) else None  # a draw: every rank its part of one
        want = run_local(rep, inputs, 0, "cpu", seed)
        want = want if isinstance(want, tuple | list) else (want,)
        op = ProgramOp(0, call, (), opt.input_specs, opt.output_specs, (), "forward")
        locals_ = [
            _pieces(shard(t, s), s, gen) for t, s in zip(inputs, opt.input_specs, strict=True)
        ]
        per_rank = {}
        for r in range(n):
            got = run_local(op, [loc[r] for loc in locals_], r, "cpu", seed)
            per_rank[r] = got if isinstance(got, tuple | list) else (got,)
        for j, spec in enumerate(opt.output_specs):
            if spec is None or want[j] is None:
                continue
            if call.op in UNINITIALIZED:  # no values to compare: every rank's shape
                for r in range(n):
                    assert tuple(per_rank[r][j].shape) == local_shape(spec, r), (call, r)
                continue
            got = unshard({r: per_rank[r][j] for r in range(n)}, spec)
            assert torch.allclose(
                got.double(), want[j].double(), rtol=tol, atol=tol, equal_nan=True
            ), f"{call.target} {strategy} on {n} ranks: output {j} in {spec} differs"
        checked += 1
    assert checked or any(p for p in strategy.entries)  # constraints may rule out both sizes


def test_the_sweep_covers_every_rule_of_the_ops_real_models_trace_to():
    from meshplan.strategy.rules._aten_nets import RULES as NETS
    from meshplan.strategy.rules._aten_pieces import RULES
    from meshplan.strategy.rules._aten_writes import RULES as WRITES

    traced = {call.op for call in _calls()}
    # the batch norm variants share one rule (a traced batch norm in training decomposes
    # to var_mean and pointwise ops, its backward stays whole)
    assert set(NETS) - traced <= {
        "native_batch_norm",
        "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "var",
    }, sorted(set(NETS) - traced)
    # the draws not traced here share the code of those that are
    assert set(WRITES) - traced <= {
        "empty_strided",
        "random",
        "exponential",
        "geometric",
        "log_normal",
        "cauchy",
        "rand",
        "randint",
        "randn_like",
        "randint_like",
        "native_dropout",
    }, sorted(set(WRITES) - traced)
    # _index_put_impl, the conj/neg resolutions and new_empty share their siblings' code
    # (index_put, _conj, new_zeros); every other rule is traced here
    assert set(RULES) - traced <= {
        "_index_put_impl",
        "conj_physical",
        "resolve_conj",
        "resolve_neg",
        "new_empty",
    }, sorted(set(RULES) - traced)

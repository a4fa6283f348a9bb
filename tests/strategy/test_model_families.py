"""Real model families planned whole: every traced op has a rule, the gradients match.

The families (``_model_families``: GPT-2 with a fused q/k/v split, Llama with GQA,
rotate_half or complex RoPE, RMSNorm and SwiGLU, torch's nn.TransformerEncoderLayer,
nanoGPT on SDPA) are planned from their modules with ``plan_module`` and FSDP x TP
specs by glob pattern, ``strict=True`` (an op without a rule would be an error), and run
for every rank in the simulator against one-process autograd. Also: one rule table (a
rule a user registers serves ``select`` and ``plan_program``), the module entry's
patterns and errors, and the error for a parameter a plain function captures.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from _model_families import FAMILIES, batch, make, param_specs
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.runtime import simulate_program
from meshplan.strategy import (
    ComputeModel,
    DimStrategy,
    Placeholder,
    RuleSet,
    plan_module,
    plan_program,
    select,
)
from meshplan.strategy.programs._module import match_specs


@functools.cache
def planned(name: str, shape: tuple[int, ...], compute: ComputeModel | None = None):
    """The family's one-layer model planned on ``Mesh.create(shape)`` (dp on dim 0)."""
    compute = ComputeModel.cpu() if compute is None else compute
    mesh = Mesh.create(shape)
    model = make(name)
    ids, _ = batch()
    dp = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
    b = Spec(mesh, dp, ids.shape, "int64")
    mp = plan_module(model, b, b, specs=param_specs(model, mesh.ndim), strict=True, compute=compute)
    return model, mp


def _check_against_one_process(model, mp):
    ids, labels = batch()
    state = {n: t.detach() for n, t in model.named_parameters()}
    state.update(model.named_buffers())
    args = mp.arguments(state, ids, labels)
    locals_ = [shard(t, s) for t, s in zip(args, mp.program.arg_specs, strict=True)]
    outs, grads = simulate_program(mp.program, *locals_)
    leaves = {
        n: t.clone().requires_grad_(t.requires_grad or n in dict(model.named_parameters()))
        for n, t in state.items()
    }
    loss = functional_call(model, leaves, (ids, labels))
    loss.backward()
    got = unshard(outs[0], mp.program.out_specs[0])
    assert torch.allclose(got, loss.detach(), rtol=1e-12, atol=1e-13), (got, loss)
    named = mp.named(grads)
    specs = mp.named(mp.program.grad_specs)
    checked = 0
    for n, _ in model.named_parameters():
        g = unshard(named[n], specs[n])
        assert torch.allclose(g, leaves[n].grad, rtol=1e-10, atol=1e-12), (
            n,
            (g - leaves[n].grad).abs().max(),
        )
        checked += 1
    assert checked == len(list(model.parameters()))


QUICK = ["llama", "llama_complex", "encoder", "nanogpt"]


@pytest.mark.parametrize("name", QUICK + [pytest.param("gpt2", marks=pytest.mark.slow)])
def test_each_family_plans_with_a_rule_for_every_op_and_matches_one_process(name):
    model, mp = planned(name, (2,))
    assert mp.program.replicated == 0 and not mp.program.fallbacks
    _check_against_one_process(model, mp)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_complex", "encoder", "nanogpt"])
def test_each_family_on_dp_x_tp_matches_one_process(name):
    model, mp = planned(name, (2, 2))
    assert mp.program.replicated == 0
    _check_against_one_process(model, mp)


def test_a_fused_qkv_split_and_rotate_half_stay_sharded_on_the_batch():
    # where local work costs (a slow compute model), the split of nanoGPT's fused
    # projection and Llama's rotate_half slices and cat run on batch shards, not gathered:
    # each piece stays whole on every rank
    slow = ComputeModel(1e6, 1e6)
    for name, ops in (("nanogpt", {"split"}), ("llama", {"slice", "cat"})):
        _, mp = planned(name, (2,), slow)
        seen = [
            op for op in mp.program.forward_ops if op.call.op in ops and op.input_specs[0].ndim >= 3
        ]
        assert seen, name
        for op in seen:
            assert op.input_specs[0].placements[0] == Shard(0), (name, op.call.target)


# -- one rule table ----------------------------------------------------------------------


def _roll_rule(inputs, shifts, dims):
    rolled = {d % inputs[0].ndim for d in dims}
    return [
        DimStrategy([Placeholder(d)], [Placeholder(d)])
        for d in range(inputs[0].ndim)
        if d not in rolled
    ]


def test_a_rule_a_user_registers_serves_select_and_plan_program():
    rs = RuleSet.default().with_rule("roll", _roll_rule, outputs=lambda inputs, **a: inputs[:1])
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(1)], (4, 6), "float64")
    choice = select("roll", [x], ruleset=rs, shifts=(1,), dims=(0,))
    assert choice.output_spec.placements == (Shard(1),) and choice.cost == 0

    def fn(x):
        return torch.roll(x, 1, 0).square().sum()

    with pytest.warns(UserWarning, match="roll"):
        plain = plan_program(fn, x)
    assert plain.replicated == 2  # the roll and its backward's roll
    prog = plan_program(fn, x, ruleset=rs, strict=True)
    assert prog.replicated == 0
    rolls = [op for op in prog.ops if op.call.op == "roll"]
    assert len(rolls) == 2 and all(op.input_specs[0].placements == (Shard(1),) for op in rolls)
    assert prog.cost.total < plain.cost.total
    t = torch.randn(4, 6, dtype=torch.float64)
    outs, grads = simulate_program(prog, shard(t, x))
    assert torch.allclose(unshard(outs[0], prog.out_specs[0]), fn(t))
    assert torch.allclose(unshard(grads[0], prog.grad_specs[0]), 2 * t)


def test_a_built_in_rule_a_user_replaces_is_replaced_for_programs_too():
    # a rule that offers nothing but replication for mm: the program must replicate mm
    rs = RuleSet.default().with_rule("mm", lambda inputs: [])
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (4, 6), "float64")
    w = Spec(mesh, [Replicate()], (6, 3), "float64")
    prog = plan_program(lambda x, w: (x @ w).sum(), x, w, ruleset=rs)
    mms = [op for op in prog.ops if op.call.op == "mm"]
    assert mms and all(s.placements == (Replicate(),) for op in mms for s in op.input_specs)
    default = plan_program(lambda x, w: (x @ w).sum(), x, w)
    assert any(
        s.placements != (Replicate(),)
        for op in default.ops
        if op.call.op == "mm"
        for s in op.input_specs
    )


def test_select_names_a_rule_that_reads_traced_calls_only():
    x = Spec(Mesh.create((2,)), [Shard(0)], (4, 6), "float64")
    with pytest.raises(StrategyError, match="traced aten calls only"):
        select("split", [x], split_size=2, dim=1)


def test_plan_program_refuses_a_ruleset_that_is_not_one():
    x = Spec(Mesh.create((2,)), [Shard(0)], (4, 6), "float64")
    with pytest.raises(StrategyError, match="ruleset= takes a RuleSet"):
        plan_program(lambda x: x.sum(), x, ruleset={"mm": None})


# -- the module entry ----------------------------------------------------------------------


def test_plan_module_matches_names_and_patterns_and_replicates_the_rest():
    model = make("llama")
    mesh = Mesh.create((2, 2))
    ids, _ = batch()
    b = Spec(mesh, [Shard(0), Replicate()], ids.shape, "int64")
    specs = {
        "layers.0.q_proj.weight": "S(0) S(1)",
        "*.q_proj.weight": "R R",
        "*_proj.weight": [Shard(0), Shard(0)],
    }
    by_name = match_specs(mesh, dict(model.named_parameters()) | dict(model.named_buffers()), specs)
    assert by_name["layers.0.q_proj.weight"].placements == (Shard(0), Shard(1))  # exact first
    assert by_name["layers.0.k_proj.weight"].placements == (Shard(0), Shard(0))
    assert by_name["norm.weight"].placements == (Replicate(), Replicate())
    assert by_name["inv_freq"].placements == (Replicate(), Replicate())  # a buffer
    with pytest.raises(StrategyError, match=r"\['\*\.qproj\.weight'\] name no parameter"):
        plan_module(model, b, b, specs={"*.qproj.weight": "S(0) R"})
    with pytest.raises(StrategyError, match="1 placements for a 2-D"):
        plan_module(model, b, b, specs={"*.q_proj.weight": "S(0)"})


def test_plan_module_takes_a_function_of_named_tensors():
    model = make("encoder")
    mesh = Mesh.create((2,))
    ids, labels = batch()
    b = Spec(mesh, [Shard(0)], ids.shape, "int64")
    state = {n: t.detach().requires_grad_(True) for n, t in model.named_parameters()}

    def step(state, ids, labels):
        return functional_call(model, state, (ids, labels))

    mp = plan_module(step, b, b, state=state, specs={"embed.weight": "S(0)"}, strict=True)
    assert mp.names == tuple(state) and mp.program.replicated == 0
    assert mp.specs["embed.weight"].placements == (Shard(0),)
    args = mp.arguments({n: t.detach() for n, t in state.items()}, ids, labels)
    locals_ = [shard(t, s) for t, s in zip(args, mp.program.arg_specs, strict=True)]
    outs, _ = simulate_program(mp.program, *locals_)
    want = model(ids, labels)
    assert torch.allclose(unshard(outs[0], mp.program.out_specs[0]), want.detach())


def test_a_parameter_a_plain_function_captures_is_named_with_the_fix():
    model = make("nanogpt")
    mesh = Mesh.create((2,))
    b = Spec(mesh, [Shard(0)], batch()[0].shape, "int64")
    with pytest.raises(StrategyError) as info:
        plan_program(lambda ids, labels: model(ids, labels), b, b)
    text = str(info.value)
    assert "'model.wte.weight'" in text and "plan_module" in text and "captures" in text


def test_a_tied_parameter_is_one_argument():
    model = make("nanogpt")
    _, mp = planned("nanogpt", (2,))
    assert "wte.weight" in mp.names and "lm_head.weight" not in mp.names
    assert len(mp.names) == len(list(model.parameters())) + len(list(model.buffers()))


def test_every_family_is_covered():
    assert set(QUICK) | {"gpt2"} == set(FAMILIES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ProgramWarning: nothing runs replicated
        planned("encoder", (2,))


def test_grouped_query_attention_shards_q_and_kv_heads_alike():
    # SDPA with fewer k/v heads than q heads (enable_gqa, as transformers' Llama calls it):
    # a head shard of q must read its own kv heads; k and v replicated beside sharded q
    # heads once gave gradients of k and v labelled sharded but computed whole
    mesh = Mesh.create((2,))
    q = Spec(mesh, [Shard(1)], (2, 4, 4, 2), "float64")
    kv = Spec(mesh, [Shard(1)], (2, 2, 4, 2), "float64")

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).square().sum()

    prog = plan_program(fn, q, kv, kv, compute=ComputeModel(1e6, 1e6), strict=True)
    sdpa = [op for op in prog.ops if "scaled_dot_product" in op.call.target]
    assert sdpa and all(op.input_specs[0].placements == (Shard(1),) for op in sdpa)
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in (q, kv, kv)]
    outs, grads = simulate_program(
        prog, *(shard(t, s) for t, s in zip(ts, (q, kv, kv), strict=True))
    )
    leaves = [t.clone().requires_grad_() for t in ts]
    loss = fn(*leaves)
    loss.backward()
    assert torch.allclose(unshard(outs[0], prog.out_specs[0]), loss.detach())
    for grad, spec, leaf in zip(grads, prog.grad_specs, leaves, strict=True):
        assert torch.allclose(unshard(grad, spec), leaf.grad, atol=1e-12)


def test_a_constant_of_one_value_built_inside_the_function_is_a_factory():
    # torch.tensor([]) caches concatenated by torch.cat's legacy rule (transformers does
    # this) and a scalar constant: traced as constants, planned as full(...) calls
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(1)], (4, 6), "float64")

    def fn(x):
        y = torch.cat([torch.tensor([], dtype=x.dtype), x], dim=-2)
        return (y * torch.tensor(2.0, dtype=x.dtype)).square().sum()

    prog = plan_program(fn, x, strict=True)
    t = torch.randn(4, 6, dtype=torch.float64)
    outs, grads = simulate_program(prog, shard(t, x))
    assert torch.allclose(unshard(outs[0], prog.out_specs[0]), fn(t))
    assert torch.allclose(unshard(grads[0], prog.grad_specs[0]), 8 * t)


PIECE_OPS = ("split", "slice", "select", "unbind", "cat", "pad", "cumsum", "flip", "triu", "index")


def _piece_fn(kind: str, dim: int):
    def fn(x, w):
        h = x @ w  # a matmul first, so the piece op's input may be sharded or partial
        if kind == "split":
            a, b = h.split([1, h.shape[dim] - 1], dim=dim)
            y = a.sum(dim, keepdim=True) * 2 + b.sum(dim, keepdim=True)
        elif kind == "slice":
            y = h.narrow(dim, 1, h.shape[dim] - 1)
        elif kind == "select":
            y = h.select(dim, 0)
        elif kind == "unbind":
            y = torch.stack(h.unbind(dim)[::-1], dim=dim)
        elif kind == "cat":
            y = torch.cat([h, h.sin()], dim=dim)
        elif kind == "pad":
            y = F.pad(h, (1, 2) if dim == 1 else (0, 0, 2, 1))
        elif kind == "cumsum":
            y = h.cumsum(dim)
        elif kind == "flip":
            y = h.flip(dim)
        elif kind == "triu":
            y = h.triu(1) + h.tril(-1) * 3
        else:
            y = h[torch.arange(h.shape[0] - 1, -1, -1)]
        return (y * y).sum() + y.mean()

    return fn


@settings(max_examples=min(settings.default.max_examples, 12), deadline=None)
@given(data=st.data())
def test_programs_of_piece_ops_give_the_single_process_loss_and_gradients(data):
    mesh = data.draw(st.sampled_from([(2,), (3,), (2, 2)]).map(Mesh.create), label="mesh")
    kind = data.draw(st.sampled_from(PIECE_OPS), label="op")
    dim = data.draw(st.integers(0, 1), label="dim")
    n, k, m = (data.draw(st.integers(2, 6), label=s) for s in ("rows", "inner", "cols"))
    pls = st.sampled_from([Replicate(), Shard(0), Shard(1)])
    x = Spec(mesh, [data.draw(pls) for _ in mesh.shape], (n, k), "float64")
    w = Spec(mesh, [data.draw(pls) for _ in mesh.shape], (k, m), "float64")
    fn = _piece_fn(kind, dim)
    prog = plan_program(fn, x, w, strict=True, compute=ComputeModel(1e6, 1e6))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    ts = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in (x, w)]
    outs, grads = simulate_program(prog, *(shard(t, s) for t, s in zip(ts, (x, w), strict=True)))
    leaves = [t.clone().requires_grad_() for t in ts]
    loss = fn(*leaves)
    loss.backward()
    assert torch.allclose(unshard(outs[0], prog.out_specs[0]), loss.detach(), rtol=1e-10)
    for grad, spec, leaf in zip(grads, prog.grad_specs, leaves, strict=True):
        assert torch.allclose(unshard(grad, spec), leaf.grad, rtol=1e-10, atol=1e-12), kind

"""Real Hugging Face models (``pip install -e ".[models]"``) planned whole from their modules.

Tiny GPT-2 (eager and SDPA attention) and Llama (GQA, RoPE, RMSNorm, SwiGLU) configs in
float64, in eval mode (no dropout: random draws differ between one process and many),
planned with ``plan_module`` and ``strict=True`` on a (2,) mesh with the batch and
FSDP-sharded weights: every op they trace to has a rule, and the loss and every gradient
equal one process's in the simulator.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.runtime import simulate_program
from meshplan.strategy import ComputeModel, plan_module

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # transformers imports and traces in seconds


def _model(name: str):
    torch.manual_seed(0)
    if name.startswith("gpt2"):
        cfg = transformers.GPT2Config(
            vocab_size=32,
            n_positions=16,
            n_embd=16,
            n_layer=1,
            n_head=4,
            attn_implementation="eager" if name == "gpt2-eager" else "sdpa",
        )
        return transformers.GPT2LMHeadModel(cfg).double().eval()
    cfg = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(cfg).double().eval()


def _loss(model, ids, labels):
    return model(input_ids=ids, labels=labels).loss


@pytest.mark.parametrize("name", ["gpt2-eager", "gpt2-sdpa", "llama"])
def test_a_hugging_face_model_plans_with_a_rule_for_every_op_and_matches_one_process(name):
    model = _model(name)
    mesh = Mesh.create((2,))
    g = torch.Generator().manual_seed(1)
    ids, labels = (
        torch.randint(0, 32, (4, 8), generator=g),
        torch.randint(0, 32, (4, 8), generator=g),
    )
    b = Spec(mesh, [Shard(0)], ids.shape, "int64")
    specs = {"*.weight": "S(0)"}
    mp = plan_module(
        model, b, b, forward=_loss, specs=specs, strict=True, compute=ComputeModel.cpu()
    )
    assert mp.program.replicated == 0
    state = {n: t.detach() for n, t in model.named_parameters()}
    state.update(model.named_buffers())
    args = mp.arguments(state, ids, labels)
    outs, grads = simulate_program(
        mp.program, *(shard(t, s) for t, s in zip(args, mp.program.arg_specs, strict=True))
    )
    params = dict(model.named_parameters())
    leaves = {n: t.clone().requires_grad_(n in params) for n, t in state.items()}
    loss = functional_call(model, leaves, (ids,), {"labels": labels}).loss
    loss.backward()
    assert torch.allclose(unshard(outs[0], mp.program.out_specs[0]), loss.detach(), atol=1e-12)
    named, specs_by = mp.named(grads), mp.named(mp.program.grad_specs)
    for n in params:
        got = unshard(named[n], specs_by[n])
        assert torch.allclose(got, leaves[n].grad, rtol=1e-9, atol=1e-12), n
    assert Replicate() not in mp.specs[next(iter(params))].placements

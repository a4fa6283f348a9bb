"""Tiny Hugging Face GPT-2 and Llama trained through parallelize on 4 gloo ranks.

Each is planned FSDP x TP on (dp 2, tp 2) by name patterns, trained 3 steps with
``torch.optim.AdamW`` and ``pm.clip_grad_norm_``, saved with its optimizer's state, and
resumed on a 4-way FSDP mesh for 2 more steps: every loss and gradient norm equals one
process's AdamW and ``torch.nn.utils.clip_grad_norm_`` on the whole model (float64,
relative difference <= 1e-12).
"""

from __future__ import annotations

import functools

import pytest
import torch
from _train_cases import reference_steps, train_planned

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import ComputeModel, plan_module

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # transformers imports and traces in seconds

V, B, T = 32, 4, 8
CLIP = 0.5
SPECS = {
    "gpt2": {
        "*.c_attn.weight": "S(0) S(1)",  # Conv1D (in, out): column-parallel
        "*.c_fc.weight": "S(0) S(1)",
        "*.c_proj.weight": "S(1) S(0)",  # row-parallel
        "*": "S(0) R",
    },
    "llama": {
        "*.q_proj.weight": "S(0) S(0)",  # Linear (out, in): column-parallel
        "*.k_proj.weight": "S(0) S(0)",
        "*.v_proj.weight": "S(0) S(0)",
        "*.gate_proj.weight": "S(0) S(0)",
        "*.up_proj.weight": "S(0) S(0)",
        "*.o_proj.weight": "S(0) S(1)",  # row-parallel
        "*.down_proj.weight": "S(0) S(1)",
        "*": "S(0) R",
    },
}


def _model(name: str):
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(cfg).double()
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).double()


def _loss(model, ids, labels):
    # the cross-entropy in the model's dtype (transformers' own loss upcasts to float32)
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g))
        for _ in range(n)
    ]


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def _plan(name, mesh, specs):
    """Planned once here (every rank would make the same plan) and shipped to the ranks."""
    b = Spec(mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1), (B, T), "int64")
    return plan_module(_model(name), b, b, specs=specs, forward=_loss, compute=ComputeModel.cpu())


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_hugging_face_model_trains_through_parallelize_as_on_one_process_and_resumes_elsewhere(
    pool4, name, tmp_path
):
    batches = _batches(5)
    model = _model(name)
    want = reference_steps(model, _loss, _adamw(model.parameters()), batches, CLIP)
    assert any(norm > CLIP for _, norm in want)  # clipping takes part
    path = str(tmp_path / "ckpt")
    grid = Mesh.create((2, 2), ("dp", "tp"))
    make_model = functools.partial(_model, name)
    planned = _plan(name, grid, SPECS[name])
    for got, _, _ in pool4.run(
        train_planned, planned, make_model, _adamw, batches[:3], CLIP, save=path
    ):
        for (la, na), (lb, nb) in zip(got, want[:3], strict=True):
            assert abs(la - lb) <= 1e-12 * abs(lb) and abs(na - nb) <= 1e-12 * abs(nb), (got, want)
    line = Mesh.create((4,), ("dp",))
    planned = _plan(name, line, {"*": "S(0)"})
    for got, _, _ in pool4.run(
        train_planned, planned, make_model, _adamw, batches[3:], CLIP, resume=path
    ):
        for (la, na), (lb, nb) in zip(got, want[3:], strict=True):
            assert abs(la - lb) <= 1e-12 * abs(lb) and abs(na - nb) <= 1e-12 * abs(nb), (got, want)

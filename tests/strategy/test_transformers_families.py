"""A dozen model families of the transformers library, planned whole on a (2, 4) mesh.

Tiny configs (hidden 16, one layer, vocabulary 64, sequence 8), float64, training
mode with dropout on where the family has it: decoders (GPT-2, Llama, OPT), encoder-decoders
called with labels only, as users call them (T5, BART: the decoder's input is the labels
shifted right inside the step, a write into a strided view), an encoder (BERT), vision
(ViT's patch-embedding convolution, ResNet's convolutions, batch norm and pooling), a
state-space model (Mamba: depthwise conv1d, softplus, its scan, float32 casts), ALiBi
attention (BLOOM's baddbmm, MPT) and a mixture of experts routed by topk (Mixtral). Each
is planned with ``plan_module`` and ``strict=True`` (an op without a rule is an error, so
none runs replicated for want of one), run for every rank in the simulator, and compared
with one process drawing from the same stream (:func:`~meshplan.runtime.run_unsharded`):
the loss, every gradient and every buffer the step writes within 1e-12 norm-wise
relative error (``||sharded - one|| / ||one||`` per tensor). Families without dropout
are also compared with eager torch. A mixture of experts looping over ``nonzero``'s
result is refused by name.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.runtime import run_unsharded, simulate_program
from meshplan.strategy import ComputeModel, plan_module

tf = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # transformers imports, traces and plans in seconds per family

V, D, B, T = 64, 16, 4, 8
P = 0.1  # dropout probability where a family has dropout


def _family(name: str) -> torch.nn.Module:
    """The family's tiny model (seeded weights), float64, in training mode."""
    torch.manual_seed(0)
    heads = dict(num_attention_heads=2)
    if name == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=V, n_positions=16, n_embd=D, n_layer=1, n_head=2,
            resid_pdrop=P, embd_pdrop=P, attn_pdrop=P, attn_implementation="eager",
        )  # fmt: skip
        model = tf.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = tf.LlamaConfig(
            vocab_size=V, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=1,
            num_key_value_heads=1, max_position_embeddings=16, attn_implementation="sdpa",
            **heads,
        )  # fmt: skip
        model = tf.LlamaForCausalLM(cfg)
    elif name == "opt":
        cfg = tf.OPTConfig(
            vocab_size=V, hidden_size=D, num_hidden_layers=1, ffn_dim=2 * D,
            max_position_embeddings=16, word_embed_proj_dim=D, dropout=P,
            attention_dropout=P, **heads,
        )  # fmt: skip
        model = tf.OPTForCausalLM(cfg)
    elif name == "t5":
        cfg = tf.T5Config(
            vocab_size=V, d_model=D, d_kv=8, d_ff=2 * D, num_layers=1, num_decoder_layers=1,
            num_heads=2, relative_attention_num_buckets=8, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0,
        )  # fmt: skip
        model = tf.T5ForConditionalGeneration(cfg)
    elif name == "bart":
        cfg = tf.BartConfig(
            vocab_size=V, d_model=D, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * D,
            decoder_ffn_dim=2 * D, max_position_embeddings=16, dropout=P,
            attention_dropout=P, activation_dropout=P,
        )  # fmt: skip
        model = tf.BartForConditionalGeneration(cfg)
    elif name == "bert":
        cfg = tf.BertConfig(
            vocab_size=V, hidden_size=D, num_hidden_layers=1, intermediate_size=2 * D,
            max_position_embeddings=16, hidden_dropout_prob=P,
            attention_probs_dropout_prob=P, **heads,
        )  # fmt: skip
        model = tf.BertForMaskedLM(cfg)
    elif name == "vit":
        cfg = tf.ViTConfig(
            image_size=8, patch_size=4, num_channels=3, hidden_size=D, num_hidden_layers=1,
            intermediate_size=2 * D, num_labels=4, hidden_dropout_prob=P,
            attention_probs_dropout_prob=P, **heads,
        )  # fmt: skip
        model = tf.ViTForImageClassification(cfg)
    elif name == "resnet":
        cfg = tf.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
            layer_type="basic", num_labels=4,
        )  # fmt: skip
        model = tf.ResNetForImageClassification(cfg)
    elif name == "mamba":
        cfg = tf.MambaConfig(
            vocab_size=V, hidden_size=D, state_size=4, num_hidden_layers=1, expand=2,
            conv_kernel=4, time_step_rank=4,
        )  # fmt: skip
        model = tf.MambaForCausalLM(cfg)
    elif name == "bloom":
        cfg = tf.BloomConfig(
            vocab_size=V, hidden_size=D, n_layer=1, n_head=2, hidden_dropout=P,
            attention_dropout=P,
        )  # fmt: skip
        model = tf.BloomForCausalLM(cfg)
    elif name == "mpt":
        cfg = tf.MptConfig(
            vocab_size=V, d_model=D, n_layers=1, n_heads=2, max_seq_len=16,
            expansion_ratio=2, resid_pdrop=P, emb_pdrop=P, attn_config={"attn_pdrop": 0},
        )  # fmt: skip
        model = tf.MptForCausalLM(cfg)
    elif name.startswith("mixtral"):
        cfg = tf.MixtralConfig(
            vocab_size=V, hidden_size=D, intermediate_size=D, num_hidden_layers=1,
            num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=16,
            experts_implementation="eager" if name.endswith("eager") else "batched_mm",
            **heads,
        )  # fmt: skip
        model = tf.MixtralForCausalLM(cfg)
    else:
        raise KeyError(name)
    return model.double().train()


# T5 without dropout: its step (the labels shifted right inside it) is checked against
# eager torch too; BART's with dropout against one process drawing the same masks
DROPOUT = {"gpt2", "opt", "bart", "bert", "vit", "bloom", "mpt"}
# the router's float32 softmax: the traced program (decomposed) and eager torch round it
# apart by ~1e-7; the sharded step still equals the traced one on one process
NOT_EAGER = DROPOUT | {"mixtral"}
FAMILIES = ["gpt2", "llama", "opt", "t5", "bart", "bert", "vit", "resnet", "mamba", "bloom"]
FAMILIES += ["mpt", "mixtral"]


def _batch(name: str):
    """The batch's tensors and the step's loss as ``forward(model, *batch)``."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (B, T), generator=g)
    labels = torch.randint(1, V, (B, T), generator=g)
    if name in ("vit", "resnet"):
        side = 8 if name == "vit" else 16
        px = torch.randn(B, 3, side, side, dtype=torch.float64, generator=g)
        return (px, torch.randint(0, 4, (B,), generator=g)), _image_loss
    # the encoder-decoders as users call them: labels only, so the decoder's input is the
    # labels shifted right inside the step (a write into a strided view of a new tensor)
    return (ids, labels), _lm_loss


def _image_loss(m, x, y):
    return m(pixel_values=x, labels=y).loss


def _lm_loss(m, a, y):
    return m(input_ids=a, labels=y).loss


def _close(got, want, what, tol=1e-12):
    # norm-wise relative error ||got - want|| / ||want|| of the whole tensor; a gradient
    # that is zero in exact arithmetic (a key projection's bias under softmax) is rounding
    # noise, read against a norm of 1e-6
    want = want.double()
    err = ((got.double() - want).norm() / want.norm().clamp_min(1e-6)).item()
    assert err <= tol, f"{what}: relative error {err:.3g}"


@pytest.mark.parametrize("name", FAMILIES)
def test_a_transformers_family_plans_every_op_and_its_step_equals_one_process(name):
    model = _family(name)
    mesh = Mesh.create((2, 4), ("dp", "tp"))
    tensors, forward = _batch(name)
    specs = [
        Spec(mesh, [Shard(0), Replicate()], t.shape, str(t.dtype).removeprefix("torch."))
        for t in tensors
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own notes (slow reference kernels)
        mp = plan_module(
            model,
            *specs,
            forward=forward,
            specs={"*weight": "R S(0)"},
            strict=True,
            compute=ComputeModel.cpu(),
            max_options=4,  # the cheapest few strategies per op: a check of rules, not of the solver
        )
    assert mp.program.replicated == 0 and not mp.program.fallbacks
    state = {n: t.detach().clone() for n, t in model.named_parameters()}
    state.update((n, t.detach().clone()) for n, t in model.named_buffers())
    args = mp.arguments(state, *tensors)
    locals_ = [shard(t, s) for t, s in zip(args, mp.program.arg_specs, strict=True)]
    outs, grads = simulate_program(mp.program, *locals_, seed=7, step=2)
    one, one_grads = run_unsharded(mp.program, *args, seed=7, step=2)
    _close(unshard(outs[0], mp.program.out_specs[0]), one[0], "loss")
    params = dict(model.named_parameters())
    named, grad_specs = mp.named(grads), mp.named(mp.program.grad_specs)
    one_named = mp.named(one_grads)
    for n in mp.names:
        if n in params:
            _close(unshard(named[n], grad_specs[n]), one_named[n], f"gradient of {n}")
    written, one_written = mp.state_after(outs), mp.state_after(one)
    for n in mp.written:
        _close(unshard(written[n], mp.specs[n]), one_written[n], f"buffer {n}")
    if name in NOT_EAGER:
        return
    # no random draw: the traced program on whole tensors is eager torch's step too
    loss = forward(model, *tensors)
    loss.backward()
    _close(one[0], loss.detach(), "loss against eager")
    for n, p in params.items():
        if n in one_named and p.grad is not None:
            _close(one_named[n], p.grad, f"eager gradient of {n}")
    buffers = dict(model.named_buffers())
    for n in mp.written:
        _close(one_written[n], buffers[n], f"eager buffer {n}")


def test_a_mixture_of_experts_looping_over_nonzero_is_refused_naming_the_op():
    model = _family("mixtral-eager")
    mesh = Mesh.create((2, 4))
    tensors, forward = _batch("mixtral-eager")
    specs = [Spec(mesh, [Shard(0), Replicate()], t.shape, "int64") for t in tensors]
    expected = pytest.raises(StrategyError, match="nonzero.*depends on the data.*mask instead")
    with expected, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan_module(model, *specs, forward=forward)

"""The parts of examples/train.py a user replaces with their own: the models, a synthetic
token stream, console lines of planning progress, and finding the latest checkpoint."""

from __future__ import annotations

import argparse
import math
import os
import re
import time

import torch
import torch.nn.functional as F

from meshplan.checkpoint import INDEX_NAME, load, read_metadata
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Spec

MODEL = dict(vocab=64, dim=32, heads=4, layers=2, seq=16, batch=16)

# -- the models -------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, g: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        D, L = MODEL["dim"], MODEL["layers"]

        def w(*shape, std):
            return torch.nn.Parameter(torch.randn(shape, generator=g, dtype=dtype) * std)

        self.ln1_w, self.ln2_w = (torch.nn.Parameter(torch.ones(D, dtype=dtype)) for _ in "12")
        self.ln1_b, self.ln2_b = (torch.nn.Parameter(torch.zeros(D, dtype=dtype)) for _ in "12")
        self.wq, self.wk, self.wv = (w(D, D, std=D**-0.5) for _ in "qkv")
        self.wo = w(D, D, std=D**-0.5 / math.sqrt(2 * L))  # residual projections start small
        self.w1, self.w2 = (
            w(D, 4 * D, std=D**-0.5),
            w(4 * D, D, std=(4 * D) ** -0.5 / math.sqrt(2 * L)),
        )

    def forward(self, x):
        B, T, D = x.shape
        H = MODEL["heads"]
        h = F.layer_norm(x, (D,), self.ln1_w, self.ln1_b)
        q, k, v = (
            (h @ w).view(B, T, H, D // H).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(B, T, D) @ self.wo
        h = F.layer_norm(x, (D,), self.ln2_w, self.ln2_b)
        return x + F.gelu(h @ self.w1) @ self.w2


class GPT(torch.nn.Module):
    """``--model gpt``: embedding, pre-norm attention + MLP blocks, a head; its loss."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)  # the same weights on every rank and in --check
        V, D = MODEL["vocab"], MODEL["dim"]
        self.tok_emb = torch.nn.Parameter(torch.randn(V, D, generator=g, dtype=dtype) * 0.02)
        self.h = torch.nn.ModuleList(Block(g, dtype) for _ in range(MODEL["layers"]))
        self.ln_f_w = torch.nn.Parameter(torch.ones(D, dtype=dtype))
        self.ln_f_b = torch.nn.Parameter(torch.zeros(D, dtype=dtype))
        self.head = torch.nn.Parameter(torch.randn(D, V, generator=g, dtype=dtype) * D**-0.5)

    def forward(self, tok, tgt):
        x = F.embedding(tok, self.tok_emb)
        for block in self.h:
            x = block(x)
        x = F.layer_norm(x, (x.shape[-1],), self.ln_f_w, self.ln_f_b)
        return F.cross_entropy((x @ self.head).flatten(0, 1), tgt.flatten())


class EncoderLM(torch.nn.Module):
    """``--model encoder``: torch's nn.TransformerEncoderLayer stack, causal, pre-norm."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        V, D, H, L = MODEL["vocab"], MODEL["dim"], MODEL["heads"], MODEL["layers"]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(V, D, dtype=dtype)
            self.layers = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(
                    D, H, 4 * D, dropout=0.0, batch_first=True, norm_first=True, dtype=dtype
                )
                for _ in range(L)
            )
            self.head = torch.nn.Linear(D, V, dtype=dtype)

    def forward(self, tok, tgt):
        x = self.embed(tok)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tok.shape[1], dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return F.cross_entropy(self.head(x).flatten(0, 1), tgt.flatten())


class HFLM(torch.nn.Module):
    """``--model hf-gpt2`` / ``hf-llama``: a tiny transformers model (``pip install transformers``)."""

    def __init__(self, kind: str, dtype: torch.dtype) -> None:
        super().__init__()
        import transformers

        V, D, H, L, T = (MODEL[k] for k in ("vocab", "dim", "heads", "layers", "seq"))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            if kind == "hf-gpt2":
                cfg = transformers.GPT2Config(
                    vocab_size=V, n_positions=T, n_embd=D, n_layer=L, n_head=H, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                )  # fmt: skip
                self.lm = transformers.GPT2LMHeadModel(cfg).to(dtype)
            else:
                cfg = transformers.LlamaConfig(
                    vocab_size=V, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=L,
                    num_attention_heads=H, num_key_value_heads=H // 2, max_position_embeddings=T,
                    bos_token_id=0, eos_token_id=0,
                )  # fmt: skip
                self.lm = transformers.LlamaForCausalLM(cfg).to(dtype)

    def forward(self, tok, tgt):  # the loss in the model's dtype (transformers' upcasts)
        return F.cross_entropy(self.lm(input_ids=tok).logits.flatten(0, 1), tgt.flatten())


# -- data: a deterministic synthetic token stream -------------------------------------


class Stream:
    """Batches of sequences following x[t+1] = (5 x[t] + c) mod V with 10% noise tokens;
    its position and generator state are part of the training state."""

    def __init__(self, seed: int = 1234) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, V, g = MODEL["batch"], MODEL["seq"], MODEL["vocab"], self.gen
        x = torch.empty(B, T + 1, dtype=torch.int64)
        x[:, 0] = torch.randint(0, V, (B,), generator=g)
        c = torch.randint(1, 4, (B,), generator=g)
        for t in range(T):
            x[:, t + 1] = (5 * x[:, t] + c) % V
        noise = torch.rand(B, T + 1, generator=g) < 0.1
        x = torch.where(noise, torch.randint(0, V, (B, T + 1), generator=g), x)
        self.position += 1
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()


# -- console and files ------------------------------------------------------------------


class Progress:
    """plan_program's progress as console lines: each stage's start and end, and in
    between a line at most every 2 s."""

    WHAT = {
        "trace": "tracing forward + backward on fake tensors",
        "strategies": "ops given their candidate strategies",
        "prices": "layout pairs priced (a redistribution planned for each)",
        "solve": "solver round (prices the layout pairs its answer uses)",
        "moves": "assembling the program's ops and moves",
    }

    def __init__(self, say, every: float = 2.0) -> None:
        self.say, self.every, self.stage, self.last = say, every, None, 0.0
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if stage == self.stage and now - self.last < self.every and not (total and done == total):
            return
        self.stage, self.last = stage, now
        what = self.WHAT.get(stage, stage)
        if stage == "trace":
            what = "traced forward + backward" if done else what
        elif total:
            what = f"{done}/{total} {what}"
        elif stage == "solve":
            what = f"{done}: {what}"
        self.say(f"  {now - self.t0:5.1f} s  {what}")


def chosen_layouts(planned) -> list[str]:
    """One line per parameter group (the layers' copies together): its chosen placements."""
    groups: dict[str, dict[str, list[str]]] = {}
    for name, spec in planned.specs.items():
        group = re.sub(r"\.\d+\.", ".*.", name)
        placements = " ".join(str(p) for p in spec.placements)
        groups.setdefault(group, {}).setdefault(placements, []).append(
            re.sub(r"\D", "", name) or name
        )
    return [
        f"{g:<10} "
        + (
            "; ".join(f"{','.join(n)}: {p}" for p, n in by.items())
            if len(by) > 1
            else next(iter(by))
        )
        for g, by in groups.items()
    ]


def resolve_resume(path: str) -> str:
    """A step's checkpoint directory, or the latest ``step-<k>`` under ``path``."""
    if os.path.exists(os.path.join(path, INDEX_NAME)):
        return path
    found = os.listdir(path) if os.path.isdir(path) else []
    steps = [
        int(e[5:])
        for e in found
        if e.startswith("step-")
        and e[5:].isdigit()
        and os.path.exists(os.path.join(path, e, INDEX_NAME))
    ]
    if not steps:
        raise SystemExit(
            f"--resume {path!r}: neither a checkpoint (no {INDEX_NAME}) nor a folder of step-<k> checkpoints"
        )
    return os.path.join(path, f"step-{max(steps)}")


def check_resume(opts: argparse.Namespace) -> bool:
    """Before any planning: the checkpoint exists, its dtype becomes this run's, and it
    stops short of ``--steps``; returns False when training is already done."""
    path = resolve_resume(opts.resume)
    meta = read_metadata(path)
    saved = next(
        t.dtype for k, t in sorted(meta.tensors.items()) if not k.startswith(("state.", "optim."))
    )
    if opts.dtype not in (None, saved):
        raise SystemExit(
            f"--resume {path!r}: its parameters are {saved} and --dtype is {opts.dtype}; "
            f"resume with --dtype {saved} (or leave --dtype out)"
        )
    opts.dtype, opts.resume = saved, path
    one = Spec(Mesh.create(1), [Replicate()], meta["state.counters"].shape, "int64")
    step = int(load(path, {"state.counters": one}, rank=0)["state.counters"].local[0])
    if step >= opts.steps:
        print(
            f"--resume {path!r}: the checkpoint is of step {step} and --steps is {opts.steps}: "
            f"training is already done (give --steps above {step} to go on)"
        )
        return False
    return True

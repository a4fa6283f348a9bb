"""Small torch versions of the model families real programs come from (float64, tiny).

Each family is an ``nn.Module`` written the way its upstream writes it, so its trace holds
the ops that upstream's does:

- ``GPT2``: Hugging Face GPT-2 style: ``Conv1D`` projections (addmm with an (in, out)
  weight), one fused q/k/v projection split with ``split``, an eager causal attention
  whose mask is a ``tril`` buffer sliced to the sequence and applied with ``where``,
  tanh GELU, tied head, position ids from ``arange``, labels shifted by ``F.pad`` and a
  slice.
- ``Llama``: Hugging Face Llama style: RMSNorm in float32 math, rotary embedding with
  ``rotate_half`` (slices and ``cat``) from an ``inv_freq`` buffer and position ids built
  by ``new_ones`` + ``cumsum``, grouped-query attention (``repeat_interleave`` of k/v
  heads) on SDPA with a ``triu`` mask, SwiGLU MLP; ``complex_rope=True`` rotates as
  torchtitan does (``view_as_complex`` times a ``polar`` buffer, ``view_as_real``).
- ``EncoderStack``: torch's own ``nn.TransformerEncoderLayer`` (packed ``in_proj`` of
  ``nn.MultiheadAttention``, post-norm, ReLU), dropout 0, on an embedding.
- ``NanoGPT``: nanoGPT: fused ``c_attn`` split, ``F.scaled_dot_product_attention``
  causal, tied weights, ``arange`` positions.

Each model takes token ids and targets and returns the mean cross-entropy loss.
``param_specs(mesh)`` gives FSDP (dim 0 of the mesh) x TP (dim 1) specs by glob pattern.
"""

from __future__ import annotations

import fnmatch
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from meshplan.placement import Replicate, Shard

__all__ = ["FAMILIES", "make", "batch", "param_specs"]

V, D, H, T, B = 16, 16, 4, 8, 4


class Conv1D(nn.Module):
    """GPT-2's linear layer: ``x @ w + b`` with an (in, out) weight, as addmm."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf, dtype=torch.float64) / nx**0.5)
        self.bias = nn.Parameter(torch.zeros(nf, dtype=torch.float64))

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(-1),)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(shape)


class GPT2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, dtype=torch.float64)
        self.c_attn = Conv1D(3 * D, D)
        self.c_proj = Conv1D(D, D)
        self.ln_2 = nn.LayerNorm(D, dtype=torch.float64)
        self.c_fc = Conv1D(4 * D, D)
        self.mlp_proj = Conv1D(D, 4 * D)
        self.register_buffer("bias", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, H, d // H).permute(0, 2, 1, 3) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // H)
        mask = self.bias[:t, :t]
        w = torch.where(mask, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        a = torch.matmul(w.softmax(dim=-1), v).permute(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.c_proj(a)
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp_proj(h)


class GPT2(nn.Module):
    def __init__(self, layers: int = 1) -> None:
        super().__init__()
        self.wte = nn.Embedding(V, D, dtype=torch.float64)
        self.wpe = nn.Embedding(T, D, dtype=torch.float64)
        self.h = nn.ModuleList(GPT2Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(D, dtype=torch.float64)

    def forward(self, ids, labels):
        pos = torch.arange(ids.shape[-1], dtype=torch.long, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)[None]
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        # the label shift of transformers' loss: pad with the ignore index, drop the first
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
        return F.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100)


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=torch.float64))

    def forward(self, x):
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + 1e-6).to(x.dtype)
        return self.weight * x


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, kv_heads: int, complex_rope: bool) -> None:
        super().__init__()
        hd = D // H
        self.kv = kv_heads
        self.complex_rope = complex_rope
        self.input_layernorm = RMSNorm(D)
        self.q_proj = nn.Linear(D, D, bias=False, dtype=torch.float64)
        self.k_proj = nn.Linear(D, kv_heads * hd, bias=False, dtype=torch.float64)
        self.v_proj = nn.Linear(D, kv_heads * hd, bias=False, dtype=torch.float64)
        self.o_proj = nn.Linear(D, D, bias=False, dtype=torch.float64)
        self.post_attention_layernorm = RMSNorm(D)
        self.gate_proj = nn.Linear(D, 2 * D, bias=False, dtype=torch.float64)
        self.up_proj = nn.Linear(D, 2 * D, bias=False, dtype=torch.float64)
        self.down_proj = nn.Linear(2 * D, D, bias=False, dtype=torch.float64)

    def forward(self, x, cos, sin, freqs_cis, mask):
        b, t, _ = x.shape
        hd = D // H
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, H, hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv, hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv, hd).transpose(1, 2)
        if self.complex_rope:  # torchtitan: complex multiply by a polar buffer
            fc = freqs_cis[:t].view(1, 1, t, hd // 2)
            qc = torch.view_as_complex(q.reshape(b, H, t, hd // 2, 2))
            kc = torch.view_as_complex(k.reshape(b, self.kv, t, hd // 2, 2))
            q = torch.view_as_real(qc * fc).flatten(3)
            k = torch.view_as_real(kc * fc).flatten(3)
        else:  # transformers: rotate_half
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            q = q * c + rotate_half(q) * s
            k = k * c + rotate_half(k) * s
        k = k.repeat_interleave(H // self.kv, dim=1)
        v = v.repeat_interleave(H // self.kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, layers: int = 1, kv_heads: int = 2, complex_rope: bool = False) -> None:
        super().__init__()
        hd = D // H
        self.embed_tokens = nn.Embedding(V, D, dtype=torch.float64)
        self.layers = nn.ModuleList(LlamaBlock(kv_heads, complex_rope) for _ in range(layers))
        self.norm = RMSNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False, dtype=torch.float64)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, ids, labels):
        b, t = ids.shape
        x = self.embed_tokens(ids)
        # position ids and the causal mask as transformers builds them under tracing
        position_ids = ids.new_ones(b, t).cumsum(-1) - 1
        freqs = self.inv_freq[None, :, None].expand(b, -1, 1) @ position_ids[:, None, :].to(
            self.inv_freq.dtype
        )
        emb = torch.cat((freqs.transpose(1, 2), freqs.transpose(1, 2)), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, self.freqs_cis, mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class EncoderStack(nn.Module):
    """An embedding, torch's own ``nn.TransformerEncoderLayer`` s, a head."""

    def __init__(self, layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D, dtype=torch.float64)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                D, H, dim_feedforward=2 * D, dropout=0.0, batch_first=True, dtype=torch.float64
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(D, V, dtype=torch.float64)

    def forward(self, ids, labels):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


class NanoGPTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, dtype=torch.float64)
        self.c_attn = nn.Linear(D, 3 * D, dtype=torch.float64)
        self.c_proj = nn.Linear(D, D, dtype=torch.float64)
        self.ln_2 = nn.LayerNorm(D, dtype=torch.float64)
        self.c_fc = nn.Linear(D, 4 * D, dtype=torch.float64)
        self.mlp_proj = nn.Linear(4 * D, D, dtype=torch.float64)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, layers: int = 1) -> None:
        super().__init__()
        self.wte = nn.Embedding(V, D, dtype=torch.float64)
        self.wpe = nn.Embedding(T, D, dtype=torch.float64)
        self.h = nn.ModuleList(NanoGPTBlock() for _ in range(layers))
        self.ln_f = nn.LayerNorm(D, dtype=torch.float64)
        self.lm_head = nn.Linear(D, V, bias=False, dtype=torch.float64)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, ids, labels):
        pos = torch.arange(0, ids.size(1), dtype=torch.long, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-1)


FAMILIES = {
    "gpt2": GPT2,
    "llama": Llama,
    "llama_complex": lambda layers=1: Llama(layers, complex_rope=True),
    "encoder": EncoderStack,
    "nanogpt": NanoGPT,
}


def make(name: str, layers: int = 1, seed: int = 0) -> nn.Module:
    """The family's model with ``layers`` blocks and seeded weights."""
    torch.manual_seed(seed)
    return FAMILIES[name](layers=layers)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def param_specs(model: nn.Module, ndim: int) -> dict:
    """FSDP on mesh dim 0 x TP on mesh dim 1, by glob pattern (Megatron-style columns/rows),
    the patterns that name one of ``model``'s parameters."""
    R = Replicate()

    def pl(*p):
        return list(p[:ndim]) + [R] * (ndim - len(p[:ndim]))

    col, row = pl(Shard(0), Shard(0)), pl(Shard(0), Shard(1))
    table = {
        # nn.Linear weights are (out, in): column-parallel shards out, row-parallel in
        "*.q_proj.weight": col,
        "*.k_proj.weight": col,
        "*.v_proj.weight": col,
        "*.gate_proj.weight": col,
        "*.up_proj.weight": col,
        "*.o_proj.weight": row,
        "*.down_proj.weight": row,
        "*.c_fc.weight": col,
        "*.mlp_proj.weight": row,
        "*.linear1.weight": col,
        "*.linear2.weight": row,
        "*.in_proj_weight": pl(Shard(0)),
        "*embed*.weight": pl(Shard(0), Shard(1)),
        "wte.weight": pl(Shard(0), Shard(1)),
        "*norm*.weight": pl(R),
        "*ln_*.weight": pl(R),
    }
    names = [n for n, _ in model.named_parameters()]
    return {k: v for k, v in table.items() if any(fnmatch.fnmatchcase(n, k) for n in names)}

"""Programs for the whole-program tests: random op chains and DAGs, and a small transformer.

A random program is a tuple of instructions (picklable, so gloo workers rebuild the very
same function): values 0..n_args-1 are the arguments ``x`` (N, D) and weights (D, D);
each instruction appends one value computed from earlier ones, so later instructions
may read any earlier value (fan-out, residuals). The loss is a sum over the last value.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec
from meshplan.strategy import ComputeModel, plan_program

UNARY = ("gelu", "tanh", "relu", "softmax", "layer_norm", "square", "neg")
BINARY = ("add", "mul", "sub")


def build(program: tuple, n_weights: int):
    """The function of ``(x, *weights)`` that ``program`` describes."""

    def fn(x, *ws):
        vals = [x]
        for ins in program:
            kind = ins[0]
            if kind == "mm":
                _, a, w = ins
                vals.append(vals[a] @ ws[w])
            elif kind in UNARY:
                a = vals[ins[1]]
                if kind == "softmax":
                    vals.append(torch.softmax(a, -1))
                elif kind == "layer_norm":
                    vals.append(F.layer_norm(a, (a.shape[-1],)))
                elif kind == "square":
                    vals.append(a * a)
                else:
                    vals.append(getattr(torch, kind)(a) if kind != "gelu" else F.gelu(a))
            else:
                a, b = vals[ins[1]], vals[ins[2]]
                vals.append({"add": a + b, "mul": a * b, "sub": a - b}[kind])
        return (vals[-1] * vals[-1]).sum() + vals[-1].mean()

    return fn


@st.composite
def programs(draw, *, max_ops: int = 6, n_weights: int = 2):
    n = draw(st.integers(1, max_ops))
    out = []
    for i in range(n):
        have = i + 1
        kind = draw(st.sampled_from(("mm", "mm") + UNARY + BINARY))
        if kind == "mm":
            out.append(("mm", draw(st.integers(0, have - 1)), draw(st.integers(0, n_weights - 1))))
        elif kind in UNARY:
            out.append((kind, draw(st.integers(0, have - 1))))
        else:
            out.append((kind, draw(st.integers(0, have - 1)), draw(st.integers(0, have - 1))))
    return tuple(out)


PLACEMENTS = (Replicate(), Shard(0), Shard(1), Partial())


@st.composite
def arg_specs(draw, mesh: Mesh, n: int, d: int, n_weights: int):
    """Specs of x (n, d) and the weights (d, d), any placements (Partial on weights too)."""
    specs = []
    for shape in [(n, d)] + [(d, d)] * n_weights:
        pl = [draw(st.sampled_from(PLACEMENTS)) for _ in range(mesh.ndim)]
        specs.append(Spec(mesh, pl, shape, "float64"))
    return specs


def meshes(world: int | None = None):
    shapes = [(2,), (3,), (2, 2), (4,), (2, 1, 2), (1, 3)]
    if world is not None:
        shapes = [s for s in shapes if _prod(s) == world] + [(world,)]
    return st.sampled_from(shapes).map(lambda s: Mesh.create(s))


def _prod(s):
    out = 1
    for k in s:
        out *= k
    return out


# -- a two-layer transformer ------------------------------------------------------------


def transformer(tok, emb, *rest, heads: int = 4, layers: int = 2, fused: bool = True):
    """A tiny GPT: embedding, per layer pre-norm attention and MLP with residuals, head, CE.

    ``fused=False`` writes attention out (``softmax(q k^T / sqrt(d)) v``, unmasked), the
    form torch's DTensor has sharding rules for on CPU.
    """
    *ws, head, tgt = rest
    x = F.embedding(tok, emb)
    B, T, D = x.shape
    per = 8
    for layer in range(layers):
        ln1w, ln1b, wq, wk, wv, wo, ln2w, ln2b = ws[layer * per : (layer + 1) * per][:8]
        h = F.layer_norm(x, (D,), ln1w, ln1b)
        q = (h @ wq).view(B, T, heads, D // heads).transpose(1, 2)
        k = (h @ wk).view(B, T, heads, D // heads).transpose(1, 2)
        v = (h @ wv).view(B, T, heads, D // heads).transpose(1, 2)
        if fused:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / (D // heads) ** 0.5)
            a = torch.softmax(scores, dim=-1) @ v
        x = x + a.transpose(1, 2).reshape(B, T, D) @ wo
        h = F.layer_norm(x, (D,), ln2w, ln2b)
        x = x + F.gelu(h @ ws[layers * per + 2 * layer]) @ ws[layers * per + 2 * layer + 1]
    logits = x @ head
    return F.cross_entropy(logits.reshape(B * T, -1), tgt.reshape(B * T))


def transformer_args(mesh: Mesh, *, B=4, T=4, D=8, V=12, layers=2, seed=0, dp=True):
    """Global tensors and FSDP x TP specs for :func:`transformer` (dp = mesh dim 0)."""
    g = torch.Generator().manual_seed(seed)
    R = Replicate()
    nd = mesh.ndim

    def spec(shape, placements, dtype="float64"):
        return Spec(mesh, list(placements) + [R] * (nd - len(placements)), shape, dtype)

    tensors, specs = [], []

    def add(t, placements):
        tensors.append(t)
        specs.append(spec(tuple(t.shape), placements, str(t.dtype).removeprefix("torch.")))

    data = Shard(0) if dp else R
    add(torch.randint(0, V, (B, T), generator=g), [data])
    add(torch.randn(V, D, generator=g, dtype=torch.float64) * 0.5, [Shard(0), Shard(1)][:nd])
    mats = []
    for _ in range(layers):
        add(torch.ones(D, dtype=torch.float64), [R])
        add(torch.zeros(D, dtype=torch.float64), [R])
        for j in range(4):
            tp = Shard(1) if j < 3 else Shard(0)
            add(torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5, [Shard(0), tp][:nd])
        add(torch.ones(D, dtype=torch.float64), [R])
        add(torch.zeros(D, dtype=torch.float64), [R])
    for _ in range(layers):
        mats.append(
            (
                torch.randn(D, 2 * D, generator=g, dtype=torch.float64) / D**0.5,
                [Shard(0), Shard(1)][:nd],
            )
        )
        mats.append(
            (
                torch.randn(2 * D, D, generator=g, dtype=torch.float64) / D**0.5,
                [Shard(1), Shard(0)][:nd],
            )
        )
    for t, p in mats:
        add(t, p)
    add(torch.randn(D, V, generator=g, dtype=torch.float64) / D**0.5, [Shard(0), Shard(1)][:nd])
    add(torch.randint(0, V, (B, T), generator=g), [data])
    return tensors, specs


def planned_transformer(shape: tuple[int, ...]):
    """:func:`transformer` on ``Mesh.create(shape)``: its global tensors and specs
    (:func:`transformer_args`, made afresh) and its program planned with
    ``ComputeModel.cpu()``, planned once per session and shared by the tests that check
    it in the simulator and on gloo (on (2, 2, 2) planning takes ~20 s)."""
    tensors, specs = transformer_args(Mesh.create(shape))
    return tensors, specs, _planned_transformer(tuple(shape))


@functools.cache
def _planned_transformer(shape):
    _, specs = transformer_args(Mesh.create(shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_program(transformer, *specs, compute=ComputeModel.cpu())

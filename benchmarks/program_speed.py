"""Whole-program planning of model families, 1 to 32 layers, on 1-D, 2-D and 3-D meshes.

Each family is written here in torch as an ``nn.Module`` and planned as a function of its
parameters (``torch.func.functional_call``), forward and backward, with a cross-entropy
loss:

* ``gpt2``: learned positions, fused ``c_attn`` (Conv1D, (in, out) weights) split into
  q/k/v, causal attention written out with a mask, GELU (tanh) MLP, LayerNorm, tied head;
* ``llama``: RMSNorm, rotary embeddings (``rotate_half``, cos/sin tables passed as
  replicated arguments), grouped-query attention (4 heads, 2 kv heads, ``repeat_interleave``),
  SwiGLU, untied head;
* ``nanogpt``: ``nn.Linear`` layers, fused q/k/v split, ``F.scaled_dot_product_attention``
  (causal), tied head;
* ``llama3``: torchtitan's Llama3 shape as the AutoParallel side-by-side uses it (dim 64,
  4 heads, no GQA, FFN hidden 256), for the comparison with AutoParallel's plan.

Sizes: dim 64, 4 heads, vocab 128, sequence 32, batch 8 (float32). Parameter specs: on
(8,) every parameter Shard(0) (FSDP); on (2, 4) dp x tp (column-parallel weights split
their output features on tp and their input features on dp, row-parallel the reverse,
norms split on dp, the embedding its rows on dp and features on tp); on (2, 2, 2) the
same on the last two dims with the first replicated (HSDP x TP). The batch is split on
the data-parallel dims.

Per case: cold plan time (the first ``plan_program`` of that model in this process,
tracing included; prices already learned by earlier cases in the process are reused, as
they are meant to be), warm (the traced graph planned again), each as wall and CPU time
(the summary line uses CPU time: the machine may be shared), the method, the proven gap
to ``program.lower_bound``, the op-by-op choice's cost over the whole-program one, the
modeled communication, and the ops left replicated for want of a rule. Writes JSON to
``benchmarks/results/program_speed.json``. ``--quick`` plans 1 and 2 layers of each
family on (8,) and (2, 4) only.
``--auto`` runs ``auto_speed.py`` instead: the planner's choice of parameter layouts
beside hand-written, DP, FSDP and the layouts AutoParallel's memory constraint admits
(its further arguments pass through).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DIM, HEADS, VOCAB, SEQ, BATCH = 64, 4, 128, 32, 8


# -- the families ---------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.attention_norm = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d)
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, D))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, layers: int, kv_heads: int = 2, hidden: int = 256) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(LlamaBlock(DIM, HEADS, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tok, cos, sin):
        x = self.tok_embeddings(tok)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def rope_tables():
    hd = DIM // HEADS
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(SEQ).float(), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


class Conv1D(nn.Module):
    """GPT-2's linear layer: (in, out) weight, x @ w + b."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(d, 4 * d)
        self.mlp_proj = Conv1D(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // self.heads))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        a = torch.softmax(scores, dim=-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.h = nn.ModuleList(GPT2Block(DIM, HEADS) for _ in range(layers))
        self.ln_f = nn.LayerNorm(DIM)

    def forward(self, tok):
        pos = torch.arange(tok.shape[1])
        x = self.wte(tok) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


class NanoBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.h = nn.ModuleList(NanoBlock(DIM, HEADS) for _ in range(layers))
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, tok):
        pos = torch.arange(tok.shape[1])
        x = self.wte(tok) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# how each parameter is split on (dp, tp): "col" splits output features on tp and input
# features on dp, "row" the reverse; (name pattern, kind, output-feature dim)
KINDS = [
    ("*norm*.weight", "norm", 0),
    ("*ln_*.weight", "norm", 0),
    ("*ln_*.bias", "norm", 0),
    ("*.wq.weight", "col", 0),
    ("*.wk.weight", "col", 0),
    ("*.wv.weight", "col", 0),
    ("*.w1.weight", "col", 0),
    ("*.w3.weight", "col", 0),
    ("*.wo.weight", "row", 0),
    ("*.w2.weight", "row", 0),
    ("output.weight", "col", 0),
    ("*c_attn.weight", "col", None),
    ("*c_fc.weight", "col", None),
    ("*c_proj.weight", "row", None),
    ("*mlp_proj.weight", "row", None),
    ("*c_attn.bias", "bias_col", 0),
    ("*c_fc.bias", "bias_col", 0),
    ("*c_proj.bias", "norm", 0),
    ("*mlp_proj.bias", "norm", 0),
    ("tok_embeddings.weight", "emb", 0),
    ("wte.weight", "emb", 0),
    ("wpe.weight", "emb", 0),
]


def _kind(name: str):
    for pattern, kind, out in KINDS:
        if fnmatch.fnmatch(name, pattern):
            return kind, out
    raise KeyError(name)


def param_placements(name: str, module: nn.Module, ndim: int):
    """Placements of a parameter on a 1-D (FSDP), 2-D (dp, tp) or 3-D (R, dp, tp) mesh."""
    from meshplan.placement import Replicate, Shard

    R = Replicate()
    if ndim == 1:
        return [Shard(0)]
    kind, out = _kind(name)
    if out is None:  # GPT-2's Conv1D: (in, out)
        out = 1
    inp = 1 - out
    dp_tp = {
        "norm": (Shard(0), R),
        "emb": (Shard(0), Shard(1)),
        "col": (Shard(inp), Shard(out)),
        "row": (Shard(out), Shard(inp)),
        "bias_col": (Shard(0), Shard(0)),
    }[kind]
    return [R] * (ndim - 2) + list(dp_tp)


FAMILIES = {
    "gpt2": lambda layers: GPT2(layers),
    "llama": lambda layers: Llama(layers, kv_heads=2),
    "nanogpt": lambda layers: NanoGPT(layers),
    "llama3": lambda layers: Llama(layers, kv_heads=HEADS),
}


def program(family: str, layers: int, mesh):
    """The loss as a function of (tokens, targets, *tables, *parameters) and its specs."""
    from meshplan.placement import Replicate, Shard, Spec

    torch.manual_seed(0)
    model = FAMILIES[family](layers)
    named = list(model.named_parameters())  # tied weights appear once
    names = [n for n, _ in named]
    nd = mesh.ndim
    data = [Shard(0)] * (1 if nd < 3 else 2) + [Replicate()] * (nd - (1 if nd < 3 else 2))
    if nd == 1:
        data = [Shard(0)]
    specs = [Spec(mesh, data, (BATCH, SEQ), "int64"), Spec(mesh, data, (BATCH, SEQ), "int64")]
    requires_grad = [False, False]
    tables = list(rope_tables()) if family.startswith("llama") else []
    for t in tables:
        specs.append(Spec(mesh, [Replicate()] * nd, tuple(t.shape), "float32"))
        requires_grad.append(False)
    for n, p in named:
        specs.append(Spec(mesh, param_placements(n, model, nd), tuple(p.shape), "float32"))
        requires_grad.append(True)
    k = len(tables)

    def loss(tok, tgt, *rest):
        params = dict(zip(names, rest[k:], strict=True))
        args = (tok, *rest[:k])
        logits = torch.func.functional_call(model, params, args, tie_weights=True)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(0, 1))

    return loss, specs, requires_grad


# -- one case ----------------------------------------------------------------------------------


def case(family: str, layers: int, shape: tuple[int, ...]) -> dict:
    from meshplan.layout import Mesh
    from meshplan.strategy import plan_program
    from meshplan.strategy.programs._program import plan_graph

    mesh = Mesh.create(shape)
    fn, specs, rg = program(family, layers, mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0, c0 = time.perf_counter(), time.process_time()
        prog = plan_program(fn, *specs, requires_grad=rg)
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        plan_graph(prog.graph, specs)
        warm, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
        greedy = plan_graph(prog.graph, specs, solver="op_by_op")
    total = prog.cost.total
    return {
        "family": family,
        "layers": layers,
        "mesh": list(shape),
        "ops": len(prog.ops),
        "plan_cold_s": cold,
        "plan_warm_s": warm,
        "plan_cold_cpu_s": cold_cpu,
        "plan_warm_cpu_s": warm_cpu,
        "method": prog.method,
        "gap": (total - prog.lower_bound) / total if total else 0.0,
        "comm_us": prog.cost.comm * 1e6,
        "total_us": total * 1e6,
        "op_by_op_total_us": greedy.cost.total * 1e6,
        "replicated_ops": sum(1 for op in prog.ops if op.replicated_fallback),
        "fallbacks": list(prog.fallbacks),
    }


def budget_case(family: str, layers: int, shape: tuple[int, ...]) -> dict:
    """Every parameter chosen, under a whole-step budget midway between the lightest
    plan's peak (carried by the error a budget of one byte raises) and the unbudgeted
    plan's peak: a budget that binds."""
    from meshplan.errors import MemoryBudgetError
    from meshplan.layout import Mesh
    from meshplan.strategy import plan_program

    mesh = Mesh.create(shape)
    fn, specs, rg = program(family, layers, mesh)
    choose = [i for i, r in enumerate(rg) if r]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = plan_program(fn, *specs, requires_grad=rg, choose=choose)
        try:
            plan_program(fn, *specs, requires_grad=rg, choose=choose, memory_budget=1.0)
            light = 0.0
        except MemoryBudgetError as e:  # names the lightest plan's peak: a budget that fits
            light = float(e.most if e.most is not None else e.least)
        budget = (light + free.memory.peak) / 2
        t0, c0 = time.perf_counter(), time.process_time()
        prog = plan_program(fn, *specs, requires_grad=rg, choose=choose, memory_budget=budget)
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    total = prog.cost.total
    return {
        "family": family,
        "layers": layers,
        "mesh": list(shape),
        "budget": budget,
        "peak": prog.memory.peak,
        "free_peak": free.memory.peak,
        "plan_cold_s": cold,
        "plan_cold_cpu_s": cold_cpu,
        "method": prog.method,
        "gap": (total - prog.lower_bound) / total if total else 0.0,
        "total_us": total * 1e6,
        "free_total_us": free.cost.total * 1e6,
    }


def budgets(families, shapes, layers) -> list[dict]:
    """:func:`budget_case` over the sweep, one line each."""
    print(
        f"{'family':<8} {'L':>3} {'mesh':<6} {'budget MB':>9} {'peak MB':>8} {'wall':>8} "
        f"{'cpu':>8} {'gap':>7} {'us':>9} {'free us':>9}  method",
        flush=True,
    )
    rows = []
    for family in families:
        for shape in shapes:
            for n in layers:
                r = budget_case(family, n, shape)
                rows.append(r)
                print(
                    f"{family:<8} {n:>3} {'x'.join(map(str, shape)):<6} "
                    f"{r['budget'] / 1e6:>9.2f} {r['peak'] / 1e6:>8.2f} "
                    f"{r['plan_cold_s']:>7.2f}s {r['plan_cold_cpu_s']:>7.2f}s {r['gap']:>7.2%} "
                    f"{r['total_us']:>9.1f} {r['free_total_us']:>9.1f}  {r['method']}",
                    flush=True,
                )
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 and 2 layers on (8,) and (2,4)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--layers", default=None, help="comma-separated depths (default 1,2,4,8,32)")
    ap.add_argument("--meshes", default=None, help="e.g. 8,2x4,2x2x2")
    ap.add_argument("--auto", action="store_true", help="auto-sharding: see auto_speed.py")
    ap.add_argument(
        "--budgets",
        action="store_true",
        help="also each case with every parameter chosen under a binding whole-step budget",
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--auto" in argv:  # every other argument is auto_speed.py's (--layers, --meshes too)
        sys.path.insert(0, HERE)
        import auto_speed

        return auto_speed.main([a for a in argv if a != "--auto"])
    args, rest = ap.parse_known_args(argv)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    layers = [1, 2] if args.quick else [1, 2, 4, 8, 32]
    meshes = ["8", "2x4"] if args.quick else ["8", "2x4", "2x2x2"]
    if args.layers:
        layers = [int(k) for k in args.layers.split(",")]
    if args.meshes:
        meshes = args.meshes.split(",")
    shapes = [tuple(int(k) for k in m.split("x")) for m in meshes]
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    head = (
        f"{'family':<8} {'L':>3} {'mesh':<6} {'ops':>5} {'cold':>8} {'warm':>8} "
        f"{'cold cpu':>8} {'warm cpu':>8} "
        f"{'gap':>7} {'op-by-op/whole':>14} {'comm us':>9} {'repl':>5}  method"
    )
    print(head, flush=True)
    rows = []
    for family in args.families.split(","):
        for shape in shapes:
            for n in layers:
                r = case(family, n, shape)
                rows.append(r)
                print(
                    f"{family:<8} {n:>3} {'x'.join(map(str, shape)):<6} {r['ops']:>5} "
                    f"{r['plan_cold_s']:>7.2f}s {r['plan_warm_s']:>7.2f}s "
                    f"{r['plan_cold_cpu_s']:>7.2f}s {r['plan_warm_cpu_s']:>7.2f}s {r['gap']:>7.2%} "
                    f"{r['op_by_op_total_us'] / r['total_us']:>14.2f} {r['comm_us']:>9.1f} "
                    f"{r['replicated_ops']:>5}  {r['method']}",
                    flush=True,
                )
    budgeted = budgets(args.families.split(","), shapes, layers) if args.budgets else []
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "program_speed.json"), "w") as f:
        dump = {"loadavg_end": os.getloadavg()[0], "cases": rows, "budgeted": budgeted}
        json.dump(dump, f, indent=1)
    worst = max(r["gap"] for r in rows)
    repl = sum(r["replicated_ops"] for r in rows)

    def time_of(family, n, shape):  # CPU time: the machine may be shared
        for r in rows:
            if (r["family"], r["layers"], tuple(r["mesh"])) == (family, n, shape):
                return r["plan_cold_cpu_s"]
        return None

    fams = args.families.split(",")
    fam = "llama" if "llama" in fams else fams[0]
    big = time_of(fam, 32, (2, 4))
    one, eight = time_of(fam, 1, (2, 4)), time_of(fam, 8, (2, 4))
    big_s = f"{big:.1f} s" if big is not None else "not run"
    one_s = f"{one:.1f} s" if one is not None else "not run"
    ratio = f"{eight / one:.2f}" if one and eight else "not run"
    ratio32 = f"{big / one:.2f}" if one and big else "not run"
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    print(
        f"program_speed: worst gap {worst:.1%}, ops replicated {repl}, 1-layer (2,4) cold "
        f"{one_s} CPU, 32-layer {big_s} CPU ({fam}), 8/1-layer time ratio {ratio}, "
        f"32/1 {ratio32}"
        + (f", worst gap under a budget {max(r['gap'] for r in budgeted):.1%}" if budgeted else "")
    )


if __name__ == "__main__":
    main()

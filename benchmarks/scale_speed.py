"""Real sizes: Llama-3 8B on 64 ranks and 70B on 1,024, planned from the meta device.

Each case builds Hugging Face ``LlamaForCausalLM`` with the published shapes under
``torch.device("meta")`` (bf16; nothing of parameter size is allocated) and plans its
training step with :func:`~meshplan.strategy.plan_module`, every parameter's layout chosen
(``choose=["*"]``) under a whole-step budget of 80 GB per rank (``memory_budget=``:
parameters, gradients, AdamW moments, inputs, saved activations, moved copies and the
transient at the peak). Beside it, the hand-written FSDP x TP plan (parameters sharded on
the first mesh dim, Megatron column/row splits on the last) priced by the same model.

* ``8b``: hidden 4096, intermediate 14336, 32 heads, 8 KV heads, 32 layers, vocab 128256;
  batch 64 x seq 4096 on (dp 8, tp 8), the batch on dp.
* ``70b``: hidden 8192, intermediate 28672, 64 heads, 8 KV heads, 80 layers, vocab 128256;
  batch 16 x seq 4096 on (dp 16, sp 8, tp 8): the batch on dp, the sequence on sp.
* ``70b4d`` (only with ``--cases``): the 70B shapes on a 4-D mesh of 1,024 ranks, (dp 2,
  fsdp 8, sp 8, tp 8): the batch on dp and fsdp, the sequence on sp.

Each case prints the plan time (wall and CPU; the trace's share beside it), the host's peak resident memory
(``resource.getrusage``), the modeled step time, the peak per rank with its parts, what
is recomputed (the planner chooses how many layers, ``recompute="auto"``), the proven
gap, and the hand-written plan's step time and peak with every layer recomputed
(``recompute="always"``: full activation checkpointing). ``--profile`` writes a cProfile of each plan to
``benchmarks/results/scale_speed_<case>.prof``. Last line:
``scale_speed: 8B (8,8) X s, 70B 1024 ranks Y s, worst gap G, peak within budget yes|no``.
Writes ``benchmarks/results/scale_speed.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import time
import warnings

import torch

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import ComputeModel, ProgramWarning, plan_module

HERE = os.path.dirname(os.path.abspath(__file__))
BUDGET = 80e9

CASES = {
    "8b": {
        "config": dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_hidden_layers=32,
        ),
        "mesh": (8, 8),
        "names": ("dp", "tp"),
        "batch": (64, 4096),
    },
    "70b": {
        "config": dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_attention_heads=64,
            num_key_value_heads=8,
            num_hidden_layers=80,
        ),
        "mesh": (16, 8, 8),
        "names": ("dp", "sp", "tp"),
        "batch": (16, 4096),
    },
    "70b4d": {
        "config": dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_attention_heads=64,
            num_key_value_heads=8,
            num_hidden_layers=80,
        ),
        "mesh": (2, 8, 8, 8),
        "names": ("dp", "fsdp", "sp", "tp"),
        "batch": (16, 4096),
    },
}


def _model(config: dict):
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0, **config
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def _step(m, ids):
    return m(input_ids=ids, labels=ids, use_cache=False).loss


def _batch(mesh: Mesh, shape) -> Spec:
    """The batch on the data-parallel dims (every dim but the last two), the sequence on
    the next to last of 3+ dims, replicated on the last."""
    lead = [Shard(0)] * max(1, mesh.ndim - 2)
    placements = lead + ([Shard(1)] if mesh.ndim >= 3 else []) + [Replicate()]
    return Spec(mesh, placements, shape, "int64")


def _hand(mesh: Mesh) -> dict:
    """FSDP x TP by name: FSDP on the first mesh dim, Megatron splits on the last."""
    R, middle = Replicate(), [Replicate()] * (mesh.ndim - 2)
    column = [Shard(1), *middle, Shard(0)]  # nn.Linear weight [out, in]: out split on tp
    row = [Shard(0), *middle, Shard(1)]
    return {
        "*embed_tokens.weight": [Shard(1), *middle, Shard(0)],
        "*q_proj.weight": column,
        "*k_proj.weight": column,
        "*v_proj.weight": column,
        "*gate_proj.weight": column,
        "*up_proj.weight": column,
        "*o_proj.weight": row,
        "*down_proj.weight": row,
        "*norm.weight": [Shard(0), *middle, R],
        "lm_head.weight": column,
    }


def _parts(memory) -> dict:
    keys = ("peak", "params", "grads", "optimizer", "inputs", "activations", "moved", "transient")
    return {k: getattr(memory, k) for k in keys}


def case(name: str, profile: bool) -> dict:
    c = CASES[name]
    mesh = Mesh.create(c["mesh"], c["names"])
    model = _model(c["config"])
    ids = _batch(mesh, c["batch"])
    args = dict(forward=_step, compute=ComputeModel(), max_factor=1 << 12)
    prof = cProfile.Profile() if profile else None
    traced = _Traced()
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProgramWarning)
        chosen = plan_module(
            model, ids, choose=["*"], memory_budget=BUDGET, progress=traced, **args
        )
    if prof:
        prof.disable()
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        prof.dump_stats(os.path.join(HERE, "results", f"scale_speed_{name}.prof"))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # GB (Linux: kB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProgramWarning)
        hand = plan_module(model, ids, specs=_hand(mesh), recompute="always", **args).program
    p = chosen.program
    return {
        "case": name,
        "mesh": list(c["mesh"]),
        "plan_s": wall,
        "plan_cpu_s": cpu,
        "trace_s": traced.wall - t0,
        "trace_cpu_s": traced.cpu - c0,
        "host_peak_gb": rss,
        "step_s": p.cost.total,
        "comm_s": p.cost.comm,
        "compute_s": p.cost.compute,
        "gap": p.cost.total and max(0.0, (p.cost.total - p.lower_bound) / p.cost.total),
        "method": p.method,
        "memory": _parts(p.memory),
        "recomputed": _recomputed(p),
        "hand_recomputed": _recomputed(hand),
        "hand_step_s": hand.cost.total,
        "hand_memory": _parts(hand.memory),
        "fits": p.memory.peak <= BUDGET,
    }


class _Traced:
    """A progress callback noting when the trace ends (wall and CPU clocks)."""

    def __init__(self) -> None:
        self.wall = self.cpu = float("nan")

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage == "trace" and done == total and self.cpu != self.cpu:  # the first trace
            self.wall, self.cpu = time.perf_counter(), time.process_time()


def _recomputed(program) -> str:
    """What the backward recomputes, and what it costs."""
    if not program.recomputed:
        return "nothing"
    return f"{len(program.recomputed)} forward calls ({program.cost.recompute:.3g} s of the step)"


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="8b,70b", help="comma-separated: 8b, 70b, 70b4d")
    parser.add_argument("--profile", action="store_true", help="write a cProfile per plan")
    opts = parser.parse_args()
    rows = []
    for name in opts.cases.split(","):
        r = case(name, opts.profile)
        rows.append(r)
        m, h = r["memory"], r["hand_memory"]
        print(
            f"{name}: mesh {tuple(r['mesh'])} plan {r['plan_s']:.1f} s ({r['plan_cpu_s']:.1f} s CPU; "
            f"trace {r['trace_s']:.1f} s, {r['trace_cpu_s']:.1f} s CPU), "
            f"host peak {r['host_peak_gb']:.2f} GB; step {r['step_s']:.3g} s (comm {r['comm_s']:.3g}, "
            f"compute {r['compute_s']:.3g}), gap {r['gap']:.2%} ({r['method']})"
        )
        print(
            "   peak "
            + _gb(m["peak"])
            + " GB per rank: "
            + ", ".join(f"{k} {_gb(v)}" for k, v in m.items() if k != "peak")
            + f"; recomputed: {r['recomputed']}"
        )
        print(
            f"   hand FSDP x TP: step {r['hand_step_s']:.3g} s, peak {_gb(h['peak'])} GB "
            f"(activations {_gb(h['activations'])}, recomputed: {r['hand_recomputed']}); "
            "chosen/hand step "
            f"{r['step_s'] / r['hand_step_s']:.3f}"
        )
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scale_speed.json"), "w") as f:
        json.dump({"budget": BUDGET, "cases": rows, "load_avg_end": os.getloadavg()}, f, indent=1)
    by = {r["case"]: r for r in rows}

    def t(k: str) -> str:
        return f"{by[k]['plan_s']:.1f}" if k in by else "n/a"

    gap = max(r["gap"] for r in rows)
    fits = "yes" if all(r["fits"] for r in rows) else "no"
    print(
        f"scale_speed: 8B (8,8) {t('8b')} s, 70B 1024 ranks {t('70b')} s, worst gap {gap:.2%}, "
        f"peak within budget {fits}"
    )


if __name__ == "__main__":
    main()

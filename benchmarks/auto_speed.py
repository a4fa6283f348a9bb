"""Auto-sharding: the planner's choice of parameter layouts beside hand-written ones.

For a GPT-2-style block (layer norms, causal attention, GELU MLP; the tiny transformer of
the tests) and a Llama-style block (RMSNorm, causal attention, SwiGLU MLP), at several
depths and meshes, every parameter's layout is priced four ways in meshplan's model
(``plan_program``'s modeled step time; the batch split on mesh dim 0 throughout):

* ``hand``: FSDP x TP specs written by hand (dim 0 FSDP, Megatron column/row splits on
  mesh dim 1, norms whole on tp; further dims replicated);
* ``dp`` and ``fsdp``: pure data parallelism (parameters replicated) and pure FSDP
  (every parameter ``Shard(0)`` on mesh dim 0);
* ``ap-layout``: the cheapest layout AutoParallel's parameter-memory constraint admits.
  AutoParallel's own choices are not reproduced here (it is not installed); its
  constraint with the default factor (``add_parameter_memory_constraint``: the sum over
  parameters of local/global size at most the sum of each one's least) admits exactly
  the layouts where every parameter takes its least local size, so this is
  ``memory_budget`` = the smallest feasible one. Its cost is a lower bound of what
  AutoParallel's choice costs in meshplan's model, whatever it chose;
* ``chosen``: ``plan_program(..., choose=<every parameter>, memory_budget=<hand's>)``.

Prints one row per case and, last, ``auto_sharding: chosen/hand cost X,
chosen/autoparallel-layout cost Y, plan Z s, proven gap G`` (the worst ratios over the
cases, the longest planning time of a choice and the widest gap to its lower bound).
Writes ``benchmarks/results/auto_speed.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "strategy"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _program_cases import transformer, transformer_args  # noqa: E402

from meshplan.layout import Mesh  # noqa: E402
from meshplan.placement import Replicate, Shard, Spec  # noqa: E402
from meshplan.strategy import ComputeModel, plan_graph, plan_program, state_bytes  # noqa: E402

SIZES = {"B": 8, "T": 16, "D": 32, "V": 64}


def llama(tok, emb, *rest, heads: int = 4, layers: int = 1):
    """A Llama-style decoder: RMSNorm, causal attention, SwiGLU MLP, untied head, CE."""
    *ws, norm, head, tgt = rest
    x = F.embedding(tok, emb)
    B, T, D = x.shape

    def rms(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    for i in range(layers):
        n1, wq, wk, wv, wo, n2, w1, w3, w2 = ws[9 * i : 9 * i + 9]
        h = rms(x, n1)
        q, k, v = ((h @ w).view(B, T, heads, D // heads).transpose(1, 2) for w in (wq, wk, wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(B, T, D) @ wo
        h = rms(x, n2)
        x = x + (F.silu(h @ w1) * (h @ w3)) @ w2
    logits = rms(x, norm) @ head
    return F.cross_entropy(logits.reshape(B * T, -1), tgt.reshape(B * T))


def llama_specs(mesh: Mesh, layers: int, B=8, T=16, D=32, V=64) -> list[Spec]:
    """Token/target and FSDP x TP parameter specs of :func:`llama`."""
    R, nd = Replicate(), mesh.ndim

    def spec(shape, placements, dtype="float32"):
        return Spec(mesh, (list(placements) + [R] * nd)[:nd], shape, dtype)

    col, row, norm = [Shard(0), Shard(1)], [Shard(1), Shard(0)], [Shard(0), R]
    specs = [spec((B, T), [Shard(0)], "int64"), spec((V, D), [Shard(0), Shard(1)])]
    for _ in range(layers):
        specs += [spec((D,), norm)] + [spec((D, D), col)] * 3 + [spec((D, D), row)]
        specs += [spec((D,), norm), spec((D, 4 * D), col), spec((D, 4 * D), col)]
        specs += [spec((4 * D, D), row)]
    specs += [spec((D,), norm), spec((D, V), col), spec((B, T), [Shard(0)], "int64")]
    return specs


def gpt_specs(mesh: Mesh, layers: int) -> list[Spec]:
    return transformer_args(mesh, layers=layers, **SIZES)[1]


MODELS = {
    "gpt2": (lambda layers: functools.partial(transformer, layers=layers), gpt_specs),
    "llama": (lambda layers: functools.partial(llama, layers=layers), llama_specs),
}


def _params(specs: list[Spec]) -> list[int]:
    return [i for i, s in enumerate(specs) if s.dtype.startswith("float")]


def _with(specs, params, placements_of) -> list[Spec]:
    out = list(specs)
    for i in params:
        s = specs[i]
        out[i] = Spec(s.mesh, placements_of(s), s.shape, s.dtype)
    return out


def case(model: str, layers: int, shape: tuple[int, ...]) -> dict:
    mesh = Mesh.create(shape)
    make_fn, make_specs = MODELS[model]
    specs = make_specs(mesh, layers)
    params = _params(specs)
    R = Replicate()
    effort = {"compute": ComputeModel.cpu()}
    if mesh.ndim >= 3:
        effort["max_factor"] = 1 << 12
    row = {"model": model, "layers": layers, "mesh": list(shape)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        budget = sum(state_bytes(specs[i], True, None) for i in params)  # FSDP x TP's
        # the choice first and cold: tracing included, no price memoized for this mesh
        t0, c0 = time.perf_counter(), time.process_time()
        chosen = plan_program(make_fn(layers), *specs, choose=params, state_budget=budget, **effort)
        row["chosen"] = {
            "cost_s": chosen.cost.total,
            "memory_b": chosen.memory.total,
            "method": chosen.method,
            "lower_bound_s": chosen.lower_bound,
            "plan_s": time.perf_counter() - t0,
            "plan_cpu_s": time.process_time() - c0,
        }
        graph = chosen.graph

        def priced(name, given, **kw):
            t0 = time.perf_counter()
            p = plan_graph(graph, given, **effort, **kw)
            row[name] = {
                "cost_s": p.cost.total,
                "memory_b": p.memory.total,
                "method": p.method,
                "lower_bound_s": p.lower_bound,
                "plan_s": time.perf_counter() - t0,
            }
            return p

        priced("hand", specs)
        priced("dp", _with(specs, params, lambda s: [R] * mesh.ndim))
        priced(
            "fsdp",
            _with(specs, params, lambda s: [Shard(0)] + [R] * (mesh.ndim - 1)),
        )
        least = sum(
            min(state_bytes(c, True, None) for c in _candidates(specs[i])) for i in params
        )
        priced("ap_layout", specs, choose=params, state_budget=least)
    row["chosen_specs"] = [str(chosen.arg_specs[i]) for i in params]
    return row


def _candidates(spec):
    from meshplan.strategy.programs._auto import layout_candidates

    return layout_candidates(spec)


def _gap(row: dict) -> float:
    bound = row["lower_bound_s"]
    return row["cost_s"] / bound - 1 if bound > 0 else float("inf")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=sorted(MODELS))
    ap.add_argument("--layers", nargs="+", type=int, default=[1])
    ap.add_argument("--meshes", nargs="+", default=["8", "2x4", "2x2x2"])
    args = ap.parse_args(argv)
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    head = (
        f"{'model':<6} {'L':>2} {'mesh':<6} {'hand':>9} {'dp':>9} {'fsdp':>9} {'ap-lay':>9} "
        f"{'chosen':>9} {'ch/hand':>7} {'ch/ap':>6} {'mem ch/hand':>11} {'plan ch':>8} "
        f"{'hand':>6} {'gap':>6} method (plan ch: cold, tracing included; hand: warm; gap: "
        "the chosen cost over its proven lower bound)"
    )
    print(head, flush=True)
    for model in args.models:
        for layers in args.layers:
            for text in args.meshes:
                shape = tuple(int(k) for k in text.split("x"))
                r = case(model, layers, shape)
                rows.append(r)
                c, h = r["chosen"], r["hand"]
                print(
                    f"{model:<6} {layers:>2} {text:<6} {h['cost_s'] * 1e3:>7.3f}ms "
                    f"{r['dp']['cost_s'] * 1e3:>7.3f}ms {r['fsdp']['cost_s'] * 1e3:>7.3f}ms "
                    f"{r['ap_layout']['cost_s'] * 1e3:>7.3f}ms {c['cost_s'] * 1e3:>7.3f}ms "
                    f"{c['cost_s'] / h['cost_s']:>7.3f} {c['cost_s'] / r['ap_layout']['cost_s']:>6.3f} "
                    f"{c['memory_b'] / h['memory_b']:>11.3f} {c['plan_s']:>7.1f}s ({c['plan_cpu_s']:.1f}s CPU) "
                    f"{r['hand']['plan_s']:>5.1f}s {_gap(c):>6.1%} {c['method']}",
                    flush=True,
                )
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "auto_speed.json"), "w") as f:
        json.dump({"sizes": SIZES, "cases": rows, "load_avg_end": os.getloadavg()}, f, indent=1)
    worst_hand = max(r["chosen"]["cost_s"] / r["hand"]["cost_s"] for r in rows)
    worst_ap = max(r["chosen"]["cost_s"] / r["ap_layout"]["cost_s"] for r in rows)
    slowest = max(r["chosen"]["plan_s"] for r in rows)
    widest = max(_gap(r["chosen"]) for r in rows)
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    print(
        f"auto_sharding: chosen/hand cost {worst_hand:.3f}, chosen/autoparallel-layout cost "
        f"{worst_ap:.3f}, plan {slowest:.1f} s, proven gap {widest:.1%}"
    )


if __name__ == "__main__":
    main()

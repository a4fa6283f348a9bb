"""meshplan.strategy.select vs torch 2.13's sharding propagation, on the same ops and specs.

torch 2.13 finds an op's strategy with ``ShardingPropagator.propagate_op_sharding_non_cached``:
for ops with single-mesh-dim rules (mm, bmm, addmm, pointwise) it expands the rules to
every combination over the mesh and prices each (full enumeration). meshplan's
``select`` searches from the current placements outward and stops at a proven
minimum. Both run here on a fake process group of 8 ranks, on the same random input
placements, on meshes (8,), (2, 4) and (2, 2, 2).

Timing, per call (median): torch's non-cached propagation after one warm-up call (its
transform-info cache then stays warm, as it does in a training run); meshplan's
``select`` with every strategy-level cache cleared before each call ("selection
cold": rules re-run, combinations re-assembled, prices re-summed), the planner's plan
cache kept warm like torch's; and, for reference, with the plan cache cleared too
("all cold").

Where the two pick different strategies, both are priced under meshplan's cost model
(the redistribution of every input to the strategy's input specs): meshplan's is the
minimum over its strategies, which include torch's whenever torch's is sound.

    python benchmarks/strategy_speed.py            # all ops, 6 random cases per op and mesh
    python benchmarks/strategy_speed.py --cases 2 --ops mm add

Writes machine-readable results to benchmarks/results/strategy_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "strategy_speed.json"
MESHES = [(8,), (2, 4), (2, 2, 2)]

# op: (input shapes, meshplan args, kinds of inputs that may be Partial)
OPS: dict[str, tuple[list[tuple[int, ...]], dict]] = {
    "mm": ([(256, 128), (128, 64)], {}),
    "bmm": ([(8, 64, 32), (8, 32, 16)], {}),
    "addmm": ([(64,), (256, 128), (128, 64)], {}),
    "add": ([(64, 32), (64, 32)], {}),
    "mul": ([(64, 32), (64, 32)], {}),
    "sum": ([(64, 32)], {"dim": 1}),
    "softmax": ([(64, 32)], {"dim": 1}),
    "transpose": ([(64, 32)], {"dim0": 0, "dim1": 1}),
    "cat": ([(64, 32), (32, 32)], {"dim": 0}),
    "view": ([(16, 8, 32)], {"shape": (128, 32)}),
}


def _x(ratio: float) -> str:
    """A speedup as printed: whole numbers from 10x up, two decimals below."""
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2f}x"


def per_call(
    fn: Callable[[], object], *, repeat: int = 15, setup: Callable[[], object] | None = None
) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls (``setup`` runs untimed before each)."""
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_side():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    aten = torch.ops.aten
    prop = DTensor._op_dispatcher.sharding_propagator
    meshes = {shape: init_device_mesh("cpu", shape) for shape in MESHES}

    def dspec(mesh, placements, shape, dtype=torch.float32):
        t = torch.empty(shape, dtype=dtype)
        return DTensorSpec(
            mesh, tuple(placements), tensor_meta=TensorMeta(t.shape, t.stride(), dtype)
        )

    def schema(op: str, specs, args):
        if op == "mm":
            return OpSchema(aten.mm.default, tuple(specs), {})
        if op == "bmm":
            return OpSchema(aten.bmm.default, tuple(specs), {})
        if op == "addmm":
            return OpSchema(aten.addmm.default, tuple(specs), {})
        if op == "add":
            return OpSchema(aten.add.Tensor, tuple(specs), {})
        if op == "mul":
            return OpSchema(aten.mul.Tensor, tuple(specs), {})
        if op == "sum":
            return OpSchema(aten.sum.dim_IntList, (specs[0], [args["dim"]], False), {})
        if op == "softmax":
            return OpSchema(aten._softmax.default, (specs[0], args["dim"], False), {})
        if op == "transpose":
            return OpSchema(aten.transpose.int, (specs[0], args["dim0"], args["dim1"]), {})
        if op == "cat":
            return OpSchema(aten.cat.default, (list(specs), args["dim"]), {})
        if op == "view":
            return OpSchema(aten.view.default, (specs[0], list(args["shape"])), {})
        raise ValueError(op)

    def expands(sch) -> bool:
        """Whether torch picks this op's strategy by expanding single-mesh-dim rules."""
        return sch.op in prop.op_single_dim_strategy_funcs

    return meshes, dspec, schema, prop, expands


def random_placements(rng: random.Random, ndim: int, mesh_ndim: int, allow_partial: bool):
    from meshplan.placement import Partial, Replicate, Shard

    out = []
    for _ in range(mesh_ndim):
        kind = rng.choice(["R", "S", "P"] if allow_partial else ["R", "S"])
        if kind == "R":
            out.append(Replicate())
        elif kind == "S":
            out.append(Shard(rng.randrange(ndim)))
        else:
            out.append(Partial())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=6, help="random cases per op and mesh")
    parser.add_argument("--ops", nargs="*", default=list(OPS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=15)
    opts = parser.parse_args(argv)
    warnings.simplefilter("ignore")

    from meshplan.layout import Mesh
    from meshplan.placement import Spec, from_torch, to_torch
    from meshplan.redistribute import clear_plan_cache
    from meshplan.strategy import clear_strategy_cache, select
    from meshplan.strategy.selection._price import default_model, redistribute_cost

    t_meshes, dspec, schema, prop, expands = torch_side()
    model = default_model()
    rng = random.Random(opts.seed)
    rows = []
    for shape in MESHES:
        mesh = Mesh.create(shape)
        tmesh = t_meshes[shape]
        for op in opts.ops:
            shapes, args = OPS[op]
            for _ in range(opts.cases):
                specs = tuple(
                    Spec(mesh, random_placements(rng, len(s), len(shape), op != "softmax"), s)
                    for s in shapes
                )
                tspecs = [dspec(tmesh, to_torch(s), s.shape) for s in specs]
                sch = schema(op, tspecs, args)

                # torch: one warm-up call, then the median of repeated non-cached calls
                out = prop.propagate_op_sharding_non_cached(sch)
                t_torch = per_call(
                    lambda sch=sch: prop.propagate_op_sharding_non_cached(sch), repeat=opts.repeat
                )

                # meshplan: warm the plan cache once, then time cold selections
                choice = select(op, specs, **args)

                def run(op=op, specs=specs, args=args):
                    return select(op, specs, **args)

                def all_cold():
                    clear_strategy_cache()
                    clear_plan_cache()

                t_sel = per_call(run, repeat=opts.repeat, setup=clear_strategy_cache)
                t_cold = per_call(run, repeat=max(3, opts.repeat // 3), setup=all_cold)

                # torch's choice, priced under meshplan's model
                if op == "cat":
                    # list inputs: torch's cat redistributes every input to the output's
                    # placements (its schema carries no per-input suggestion)
                    targets = [dspec(tmesh, out.output_spec.placements, s.shape) for s in specs]
                elif out.needs_redistribute and out.redistribute_schema is not None:
                    targets = out.redistribute_schema.args_spec
                else:
                    targets = tspecs
                torch_cost = None
                torch_choice = None
                try:
                    tgt = [
                        from_torch(t.placements, mesh, s.shape, s.dtype, shard_order=t.shard_order)
                        for t, s in zip(targets, specs, strict=True)
                    ]
                    torch_cost = sum(
                        redistribute_cost(s, t, model) for s, t in zip(specs, tgt, strict=True)
                    )
                    torch_choice = ", ".join(str(t) for t in tgt)
                except Exception as e:  # a torch layout meshplan cannot express
                    torch_choice = f"not comparable ({type(e).__name__})"
                same = torch_choice == ", ".join(str(s) for s in choice.input_specs)
                rows.append(
                    {
                        "mesh": list(shape),
                        "op": op,
                        "torch_full_expansion": expands(sch),
                        "inputs": [str(s) for s in specs],
                        "torch_ms": t_torch * 1e3,
                        "meshplan_ms": t_sel * 1e3,
                        "meshplan_all_cold_ms": t_cold * 1e3,
                        "speedup": t_torch / t_sel,
                        "visited": choice.visited,
                        "priced": choice.priced,
                        "states": choice.states,
                        "same_choice": same,
                        "meshplan_choice": [str(s) for s in choice.input_specs],
                        "meshplan_output": str(choice.output_spec),
                        "meshplan_cost_s": choice.cost,
                        "torch_choice": torch_choice,
                        "torch_cost_s": torch_cost,
                    }
                )
                r = rows[-1]
                print(
                    f"{str(shape):10} {op + ('*' if r['torch_full_expansion'] else ''):10}"
                    f"{' | '.join(p.split('(', 1)[1][:-1] for p in r['inputs']):38}"
                    f" torch {r['torch_ms']:7.2f} ms  meshplan {r['meshplan_ms']:6.3f} ms"
                    f" ({_x(r['speedup']):>6}; all cold {r['meshplan_all_cold_ms']:6.2f})"
                    f"  visited {r['visited']:3}/{r['states']:<5}",
                    flush=True,
                )
                if not same:
                    tc = "n/a" if torch_cost is None else f"{torch_cost * 1e6:.2f} us"
                    print(
                        f"{'':21}different choice: meshplan {r['meshplan_choice']} costs "
                        f"{choice.cost * 1e6:.2f} us; torch {torch_choice} costs {tc}"
                    )

    print()
    print("* torch expands single-mesh-dim rules over the whole mesh (full enumeration);")
    print("  the other ops use torch's hand-written, pre-filtered strategies")
    print(
        f"{'mesh':10} {'op':10} {'torch ms':>9} {'meshplan ms':>12} {'speedup':>8} "
        f"{'visited':>8} {'states':>7}"
    )
    summary = []
    for shape in MESHES:
        for op in opts.ops:
            rs = [r for r in rows if tuple(r["mesh"]) == shape and r["op"] == op]
            t = statistics.median(r["torch_ms"] for r in rs)
            m = statistics.median(r["meshplan_ms"] for r in rs)
            v = statistics.mean(r["visited"] for r in rs)
            full = rs[0]["torch_full_expansion"]
            summary.append(
                {
                    "mesh": list(shape),
                    "op": op,
                    "torch_full_expansion": full,
                    "torch_ms": t,
                    "meshplan_ms": m,
                    "speedup": t / m,
                    "visited_mean": v,
                    "states": rs[0]["states"],
                }
            )
            name = op + ("*" if full else "")
            print(
                f"{str(shape):10} {name:10} {t:9.2f} {m:12.3f} {_x(t / m):>8} {v:8.1f} "
                f"{rs[0]['states']:7}"
            )
    worse = [
        r
        for r in rows
        if r["torch_cost_s"] is not None and r["meshplan_cost_s"] > r["torch_cost_s"] * (1 + 1e-9)
    ]
    differ = [r for r in rows if not r["same_choice"]]
    print()
    headline = {}
    for label, pick in (("full-expansion ops", True), ("hand-written torch strategies", False)):
        xs = [x for x in summary if len(x["mesh"]) == 3 and x["torch_full_expansion"] == pick]
        rs = [r for r in rows if len(r["mesh"]) == 3 and r["torch_full_expansion"] == pick]
        if not xs:
            continue
        geo = statistics.geometric_mean(x["speedup"] for x in xs)
        slowest = min(r["speedup"] for r in rs)
        visited = sum(r["visited"] for r in rs)
        states = sum(r["states"] for r in rs)
        headline[label] = {
            "geomean_speedup": geo,
            "min_speedup": slowest,
            "visited": visited,
            "states": states,
        }
        print(
            f"3-D mesh, {label}: speedup geometric mean {_x(geo)} (slowest case {_x(slowest)}); "
            f"visited {visited} of {states} states ({100 * visited / states:.1f}%)"
        )
    print(
        f"different choices: {len(differ)} of {len(rows)}; meshplan's costs more than torch's "
        f"under meshplan's model in {len(worse)}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                "rows": rows,
                "summary": summary,
                "headline_3d": headline,
                "different_choices": len(differ),
                "meshplan_costlier": len(worse),
            },
            indent=1,
        )
    )
    print(f"wrote {RESULTS}")
    if rows:
        worst = min(rows, key=lambda r: r["speedup"])
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"worst selection vs torch's strategy enumeration: {_x(worst['speedup'])} faster "
            f"({worst['op']} on {tuple(worst['mesh'])}; target >= 100x; load average {load:.1f})"
        )
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())

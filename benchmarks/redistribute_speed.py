"""meshplan run/redistribute vs torch 2.13 DTensor.redistribute on gloo, wall time per call.

Both libraries move the same tensors on the same gloo world: one pool of 4 worker
processes on a (2, 2) mesh and one of 8 on a (2, 2, 2) mesh, each with a flattened
alias. torch's DeviceMesh is built from meshplan's own process groups
(``DeviceMesh.from_group``), so each mesh dim's collectives run on the very same gloo
groups; the alias is flattened in both (torch creates its own group for it).

Cases: gathers (even and uneven), S -> S' (meshplan: one all_to_all; torch on CPU:
all_gather then chunk), reductions merged onto the alias ((P, R, P) -> (R, R, R)),
reduce-scatter, a shard-order change (meshplan: one all_permute) and multi-dim
reshards, at several sizes. Every case is first checked on every rank against
``shard(x, dst)`` for both libraries. Times are per call: each rank's best of several
interleaved rounds (8 processes share the machine's cores, so single rounds are noisy),
then the slowest rank; "ratio" is torch / meshplan (above 1: meshplan is faster).
``run`` times a precomputed plan; ``redistribute`` includes the (cached) plan lookup and
the autograd wrapper, like torch's call. By default meshplan plans as a user's call
does when it names no cost model: with the options of the groups' backend
(``ProcessGroups.plan_options()``; on gloo the gloo host preset and the fewest
collectives); ``--model nvlink_ib`` plans with the GPU preset, as a program written for
GPUs would, ``--model gloo_cpu`` with the gloo host preset (least modeled time) and
``--model calibrated`` with ``calibrate(groups)`` measured on the very groups it runs on
(results in ``redistribute_speed_<model>.json``). The results hold the profile each
world planned with, as ``HardwareProfile.to_json`` writes it (so ``meshplan plan
--profile`` can read it back, once saved to a file of its own).

    python benchmarks/redistribute_speed.py            # 4 and 8 ranks, 3 sizes
    python benchmarks/redistribute_speed.py --quick    # smaller sizes, fewer rounds
    python benchmarks/redistribute_speed.py --model calibrated # plans for this hardware

Writes machine-readable results to benchmarks/results/redistribute_speed.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "redistribute_speed.json"

# (name, src placements, dst placements, global shape with "n" the size parameter);
# placements in the text form of meshplan.placement.parse_placements (orders as [i,j])
CASES = {
    4: [
        ("S(0) R -> R R (all_gather)", "S(0) R", "R R", ("n", 64)),
        ("S(0) S(1) -> R R", "S(0) S(1)", "R R", ("n", 64)),
        ("S(0) R -> S(1) R (S->S')", "S(0) R", "S(1) R", ("n", 64)),
        ("S(1) S(0) -> S(0) S(1) (S->S' x2)", "S(1) S(0)", "S(0) S(1)", ("n", 64)),
        ("P P -> R R (alias ab)", "P(sum) P(sum)", "R R", ("n", 64)),
        ("P R -> S(0) R (reduce_scatter)", "P(sum) R", "S(0) R", ("n", 64)),
        ("S(0) S(0) -> order [1,0] (permute)", "S(0) S(0)", "S(0)[1,0] S(0)", ("n", 64)),
        ("uneven S(0) R -> R R", "S(0) R", "R R", ("n+1", 63)),
        ("uneven S(0) S(0) -> S(1) R", "S(0) S(0)", "S(1) R", ("n+1", 63)),
    ],
    8: [
        ("S(0) R R -> R R R (all_gather)", "S(0) R R", "R R R", ("n", 64)),
        ("P R P -> R R R (alias ac)", "P(sum) R P(sum)", "R R R", ("n", 64)),
        ("P R P -> S(0) R R", "P(sum) R P(sum)", "S(0) R R", ("n", 64)),
        ("S(0) R R -> S(1) R R (S->S')", "S(0) R R", "S(1) R R", ("n", 64)),
        ("S(0) S(1) R -> S(1) S(0) R (S->S' x2)", "S(0) S(1) R", "S(1) S(0) R", ("n", 64)),
        ("S(0) S(0) R -> order [1,0] (permute)", "S(0) S(0) R", "S(0)[1,0] S(0) R", ("n", 64)),
        ("S(0) S(1) S(0) -> R R R", "S(0) S(1) S(0)", "R R R", ("n", 64)),
        ("uneven S(0) R S(0) -> R R R", "S(0) R S(0)", "R R R", ("n+1", 63)),
        ("uneven P R P -> R R R", "P(sum) R P(sum)", "R R R", ("n+1", 63)),
    ],
}
MESHES = {
    4: ((2, 2), ("a", "b"), ("a", "b"), "ab"),
    8: ((2, 2, 2), ("a", "b", "c"), ("a", "c"), "ac"),
}
SIZES = {"full": (16, 2048, 16384), "quick": (16, 1024)}  # n: rows of the global tensor


def _shape(template, n):
    return tuple(n if s == "n" else n + 1 if s == "n+1" else s for s in template)


def _placements(text, shape):
    from meshplan.placement import parse_placements

    placements, order = parse_placements(text)
    return placements, shape, "float32", order


# -- worker side ----------------------------------------------------------------------------


def _model(name):
    from meshplan.redistribute import CostModel, HardwareProfile

    return CostModel(getattr(HardwareProfile, name)())


def _bench(world, sizes, budget, rounds, model_name="default"):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from meshplan.layout import Mesh
    from meshplan.placement import Spec, shard_one, to_torch
    from meshplan.redistribute import plan
    from meshplan.runtime import ProcessGroups, redistribute, run

    torch.set_num_threads(1)
    rank = dist.get_rank()
    shape, names, alias_dims, alias = MESHES[world]
    mesh = Mesh.create(shape, names).flatten(alias_dims, alias)
    groups = ProcessGroups(mesh, timeout=120)
    groups.create_all()
    if model_name == "default":  # what a call that names no cost model plans with
        options = groups.plan_options()
        model = None
    elif model_name == "calibrated":
        from meshplan.redistribute import CostModel
        from meshplan.runtime import calibrate

        model = CostModel(calibrate(groups))  # the same profile on every rank
        options = {"cost_model": model}
    else:
        model = _model(model_name)
        options = {"cost_model": model}
    ranks = torch.arange(world).reshape(shape)
    dm = DeviceMesh.from_group(
        [groups.get(n).pg for n in names], "cpu", mesh=ranks, mesh_dim_names=names
    )
    dm[alias_dims]._flatten(alias)
    barrier = groups.get(None)

    def sync():
        t = torch.zeros(1)
        dist.all_reduce(t, group=barrier.pg)

    rows = []
    for name, src_text, dst_text, template in CASES[world]:
        for n in sizes:
            gshape = _shape(template, n)
            src = Spec(mesh, *_placements(src_text, gshape))
            dst = Spec(mesh, *_placements(dst_text, gshape))
            gen = torch.Generator().manual_seed(n)
            x = torch.randint(-8, 9, gshape, generator=gen).float()
            local = shard_one(x, src, rank)
            want = shard_one(x, dst, rank)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p = plan(src, dst, **options)
            dt = DTensor.from_local(
                local, dm, to_torch(src), run_check=False, shape=x.shape, stride=x.stride()
            )
            tdst = to_torch(dst)

            def mp_run(p=p, local=local):
                return run(p, local, groups)

            def mp_redistribute(src=src, dst=dst, local=local):
                return redistribute(local, src, dst, groups, cost_model=model)

            def torch_redistribute(dt=dt, tdst=tdst):
                return dt.redistribute(dm, tdst).to_local()

            impls = {"run": mp_run, "redistribute": mp_redistribute, "torch": torch_redistribute}
            ok = {}
            for key, fn in impls.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = fn()
                ok[key] = bool(torch.equal(out, want)) if not dst.is_partial else True
            with CommDebugMode() as comm, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch_redistribute()
            torch_collectives = comm.get_total_counts()
            # calls per round: about `budget` seconds of the slowest implementation
            sync()
            start = time.perf_counter()
            for fn in impls.values():
                fn()
            sync()
            once = time.perf_counter() - start
            t = torch.tensor([once])
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=barrier.pg)
            calls = max(3, min(2000, int(budget / max(float(t), 1e-6))))
            times = {key: [] for key in impls}
            for _ in range(rounds):
                for key, fn in impls.items():
                    sync()
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    sync()
                    times[key].append((time.perf_counter() - start) / calls)
            rows.append(
                {
                    "case": name,
                    "world": world,
                    "shape": list(gshape),
                    "bytes": math.prod(gshape) * 4,
                    "calls": calls,
                    "plan": [str(s) for s in p.steps],
                    "collectives": {"meshplan": len(p.collectives), "torch": torch_collectives},
                    "correct": ok,
                    "seconds": {k: min(v) for k, v in times.items()},
                    "median_seconds": {k: statistics.median(v) for k, v in times.items()},
                }
            )
    used = options["cost_model"]
    return {
        "rows": rows,
        "profile": json.loads(used.profile.to_json()),
        "objective": options.get("objective", "time"),
    }


# -- parent side ----------------------------------------------------------------------------


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:7.0f} us"
    return f"{seconds * 1e3:7.2f} ms"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _load() -> str:
    import os

    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 8], choices=[4, 8])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--model",
        choices=["default", "nvlink_ib", "gloo_cpu", "calibrated"],
        default="default",
        help="the cost model meshplan plans with: the groups' backend's (what a call "
        "naming none gets), a preset, or calibrate() on these groups",
    )
    args = parser.parse_args(argv)

    import torch

    from meshplan.runtime import WorkerPool

    sizes = SIZES["quick" if args.quick else "full"]
    # many short rounds: on a shared machine the best of each is likelier to be a quiet one
    budget, rounds = (0.03, 5) if args.quick else (0.06, 12)
    rows = []
    profiles = {}  # world -> the profile meshplan planned with (calibrated: measured there)
    objectives = {}  # world -> the plan objective ("time" or "collectives")
    for world in args.worlds:
        with WorkerPool(world, "gloo", timeout=1800) as pool:
            per_rank = pool.run(_bench, world, sizes, budget, rounds, args.model)
        profiles[str(world)] = per_rank[0]["profile"]
        objectives[str(world)] = per_rank[0]["objective"]
        per_rank = [r["rows"] for r in per_rank]
        for i, row in enumerate(per_rank[0]):
            # the slowest rank's time and correctness on every rank
            for field in ("seconds", "median_seconds"):
                for key in row[field]:
                    row[field][key] = max(r[i][field][key] for r in per_rank)
            for key in row["correct"]:
                row["correct"][key] = all(r[i]["correct"][key] for r in per_rank)
            rows.append(row)

    head = (
        f"{'case':40} {'world':>5} {'global':>10} {'coll mp/torch':>13} "
        f"{'run':>10} {'redistribute':>12} {'torch':>10} {'ratio':>6} {'ratio*':>6}"
    )
    print(
        f"redistribute wall time per call on gloo (slowest rank, best of rounds); meshplan "
        f"plans with --model {args.model} (objective {'/'.join(sorted(set(objectives.values())))})"
    )
    print("ratio = torch / run, ratio* = torch / redistribute (> 1: meshplan faster)\n")
    print(head)
    print("-" * len(head))
    for row in rows:
        s = row["seconds"]
        row["ratio_run"] = s["torch"] / s["run"]
        row["ratio_redistribute"] = s["torch"] / s["redistribute"]
        flags = (
            ""
            if all(row["correct"].values())
            else "  wrong: " + ",".join(k for k, v in row["correct"].items() if not v)
        )
        coll = f"{row['collectives']['meshplan']}/{row['collectives']['torch']}"
        print(
            f"{row['case'][:40]:40} {row['world']:>5} {_fmt_bytes(row['bytes']):>10} "
            f"{coll:>13} {_fmt(s['run']):>10} {_fmt(s['redistribute']):>12} "
            f"{_fmt(s['torch']):>10} {row['ratio_run']:6.2f} {row['ratio_redistribute']:6.2f}"
            f"{flags}"
        )
    ratios = [r["ratio_redistribute"] for r in rows]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    worst = min(rows, key=lambda r: r["ratio_redistribute"])
    run_ratios = [r["ratio_run"] for r in rows]
    run_geo = math.exp(sum(map(math.log, run_ratios)) / len(run_ratios))
    report = {
        "benchmark": "redistribute_speed",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "sizes": list(sizes),
        "model": args.model,
        "profiles": profiles,
        "objectives": objectives,
        "rows": rows,
        "summary": {
            "min_ratio": min(ratios),
            "geomean_ratio": geo,
            "max_ratio": max(ratios),
            "worst_case": [worst["case"], worst["world"], worst["bytes"]],
            "min_ratio_run": min(run_ratios),
            "geomean_ratio_run": run_geo,
        },
    }
    if args.out is None:
        suffix = "" if args.model == "default" else f"_{args.model}"
        args.out = RESULTS.with_name(f"redistribute_speed{suffix}.json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    print(
        f"ratio (torch / run): worst {min(run_ratios):.2f}, geometric mean {run_geo:.2f}; "
        f"ratio* (torch / redistribute): worst {min(ratios):.2f} ({worst['case']}, "
        f"{worst['world']} ranks, {_fmt_bytes(worst['bytes'])}), geometric mean {geo:.2f}, "
        f"max {max(ratios):.2f} over {len(rows)} cases; load average {_load()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

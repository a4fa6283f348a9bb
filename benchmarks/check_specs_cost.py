"""What the default ``check_specs`` costs: run with and without it on gloo, small tensors.

On a 4-rank gloo pool ((2, 2) mesh), for a few small redistributions (64 x 64 float32
and smaller), per call, each rank's best of several interleaved rounds, then the slowest
rank:

* ``off``: ``run`` on ``ProcessGroups(mesh, check_specs=False)``;
* ``on``: ``run`` on ``ProcessGroups(mesh)`` (the default) once the plan was agreed on:
  what every later run of a plan costs;
* ``agreed``: the check of a plan agreed on, timed alone (what ``on`` adds to ``off``);
* ``first``: the check of a plan not yet agreed on (one 32-byte all_reduce, paid once per
  distinct plan per ProcessGroups), timed alone;
* ``program``: the check ``run_program`` makes on every call (one 24-byte all_reduce).

    python benchmarks/check_specs_cost.py [--rounds 7] [--calls 200]

Prints a table (with the load average) and writes benchmarks/results/check_specs_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "check_specs_cost.json"

CASES = [
    ("S(0) R -> R R", "S(0) R", "R R", (64, 64)),
    ("S(0) S(1) -> R R", "S(0) S(1)", "R R", (64, 64)),
    ("S(0) R -> S(1) R", "S(0) R", "S(1) R", (64, 64)),
    ("P P -> R R", "P(sum) P(sum)", "R R", (16, 16)),
    ("R R -> S(0) S(1) (local)", "R R", "S(0) S(1)", (16, 16)),
]


def _bench(rounds: int, calls: int):
    import torch
    import torch.distributed as dist

    from meshplan.layout import Mesh
    from meshplan.placement import Spec, parse_placements, shard_one
    from meshplan.redistribute import plan
    from meshplan.runtime import ProcessGroups, run
    from meshplan.runtime._agree import check_same_call, check_same_plan

    torch.set_num_threads(1)
    rank = dist.get_rank()
    mesh = Mesh.create((2, 2), ("a", "b"))
    on = ProcessGroups(mesh, timeout=120)
    off = ProcessGroups(mesh, timeout=120, check_specs=False)
    on.create_all()
    barrier = on.get(None).pg

    def sync():
        dist.all_reduce(torch.zeros(1), group=barrier)

    def best(fn):
        out = []
        for _ in range(rounds):
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            out.append((time.perf_counter() - start) / calls)
        return min(out)

    rows = []
    for name, a, b, shape in CASES:
        pa, oa = parse_placements(a)
        pb, ob = parse_placements(b)
        src, dst = Spec(mesh, pa, shape, "float32", oa), Spec(mesh, pb, shape, "float32", ob)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MergeWarning: the mesh has no flattened alias
            p = plan(src, dst)
        local = shard_one(torch.randn(shape, generator=torch.Generator().manual_seed(0)), src, rank)
        run(p, local, on)  # agreed once

        def first(p=p):
            on._agreed_plans.pop((p.src, p.dst), None)
            check_same_plan(p, on)

        times = {
            "off": best(lambda p=p, local=local: run(p, local, off)),
            "on": best(lambda p=p, local=local: run(p, local, on)),
            "first": best(first),
            # what "on" adds to "off" once the plan is agreed on: a dict lookup, no message
            "agreed": best(lambda p=p: check_same_plan(p, on)),
        }
        rows.append(
            {"case": name, "shape": list(shape), "collectives": len(p.collectives), **times}
        )
    program = best(lambda: check_same_call(on, 12345, None, "program"))
    return rows, program


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()

    from meshplan.runtime import WorkerPool

    load = os.getloadavg()
    with WorkerPool(4, timeout=600) as pool:
        results = pool.run(_bench, args.rounds, args.calls)
    rows = []
    for i, row in enumerate(results[0][0]):
        merged = dict(row)
        for key in ("off", "on", "first", "agreed"):
            merged[key] = max(r[0][i][key] for r in results)  # the slowest rank
        rows.append(merged)
    program = max(r[1] for r in results)
    load_after = os.getloadavg()
    print(f"load average {load[0]:.1f} before, {load_after[0]:.1f} after (2 cores: noisy)")
    print(
        f"{'case':28} {'off us':>8} {'on us':>8} {'on/off':>7} {'agreed check us':>16} "
        f"{'first-run check us':>19}"
    )
    for r in rows:
        print(
            f"{r['case']:28} {r['off'] * 1e6:8.1f} {r['on'] * 1e6:8.1f} "
            f"{r['on'] / r['off']:7.2f} {r['agreed'] * 1e6:16.2f} {r['first'] * 1e6:19.1f}"
        )
    print(f"run_program's check per call: {program * 1e6:.1f} us")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "load_average": [load, load_after],
                "rounds": args.rounds,
                "calls": args.calls,
                "rows": rows,
                "run_program_check_s": program,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

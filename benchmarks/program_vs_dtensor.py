"""Whole-program planning beside torch 2.13's DTensor and beside op-by-op selection.

For a transformer block (embedding, attention with 4 heads written out, MLP, layer
norms, cross-entropy; FSDP x TP parameter specs: dp on mesh dim 0, tp on mesh dim 1,
further dims replicated) on 2-D, 3-D and 4-D meshes:

* meshplan's ``plan_program``: planning time (cold: a new process's first plan of the
  program; warm: the same program again), and the planned step's modeled cost,
  collectives and bytes per rank, forward and backward;
* the op-by-op choice (each op's cheapest strategy given its inputs as they come, what
  a planner without look-ahead does), priced by the same model;
* torch 2.13's DTensor on the same function and placements (run on a fake process
  group; its gradients moved to their parameters' placements as a user must): every
  collective it issues, priced by meshplan's cost model as the one-step move it is, and
  the time its sharding propagation takes (``--torch-limit`` seconds at most a mesh; past
  that it is reported as unfinished).

Prints a table of ratios and writes JSON to ``benchmarks/results/program_vs_dtensor.json``.
``--quick`` runs the 2-D and 3-D meshes only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "strategy"))

from _dtensor_peer import dtensor_collectives, price  # noqa: E402
from _program_cases import transformer, transformer_args  # noqa: E402

from meshplan.layout import Mesh  # noqa: E402
from meshplan.strategy import plan_program  # noqa: E402
from meshplan.strategy.programs._program import plan_graph  # noqa: E402

SIZES = {"B": 8, "T": 16, "D": 32, "V": 64}


class _TooLong(Exception):
    pass


def _alarm(signum, frame):
    raise _TooLong


def case(shape: tuple[int, ...], torch_limit: float) -> dict:
    mesh = Mesh.create(shape)
    tensors, specs = transformer_args(mesh, layers=1, **SIZES)
    fn = functools.partial(transformer, layers=1, fused=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        prog = plan_program(fn, *specs)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan_graph(prog.graph, specs)
        warm = time.perf_counter() - t0
        greedy = plan_graph(prog.graph, specs, solver="op_by_op")
        print(
            f"  meshplan: planned in {cold:.1f} s (warm {warm:.1f} s); torch DTensor ...",
            flush=True,
        )
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, torch_limit)
        t0 = time.perf_counter()
        try:
            peer = price(dtensor_collectives(fn, tensors, specs), mesh)
        except _TooLong:  # torch's sharding propagation did not finish in the time given
            peer = {"comm": None, "bytes": None, "collectives": None}
            peer["error"] = f"did not finish in {torch_limit:.0f} s"
        except Exception as exc:  # torch cannot run the program on this mesh
            peer = {"comm": None, "bytes": None, "collectives": None}
            if time.perf_counter() - t0 >= torch_limit:
                # (the limit struck inside torch's dispatcher, which rewraps the exception)
                peer["error"] = f"did not finish in {torch_limit:.0f} s"
            else:
                text = (str(exc).splitlines() or [""])[0][:120]
                peer["error"] = f"{type(exc).__name__}: {text}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        peer_s = time.perf_counter() - t0
    return {
        "mesh": list(shape),
        "ops": len(prog.ops),
        "plan_cold_s": cold,
        "plan_warm_s": warm,
        "torch_dtensor_s": peer_s,
        "method": prog.method,
        "gap": (prog.cost.total - prog.lower_bound) / prog.cost.total if prog.cost.total else 0.0,
        "meshplan": {
            "total_s": prog.cost.total,
            "comm_s": prog.cost.comm,
            "collectives": prog.cost.collectives,
            "bytes": prog.cost.bytes,
        },
        "op_by_op": {
            "total_s": greedy.cost.total,
            "comm_s": greedy.cost.comm,
            "collectives": greedy.cost.collectives,
            "bytes": greedy.cost.bytes,
        },
        "torch_dtensor": {
            "comm_s": peer["comm"],
            "collectives": peer["collectives"],
            "bytes": peer["bytes"],
            "error": peer.get("error"),
        },
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2-D and 3-D meshes only")
    ap.add_argument(
        "--torch-limit",
        type=float,
        default=900.0,
        help="seconds torch DTensor may take for one mesh before it is reported as unfinished",
    )
    args = ap.parse_args(argv)
    shapes = [(2, 2), (2, 2, 2)] + ([] if args.quick else [(2, 2, 2, 2)])
    rows = []
    for shape in shapes:
        print(f"planning the transformer block on {shape} ...", flush=True)
        rows.append(case(shape, args.torch_limit))
    head = (
        f"{'mesh':<10} {'plan cold':>9} {'warm':>7} {'method':<8} "
        f"{'mp comm':>9} {'mp coll':>7} {'greedy/mp':>9} {'torch time':>10} {'torch/mp comm':>13} "
        f"{'torch coll':>10} {'torch/mp bytes':>14}"
    )
    print(head)
    for r in rows:
        mp, gr, tc = r["meshplan"], r["op_by_op"], r["torch_dtensor"]
        line = (
            f"{'x'.join(map(str, r['mesh'])):<10} {r['plan_cold_s']:>8.2f}s {r['plan_warm_s']:>6.2f}s "
            f"{r['method'][:8]:<8} {mp['comm_s'] * 1e6:>7.1f}us {mp['collectives']:>7} "
            f"{gr['total_s'] / mp['total_s']:>9.2f} {r['torch_dtensor_s']:>9.1f}s "
        )
        if tc["comm_s"] is None:
            line += f"torch failed: {tc['error']}"
        else:
            line += (
                f"{tc['comm_s'] / mp['total_s']:>13.2f} {tc['collectives']:>10} "
                f"{tc['bytes'] / max(mp['bytes'], 1):>14.2f}"
            )
        print(line)
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "program_vs_dtensor.json"), "w") as f:
        json.dump({"sizes": SIZES, "cases": rows}, f, indent=1)
    ran = [r for r in rows if r["torch_dtensor"]["comm_s"] is not None]
    worst = min((r["torch_dtensor"]["comm_s"] / r["meshplan"]["total_s"] for r in ran), default=0)
    greedy = min(r["op_by_op"]["total_s"] / r["meshplan"]["total_s"] for r in rows)
    print(
        f"program_vs_dtensor: torch DTensor comm / meshplan total >= {worst:.2f} where torch runs "
        f"({len(ran)} of {len(rows)} meshes); op-by-op / meshplan >= {greedy:.2f}"
    )


if __name__ == "__main__":
    main()

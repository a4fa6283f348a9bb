"""meshplan.checkpoint vs torch.distributed.checkpoint (DCP) on the same gloo processes.

Four gloo ranks hold a float32 tensor sharded by rows; each library saves it to its own
directory, then loads it resharded by columns (every rank reads parts of every saved
chunk). Both sides time the same thing: barrier, the call, barrier, on the same tensors
and the same disk; the table shows the median of a few rounds, throughput in MB/s of
global tensor, and meshplan's speed relative to DCP (>1: meshplan faster): of the
fastest round (speedup), of the median round (median), and of the CPU time all ranks
spent (CPU; steadier on a loaded machine). A round lasts as long as its slowest rank.
meshplan's load is timed with checksum verification on (its default: with groups each
saved chunk is checked by one of the ranks reading it) and off. meshplan computes its
checksums with ISA-L when the optional ``isal`` package is installed (``meshplan[fast]``;
the header line says which). The last line states, per size, the save and (verified)
load speedups and the load average.

    python benchmarks/checkpoint_speed.py                 # 4, 16, 64 MB
    python benchmarks/checkpoint_speed.py --sizes 1 4     # MB of global tensor

Writes machine-readable results to benchmarks/results/checkpoint_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint_speed.json"
WORLD = 4
COLS = 256


def _tensor(rows: int):
    import torch

    gen = torch.Generator().manual_seed(rows)
    return torch.randn(rows, COLS, generator=gen)


def _rank_task(rows: int, root: str, rounds: int) -> dict[str, list[float]]:
    """Runs on every rank: time meshplan and DCP save/load; check both loads."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as TShard

    from meshplan.checkpoint import load, save
    from meshplan.layout import Mesh
    from meshplan.placement import Shard, Sharded, Spec, shard_one
    from meshplan.runtime._groups import ProcessGroups

    rank = dist.get_rank()
    x = _tensor(rows)
    mesh = Mesh.create(WORLD)
    groups = ProcessGroups(mesh)
    src = Spec(mesh, (Shard(0),), x.shape)
    dst = Spec(mesh, (Shard(1),), x.shape)
    local = shard_one(x, src, rank)
    want = shard_one(x, dst, rank)
    tmesh = init_device_mesh("cpu", (WORLD,))
    dt = DTensor.from_local(
        local, tmesh, [TShard(0)], run_check=False, shape=x.shape, stride=x.stride()
    )

    out: dict[str, list[float]] = {
        k: []
        for op in ("mp_save", "mp_load", "mp_load_noverify", "dcp_save", "dcp_load")
        for k in (op, f"{op}_cpu")
    }

    def timed(op: str, fn) -> None:
        """Wall time between barriers into out[op]; the CPU time this process spent in
        the call (all its threads: the machine may be loaded) into out[op + '_cpu']."""
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        out[f"{op}_cpu"].append(time.process_time() - cpu)
        dist.barrier()
        out[op].append(time.perf_counter() - start)

    for i in range(rounds):
        mp_dir = os.path.join(root, f"mp{i}")
        dcp_dir = os.path.join(root, f"dcp{i}")
        timed("mp_save", lambda d=mp_dir: save({"x": Sharded(local, src, rank)}, d, groups))
        timed("dcp_save", lambda d=dcp_dir: dcp.save({"x": dt}, checkpoint_id=d))
        got = {}
        timed("mp_load", lambda d=mp_dir, got=got: got.update(load(d, {"x": dst}, groups)))
        assert torch.equal(got["x"].local, want), "meshplan load is wrong"
        timed(
            "mp_load_noverify",
            lambda d=mp_dir, got=got: got.update(load(d, {"x": dst}, groups, verify=False)),
        )
        assert torch.equal(got["x"].local, want), "meshplan load (no verify) is wrong"
        target = DTensor.from_local(
            torch.zeros_like(want),
            tmesh,
            [TShard(1)],
            run_check=False,
            shape=x.shape,
            stride=x.stride(),
        )
        box = {"x": target}
        timed("dcp_load", lambda d=dcp_dir, box=box: dcp.load(box, checkpoint_id=d))
        assert torch.equal(box["x"].to_local(), want), "DCP load is wrong"
        dist.barrier()
        if rank == 0:
            shutil.rmtree(mp_dir, ignore_errors=True)
            shutil.rmtree(dcp_dir, ignore_errors=True)
        dist.barrier()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64], help="MB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from meshplan.runtime._pool import WorkerPool

    rows_of = {mb: mb * 2**20 // (4 * COLS) for mb in args.sizes}
    results = []
    worst: list[str] = []
    root = tempfile.mkdtemp(prefix="meshplan-ckpt-bench-")
    header = (
        f"{'MB':>5} {'op':<6} {'meshplan s':>11} {'DCP s':>9} {'meshplan MB/s':>14} "
        f"{'DCP MB/s':>9} {'speedup':>8} {'median':>7} {'CPU':>6}"
    )
    from meshplan.checkpoint._crc import FAST

    print(
        f"checkpoint save/load, {WORLD} gloo ranks, float32 [rows, {COLS}], "
        f"save Shard(0), load Shard(1); min of {args.rounds} rounds; meshplan's checksums "
        f"by {'ISA-L' if FAST else 'zlib'}"
    )
    print(header)
    print("-" * len(header))
    try:
        with WorkerPool(WORLD, "gloo", timeout=600.0) as pool:
            for mb, rows in rows_of.items():
                per_rank = pool.run(_rank_task, rows, root, args.rounds)
                # a round takes as long as its slowest rank; its CPU time is every rank's
                rounds = {
                    k: [
                        (sum if k.endswith("_cpu") else max)(r[k][i] for r in per_rank)
                        for i in range(args.rounds)
                    ]
                    for k in per_rank[0]
                }
                best = {k: min(v) for k, v in rounds.items()}
                med = {k: statistics.median(v) for k, v in rounds.items()}
                ratios = {}
                for op, mine, theirs in [
                    ("save", "mp_save", "dcp_save"),
                    ("load", "mp_load", "dcp_load"),
                    ("load*", "mp_load_noverify", "dcp_load"),
                ]:
                    ratios[op] = best[theirs] / best[mine]
                    print(
                        f"{mb:>5} {op:<6} {best[mine]:>11.4f} {best[theirs]:>9.4f} "
                        f"{mb / best[mine]:>14.1f} {mb / best[theirs]:>9.1f} "
                        f"{ratios[op]:>7.2f}x {med[theirs] / med[mine]:>6.2f}x "
                        f"{best[theirs + '_cpu'] / best[mine + '_cpu']:>5.2f}x"
                    )
                worst.append(f"{mb} MB save {ratios['save']:.2f}x load {ratios['load']:.2f}x")
                results.append(
                    {"mb": mb, "rows": rows, "cols": COLS, "min_seconds": best, "seconds": med}
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("load*: meshplan with verify=False (reads only the needed slices, no checksums)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "checkpoint_speed",
                "world": WORLD,
                "cpu_count": os.cpu_count(),
                "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                "platform": platform.platform(),
                "disk": root.rsplit("/", 1)[0],
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"worst ratio vs DCP (min of {args.rounds}, load {load:.1f}): " + "; ".join(worst))


if __name__ == "__main__":
    main()

"""meshplan.layout vs torch 2.13 DeviceMesh on a mesh of 2**17 ranks.

Times slicing, flattening, unflattening, group_of, coordinate and submesh on the
same mesh shape in both libraries (torch on a fake process group of the same world
size, in this process) and prints a table with ratios. meshplan's operations cost
time and memory proportional to the group they return, never the world: the
"peak" column is the most memory (tracemalloc) one meshplan call allocates.

torch has no call for "another rank's group" or "another rank's coordinate"; its
columns for those rows time what torch does internally to answer them for the
calling rank (``remap_to_tensor`` of the whole world, then a search), and are
marked ``*``. Rows torch refuses (out-of-order slices) show ``refused``.

    python benchmarks/layout_speed.py                   # (64, 32, 64), with torch
    python benchmarks/layout_speed.py --no-torch        # meshplan only

Writes machine-readable results to benchmarks/results/layout_speed.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from meshplan.layout import Mesh

RESULTS = Path(__file__).resolve().parent / "results" / "layout_speed.json"


def per_call(fn: Callable[[], object], *, budget: float = 0.05, repeat: int = 5) -> float:
    """Median seconds per call over ``repeat`` rounds of about ``budget`` seconds each."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    loops = max(1, min(100_000, int(budget / once)))
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        rounds.append((time.perf_counter() - start) / loops)
    return statistics.median(rounds)


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most Python memory one call allocates (tracemalloc)."""
    fn()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def meshplan_cases(shape: tuple[int, ...], rank: int, permuted: bool):
    names = ("dp", "cp", "tp")
    world = math.prod(shape)
    ranks = None
    if permuted:
        ranks = list(range(world))
        random.Random(0).shuffle(ranks)
    mesh = Mesh.create(shape, names, ranks)
    # the rank map as torch takes it: an int tensor (meshplan checks arrays at C speed)
    array = np.arange(world) if ranks is None else np.array(ranks)
    flat = mesh.flatten(("cp", "tp"), "cptp").flatten(("dp", "tp"), "dptp")
    size = dict(zip(names, shape, strict=True))
    return [
        ("create", world, lambda: Mesh.create(shape, names, ranks)),
        ("create from an int array", world, lambda: Mesh.create(shape, names, array)),
        ("slice (dp, tp)", size["dp"] * size["tp"], lambda: mesh["dp", "tp"]),
        ("slice tp", size["tp"], lambda: mesh["tp"]),
        ("slice out of order (tp, dp)", size["dp"] * size["tp"], lambda: mesh["tp", "dp"]),
        (
            "flatten adjacent (cp, tp)",
            size["cp"] * size["tp"],
            lambda: mesh.flatten(("cp", "tp"), "cptp"),
        ),
        (
            "flatten non-adjacent (dp, tp)",
            size["dp"] * size["tp"],
            lambda: mesh.flatten(("dp", "tp"), "dptp"),
        ),
        ("slice alias + dim (dp, cptp)", world, lambda: flat["dp", "cptp"]),
        ("slice non-adjacent alias + dim (dptp, cp)", world, lambda: flat["dptp", "cp"]),
        (
            "unflatten dp -> (8, 8)",
            world,
            lambda: mesh.unflatten("dp", (8, size["dp"] // 8), ("d1", "d2")),
        ),
        ("group_of(rank, tp)", size["tp"], lambda: mesh.group_of(rank, "tp")),
        (
            "group_of(rank, (dp, tp))",
            size["dp"] * size["tp"],
            lambda: mesh.group_of(rank, ("dp", "tp")),
        ),
        ("coordinate(rank)", 1, lambda: mesh.coordinate(rank)),
        ("submesh(tp, at=rank)", size["tp"], lambda: mesh.submesh("tp", at=rank)),
        (
            "submesh((cp, tp), at=rank)",
            size["cp"] * size["tp"],
            lambda: mesh.submesh(("cp", "tp"), at=rank),
        ),
    ]


def torch_cases(shape: tuple[int, ...], rank: int, permuted: bool):
    """torch callables for the same rows (None: torch refuses; '*': internal equivalent)."""
    import torch
    import torch.distributed as dist
    from torch.distributed._mesh_layout import _MeshLayout
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = math.prod(shape)
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    names = ("dp", "cp", "tp")
    ranks = torch.arange(world, dtype=torch.int)
    if permuted:
        order = list(range(world))
        random.Random(0).shuffle(order)
        ranks = torch.tensor(order, dtype=torch.int)
    mesh = DeviceMesh("cpu", ranks.reshape(shape), mesh_dim_names=names)
    mesh["cp", "tp"]._flatten("cptp")
    fresh = itertools.count()

    def group_of(dims):
        layout = _MeshLayout([mesh._layout[names.index(d)] for d in dims])
        full = layout.remap_to_tensor(mesh._rank_map)
        return full[(full == rank).any(dim=1)][0].tolist()

    def coordinate():
        return DeviceMesh._compute_coordinates_from_mesh(mesh.mesh, rank)

    return {
        "create": (
            lambda: DeviceMesh(
                "cpu", ranks.reshape(shape), mesh_dim_names=names, _init_backend=False
            ),
            "DeviceMesh(..., _init_backend=False)",
        ),
        "create from an int array": (
            lambda: DeviceMesh(
                "cpu", ranks.reshape(shape), mesh_dim_names=names, _init_backend=False
            ),
            "DeviceMesh(..., _init_backend=False)",
        ),
        "slice (dp, tp)": (lambda: mesh["dp", "tp"], ""),
        "slice tp": (lambda: mesh["tp"], ""),
        "slice out of order (tp, dp)": (None, ""),
        "flatten adjacent (cp, tp)": (
            lambda: mesh["cp", "tp"]._flatten(f"a{next(fresh)}"),
            "creates its process groups",
        ),
        "flatten non-adjacent (dp, tp)": (
            lambda: mesh["dp", "tp"]._flatten(f"n{next(fresh)}"),
            "creates its process groups",
        ),
        "slice alias + dim (dp, cptp)": (lambda: mesh["dp", "cptp"], ""),
        "slice non-adjacent alias + dim (dptp, cp)": (None, ""),
        "unflatten dp -> (8, 8)": (
            lambda: mesh._unflatten(
                "dp", (8, shape[0] // 8), (f"d{next(fresh)}", f"e{next(fresh)}")
            ),
            "creates its process groups",
        ),
        "group_of(rank, tp)": (lambda: group_of(("tp",)), "*"),
        "group_of(rank, (dp, tp))": (lambda: group_of(("dp", "tp")), "*"),
        "coordinate(rank)": (coordinate, "*"),
        "submesh(tp, at=rank)": (lambda: mesh["tp"].mesh, "* the calling rank's"),
        "submesh((cp, tp), at=rank)": (lambda: mesh["cp", "tp"].mesh, "* the calling rank's"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,32,64", help="three sizes (dp, cp, tp)")
    parser.add_argument("--no-torch", action="store_true", help="time meshplan only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    if len(shape) != 3 or shape[0] % 8:
        parser.error("--shape needs three sizes, the first a multiple of 8")
    world = math.prod(shape)
    rank = world // 2 + 12345 % world  # any rank: not the calling one
    warnings.simplefilter("ignore")

    rows = []
    for permuted in (False, True):
        ours = meshplan_cases(shape, rank, permuted)
        theirs = {} if args.no_torch else torch_cases(shape, rank, permuted)
        for name, group, fn in ours:
            t_ours = per_call(fn)
            peak = peak_bytes(fn)
            torch_fn, note = theirs.get(name, (None, "not run"))
            t_torch = None
            if torch_fn is not None:
                t_torch = per_call(torch_fn, budget=0.3, repeat=3)
            elif not args.no_torch:
                note = "refused"
            rows.append(
                {
                    "rank_map": "permuted" if permuted else "identity",
                    "op": name,
                    "group_size": group,
                    "meshplan_us": t_ours * 1e6,
                    "meshplan_peak_bytes": peak,
                    "torch_us": None if t_torch is None else t_torch * 1e6,
                    "ratio_torch_over_meshplan": None if t_torch is None else t_torch / t_ours,
                    "torch_note": note,
                }
            )

    print(
        f"meshplan.layout vs torch {_torch_version()} DeviceMesh, mesh {shape} = {world} ranks "
        f"({os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f})"
    )
    header = f"{'rank map':9} {'operation':43} {'ranks out':>9} {'meshplan':>11} {'peak':>9} {'torch':>12} {'torch/mp':>9}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        torch_col = "-" if r["torch_us"] is None else _us(r["torch_us"])
        x = r["ratio_torch_over_meshplan"]
        ratio = "-" if x is None else f"{x:,.0f}x" if x >= 10 else f"{x:.2f}x"
        print(
            f"{r['rank_map']:9} {r['op']:43} {r['group_size']:>9} {_us(r['meshplan_us']):>11} "
            f"{_kib(r['meshplan_peak_bytes']):>9} {torch_col:>12} {ratio:>9}  {r['torch_note']}"
        )
    print(
        "create builds the whole rank map (from a list of ints, or from an int array as torch "
        "does); every other meshplan row is world-independent."
    )
    print("* torch has no call for another rank's group/coordinate/submesh: internal equivalent.")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "shape": shape,
        "world": world,
        "rank": rank,
        "torch": _torch_version(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


def _us(us: float) -> str:
    if us >= 1000:
        return f"{us / 1000:,.1f} ms"
    return f"{us:,.1f} us"


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:  # pragma: no cover
        return "n/a"


if __name__ == "__main__":
    sys.exit(main())

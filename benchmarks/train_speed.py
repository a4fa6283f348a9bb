"""Training step time, peak memory and bytes per step: meshplan vs torch 2.13 FSDP2 x TP.

The model is a residual MLP (``--layers`` blocks of ``x + gelu(x @ w1) @ w2``, d 256,
hidden 1024, batch 32 per dp rank, mean-squared error, AdamW, gradient clipping by the
global norm) on a (dp 2, tp 4) mesh of 8 gloo ranks on this machine. torch runs it as
``nn.Linear`` blocks with ``parallelize_module`` (fc1 ColwiseParallel, fc2 RowwiseParallel)
on the tp dim and ``fully_shard`` on the dp dim, with ``torch.optim.AdamW`` and
``clip_grad_norm_``. meshplan runs the same global function through ``plan_program`` /
``run_program`` with the parameters stored FSDP x TP (w1 ``S(0) S(1)``, w2 ``S(1) S(0)``),
the global-norm clip and AdamW of ``examples/train.py`` on the local shards, planned for
the machine it runs on (``--cost-model gloo``: ``HardwareProfile.gloo_cpu()``, where a
collective costs ~100x more than on the default GPU profile; ``--cost-model default``
plans for GPUs). ``--bucket-bytes`` and ``--prefetch`` pass run_program's options. Both
start from the same weights (each rank builds one layer's global weights at a time) and
see the same batches.

(The residual MLP rather than the example's transformer: FSDP2 x TP of attention on gloo
needs per-module input/output layouts for every op; the MLP is the case the torch side
runs without any.)

Each framework has its own pool of 8 processes, so each rank's peak memory (growth of the
maximum resident set over the process's baseline, measured before the model is built)
is its own; rounds alternate between the two pools. Bytes per step: the payload bytes
each rank hands to collectives in one step (``torch.distributed`` calls and functional
collectives), counted the same way for both.

    python benchmarks/train_speed.py [--quick | --profile] [--cost-model gloo|default]

Last line: ``train_speed: meshplan/torch step time X, peak memory Y (...)`` (ratios of medians).
Writes JSON to benchmarks/results/train_speed.json. ``--profile`` instead runs meshplan's
step under cProfile on every rank (planning excluded) and splits each rank's time into
waiting in gloo collectives, local compute (aten kernels, the autograd engine) and Python
(run_program's interpreter and the runtime shell, torch.distributed's wrappers, the rest).

Measured (full run: 4 layers, 5 interleaved rounds of 5 steps; 8 gloo ranks on 2 cores
shared with other jobs, load average 12-39 during these runs, so a round's time varies by
+-30%; best of three runs):

    ========  =======  =======  ==========
              step ms  peak MB  bytes/step
    torch       376.4     62.1   4,653,060
    meshplan    187.4     45.2     917,532
    ========  =======  =======  ==========

    train_speed: meshplan/torch step time 0.50, peak memory 0.73 (gloo cost model, 19 planned
    collectives); loss curves within 2.1e-7

The three runs gave step time 0.59, 0.50, 0.53 and peak memory 0.65, 0.73, 0.66; planned
for GPUs (``--cost-model default``, 31 collectives, as before) 0.77 and 0.82; ``--quick``
0.58-0.91 (six timed steps per framework: too few on a machine this busy).

Where meshplan's step goes (``--profile --steps 10``, load average ~6): 199 ms per step
unprofiled, 31 ms of CPU per rank (its gloo threads included), so 247 ms of CPU for the 8
ranks on 2 cores. Profiled (157 ms, rank 0; rank 7 alike): waiting in gloo collectives
115 ms (77%: wait 72 ms over 21 calls, starting 19 all_reduces 40 ms, all_to_all 3 ms),
meshplan's Python 14 ms (9%), local compute 10 ms (6%), torch.distributed's Python
wrappers 3 ms, other Python 5 ms. The step is a chain of 19 planned collectives (two
all_reduces per layer forward and backward, each on the output of the op just before
its reader, plus an all_to_all in and out) and run_program's agreement check: run_program
starts each as soon as its input exists and buckets what starts together, but here no
two moves of one kind are ready at once and no op can run while one travels, so
``--bucket-bytes 0 --prefetch 0`` measures the same within the noise. What would lower it
further is fewer collectives on that chain.

Peak memory: of meshplan's ~42 MB (the growth of each rank's maximum resident set),
~20 MB appears while the harness builds the weights (the allocator keeps the pages of
freed 1 MB temporaries; torch's side pays the same), ~17 MB in the first step (the code
pages and buffers of first calls: gelu 4.5 MB, mm 2 MB, the agreement check's first
int64 all_reduce 3 MB), and the training state (parameters, gradients, AdamW moments) is
4 MB per rank; the activations the step keeps are under 1 MB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

D, H, BATCH_PER_DP, MESH = 256, 1024, 32, (2, 4)
LR, CLIP = 1e-3, 1.0
_STATE: dict = {}  # per worker: the model, optimizer and counters of its framework


def mlp(x, y, *ws):
    """The global function: residual blocks, then the mean-squared error against y."""
    for w1, w2 in zip(ws[::2], ws[1::2], strict=True):
        x = x + torch.nn.functional.gelu(x @ w1) @ w2
    return ((x - y) ** 2).mean()


def init_weights(layers: int, seed: int = 0):
    """Each layer's global (w1, w2) in turn: every rank (and both frameworks) holds one
    layer's global weights at a time while it builds its shards."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(layers):
        w1 = torch.randn(D, H, generator=g) / D**0.5
        w2 = torch.randn(H, D, generator=g) / H**0.5 / math.sqrt(2 * layers)
        yield w1, w2


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    B = BATCH_PER_DP * MESH[0]
    x = torch.randn(B, D, generator=g)
    return x, torch.tanh(x.roll(1, dims=1))


# -- counting collective payload bytes, the same way for both ------------------------------

_BYTES = [0]
_NAMES = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_gather_single",
    "reduce_scatter_single",
    "broadcast",
    "all_gather",
)


def _count_bytes() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    for name in _NAMES:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "_counted", False):
            continue

        def wrapped(*args, _fn=fn, **kwargs):
            # the payload: the input tensor (the first tensor of an all_reduce or broadcast,
            # the second, after the output, of the others), positional or keyword
            ts = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            t = ts[0] if _fn.__name__ in ("all_reduce", "broadcast") or len(ts) < 2 else ts[1]
            if ts:
                _BYTES[0] += t.numel() * t.element_size()
            return _fn(*args, **kwargs)

        wrapped._counted = True
        setattr(dist, name, wrapped)

    class Functional(TorchDispatchMode):  # DTensor's collectives (funcol)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "_c10d_functional" and "wait" not in func.__name__:
                t = args[0]
                if isinstance(t, torch.Tensor):
                    _BYTES[0] += t.numel() * t.element_size()
            return func(*args, **(kwargs or {}))

    _STATE["mode"] = Functional


# -- the two frameworks, one step each -------------------------------------------------------


def setup(framework: str, layers: int, program=None, run_options=None) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    _STATE["rss0"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _count_bytes()
    rank = dist.get_rank()
    if framework == "torch":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        class Block(torch.nn.Module):
            def __init__(self, w1, w2):
                super().__init__()
                self.fc1 = torch.nn.Linear(D, H, bias=False)
                self.fc2 = torch.nn.Linear(H, D, bias=False)
                with torch.no_grad():
                    self.fc1.weight.copy_(w1.T)
                    self.fc2.weight.copy_(w2.T)

            def forward(self, x):
                return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))

        mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("dp", "tp"))
        blocks = []
        for w1, w2 in init_weights(layers):
            blk = Block(w1, w2)
            parallelize_module(
                blk, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
            )
            fully_shard(blk, mesh=mesh["dp"])
            blocks.append(blk)
            del w1, w2, blk
        model = torch.nn.Sequential(*blocks)
        fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.AdamW(
            model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False
        )
        _STATE.update(model=model, opt=opt, dp=mesh["dp"].get_local_rank())
    else:
        from meshplan.layout import Mesh
        from meshplan.placement import Sharded
        from meshplan.runtime import ProcessGroups

        groups = ProcessGroups(program.arg_specs[0].mesh, timeout=300)
        groups.create_all()
        specs = program.arg_specs[2:]
        params = []
        for w1, w2 in init_weights(layers):
            for w, s in zip((w1, w2), specs[len(params) : len(params) + 2], strict=True):
                params.append(Sharded.from_global(w, s, rank).local.clone().requires_grad_())
            del w1, w2
        import train as example

        _STATE.update(
            program=program,
            groups=groups,
            params=params,
            ms=[torch.zeros_like(p) for p in params],
            vs=[torch.zeros_like(p) for p in params],
            once=[example.counts_once(s, rank) for s in specs],
            adamw=example.adamw_,
        )
        assert isinstance(program.arg_specs[0].mesh, Mesh)
    _STATE.update(framework=framework, step=0, run_options=dict(run_options or {}))


def _torch_step(x, y):
    s = _STATE
    dp = s["dp"]
    lx, ly = x.chunk(MESH[0])[dp], y.chunk(MESH[0])[dp]
    loss = mlp_torch(s["model"], lx, ly)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(s["model"].parameters(), CLIP)
    s["opt"].step()
    s["opt"].zero_grad()
    full = loss.detach().clone()
    dist.all_reduce(full)  # the global mean over the dp ranks' equal batches (tp ranks agree)
    return full.item() / dist.get_world_size()


def mlp_torch(model, x, y):
    return ((model(x) - y) ** 2).mean()


def _meshplan_step(x, y):
    from meshplan.placement import Sharded
    from meshplan.runtime import run_program

    s = _STATE
    prog, groups, params, rank = s["program"], s["groups"], s["params"], dist.get_rank()
    lx = Sharded.from_global(x, prog.arg_specs[0], rank).local
    ly = Sharded.from_global(y, prog.arg_specs[1], rank).local
    loss = run_program(prog, groups, lx, ly, *params, **s["run_options"])
    loss.backward()
    with torch.no_grad():
        sq = sum(
            (p.grad.pow(2).sum() for p, o in zip(params, s["once"], strict=True) if o),
            torch.zeros(()),
        )
        dist.all_reduce(sq, group=groups.get(None).pg)
        scale = min(1.0, CLIP / (sq.sqrt().item() + 1e-6))
        for p, m, v in zip(params, s["ms"], s["vs"], strict=True):
            s["adamw"](p, p.grad * scale, m, v, s["step"], LR)
            p.grad = None
    return loss.item()


def steps(n: int) -> dict:
    """Run n steps of this worker's framework: losses, seconds per step, bytes per step."""
    s, out = _STATE, {"losses": [], "times": [], "bytes": []}
    step_fn = _torch_step if s["framework"] == "torch" else _meshplan_step
    for _ in range(n):
        s["step"] += 1
        x, y = batch(s["step"])
        dist.barrier()
        _BYTES[0] = 0
        t0, c0 = time.perf_counter(), time.process_time()
        with s["mode"]():
            loss = step_fn(x, y)
        out["times"].append(time.perf_counter() - t0)
        out.setdefault("cpu", []).append(time.process_time() - c0)  # all threads
        out["bytes"].append(_BYTES[0])
        out["losses"].append(loss)
    out["rss_growth_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - s["rss0"]
    return out


# -- where meshplan's step time goes (--profile) ----------------------------------------------


def _kind(func: tuple) -> str:
    """The category of one cProfile entry: collective, local compute, or Python code."""
    file, _, name = func
    if file == "~":  # a built-in: C code called from Python
        if "c10d" in name or "ProcessGroup" in name or "Work" in name:
            return "collectives (waiting in gloo)"
        if "torch" in name or "Tensor" in name or "_EngineBase" in name:
            return "local compute (aten kernels, autograd engine)"
        return "Python: other"
    if os.path.join("torch", "distributed") in file:
        return "Python: torch.distributed wrappers"
    if file.startswith(_ROOT):
        return "Python: meshplan (run_program's interpreter, runtime shell)"
    if os.sep + "torch" + os.sep in file:
        return "Python: torch (autograd.Function, dispatch)"
    return "Python: other"


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def profile_steps(n: int) -> dict:
    """n meshplan steps under cProfile: seconds per step by category (self time)."""
    import cProfile
    import pstats

    s = _STATE
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    for _ in range(n):
        s["step"] += 1
        x, y = batch(s["step"])
        prof.enable()
        _meshplan_step(x, y)
        prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    kinds: dict[str, float] = {}
    for func, (_, _, tottime, _, _) in stats.items():
        kinds[_kind(func)] = kinds.get(_kind(func), 0.0) + tottime / n
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    return {
        "wall_per_step": wall / n,
        "kinds": kinds,
        "top": [(f"{os.path.basename(f[0])}:{f[2]}", v[2] / n, v[0] / n) for f, v in top],
    }


def profile(layers: int, program, n: int, run_options: dict) -> None:
    from meshplan.runtime import WorkerPool

    pool = WorkerPool(
        8, "gloo", timeout=1800, preload=("meshplan.runtime._run", "meshplan.runtime._program")
    )
    try:
        pool.run(setup, "meshplan", layers, program, run_options)
        pool.run(steps, 3)  # warm up
        plain = pool.run(steps, n)
        got = pool.run(profile_steps, n)
    finally:
        pool.shutdown()
    plain_ms = statistics.median(max(r["times"][i] for r in plain) for i in range(n)) * 1e3
    cpu_ms = statistics.median(c for r in plain for c in r["cpu"]) * 1e3
    print(
        f"meshplan step without the profiler: {plain_ms:.1f} ms (median of the slowest rank); "
        f"CPU time {cpu_ms:.1f} ms per rank per step, {8 * cpu_ms:.0f} ms for the 8 ranks on "
        f"{os.cpu_count()} cores"
    )
    for rank in (0, 7):
        g = got[rank]
        total = sum(g["kinds"].values())
        print(f"rank {rank}: {g['wall_per_step'] * 1e3:.1f} ms per profiled step; self time:")
        for kind, sec in sorted(g["kinds"].items(), key=lambda kv: -kv[1]):
            print(f"  {kind:58} {sec * 1e3:7.1f} ms {sec / total:6.1%}")
    print("rank 0's top functions by self time (ms per step, calls per step):")
    for name, sec, calls in got[0]["top"]:
        print(f"  {name:70} {sec * 1e3:7.2f} ms {calls:7.0f}")


def main() -> None:
    from meshplan.layout import Mesh
    from meshplan.placement import Replicate, Shard, Spec
    from meshplan.redistribute import CostModel, HardwareProfile
    from meshplan.runtime import WorkerPool
    from meshplan.strategy import ComputeModel, plan_program

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, 3 rounds of 3 steps")
    ap.add_argument(
        "--cost-model",
        choices=("gloo", "default"),
        default="gloo",
        help="plan for gloo on CPU (HardwareProfile.gloo_cpu, the machine this runs on) or "
        "for the default GPU profile",
    )
    ap.add_argument("--bucket-bytes", type=int, default=None, help="run_program's bucket cap")
    ap.add_argument("--prefetch", default=None, help="run_program's prefetch (int or 'none')")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="steps per round")
    ap.add_argument(
        "--profile", action="store_true", help="profile meshplan's step (cProfile) instead"
    )
    opts = ap.parse_args()
    layers, rounds, per = (2, 3, 3) if opts.quick else (4, opts.rounds, opts.steps)

    mesh = Mesh.create(MESH, names=("dp", "tp"))
    R, S = Replicate(), Shard
    data = Spec(mesh, [S(0), R], (BATCH_PER_DP * MESH[0], D), "float32")
    ws = [Spec(mesh, [S(0), S(1)], (D, H), "float32"), Spec(mesh, [S(1), S(0)], (H, D), "float32")]
    print(f"planning the {layers}-layer residual MLP on {mesh} ...", flush=True)
    t0 = time.perf_counter()
    model = CostModel(HardwareProfile.gloo_cpu()) if opts.cost_model == "gloo" else None
    program = plan_program(
        mlp, data, data, *(ws * layers), compute=ComputeModel.cpu(), cost_model=model
    )
    print(
        f"planned in {time.perf_counter() - t0:.1f} s: {program.cost.collectives} collectives",
        flush=True,
    )

    run_options = {}
    if opts.bucket_bytes is not None:
        run_options["bucket_bytes"] = opts.bucket_bytes
    if opts.prefetch is not None:
        run_options["prefetch"] = None if opts.prefetch == "none" else int(opts.prefetch)
    if opts.profile:
        profile(layers, program, opts.steps, run_options)
        return
    pools = {
        name: WorkerPool(
            8, "gloo", timeout=1800, preload=("meshplan.runtime._run", "meshplan.runtime._program")
        )
        for name in ("torch", "meshplan")
    }
    results: dict[str, list] = {"torch": [], "meshplan": []}
    try:
        for name, pool in pools.items():
            print(f"starting 8 gloo processes for {name} ...", flush=True)
            if name == "meshplan":
                pool.run(setup, name, layers, program, run_options)
            else:
                pool.run(setup, name, layers)
        for r in range(rounds):
            for name in ("torch", "meshplan") if r % 2 == 0 else ("meshplan", "torch"):
                results[name].append(pools[name].run(steps, per))
            last = {k: statistics.median(results[k][-1][0]["times"]) * 1e3 for k in results}
            print(
                f"round {r + 1}/{rounds}: torch {last['torch']:.1f} ms, meshplan {last['meshplan']:.1f} ms per step",
                flush=True,
            )
    finally:
        for pool in pools.values():
            pool.shutdown()

    summary = {}
    for name, per_round in results.items():
        # the slowest rank's time per step; the first round warms up
        times = [max(r[k]["times"][i] for k in range(8)) for r in per_round[1:] for i in range(per)]
        summary[name] = {
            "step_ms": statistics.median(times) * 1e3,
            "peak_memory_mb": max(r["rss_growth_kb"] for r in per_round[-1]) / 1e3,
            "bytes_per_step": max(per_round[-1][k]["bytes"][-1] for k in range(8)),
            "losses": [loss for r in per_round for loss in r[0]["losses"]],
        }
    lt, lm = summary["torch"]["losses"], summary["meshplan"]["losses"]
    diff = max(abs(a - b) / abs(a) for a, b in zip(lt, lm, strict=True))
    print(f"{'':10} {'step ms':>9} {'peak MB':>9} {'bytes/step':>11}")
    for name, s in summary.items():
        print(f"{name:10} {s['step_ms']:9.1f} {s['peak_memory_mb']:9.1f} {s['bytes_per_step']:11d}")
    print("loss curves (torch, meshplan):")
    for k, (a, b) in enumerate(zip(lt, lm, strict=True), 1):
        print(f"  step {k:3d} {a:.6f} {b:.6f}")
    print(f"max rel loss diff {diff:.2e}")
    ratio_t = summary["meshplan"]["step_ms"] / summary["torch"]["step_ms"]
    ratio_m = summary["meshplan"]["peak_memory_mb"] / max(summary["torch"]["peak_memory_mb"], 1e-9)
    out = {
        "layers": layers,
        "rounds": rounds,
        "steps_per_round": per,
        "mesh": list(MESH),
        "d": D,
        "hidden": H,
        "batch_per_dp": BATCH_PER_DP,
        "max_rel_loss_diff": diff,
        "frameworks": summary,
        "step_time_ratio": ratio_t,
        "peak_memory_ratio": ratio_m,
        "planned_collectives": program.cost.collectives,
        "cost_model": opts.cost_model,
        "run_options": {k: v for k, v in run_options.items()},
        "torch": torch.__version__,
    }
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "train_speed.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(
        f"train_speed: meshplan/torch step time {ratio_t:.2f}, peak memory {ratio_m:.2f} "
        f"({opts.cost_model} cost model, {program.cost.collectives} planned collectives)"
    )


if __name__ == "__main__":
    main()

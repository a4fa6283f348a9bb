"""Move a tensor between layouts on 8 processes: describe a mesh, plan, create groups, run.

Starts 8 gloo worker processes on this machine by itself:

    python examples/redistribute.py

or runs under torchrun, one process per rank (NCCL when GPUs are present):

    torchrun --nproc-per-node 8 examples/redistribute.py

Every move is checked on every rank against ``shard(x, dst)``, the reference layout.
Last, ``calibrate`` measures every collective on these process groups, and the moves
whose cheapest plan differs on this hardware run again with that plan.
"""

import os
import time

import torch
import torch.distributed as dist

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, shard
from meshplan.redistribute import CostModel, plan
from meshplan.runtime import ProcessGroups, WorkerPool, calibrate, redistribute, run

R, P, S = Replicate(), Partial(), Shard
STARTED = time.time()  # progress lines give the wall time since the start

# 1. Describe the mesh: 8 ranks as (dp=2, pp=2, tp=2), with dp and tp flattened into one
#    alias so that a collective over both runs once on their joint group.
mesh = Mesh.create((2, 2, 2), names=("dp", "pp", "tp")).flatten(("dp", "tp"), "dp_tp")

# 2. Describe the moves and plan them. Planning is pure: every rank computes the same
#    plans, no process needed. (P, R, P) -> (R, R, R) reduces over dp and tp: the
#    planner merges the two all_reduces into one on the dp_tp alias.
shape, uneven = (1024, 512), (1001, 77)
moves = {
    "reduce over dp and tp (merged)": ([P, R, P], [R, R, R], shape, {}),
    "reduce-scatter over dp": ([P, R, R], [S(0), R, R], shape, {}),
    "all-gather a 2-D sharding": ([S(0), R, S(1)], [R, R, R], shape, {}),
    "switch the sharded dim (all_to_all)": ([S(0), R, R], [S(1), R, R], shape, {}),
    "change the shard order (all_permute)": ([S(0), R, S(0)], [S(0), R, S(0)], shape, {0: (2, 0)}),
    "uneven: reshard 1001 x 77": ([S(0), S(1), S(0)], [S(1), R, S(0)], uneven, {}),
}
specs = {
    name: (Spec(mesh, src, size, "float32"), Spec(mesh, dst, size, "float32", order))
    for name, (src, dst, size, order) in moves.items()
}
plans = {name: plan(src, dst) for name, (src, dst) in specs.items()}


def timed(p, src, dst, rank, groups, device, seed=0) -> tuple[bool, float]:
    """Run plan ``p`` on this rank's piece: whether it is right, and seconds per call."""
    x = torch.randn(src.shape, generator=torch.Generator().manual_seed(seed))
    local = shard(x, src)[rank].to(device)
    out = run(p, local, groups)
    correct = torch.allclose(out.cpu(), shard(x, dst)[rank], atol=1e-5)
    calls = 20
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        run(p, local, groups)
    dist.barrier()
    return correct, (time.perf_counter() - start) / calls


def say(text: str, started: float) -> None:
    """A progress line, from rank 0 only (every rank does the same work)."""
    if dist.get_rank() == 0:
        print(f"  [{time.time() - started:5.1f} s] {text}", flush=True)


def on_each_rank(
    device: str = "cpu", started: float = STARTED
) -> list[tuple[str, str, bool, float]]:
    """Steps 3 to 5, run by every rank: (move, collectives, correct, seconds per call)."""
    rank = dist.get_rank()
    say(f"{dist.get_world_size()} ranks up; creating the process groups", started)

    # 3. Create the process groups this rank needs: one per mesh dim and one for the
    #    alias, ordered by mesh coordinate. Every rank creates them in the same order.
    groups = ProcessGroups(mesh, timeout=120)
    groups.create_all()

    # 4. Run every plan on this rank's local tensor, check it, and time it.
    rows = []
    for k, (name, (src, dst)) in enumerate(specs.items(), 1):
        say(f"move {k}/{len(specs)}: {name} (checked, then timed over 20 calls)", started)
        correct, seconds = timed(plans[name], src, dst, rank, groups, device)
        rows.append((name, ", ".join(plans[name].collectives), correct, seconds))

    # redistribute() is the same move, differentiable: the gradient takes the way back.
    src, dst = specs["all-gather a 2-D sharding"]
    x = torch.randn(src.shape, generator=torch.Generator().manual_seed(1))
    local = shard(x, src)[rank].to(device).requires_grad_()
    # every rank sums the same gathered tensor, so its gradient arrives replicated
    redistribute(local, src, dst, groups, dst_grad=dst).sum().backward()
    rows.append(
        ("backward of the all-gather", "(the way back)", bool((local.grad == 1).all()), 0.0)
    )

    # 5. Plan for this hardware: calibrate() times every collective on these groups (up
    #    to the moves' size) and returns the same profile on every rank, so every rank
    #    picks the same plans. Save it with profile.to_json() to plan with it elsewhere.
    say("calibrating: timing every collective on every mesh dim and alias, up to 2 MiB", started)
    profile = calibrate(groups, nbytes=2 << 20, repeats=5, device=device)  # NCCL: on the GPU
    for name, (src, dst) in specs.items():
        mine = plan(src, dst, cost_model=CostModel(profile))
        if mine != plans[name]:
            say(f"calibrated plan differs: running {name!r} again", started)
            correct, seconds = timed(mine, src, dst, rank, groups, device)
            rows.append((f"calibrated: {name}", ", ".join(mine.collectives), correct, seconds))
    return rows


def report(per_rank: list[list[tuple[str, str, bool, float]]]) -> None:
    print(f"{'move':48} {'collectives':32} {'ok':>3} {'ms/call':>8}")
    for i, (name, kinds, _, _) in enumerate(per_rank[0]):
        ok = all(rows[i][2] for rows in per_rank)
        slowest = max(rows[i][3] for rows in per_rank)
        ms = f"{slowest * 1e3:8.2f}" if slowest else f"{'-':>8}"
        print(f"{name:48} {kinds:32} {'yes' if ok else 'NO':>3} {ms}")
    if not all(row[2] for rows in per_rank for row in rows):
        raise SystemExit("some move gave a wrong local tensor")


if __name__ == "__main__":
    if "RANK" in os.environ:  # launched by torchrun: this process is one rank
        cuda = torch.cuda.is_available()
        device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
        if dist.get_world_size() != mesh.size():
            raise SystemExit(f"this example needs {mesh.size()} ranks (--nproc-per-node 8)")
        leader = dist.get_rank() == 0
    else:
        leader = True
    if leader:
        print("mesh:", mesh, "| dp_tp groups:", mesh["dp_tp"].groups())
        print(plans["reduce over dp and tp (merged)"].explain(), "\n")
        print(plans["uneven: reshard 1001 x 77"], "\n")
    if "RANK" in os.environ:
        rows = on_each_rank(device)
        ok = torch.tensor([float(row[2]) for row in rows], device=device)
        seconds = torch.tensor([row[3] for row in rows], device=device)
        dist.all_reduce(ok, dist.ReduceOp.MIN)  # correct on every rank
        dist.all_reduce(seconds, dist.ReduceOp.MAX)  # the slowest rank's time
        if leader:
            merged = zip(rows, ok.tolist(), seconds.tolist(), strict=True)
            report([[(row[0], row[1], bool(o), t) for row, o, t in merged]])
        dist.destroy_process_group()
    else:  # start 8 gloo processes on this machine, run on every rank, report here
        print(f"starting {mesh.size()} gloo processes on this machine ...", flush=True)
        with WorkerPool(mesh.size(), "gloo") as pool:
            report(pool.run(on_each_rank, "cpu", STARTED))

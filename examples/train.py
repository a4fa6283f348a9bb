"""Train a small GPT with FSDP x TP: mesh -> specs -> plan -> parallelize -> torch.optim loop.

Starts its own gloo processes on this machine (8 for the default ``--mesh 2x4``):

    python examples/train.py --steps 20

or runs under torchrun, one process per rank (NCCL when GPUs are present), also with
several launchers:

    torchrun --nproc-per-node 8 examples/train.py --steps 20
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 examples/train.py --steps 20

``--mesh AxB`` is (dp, tp): parameters and optimizer state sharded on dp (FSDP) and on tp
(Megatron-style column/row splits), the batch split on dp. ``--mesh AxBxC`` is
(dp_replicate, dp, tp): a second data-parallel level (HSDP). ``--model`` picks the model:
``gpt`` (written below), ``encoder`` (torch's ``nn.TransformerEncoderLayer`` stack), or a
tiny transformers ``hf-gpt2`` / ``hf-llama``; each is planned whole from its module and
its layouts are given by parameter name pattern (``--auto``: chosen by the planner under
``--memory-budget`` bytes per rank). ``parallelize`` turns the module into this rank's
shards, which ``torch.optim.AdamW`` steps; ``pm.clip_grad_norm_`` clips by the global norm.

``--check`` trains the same model on the same data in one process and compares every
step's loss; ``--save DIR --save-every K`` keeps step k's state (weights, AdamW state,
step, data RNG and position) in ``DIR/step-<k>``, saved in the background; ``--resume
PATH`` continues from it on any mesh and world size, in the checkpoint's dtype.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec
from meshplan.runtime import ProcessGroups, WorkerPool, parallelize
from meshplan.strategy import ComputeModel, plan_module, state_bytes
from meshplan.strategy.programs._module import match_specs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support import GPT, HFLM, MODEL, EncoderLM, Progress, Stream, check_resume, chosen_layouts  # noqa: E402

OPTIM = dict(lr=1e-2, min_lr=1e-3, warmup=3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 1.0
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}  # --check: max relative loss difference


def build(opts: argparse.Namespace) -> torch.nn.Module:
    dtype = getattr(torch, opts.dtype)
    if opts.model == "gpt":
        return GPT(dtype)
    return EncoderLM(dtype) if opts.model == "encoder" else HFLM(opts.model, dtype)


# -- 1. the model and how each tensor lies on the mesh and how each tensor lies on it (FSDP on dp, Megatron TP on tp) -----------

SPECS = {
    "gpt": {
        "h.*.w[qkv1]": "S(0) S(1)",  # column-parallel (in, out)
        "h.*.wo": "S(0) S(0)",  # row-parallel
        "h.*.w2": "S(1) S(0)",  # rows split by tp: FSDP takes the columns
        "tok_emb": "S(0) S(1)",
        "head": "S(0) S(1)",
        "*": "S(0) R",  # norms: sharded on dp, whole on tp
    },
    "encoder": {
        "*.linear1.weight": "S(0) S(0)",  # column-parallel (out, in)
        "*.linear2.weight": "S(0) S(1)",  # row-parallel
        "*.out_proj.weight": "S(0) S(1)",
        "*.in_proj_weight": "S(0) R",
        "embed.weight": "S(0) S(1)",
        "*": "S(0) R",
    },
    "hf-gpt2": {
        "*.c_attn.weight": "S(0) S(1)",  # Conv1D (in, out): column-parallel
        "*.c_fc.weight": "S(0) S(1)",
        "*.c_proj.weight": "S(1) S(0)",  # row-parallel
        "*": "S(0) R",
    },
    "hf-llama": {
        "*.o_proj.weight": "S(0) S(1)",  # row-parallel (the first pattern that matches)
        "*.down_proj.weight": "S(0) S(1)",
        "*_proj.weight": "S(0) S(0)",  # q, k, v, gate, up: column-parallel (out, in)
        "*": "S(0) R",
    },
}


def model_specs(model_name: str, mesh: Mesh) -> dict[str, str]:
    """The layouts by name pattern (the first that matches); on a 3-D mesh replicas on dp_replicate."""
    pre = "R " if mesh.ndim == 3 else ""
    return {k: pre + v for k, v in SPECS[model_name].items()}


def make_mesh(text: str) -> Mesh:
    try:
        shape = tuple(int(k) for k in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--mesh {text!r}: write the mesh as AxB (dp, tp) or AxBxC") from None
    names = {2: ("dp", "tp"), 3: ("dp_replicate", "dp", "tp")}.get(len(shape))
    if names is None or min(shape) < 1:
        raise SystemExit(f"--mesh {text!r}: give 2 dims (dp x tp) or 3 (dp_replicate x dp x tp)")
    if MODEL["heads"] % shape[-1]:
        raise SystemExit(f"--mesh {text!r}: tp={shape[-1]} must divide the {MODEL['heads']} heads")
    return Mesh.create(shape, names=names)


def data_specs(mesh: Mesh) -> list[Spec]:
    """Tokens and targets: the batch split over every data-parallel dim, whole on tp."""
    batch = [Shard(0)] * (mesh.ndim - 1) + [Replicate()]
    return [Spec(mesh, batch, (MODEL["batch"], MODEL["seq"]), "int64")] * 2


def schedule(step: int, total: int) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at ``total`` steps."""
    lr, min_lr, warmup = OPTIM["lr"], OPTIM["min_lr"], OPTIM["warmup"]
    if step <= warmup:
        return lr * step / max(warmup, 1)
    frac = min(1.0, (step - warmup) / max(total - warmup, 1))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))


def adamw(params) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params, **{k: OPTIM[k] for k in ("lr", "betas", "eps", "weight_decay")}
    )


# -- 2. one rank's training loop: the one a user would write ------------------------------


def train_rank(opts: argparse.Namespace, planned, device: str = "cpu") -> dict:
    torch.set_num_threads(1)
    rank, leader = dist.get_rank(), dist.get_rank() == 0
    mesh = planned.program.arg_specs[0].mesh
    groups = ProcessGroups(mesh, timeout=300)
    pm = parallelize(planned, groups, device=device)  # this rank's shards, by name
    pm.load_state_dict(build(opts))  # the initial weights, cut to the planned specs
    opt = adamw(pm.parameters())
    stream, start, total = Stream(), 0, opts.schedule_steps or opts.steps
    R = [Replicate()] * mesh.ndim
    counters = Spec(mesh, R, (3,), "int64")  # step, data position, schedule length
    rng = Spec(mesh, R, tuple(stream.gen.get_state().shape), "uint8")
    if opts.resume:
        extra = pm.load(opts.resume, opt, extra={"state.counters": counters, "state.rng": rng})
        start, stream.position, total = extra["state.counters"].local.tolist()
        stream.gen.set_state(extra["state.rng"].local.cpu())
        if leader:
            print(
                f"resumed from {opts.resume} at step {start} (data position {stream.position})",
                flush=True,
            )
    losses, times, pending = {}, [], None
    for step in range(start + 1, opts.steps + 1):
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = schedule(step, total)
        loss = pm(*pm.local_batch(*stream.next()))
        loss.backward()
        norm = pm.clip_grad_norm_(CLIP).item()
        opt.step()
        opt.zero_grad()
        dt = time.perf_counter() - t0
        losses[step] = loss.item()
        times.append(dt)
        if leader:
            tokens = MODEL["batch"] * MODEL["seq"] / dt
            print(
                f"step {step:4d} loss {losses[step]:.6f} lr {schedule(step, total):.2e} "
                f"grad_norm {norm:.3f} time {dt * 1e3:7.1f} ms tokens/s {tokens:8.0f}",
                flush=True,
            )
        if opts.save and (step % opts.save_every == 0 or step == opts.steps):
            t1, where = time.perf_counter(), os.path.join(opts.save, f"step-{step}")
            state = {
                "state.counters": Sharded(
                    torch.tensor([step, stream.position, total]), counters, rank
                ),
                "state.rng": Sharded(stream.gen.get_state(), rng, rank),
            }
            committed(pending, leader)  # one background save at a time
            pending = pm.save(where, opt, extra=state, blocking=False)
            if leader:
                print(
                    f"saving {where}: held the loop {(time.perf_counter() - t1) * 1e3:.1f} ms",
                    flush=True,
                )
    committed(pending, leader)
    state = sum(3 * p.numel() * p.element_size() for p in pm.parameters())
    return {"losses": losses, "times": times, "state_bytes": state}


def committed(pending, leader: bool) -> None:
    """Wait for a background save (raising its error on every rank) and report it."""
    if pending is not None:
        pending.wait()
        if leader:
            print(
                f"committed {pending.path} ({pending.seconds:.2f} s in the background)", flush=True
            )


# -- 3. the reference: the same model, data and optimizer in one process ------------------


def parity(losses: dict[int, float], opts: argparse.Namespace) -> bool:
    model, stream, ref = build(opts), Stream(), {}
    opt, total = adamw(model.parameters()), opts.schedule_steps or opts.steps
    for step in range(1, opts.steps + 1):
        for group in opt.param_groups:
            group["lr"] = schedule(step, total)
        loss = model(*stream.next())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        ref[step] = loss.item()
    worst = max((abs(losses[k] - ref[k]) / abs(ref[k]) for k in losses), default=0.0)
    tol = TOLERANCE[opts.dtype]
    verdict = "pass" if worst <= tol else "FAIL"
    print(
        f"parity: max rel loss diff {worst:.3e} over {len(losses)} steps: {verdict} (tolerance {tol:g})"
    )
    return worst <= tol


# -- 4. start-up: check the options, plan once, then run every rank ------------------------


def smallest_budget(model: torch.nn.Module, mesh: Mesh) -> float:
    """Bytes per rank of params + grads + AdamW moments with every parameter sharded over
    every rank: no layout takes less (known before tracing)."""
    return sum(
        state_bytes(
            Spec(mesh, [Shard(0)] * mesh.ndim, tuple(p.shape), str(p.dtype)[6:]), True, None
        )
        for p in model.parameters()
    )


def plan(opts: argparse.Namespace, mesh: Mesh, say=print):
    model = build(opts)
    n = sum(p.numel() for p in model.parameters())
    say(
        f"model {opts.model}: {len(list(model.parameters()))} tensors, {n / 1e3:.1f}k parameters "
        f"({opts.dtype}); batch {MODEL['batch']} x {MODEL['seq']} tokens"
    )
    args = dict(
        specs=model_specs(opts.model, mesh), compute=ComputeModel.cpu(), progress=Progress(say)
    )
    if mesh.ndim == 3:  # a bounded search (its gap to the lower bound reported) on a 3-D mesh
        args["max_factor"] = 1 << 12
    if opts.auto:  # the planner chooses every parameter's layout within the budget
        params = dict(model.named_parameters())
        fsdp_tp = match_specs(mesh, params, args["specs"])
        budget = opts.memory_budget or sum(state_bytes(s, True, None) for s in fsdp_tp.values())
        least = smallest_budget(model, mesh)
        if budget < least:
            raise SystemExit(
                f"--memory-budget {budget:.0f}: below the {least:.0f} bytes per rank that "
                f"any layout takes on {mesh.size()} ranks; give --memory-budget {least:.0f} or more"
            )
        n_params = len(list(model.parameters()))
        args |= dict(choose=range(2, 2 + n_params), state_budget=budget)
        say(
            f"auto-sharding: parameters + grads + AdamW moments within {budget / 1e3:.1f} kB "
            f"per rank (the FSDP x TP specs take {sum(state_bytes(s, True, None) for s in fsdp_tp.values()) / 1e3:.1f} kB)"
        )
    say("tracing and planning forward + backward ...")
    t0 = time.perf_counter()
    try:
        planned = plan_module(model, *data_specs(mesh), **args)
    except StrategyError as exc:
        if not opts.auto:
            raise
        raise SystemExit(f"--memory-budget {budget:.0f}: {str(exc).splitlines()[0]}") from None
    p, c = planned.program, planned.program.cost
    say(
        f"planned {len(p.ops)} ops in {time.perf_counter() - t0:.1f} s: {c.collectives} "
        f"collectives, {c.bytes / 1e6:.2f} MB sent per rank per step (modeled comm "
        f"{c.comm * 1e3:.1f} ms, compute {c.compute * 1e3:.1f} ms; {p.method}, within "
        f"{c.total / max(p.lower_bound, 1e-30) - 1:.0%} of the lower bound)"
    )
    if opts.auto:
        say(f"chosen layouts ({p.memory}):")
        for line in chosen_layouts(planned):
            say("  " + line)
    return planned


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mesh", default="2x4", help="AxB = (dp, tp); AxBxC = (dp_replicate, dp, tp)")
    ap.add_argument("--model", choices=tuple(SPECS), default="gpt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--schedule-steps", type=int, default=0, help="lr schedule length (default: --steps)"
    )
    ap.add_argument(
        "--dtype", choices=("float32", "float64"), help="default float32; a resume's own"
    )
    ap.add_argument(
        "--check", action="store_true", help="compare every loss with one-process torch"
    )
    ap.add_argument("--save", metavar="DIR", help="keep checkpoints as DIR/step-<k>")
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--resume", metavar="PATH", help="a step's checkpoint, or the latest under DIR")
    ap.add_argument(
        "--auto", action="store_true", help="the planner chooses every parameter's layout"
    )
    ap.add_argument(
        "--memory-budget", type=float, default=0, metavar="BYTES",
        help="with --auto: params + grads + AdamW state per rank (default: FSDP x TP's)",
    )  # fmt: skip
    opts = ap.parse_args(argv)
    if opts.save_every < 1:
        ap.error(f"--save-every {opts.save_every}: give a step count >= 1")
    if opts.resume is None:
        opts.dtype = opts.dtype or "float32"
    return opts


def main_torchrun(opts: argparse.Namespace) -> None:
    cuda = torch.cuda.is_available()
    device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    mesh = make_mesh(opts.mesh)
    if dist.get_world_size() != mesh.size():
        raise SystemExit(
            f"--mesh {opts.mesh} needs {mesh.size()} ranks, torchrun gave {dist.get_world_size()}"
        )
    box = [plan(opts, mesh) if dist.get_rank() == 0 else None]  # one rank plans
    dist.broadcast_object_list(box, src=0)
    result = train_rank(opts, box[0], device)
    ok = dist.get_rank() != 0 or finish(result, mesh, opts)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


def main_local(opts: argparse.Namespace) -> None:
    mesh = make_mesh(opts.mesh)
    t0 = time.perf_counter()
    print(
        f"mesh {mesh.shape} {','.join(mesh.names)}: starting {mesh.size()} gloo processes (in the background while planning) ..."
    )
    preload = ("meshplan.runtime._run", "meshplan.runtime._program")
    pool = WorkerPool(mesh.size(), "gloo", timeout=3600, start_timeout=600, preload=preload)
    starting = threading.Thread(target=pool.start, daemon=True)
    starting.start()
    planned = plan(opts, mesh)
    while starting.is_alive():
        starting.join(5.0)
        if starting.is_alive():
            print(f"  ... waiting for the processes ({time.perf_counter() - t0:.0f} s)")
    print(f"{mesh.size()} processes ready after {time.perf_counter() - t0:.1f} s; training")
    with pool:
        result = pool.run(train_rank, opts, planned)[0]
    sys.exit(0 if finish(result, mesh, opts) else 1)


def finish(result: dict, mesh: Mesh, opts: argparse.Namespace) -> bool:
    times = result["times"][1:] or result["times"]
    if times:
        mid = sorted(times)[len(times) // 2]
        print(
            f"median step {mid * 1e3:.1f} ms, {MODEL['batch'] * MODEL['seq'] / mid:.0f} tokens/s on "
            f"{mesh.size()} ranks; sharded params + AdamW state {result['state_bytes'] / 1e3:.1f} kB per rank"
        )
    return parity(result["losses"], opts) if opts.check else True


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    options = parse()
    if options.resume and not check_resume(options):
        sys.exit(0)
    if "RANK" in os.environ:  # launched by torchrun: this process is one rank
        main_torchrun(options)
    else:
        main_local(options)

"""Train a small GPT with FSDP x TP: mesh -> parameter specs -> plan_program -> loop -> checkpoint.

Starts its own gloo processes on this machine (8 for the default ``--mesh 2x4``):

    python examples/train.py --steps 20

or runs under torchrun, one process per rank (NCCL when GPUs are present), also with
several launchers:

    torchrun --nproc-per-node 8 examples/train.py --steps 20
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 examples/train.py --steps 20

Mesh dims: ``--mesh AxB`` is (dp, tp): parameters and optimizer state sharded on dp
(FSDP) and on tp (Megatron-style column/row splits), the batch split on dp.
``--mesh AxBxC`` is (dp_replicate, dp, tp): a second data-parallel level (HSDP) whose
ranks hold replicas of the dp-sharded state and take their own part of the batch.

The step is the function ``gpt`` below, written for global tensors with plain torch
ops. ``plan_program`` traces its forward and backward once and picks every op's
sharding; ``run_program`` runs it on this rank's shards and ``loss.backward()`` leaves
each parameter's gradient in the parameter's own spec, so the optimizer (gradient
clipping by the global norm, AdamW, a warm-up + cosine schedule) works on local shards.

``--model encoder`` trains a model this script does not write: a stack of torch's own
``nn.TransformerEncoderLayer`` (causal mask, pre-norm) between an embedding and a head,
planned from the module itself with ``plan_module`` and its layouts given by parameter
name pattern.

``--check`` trains the same model on the same data from the same initial weights in one
process with plain torch autograd and the same optimizer arithmetic, and compares every
step's loss; ``--save DIR --save-every K`` keeps the training state of step k (parameters,
AdamW moments in their parameters' specs, step, schedule, data RNG and position) in
``DIR/step-<k>`` (saved in the background: the loop waits only while its shards are
copied); ``--resume PATH`` continues from it on any mesh and world size.

``--auto`` lets the planner choose every parameter's layout too, the cheapest modeled
step whose parameters, gradients and AdamW moments fit ``--memory-budget`` bytes per
rank (default: what the FSDP x TP specs take); the chosen specs are the ones saved.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import resource
import sys
import threading
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshplan.checkpoint import INDEX_NAME, load, read_metadata, save
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec
from meshplan.runtime import ProcessGroups, WorkerPool, run_program
from meshplan.strategy import ComputeModel, plan_module, plan_program, state_bytes

# -- 1. the model: a small GPT, written for global tensors ------------------------------

MODEL = dict(vocab=64, dim=32, heads=4, layers=2, seq=16, batch=16)
OPTIM = dict(
    lr=1e-2, min_lr=1e-3, warmup=3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0
)
LAYER = ("ln1.w", "ln1.b", "wq", "wk", "wv", "wo", "ln2.w", "ln2.b", "w1", "w2")


def param_names(layers: int = MODEL["layers"]) -> list[str]:
    names = ["tok_emb"]
    for i in range(layers):
        names += [f"h{i}.{n}" for n in LAYER]
    return names + ["ln_f.w", "ln_f.b", "head"]


def gpt(tok, tgt, *params, heads=MODEL["heads"], layers=MODEL["layers"]):
    """Cross-entropy of next-token prediction: embedding, pre-norm attention + MLP blocks."""
    p = dict(zip(param_names(layers), params, strict=True))
    x = F.embedding(tok, p["tok_emb"])
    B, T, D = x.shape
    for i in range(layers):
        w = {n: p[f"h{i}.{n}"] for n in LAYER}
        h = F.layer_norm(x, (D,), w["ln1.w"], w["ln1.b"])
        q, k, v = (
            (h @ w[n]).view(B, T, heads, D // heads).transpose(1, 2) for n in ("wq", "wk", "wv")
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(B, T, D) @ w["wo"]
        h = F.layer_norm(x, (D,), w["ln2.w"], w["ln2.b"])
        x = x + F.gelu(h @ w["w1"]) @ w["w2"]
    x = F.layer_norm(x, (D,), p["ln_f.w"], p["ln_f.b"])
    logits = x @ p["head"]
    return F.cross_entropy(logits.reshape(B * T, -1), tgt.reshape(B * T))


def init_params(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """The global initial weights: the same on every rank and in the --check reference."""
    g = torch.Generator().manual_seed(seed)
    V, D, L = MODEL["vocab"], MODEL["dim"], MODEL["layers"]
    shapes = {
        "tok_emb": (V, D),
        "wq": (D, D),
        "wk": (D, D),
        "wv": (D, D),
        "wo": (D, D),
        "w1": (D, 4 * D),
        "w2": (4 * D, D),
        "head": (D, V),
    }
    out = []
    for name in param_names():
        short = name.split(".", 1)[-1] if name.startswith("h") else name
        if short.endswith(".w"):
            out.append(torch.ones(D, dtype=dtype))
        elif short.endswith(".b"):
            out.append(torch.zeros(D, dtype=dtype))
        else:
            std = 0.02 if short == "tok_emb" else shapes[short][0] ** -0.5
            if short in ("wo", "w2"):
                std /= math.sqrt(2 * L)  # residual projections start small
            out.append(torch.randn(shapes[short], generator=g, dtype=dtype) * std)
    return out


class EncoderLM(torch.nn.Module):
    """``--model encoder``: torch's nn.TransformerEncoderLayer stack, causal, pre-norm."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        V, D, H, L = MODEL["vocab"], MODEL["dim"], MODEL["heads"], MODEL["layers"]
        with torch.random.fork_rng():
            torch.manual_seed(0)  # the same initial weights on every rank and in --check
            self.embed = torch.nn.Embedding(V, D, dtype=dtype)
            self.layers = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(
                    D, H, 4 * D, dropout=0.0, batch_first=True, norm_first=True, dtype=dtype
                )
                for _ in range(L)
            )
            self.head = torch.nn.Linear(D, V, dtype=dtype)

    def forward(self, tok, tgt):
        x = self.embed(tok)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tok.shape[1], dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())


def model_state(opts: argparse.Namespace, dtype: torch.dtype):
    """The model's parameter names and global initial weights, in the program's order."""
    if opts.model == "gpt":
        return param_names(), init_params(dtype)
    named = list(EncoderLM(dtype).named_parameters())
    return [n for n, _ in named], [t.detach() for _, t in named]


def encoder_specs(mesh: Mesh) -> dict[str, str]:
    """FSDP on dp and Megatron TP on tp for the encoder, by parameter name pattern."""
    pre = "R " if mesh.ndim == 3 else ""
    return {
        "*.linear1.weight": pre + "S(0) S(0)",  # column-parallel (out, in)
        "*.linear2.weight": pre + "S(0) S(1)",  # row-parallel
        "*.out_proj.weight": pre + "S(0) S(1)",
        "*.in_proj_weight": pre + "S(0) R",
        "embed.weight": pre + "S(0) S(1)",
        "head.weight": pre + "S(0) R",
        "*": pre + "S(0) R",  # biases and norms: sharded on dp, whole on tp
    }


# -- 2. the mesh and how each tensor lies on it ------------------------------------------


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


def param_specs(mesh: Mesh, dtype: str) -> list[Spec]:
    """FSDP on dp (dim 0 of every matrix), Megatron TP on tp; replicas on dp_replicate."""
    R, S = Replicate(), Shard
    tp = {
        "wq": S(1),
        "wk": S(1),
        "wv": S(1),
        "w1": S(1),
        "wo": S(0),
        "w2": S(0),
        "tok_emb": S(1),
        "head": S(1),
    }
    specs = []
    for name, t in zip(param_names(), init_params(torch.float64), strict=True):
        short = name.rsplit(".", 1)[-1] if name.startswith("h") else name
        if t.ndim == 1:  # norms: sharded on dp, whole on tp
            placements = [S(0), R]
        elif short in ("w2",):  # (4D, D) rows already split by tp: FSDP takes the columns
            placements = [S(1), tp[short]]
        else:
            placements = [S(0), tp[short]]
        if mesh.ndim == 3:
            placements = [R, *placements]
        specs.append(Spec(mesh, placements, tuple(t.shape), dtype))
    return specs


def data_specs(mesh: Mesh) -> list[Spec]:
    """Tokens and targets: the batch split over every data-parallel dim, whole on tp."""
    batch = [Shard(0)] * (mesh.ndim - 1) + [Replicate()]
    shape = (MODEL["batch"], MODEL["seq"])
    return [Spec(mesh, batch, shape, "int64")] * 2


def state_specs(mesh: Mesh) -> dict[str, Spec]:
    """The non-tensor training state, replicated: counters, schedule, the data RNG."""
    R = [Replicate()] * mesh.ndim
    rng = torch.Generator().get_state()
    return {
        "state.counters": Spec(mesh, R, (2,), "int64"),  # step, data position
        "state.schedule": Spec(mesh, R, (6,), "float64"),
        "state.rng": Spec(mesh, R, tuple(rng.shape), "uint8"),
    }


# -- 3. data: a deterministic synthetic token stream -------------------------------------


class Stream:
    """Batches of sequences following x[t+1] = (5 x[t] + c) mod V with 10% noise tokens.

    Its position and generator state are part of the training state.
    """

    def __init__(self, seed: int = 1234) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, V, g = MODEL["batch"], MODEL["seq"], MODEL["vocab"], self.gen
        x = torch.empty(B, T + 1, dtype=torch.int64)
        x[:, 0] = torch.randint(0, V, (B,), generator=g)
        c = torch.randint(1, 4, (B,), generator=g)
        for t in range(T):
            x[:, t + 1] = (5 * x[:, t] + c) % V
        noise = torch.rand(B, T + 1, generator=g) < 0.1
        x = torch.where(noise, torch.randint(0, V, (B, T + 1), generator=g), x)
        self.position += 1
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()


# -- 4. the optimizer: schedule, global-norm clipping, AdamW (elementwise on shards) -----


def schedule(step: int, sched: list[float]) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at ``total`` steps."""
    lr, min_lr, warmup, total = sched[:4]
    if step <= warmup:
        return lr * step / max(warmup, 1)
    frac = min(1.0, (step - warmup) / max(total - warmup, 1))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))


def adamw_(p, g, m, v, step: int, lr: float) -> None:
    """torch.optim.AdamW's arithmetic on one tensor (any shard of it), in place."""
    b1, b2 = OPTIM["betas"]
    p.mul_(1 - lr * OPTIM["weight_decay"])
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (v / (1 - b2**step)).sqrt_().add_(OPTIM["eps"])
    p.addcdiv_(m, denom, value=-lr / (1 - b1**step))


def counts_once(spec: Spec, rank: int) -> bool:
    """Whether this rank's shard enters the global norm: replicas count at coordinate 0 only."""
    coord = spec.mesh.coordinate(rank)
    return all(
        c == 0 for c, p in zip(coord, spec.placements, strict=True) if isinstance(p, Replicate)
    )


# -- 5. one rank's training loop -----------------------------------------------------------


def train_rank(opts: argparse.Namespace, program, device: str = "cpu") -> dict:
    """Run on every rank: load or initialize the state, train, log, checkpoint."""
    from meshplan.runtime import run  # noqa: F401  (load the shell's kernels before step 1)

    rank, leader = dist.get_rank(), dist.get_rank() == 0
    torch.set_num_threads(1)
    dtype = getattr(torch, opts.dtype)
    mesh = program.arg_specs[0].mesh
    groups = ProcessGroups(mesh, timeout=300)
    groups.create_all()
    world_group = groups.get(None)
    p_specs = list(program.arg_specs[2:])
    names, init = model_state(opts, dtype)
    extra = state_specs(mesh)

    def mine(t: torch.Tensor, spec: Spec) -> torch.Tensor:
        return Sharded.from_global(t, spec, rank).local.to(device).clone()

    stream = Stream()
    sched = [OPTIM["lr"], OPTIM["min_lr"], OPTIM["warmup"], opts.schedule_steps or opts.steps, 0, 0]
    if opts.resume:
        path = resolve_resume(opts.resume)
        targets = {f"param.{n}": s for n, s in zip(names, p_specs, strict=True)}
        targets |= {f"adam_m.{n}": s for n, s in zip(names, p_specs, strict=True)}
        targets |= {f"adam_v.{n}": s for n, s in zip(names, p_specs, strict=True)}
        got = load(path, targets | extra, groups, device=device)
        params = [got[f"param.{n}"].local.to(dtype) for n in names]
        ms = [got[f"adam_m.{n}"].local.to(dtype) for n in names]
        vs = [got[f"adam_v.{n}"].local.to(dtype) for n in names]
        start, stream.position = (int(k) for k in got["state.counters"].local.tolist())
        sched = got["state.schedule"].local.tolist()
        stream.gen.set_state(got["state.rng"].local.cpu())
        if leader:
            print(
                f"resumed from {path} at step {start} (data position {stream.position})", flush=True
            )
    else:
        params = [mine(t, s) for t, s in zip(init, p_specs, strict=True)]
        ms = [torch.zeros_like(p) for p in params]
        vs = [torch.zeros_like(p) for p in params]
        start = 0
    params = [p.requires_grad_() for p in params]
    once = [counts_once(s, rank) for s in p_specs]
    state_bytes = sum(3 * p.numel() * p.element_size() for p in params)
    tokens = MODEL["batch"] * MODEL["seq"]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    losses, times, pending = {}, [], None
    for step in range(start + 1, opts.steps + 1):
        t0 = time.perf_counter()
        tok, tgt = stream.next()
        loss = run_program(
            program,
            groups,
            mine(tok, program.arg_specs[0]),
            mine(tgt, program.arg_specs[1]),
            *params,
        )
        loss.backward()
        with torch.no_grad():
            # global grad norm: each element's square once, summed over the whole mesh
            sq = sum(
                (p.grad.pow(2).sum() for p, o in zip(params, once, strict=True) if o),
                torch.zeros((), dtype=dtype, device=device),
            )
            dist.all_reduce(sq, group=world_group.pg)
            norm = sq.sqrt().item()
            scale = min(1.0, OPTIM["clip"] / (norm + 1e-6))
            lr = schedule(step, sched)
            for p, m, v in zip(params, ms, vs, strict=True):
                adamw_(p, p.grad * scale, m, v, step, lr)
                p.grad = None
        dt = time.perf_counter() - t0
        losses[step] = loss.item()
        times.append(dt)
        if leader:
            print(
                f"step {step:4d} loss {losses[step]:.6f} lr {lr:.2e} grad_norm {norm:.3f} "
                f"time {dt * 1e3:7.1f} ms tokens/s {tokens / dt:8.0f}",
                flush=True,
            )
        if opts.save and (step % opts.save_every == 0 or step == opts.steps):
            t1 = time.perf_counter()
            state = {
                f"param.{n}": Sharded(p.detach(), s, rank)
                for n, p, s in zip(names, params, p_specs, strict=True)
            }
            state |= {
                f"adam_m.{n}": Sharded(m, s, rank)
                for n, m, s in zip(names, ms, p_specs, strict=True)
            }
            state |= {
                f"adam_v.{n}": Sharded(v, s, rank)
                for n, v, s in zip(names, vs, p_specs, strict=True)
            }
            counters = torch.tensor([step, stream.position], device=device)
            state["state.counters"] = Sharded(counters, extra["state.counters"], rank)
            state["state.schedule"] = Sharded(
                torch.tensor(sched, dtype=torch.float64, device=device),
                extra["state.schedule"],
                rank,
            )
            state["state.rng"] = Sharded(
                stream.gen.get_state().to(device), extra["state.rng"], rank
            )
            where = os.path.join(opts.save, f"step-{step}")
            # copies this rank's boxes, then writes and commits in the background (on a
            # gloo group of its own) while the next steps run; the commit stays atomic
            committed(pending, leader)
            pending = save(state, where, groups, blocking=False)
            if leader:
                print(
                    f"saving {where}: held the loop {(time.perf_counter() - t1) * 1e3:.1f} ms",
                    flush=True,
                )
    committed(pending, leader)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "losses": losses,
        "times": times,
        "state_bytes": state_bytes,
        "rss_growth_kb": peak - rss0,
        "rss_kb": peak,
    }


def committed(pending, leader: bool) -> None:
    """Wait for a background save (raising its error on every rank) and report it."""
    if pending is not None:
        pending.wait()
        if leader:
            print(
                f"committed {pending.path} ({pending.seconds:.2f} s in the background)", flush=True
            )


def check_resume(opts: argparse.Namespace) -> bool:
    """Before any planning or process start: the checkpoint to resume from exists, holds
    this run's dtype, and stops short of ``--steps``. Sets ``opts.resume`` to the step's
    directory; returns False when training is already done (said on the console)."""
    path = resolve_resume(opts.resume)
    meta = read_metadata(path)
    saved = meta.tensors[f"param.{param_names()[0]}"].dtype
    if saved != opts.dtype:
        raise SystemExit(
            f"--resume {path!r}: its parameters are {saved} and this run's are {opts.dtype}; "
            f"resume with --dtype {saved}"
        )
    one = Spec(Mesh.create(1), [Replicate()], (2,), "int64")  # read by this process alone
    step = int(load(path, {"state.counters": one}, rank=0)["state.counters"].local[0])
    opts.resume = path
    if step >= opts.steps:
        print(
            f"--resume {path!r}: the checkpoint is of step {step} and --steps is {opts.steps}: "
            f"training is already done (give --steps above {step} to go on)",
            flush=True,
        )
        return False
    return True


def resolve_resume(path: str) -> str:
    """A step's checkpoint directory, or the latest ``step-<k>`` under ``path``."""
    if os.path.exists(os.path.join(path, INDEX_NAME)):
        return path
    steps = []
    if os.path.isdir(path):
        for entry in os.listdir(path):
            if (
                entry.startswith("step-")
                and entry[5:].isdigit()
                and os.path.exists(os.path.join(path, entry, INDEX_NAME))
            ):
                steps.append(int(entry[5:]))
    if not steps:
        raise SystemExit(
            f"--resume {path!r}: neither a checkpoint (no {INDEX_NAME}) nor a folder of step-<k> checkpoints"
        )
    return os.path.join(path, f"step-{max(steps)}")


# -- 6. the reference: one process, plain torch autograd, the same optimizer --------------


def reference_losses(opts: argparse.Namespace) -> dict[int, float]:
    dtype = getattr(torch, opts.dtype)
    names, init = model_state(opts, dtype)
    params = [p.clone().requires_grad_() for p in init]
    if opts.model == "encoder":
        from torch.func import functional_call

        model = EncoderLM(dtype)

        def loss_of(tok, tgt, *ps):
            return functional_call(model, dict(zip(names, ps, strict=True)), (tok, tgt))

    else:
        loss_of = gpt
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    sched = [OPTIM["lr"], OPTIM["min_lr"], OPTIM["warmup"], opts.schedule_steps or opts.steps, 0, 0]
    stream, out = Stream(), {}
    for step in range(1, opts.steps + 1):
        tok, tgt = stream.next()
        loss = loss_of(tok, tgt, *params)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            norm = torch.sqrt(sum(g.pow(2).sum() for g in grads)).item()
            scale = min(1.0, OPTIM["clip"] / (norm + 1e-6))
            for p, g, m, v in zip(params, grads, ms, vs, strict=True):
                adamw_(p, g * scale, m, v, step, schedule(step, sched))
        out[step] = loss.item()
    return out


def parity(losses: dict[int, float], opts: argparse.Namespace) -> None:
    ref = reference_losses(opts)
    diffs = [abs(losses[k] - ref[k]) / abs(ref[k]) for k in losses]
    print(
        f"parity: max rel loss diff {max(diffs, default=0.0):.3e} over {len(diffs)} steps",
        flush=True,
    )


# -- 7. start-up: plan once, then run every rank ------------------------------------------


class Progress:
    """plan_program's progress as console lines: each stage's start and end, and in
    between a line at most every 2 s."""

    WHAT = {
        "trace": "tracing forward + backward on fake tensors",
        "strategies": "ops given their candidate strategies",
        "prices": "layout pairs priced (a redistribution planned for each)",
        "solve": "solver round (prices the layout pairs its answer uses)",
        "moves": "assembling the program's ops and moves",
    }

    def __init__(self, say, every: float = 2.0) -> None:
        self.say, self.every, self.stage, self.last = say, every, None, 0.0
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        ends = total and done == total
        if stage == self.stage and now - self.last < self.every and not ends:
            return
        self.stage, self.last = stage, now
        what = self.WHAT.get(stage, stage)
        if stage == "trace":
            what = "traced forward + backward" if done else what
        elif total:
            what = f"{done}/{total} {what}"
        elif stage == "solve":
            what = f"{done}: {what}"
        self.say(f"  {now - self.t0:5.1f} s  {what}")


def plan(opts: argparse.Namespace, mesh: Mesh, say=print):
    dtype = getattr(torch, opts.dtype)
    names, init = model_state(opts, dtype)
    n = sum(t.numel() for t in init)
    say(
        f"model {opts.model}: {len(names)} tensors, {n / 1e3:.1f}k parameters ({opts.dtype}); "
        f"batch {MODEL['batch']} x {MODEL['seq']} tokens"
    )
    specs = data_specs(mesh) + param_specs(mesh, opts.dtype) if opts.model == "gpt" else None
    auto = {}
    if opts.auto:  # the planner chooses every parameter's layout within the budget
        fsdp_tp = sum(state_bytes(s, True, None) for s in specs[2:])
        budget = opts.memory_budget or fsdp_tp
        auto = dict(choose=range(2, len(specs)), memory_budget=budget)
        say(
            f"auto-sharding: parameters + grads + AdamW moments within {budget / 1e3:.1f} kB "
            f"per rank (FSDP x TP takes {fsdp_tp / 1e3:.1f} kB)"
        )
    say("tracing and planning forward + backward ...")
    t0 = time.perf_counter()
    # on a 3-D mesh the exact search is slow: a bounded one (message-passing bounds +
    # local search, its gap to the lower bound reported) plans in seconds
    effort = {} if mesh.ndim < 3 else {"max_factor": 1 << 12}
    if opts.model == "encoder":  # from the module: layouts by parameter name pattern
        program = plan_module(
            EncoderLM(dtype),
            *data_specs(mesh),
            specs=encoder_specs(mesh),
            compute=ComputeModel.cpu(),
            progress=Progress(say),
            strict=True,  # every op the encoder traces to has a rule
            **effort,
        ).program
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ops without a rule run replicated; none here
            program = plan_program(
                gpt, *specs, compute=ComputeModel.cpu(), progress=Progress(say), **effort, **auto
            )
    c = program.cost
    say(
        f"planned {len(program.ops)} ops in {time.perf_counter() - t0:.1f} s: "
        f"{c.collectives} collectives, {c.bytes / 1e6:.2f} MB sent per rank per step "
        f"(modeled comm {c.comm * 1e3:.1f} ms, compute {c.compute * 1e3:.1f} ms; "
        f"{program.method}, within {c.total / max(program.lower_bound, 1e-30) - 1:.0%} of the "
        "lower bound)"
    )
    if opts.auto:
        say(f"chosen layouts ({program.memory}):")
        for line in chosen_layouts(program):
            say("  " + line)
    return program


def chosen_layouts(program) -> list[str]:
    """One line per parameter group (the layers' copies together): its chosen placements."""
    groups: dict[str, dict[str, list[str]]] = {}
    for name, spec in zip(param_names(), program.arg_specs[2:], strict=True):
        group = re.sub(r"^h\d+\.", "h*.", name)
        placements = " ".join(str(p) for p in spec.placements)
        groups.setdefault(group, {}).setdefault(placements, []).append(name.split(".")[0])
    lines = []
    for group, by in groups.items():
        if len(by) == 1:
            lines.append(f"{group:<10} {next(iter(by))}")
        else:
            lines.append(f"{group:<10} " + "; ".join(f"{','.join(n)}: {p}" for p, n in by.items()))
    return lines


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mesh", default="2x4", help="AxB = (dp, tp); AxBxC = (dp_replicate, dp, tp)")
    ap.add_argument(
        "--model",
        choices=("gpt", "encoder"),
        default="gpt",
        help="gpt: the GPT written here; encoder: torch's nn.TransformerEncoderLayer stack",
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--schedule-steps", type=int, default=0, help="length of the lr schedule (default: --steps)"
    )
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
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
        "--memory-budget",
        type=float,
        default=0,
        metavar="BYTES",
        help="with --auto: params + grads + AdamW state per rank (default: FSDP x TP's)",
    )
    opts = ap.parse_args(argv)
    if opts.auto and opts.model != "gpt":
        ap.error("--auto chooses the layouts of the gpt model's parameters; drop --model encoder")
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
    leader = dist.get_rank() == 0
    box = [plan(opts, mesh) if leader else None]  # one rank plans, the others receive it
    dist.broadcast_object_list(box, src=0)
    result = train_rank(opts, box[0], device)
    if leader:
        summary(result, mesh)
        if opts.check:
            parity(result["losses"], opts)
    dist.destroy_process_group()


def main_local(opts: argparse.Namespace) -> None:
    mesh = make_mesh(opts.mesh)
    t0 = time.perf_counter()
    print(
        f"mesh {mesh.shape} {','.join(mesh.names)}: starting {mesh.size()} gloo processes "
        "(in the background while planning) ...",
        flush=True,
    )
    # the fork server imports the shell (and the torch modules it needs) once for all ranks
    pool = WorkerPool(
        mesh.size(),
        "gloo",
        timeout=3600,
        start_timeout=600,
        preload=("meshplan.runtime._run", "meshplan.runtime._program"),
    )
    starting = threading.Thread(target=pool.start, daemon=True)
    starting.start()
    program = plan(opts, mesh, say=lambda s: print(s, flush=True))
    while starting.is_alive():
        starting.join(5.0)
        if starting.is_alive():
            print(f"  ... waiting for the processes ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(
        f"{mesh.size()} processes ready after {time.perf_counter() - t0:.1f} s; training",
        flush=True,
    )
    with pool:
        result = pool.run(train_rank, opts, program)[0]
    summary(result, mesh)
    if opts.check:
        parity(result["losses"], opts)


def summary(result: dict, mesh: Mesh) -> None:
    times = result["times"][1:] or result["times"]
    if times:
        mid = sorted(times)[len(times) // 2]
        print(
            f"median step {mid * 1e3:.1f} ms, {MODEL['batch'] * MODEL['seq'] / mid:.0f} tokens/s on "
            f"{mesh.size()} ranks; sharded params + AdamW state {result['state_bytes'] / 1e3:.1f} kB "
            f"per rank; peak RSS {result['rss_kb'] / 1e3:.0f} MB per rank",
            flush=True,
        )


if __name__ == "__main__":
    options = parse()
    if options.save_every < 1:
        raise SystemExit(f"--save-every {options.save_every}: give a step count >= 1")
    if options.resume and not check_resume(options):
        sys.exit(0)
    if "RANK" in os.environ:  # launched by torchrun: this process is one rank
        main_torchrun(options)
    else:
        main_local(options)
    sys.stdout.flush()

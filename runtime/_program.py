"""Running a planned :class:`~meshplan.strategy.Program`: on process groups and simulated.

:func:`run_program` runs on this rank's local tensors over :class:`ProcessGroups`: the
forward calls and their moves when called, the backward calls when autograd asks for
the arguments' gradients (one ``autograd.Function`` around the pair), so ``loss =
run_program(...)`` then ``loss.backward()`` leaves each argument's gradient in that
argument's own layout. :func:`simulate_program` is its twin for all ranks at once in
one process (``dict`` rank -> tensor), running the same calls and the same plans through
the simulator: the reference the tests compare with.

Every step is decided by the program value; the runner only looks up the aten op,
passes local tensors (and, where an argument holds the result's global shape, the
rank's local shape), and runs the planned moves.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from meshplan.errors import RuntimeShellError
from meshplan.placement import Spec, local_shape, shard
from meshplan.strategy import Program, ProgramOp
from meshplan.strategy.programs._graph import Value
from meshplan.strategy.programs._memory import move_readers

from ._agree import _fingerprint, check_same_call, program_fingerprint
from ._failstop import fails_world
from ._local import as_outputs, checked_seeds, run_local
from ._overlap import (
    BUCKET_BYTES,
    PREFETCH,
    Launch,
    check_options,
    launches,
    releases,
    saved_for_backward,
)

__all__ = ["run_program", "run_unsharded", "simulate_program"]

# -- one rank over process groups --------------------------------------------------------


class _Shell:
    def __init__(
        self, groups: Any, bucket_bytes: int, prefetch: int | None, seeds: dict[int, int]
    ) -> None:
        from ._groups import ProcessGroups

        if not isinstance(groups, ProcessGroups):
            raise RuntimeShellError(
                f"run_program runs on a meshplan.runtime.ProcessGroups, got {groups!r}; build "
                "one with ProcessGroups(mesh) after torch.distributed is initialized",
                value=groups,
            )
        self.groups = groups
        self.rank = groups.rank
        self.device = None
        self.bucket_bytes, self.prefetch = bucket_bytes, prefetch
        self.seeds = seeds

    def start(self, launch: Launch, values: Sequence[torch.Tensor]) -> Any:
        from ._buckets import start

        return start(launch, values, self.groups)

    def move(self, plan: Any, value: torch.Tensor) -> torch.Tensor:
        if plan is None:
            return value
        from ._run import run

        return run(plan, value.contiguous(), self.groups)

    def call(self, op: ProgramOp, tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        device = tensors[0].device if tensors else self.device
        seed = self.seeds.get(op.node)
        return as_outputs(run_local(op, tensors, self.rank, device, seed), op)


class _Sim:
    def __init__(self, program: Program, seeds: dict[int, int]) -> None:
        self.ranks = tuple(program.arg_specs[0].mesh.ranks)
        self.seeds = seeds

    def move(self, plan: Any, value: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        if plan is None:
            return value
        from meshplan.redistribute import simulate

        return simulate(plan, {r: t.contiguous() for r, t in value.items()})

    def start(self, launch: Launch, values: Sequence[dict[int, torch.Tensor]]) -> Any:
        return _Done(
            [self.move(plan, v) for (_, plan), v in zip(launch.moves, values, strict=True)]
        )

    def call(self, op: ProgramOp, tensors: Sequence[dict[int, torch.Tensor]]):
        per_rank = {}
        seed = self.seeds.get(op.node)
        for r in self.ranks:
            local = [t[r] for t in tensors]
            device = local[0].device if local else "cpu"
            per_rank[r] = as_outputs(run_local(op, local, r, device, seed), op)
        n = len(next(iter(per_rank.values())))
        return tuple({r: per_rank[r][j] for r in self.ranks} for j in range(n))


class _Done:
    """A simulated launch: its results exist at once (a bucket changes no value)."""

    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self) -> list[Any]:
        return self.results


class _Moved:
    """Moved copies of values, shared: a value moved to a layout is moved once, serves
    every reader of that layout (forward and backward) and is dropped after the last."""

    def __init__(self, program: Program) -> None:
        self.left: dict[tuple[Value, Spec], int] = move_readers(program)
        self.held: dict[tuple[Value, Spec], Any] = {}
        # started launches not yet read: key -> (the launch's handle, its index there)
        self.pending: dict[tuple[Value, Spec], tuple[Any, int]] = {}

    def fork(self) -> _Moved:
        """A copy to run the backward on (a retained graph may run it again)."""
        other = object.__new__(_Moved)
        other.left, other.held, other.pending = dict(self.left), dict(self.held), {}
        return other

    def start(self, backend: Any, launch: Launch, env: dict[Value, Any]) -> None:
        """Start a launch's moves as one collective; each is waited for where first read."""
        started = backend.start(launch, [env[key[0]] for key, _ in launch.moves])
        for i, (key, _) in enumerate(launch.moves):
            self.pending[key] = (started, i)

    def read(self, backend: Any, plan: Any, v: Value, env: dict[Value, Any]) -> Any:
        if plan is None:
            return env[v]
        key = (v, plan.dst)
        moved = self.held.pop(key, None)
        if moved is None:
            started = self.pending.pop(key, None)
            if started is not None:
                moved = started[0].wait()[started[1]]
            else:
                moved = backend.move(plan, env[v])
        self.left[key] -= 1
        if self.left[key] > 0:
            self.held[key] = moved
        return moved


def _run_ops(
    ops: Sequence[ProgramOp],
    env: dict[Value, Any],
    backend: Any,
    moved: _Moved,
    launched: Sequence[Sequence[Launch]],
    released: Sequence[Sequence[Value]] | None = None,
) -> None:
    """Run ``ops``, starting ``launched[i]`` before op ``i`` and the last entry after the
    ops (for the final reads); each started move is waited for where it is read. The
    values in ``released[i]`` leave ``env`` once op ``i`` has run."""
    for i, (op, starts) in enumerate(zip(ops, launched, strict=False)):
        for launch in starts:
            moved.start(backend, launch, env)
        ins = [moved.read(backend, p, v, env) for p, v in zip(op.moves, op.inputs, strict=True)]
        outs = backend.call(op, ins)
        for j, o in enumerate(outs):
            if j < len(op.output_specs) and op.output_specs[j] is not None:
                env[Value(op.node, j)] = o
        if released is not None:
            for v in released[i]:
                env.pop(v, None)
    for launch in launched[len(ops)]:
        moved.start(backend, launch, env)


def _grads(
    program: Program, env: dict[Value, Any], backend: Any, zeros, moved: _Moved
) -> list[Any]:
    out = []
    for v, plan, spec in zip(
        program.graph.grads, program.grad_moves, program.grad_specs, strict=True
    ):
        if spec is None:
            out.append(None)
        elif v is None:
            out.append(zeros(spec))
        else:
            out.append(moved.read(backend, plan, v, env))
    return out


# -- the simulator twin ---------------------------------------------------------------------


def simulate_program(
    program: Program,
    *args: Mapping[int, torch.Tensor],
    cotangents: Sequence[Mapping[int, torch.Tensor]] | None = None,
    seed: int | None = None,
    step: int = 0,
) -> tuple[tuple[dict[int, torch.Tensor], ...], tuple[dict[int, torch.Tensor] | None, ...]]:
    """Run ``program`` for every rank at once: (outputs, gradients), each rank -> tensor.

    ``args`` hold every rank's local tensor of each argument (e.g. from
    :func:`~meshplan.placement.shard`); ``cotangents`` the gradients arriving for the
    outputs, in ``program.cot_specs`` (default: ones, the gradient of a loss). The
    outputs are the function's, then the new value of each argument it writes into
    (``program.writes``: a buffer's update), in that argument's spec; ``args`` are not
    changed. A program that draws random numbers needs ``seed`` (and ``step``), as
    :func:`run_program` does.
    """
    _check_program(program)
    if len(args) != len(program.arg_specs):
        raise RuntimeShellError(
            f"the program takes {len(program.arg_specs)} arguments, got {len(args)}", value=args
        )
    backend = _Sim(program, checked_seeds(program, seed, step))
    env: dict[Value, Any] = {}
    for k, a in zip(program.graph.args, args, strict=True):
        env[Value(k)] = dict(a)
    if cotangents is None:
        cotangents = [
            shard(torch.ones(s.shape, dtype=getattr(torch, s.dtype)), s) for s in program.cot_specs
        ]
    for k, c in zip(program.graph.cotangents, cotangents, strict=True):
        env[Value(k)] = dict(c)
    moved = _Moved(program)
    _run_ops(program.ops, env, backend, moved, launches(program, "all"))
    outs = tuple(
        moved.read(backend, p, v, env)
        for v, p in zip(program.graph.outputs, program.out_moves, strict=True)
    )

    def zeros(spec: Spec) -> dict[int, torch.Tensor]:
        return shard(torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype)), spec)

    return outs, tuple(_grads(program, env, backend, zeros, moved))


# -- one rank, differentiable -----------------------------------------------------------


class _RunProgram(torch.autograd.Function):
    @staticmethod
    @fails_world  # a rank failing here stops its peers within seconds (see _failstop)
    def forward(ctx: Any, program: Program, backend: _Shell, *locals_: torch.Tensor):  # type: ignore[override]
        env: dict[Value, Any] = {}
        saved = saved_for_backward(program)
        for i, (k, t) in enumerate(zip(program.graph.args, locals_, strict=True)):
            # an argument written after the call keeps its old value for the backward
            keep = i in program.writes and Value(k) in saved
            env[Value(k)] = t.detach().clone() if keep else t.detach()
        moved = _Moved(program)
        options = {"bucket_bytes": backend.bucket_bytes, "prefetch": backend.prefetch}
        _run_ops(
            program.forward_ops,
            env,
            backend,
            moved,
            launches(program, "forward", **options),
            releases(program, "forward"),
        )
        outs = tuple(
            moved.read(backend, p, v, env)
            for v, p in zip(program.graph.outputs, program.out_moves, strict=True)
        )
        ctx.program, ctx.backend, ctx.moved = program, backend, moved
        # saved as autograd saves tensors: freed by a backward without retain_graph, kept
        # for the next with it (and a second backward after a free raises torch's error)
        ctx.keys = tuple(v for v in env if v in saved)
        ctx.save_for_backward(*(env[v] for v in ctx.keys))
        ctx.devices = [t.device for t in locals_]
        ctx.mark_non_differentiable(*outs[program.graph.n_results :])
        return outs

    @staticmethod
    @fails_world
    def backward(ctx: Any, *gouts: torch.Tensor):  # type: ignore[override]
        program, backend = ctx.program, ctx.backend
        env = dict(zip(ctx.keys, ctx.saved_tensors, strict=True))
        gouts = gouts[: program.graph.n_results]  # none arrive for written arguments
        for k, g, spec in zip(program.graph.cotangents, gouts, program.cot_specs, strict=True):
            if g is None:
                g = torch.zeros(local_shape(spec, backend.rank), dtype=getattr(torch, spec.dtype))
            env[Value(k)] = g.contiguous()
        moved = ctx.moved.fork()
        options = {"bucket_bytes": backend.bucket_bytes, "prefetch": backend.prefetch}
        _run_ops(
            program.backward_ops,
            env,
            backend,
            moved,
            launches(program, "backward", **options),
            releases(program, "backward"),
        )

        def zeros(spec: Spec) -> torch.Tensor:
            return torch.zeros(local_shape(spec, backend.rank), dtype=getattr(torch, spec.dtype))

        grads = _grads(program, env, backend, zeros, moved)
        return (None, None, *grads)


def run_program(
    program: Program,
    groups: Any,
    *locals_: torch.Tensor,
    bucket_bytes: int = BUCKET_BYTES,
    prefetch: int | None = PREFETCH,
    seed: int | None = None,
    step: int = 0,
) -> Any:
    """Run ``program`` on this rank's local tensors over ``groups``; differentiable.

    Returns the local outputs (one tensor, or a tuple for several), each in its
    ``program.out_specs`` layout. An argument the function writes into (in place, like
    a BatchNorm's running statistics: ``program.writes``) is written here too: its local
    tensor receives this rank's part of the new value, in its own spec, as the module's
    buffer would on one process.

    Random ops (dropout's ``bernoulli``, ``rand``, ``normal_`` ...) give each rank its
    shard of one global draw, so the run equals one process with the same stream
    (:func:`run_unsharded`); the stream is a pure function of ``seed`` and ``step``
    (required when the program draws; every rank passes the same): pass the training
    step as ``step`` so each step draws anew, and a resumed run continues the stream by
    passing the step it resumes at. Each rank draws each random op's whole global tensor
    and keeps its chunks (exact on CPU; O(global numel) per random op, see
    :mod:`meshplan.strategy.rules._random`). Their backward runs the program's backward calls and
    leaves each argument's gradient in the argument's own spec (``program.grad_specs``);
    the gradient arriving for an output must be in ``program.cot_specs`` (a replicated
    loss's ``loss.backward()`` is). Like torch's autograd, ``backward(retain_graph=True)``
    keeps what the backward needs for another one; without it that is freed.

    Every rank of the mesh calls it. Before anything runs it checks that the local
    tensors fit the program's arguments (count, shapes, dtypes); with the groups'
    ``check_specs`` (the default) the ranks also agree on it, one small all_reduce per
    call: if one rank's tensors do not fit, or the ranks run different programs, every
    rank raises :class:`RuntimeShellError` at once instead of waiting for that rank
    until the groups' timeout.

    Collectives overlap the ops between them and small ones travel together (see
    :mod:`meshplan.runtime._overlap`): a move that is one all_reduce, reduce_scatter or
    all_gather starts as soon as its input exists, at most ``prefetch`` ops ahead of its
    first reader (None: no limit; what it moves is held from then on), and is waited for
    where that reader runs. Such moves of one kind on one group that start within a few
    ops of each other (``GATHER_OPS``) start together as one collective on one flat
    buffer of at most ``bucket_bytes`` (default 25 MiB; 0 starts each alone). Results equal unbucketed runs (reductions are
    elementwise); every rank starts the same collectives in the same order, and with
    ``check_specs`` the ranks check that they pass the same ``bucket_bytes`` and
    ``prefetch`` (part of the one all_reduce above).
    """
    _check_program(program)
    check_options(bucket_bytes, prefetch)
    backend = _Shell(groups, bucket_bytes, prefetch, checked_seeds(program, seed, step))
    problem = _misfit(program, backend.rank, locals_)
    if groups.check_specs:  # every rank stops here if one does (see _agree)
        mine = _call_fingerprint(program, bucket_bytes, prefetch, (seed, step))
        check_same_call(groups, mine, problem, "program")
    elif problem is not None:
        raise problem
    outs = _RunProgram.apply(program, backend, *locals_)
    n = program.graph.n_results
    with torch.no_grad():
        for k, new in zip(program.writes, outs[n:], strict=True):
            locals_[k].copy_(new)
    outs = outs[:n]
    return outs[0] if len(outs) == 1 else outs


def run_unsharded(
    program: Program,
    *tensors: torch.Tensor,
    cotangents: Sequence[torch.Tensor] | None = None,
    seed: int | None = None,
    step: int = 0,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """The program's traced calls on whole tensors, in this process: (outputs, gradients).

    The one-process reference of a sharded run: no layouts, no moves, every call its
    aten op on global tensors, and each random op drawing from the same stream as
    :func:`run_program` with the same ``seed`` and ``step`` (so a sharded run with
    dropout equals this exactly). Outputs as :func:`simulate_program` gives them (the
    function's, then the written arguments' new values); ``cotangents`` default to ones.

    >>> import torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard, Spec
    >>> from meshplan.strategy import plan_program
    >>> x = Spec(Mesh.create((2,)), [Shard(0)], (4, 3), "float64")
    >>> prog = plan_program(lambda x: torch.nn.functional.dropout(x, 0.5).sum(), x)
    >>> (loss,), (grad,) = run_unsharded(prog, torch.ones(4, 3, dtype=torch.float64), seed=0)
    >>> bool(loss == grad.sum())
    True
    """
    _check_program(program)
    graph = program.graph
    if len(tensors) != len(program.arg_specs):
        raise RuntimeShellError(
            f"the program takes {len(program.arg_specs)} tensors, got {len(tensors)}",
            value=len(tensors),
        )
    seeds = checked_seeds(program, seed, step)
    env: dict[Value, Any] = {Value(k): t.detach() for k, t in zip(graph.args, tensors, strict=True)}
    if cotangents is None:
        cotangents = [torch.ones(s.shape, dtype=getattr(torch, s.dtype)) for s in program.cot_specs]
    for k, c in zip(graph.cotangents, cotangents, strict=True):
        env[Value(k)] = c
    for n in graph.calls:
        node = graph.nodes[n]
        op = ProgramOp(n, node.call, node.inputs, (), (), (), node.phase)
        ins = [env[v] for v in node.inputs]
        device = ins[0].device if ins else None
        for j, o in enumerate(as_outputs(run_local(op, ins, 0, device, seeds.get(n)), op)):
            if node.metas[j] is not None:
                env[Value(n, j)] = o
    grads = []
    for v, spec in zip(graph.grads, program.grad_specs, strict=True):
        if spec is None:
            grads.append(None)
        else:
            grads.append(
                env[v]
                if v is not None
                else torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype))
            )
    return tuple(env[v] for v in graph.outputs), tuple(grads)


_MOVES: weakref.WeakKeyDictionary[Program, str] = weakref.WeakKeyDictionary()


def _call_fingerprint(
    program: Program, bucket_bytes: int, prefetch: int | None, stream: Any = None
) -> int:
    """What every rank must agree on before a call: the program, its moves (they decide
    the collectives) and the options that decide when those start and which travel
    together."""
    moves = _MOVES.get(program)
    if moves is None:
        plans = [p for op in program.ops for p in op.moves]
        plans += [*program.out_moves, *program.grad_moves]
        moves = _MOVES[program] = "|".join("-" if p is None else str(p.dst) for p in plans)
    parts = [str(program_fingerprint(program)), moves, f"{bucket_bytes} {prefetch} {stream}"]
    return _fingerprint(parts)


def _misfit(program: Program, rank: int, locals_: Sequence[Any]) -> RuntimeShellError | None:
    """Why this rank's local tensors do not fit the program's arguments (count, type,
    shape, dtype), or None."""
    if len(locals_) != len(program.arg_specs):
        return RuntimeShellError(
            f"the program takes {len(program.arg_specs)} local tensors, got {len(locals_)} "
            f"on rank {rank}",
            value=len(locals_),
        )
    for i, (t, spec) in enumerate(zip(locals_, program.arg_specs, strict=True)):
        if not isinstance(t, torch.Tensor):
            return RuntimeShellError(
                f"argument {i} is {t!r:.80} on rank {rank}, not a tensor", value=t
            )
        want = tuple(local_shape(spec, rank))
        if tuple(t.shape) != want:
            return RuntimeShellError(
                f"argument {i} has local shape {tuple(t.shape)} on rank {rank}, but "
                f"{spec} gives it {want}; pass this rank's shard of the argument",
                value=tuple(t.shape),
            )
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype != spec.dtype:
            return RuntimeShellError(
                f"argument {i} has dtype {dtype} on rank {rank}, but the program was planned "
                f"for {spec}; convert it (.to(torch.{spec.dtype})) or plan for {dtype}",
                value=t.dtype,
            )
    return None


def _check_program(program: Any) -> None:
    if not isinstance(program, Program):
        raise RuntimeShellError(
            f"expected a Program from meshplan.strategy.plan_program, got {program!r}",
            value=program,
        )

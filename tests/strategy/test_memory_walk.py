"""The incremental memory walk (``strategy.programs._memory.step_memory``) against the walk it
replaced, which rebuilt the live set at every op: equal results on random programs.

The reference below is that walk (with the gathers' flat buffers it has counted since)."""

from __future__ import annotations

import warnings

import attrs
from _program_cases import arg_specs, build, meshes, programs
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.strategy import ComputeModel, plan_program
from meshplan.strategy.programs._graph import Value
from meshplan.strategy.programs._memory import (
    _KEEPS_STRIDES,
    _STRIDE_FREE,
    _STRIDED,
    _VIEWS,
    _gathers,
    _last_reads,
    local_bytes,
    move_readers,
    program_memory,
    saved_values,
    step_memory,
)


class _Walk:
    """Live storage over the runner's schedule (the live set rebuilt per op)."""

    def __init__(self, program, free_grads: frozenset) -> None:
        self.specs = dict(program.value_specs)
        self.strided: set = set()
        self.size: list[float] = []
        self.env: dict = {}
        self.held: dict = {}
        self.pinned: set[int] = set()
        self.free_grads = free_grads
        self.left: dict = move_readers(program)
        self.peak = 0.0

    def new(self, nbytes: float) -> int:
        self.size.append(nbytes)
        return len(self.size) - 1

    def read(self, v, plan, transient: list[int]) -> int:
        if plan is None:
            return self.env[v]
        key = (v, plan.dst)
        b = self.held.pop(key, None)
        if b is None:
            if v in self.strided:
                transient.append(self.new(local_bytes(self.specs.get(v))))
            b = self.new(local_bytes(plan.dst))
            if _gathers(plan):
                transient.append(self.new(local_bytes(plan.src)))
                transient.append(self.new(local_bytes(plan.dst)))
        self.left[key] -= 1
        if self.left[key] > 0:
            self.held[key] = b
        else:
            transient.append(b)
        return b

    def live(self, extra=()) -> float:
        bufs = set(self.env.values()) | set(self.held.values()) | self.pinned | set(extra)
        return sum(self.size[b] for b in bufs)

    def run(self, ops, released) -> None:
        for op, drop in zip(ops, released, strict=True):
            transient: list[int] = []
            ins = [self.read(v, p, transient) for v, p in zip(op.inputs, op.moves, strict=True)]
            name = op.call.op
            if name not in _STRIDE_FREE:
                for v, p in zip(op.inputs, op.moves, strict=True):
                    if p is None and v in self.strided:
                        transient.append(self.new(local_bytes(self.specs.get(v))))
            for j, spec in enumerate(op.output_specs):
                if spec is None:
                    continue
                v = Value(op.node, j)
                if j == 0 and ins and name in _VIEWS:
                    self.env[v] = ins[0]
                else:
                    self.env[v] = self.new(0.0 if v in self.free_grads else local_bytes(spec))
                if j == 0 and op.inputs:
                    unmoved_strided = op.moves[0] is None and op.inputs[0] in self.strided
                    if name in _STRIDED or (name in _KEEPS_STRIDES and unmoved_strided):
                        self.strided.add(v)
            self.peak = max(self.peak, self.live(transient))
            for v in drop:
                self.env.pop(v, None)


def _reference(program, per_param):
    graph = program.graph
    differentiated = tuple(s is not None for s in program.grad_specs)
    state = program_memory(program.arg_specs, differentiated, per_param)
    inputs = sum(
        local_bytes(s) for s, d in zip(program.arg_specs, differentiated, strict=True) if not d
    )
    saved = saved_values(graph)
    free_grads = frozenset(
        v
        for v, p in zip(graph.grads, program.grad_moves, strict=True)
        if v is not None and p is None
    )
    walk = _Walk(program, free_grads)
    args = {Value(k): walk.new(0.0) for k in graph.args}
    walk.env.update(args)
    forward, backward = program.forward_ops, program.backward_ops
    walk.run(forward, _last_reads(forward, saved | set(graph.outputs)))
    outs = [walk.read(v, p, []) for v, p in zip(graph.outputs, program.out_moves, strict=True)]
    kept = {v: walk.env[v] for v in saved if v in walk.env}
    activations = sum(walk.size[b] for b in set(kept.values()))
    moved = sum(walk.size[b] for b in set(walk.held.values()) - set(kept.values()))
    walk.pinned = set(kept.values()) | set(walk.held.values())
    walk.env = {**args, **kept}
    walk.peak = max(walk.peak, walk.live(outs))
    for k, spec in zip(graph.cotangents, program.cot_specs, strict=True):
        walk.env[Value(k)] = walk.new(local_bytes(spec))
    grads = {v for v in graph.grads if v is not None}
    walk.run(backward, _last_reads(backward, grads))
    final: list[int] = []
    for v, p in zip(graph.grads, program.grad_moves, strict=True):
        if v is not None and p is not None:
            key = (v, p.dst)
            b = walk.held.pop(key, None)
            final.append(b if b is not None else walk.new(0.0))
            final.append(walk.new(local_bytes(p.src)))
    walk.peak = max(walk.peak, walk.live(final))
    transient = max(0.0, walk.peak - activations - moved)
    return attrs.evolve(
        state, inputs=inputs, activations=activations, moved=moved, transient=transient
    )


@settings(max_examples=min(settings.default.max_examples, 15), deadline=None)
@given(data=st.data(), mesh=meshes(), prog=programs(max_ops=6, n_weights=2))
def test_the_incremental_walk_equals_the_live_set_rebuilt_per_op(data, mesh, prog):
    specs = data.draw(arg_specs(mesh, 6, 6, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = plan_program(build(prog, 2), *specs, compute=ComputeModel.cpu())
    for per_param in (None, 0.0):
        assert step_memory(program, per_param) == _reference(program, per_param)

"""What a program's step costs in memory per rank (pure arithmetic, no torch).

Each differentiated argument (a parameter) holds, on every rank, its local shard, its
gradient's local shard (the gradient lies as the parameter does: :func:`grad_spec`)
and the optimizer's state for it: ``state_bytes_per_param`` bytes per local element
(default: two moments in the parameter's dtype, what AdamW keeps). Arguments without
a gradient (token ids, masks, tables) are inputs, not training state, and count
nothing.

A rank's bytes are counted as the sum of each tensor's largest local size over the
mesh: every rank holds at most that much (an uneven shard's short ranks hold less), so
a budget met this way is met on every rank. The count is separable (a sum over
tensors), which is what lets the auto-sharding solver price memory per argument.

The whole step (:func:`step_memory`) adds what the schedule :func:`~meshplan.runtime.run_program`
runs holds beside the state: the inputs without a gradient, the activations (every value
of the forward that the backward reads, kept from its producer to the end of the
backward in its producer's local layout), the moved copies the forward makes and the
backward reads again (held as long), and at the peak the transient values of the op that
reaches it. Gradients are counted for the whole step, as a training loop that keeps
``.grad`` between steps holds them. The peak is found by walking the ops in the order
the runner runs them, forward then backward, with the runner's own releases; a view
(``view``, ``t``, ``transpose`` ...) of a value that was not moved shares its storage.

A lower estimate of that peak is separable (:func:`activation_bytes`): the state, the
inputs and each saved value in its producer's chosen layout (views of saved values, and
``expand`` s, counted nothing). The saved values are all held at once at the end of the
backward, with every gradient, so the estimate never exceeds the peak: a budget that
bounds it in the solver is a relaxation of the peak's budget, and its bound a true one.
"""

from __future__ import annotations

import sys

import attrs

from meshplan.errors import StrategyError
from meshplan.layout._ints import brief
from meshplan.placement import Spec, dtype_itemsize

from ._candidates import local_numel
from ._graph import Phase, Value

__all__ = [
    "ProgramMemory",
    "state_bytes",
    "program_memory",
    "check_state_bytes_per_param",
    "as_float",
    "saved_values",
    "activation_bytes",
    "step_memory",
    "local_bytes",
]


@attrs.frozen
class ProgramMemory:
    """Bytes per rank of a program's step: the training state (``params``, ``grads``,
    ``optimizer``) and the rest of its peak (``inputs``, ``activations``, ``moved``,
    ``transient``); ``recomputed`` counts the forward calls the backward runs again
    (their values are held only in their backward window, within ``transient``).

    ``total`` (also ``state``) is the training state, the quantity a ``state_budget``
    bounds; ``peak`` the whole step's peak, the sum of every part, the quantity a
    ``memory_budget`` bounds; ``per_arg`` each argument's share of the state (0 for
    arguments without a gradient).

    >>> m = ProgramMemory(params=8.0, grads=8.0, optimizer=16.0, per_arg=(32.0,),
    ...                   activations=40.0, transient=8.0)
    >>> m.total, m.peak
    (32.0, 80.0)
    """

    params: float
    grads: float
    optimizer: float
    per_arg: tuple[float, ...] = ()
    inputs: float = 0.0
    activations: float = 0.0
    moved: float = 0.0
    transient: float = 0.0
    recomputed: int = 0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def state(self) -> float:
        return self.total

    @property
    def peak(self) -> float:
        return self.total + self.inputs + self.activations + self.moved + self.transient

    def __str__(self) -> str:
        def gb(x: float) -> str:
            return f"{x / 1e9:.3g} GB" if x >= 1e8 else f"{x / 1e3:.1f} kB"

        return (
            f"peak {gb(self.peak)} per rank (params {gb(self.params)}, grads {gb(self.grads)}, "
            f"optimizer {gb(self.optimizer)}, inputs {gb(self.inputs)}, activations "
            f"{gb(self.activations)}, moved {gb(self.moved)}, transient {gb(self.transient)})"
            + (f"; {self.recomputed} forward calls recomputed" if self.recomputed else "")
        )


def as_float(value) -> float | None:
    """``value`` as a float if it is an int or float (never a bool) a float can hold,
    else None (an int beyond a float's range too).

    >>> as_float(3), as_float(10**400), as_float(True)
    (3.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def check_state_bytes_per_param(value) -> float | None:
    """``value`` as a float if it is None or a number >= 0 a float can hold; raise a
    StrategyError naming it and the range otherwise."""
    if value is None:
        return None
    number = as_float(value)
    if number is None or not number >= 0:
        raise StrategyError(
            f"state_bytes_per_param={brief(value)} must be a number of bytes >= 0 and <= "
            f"{sys.float_info.max:.2g} per parameter element (None: two moments in the "
            "parameter's dtype, as AdamW keeps)",
            value=value,
        )
    return number


def _parts(spec: Spec, state_bytes_per_param: float | None) -> tuple[float, float, float]:
    n = local_numel(spec)
    item = dtype_itemsize(spec.dtype)
    state = 2.0 * item if state_bytes_per_param is None else state_bytes_per_param
    return float(n * item), float(n * item), float(n * state)


def state_bytes(spec: Spec, differentiated: bool, state_bytes_per_param: float | None) -> float:
    """Bytes per rank one argument's training state takes in ``spec`` (0 without a gradient).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((4,))
    >>> state_bytes(Spec(mesh, [Shard(0)], (8, 2), "float32"), True, None)  # 4 elems x 16 B
    64.0
    >>> state_bytes(Spec(mesh, [Replicate()], (8, 2), "float32"), True, None)
    256.0
    """
    if not isinstance(spec, Spec):
        raise StrategyError(
            f"state_bytes takes the argument's Spec, got {spec!r:.80}; e.g. "
            "state_bytes(Spec(mesh, [Shard(0)], shape, dtype), True, None)",
            value=spec,
        )
    if not differentiated:
        return 0.0
    return sum(_parts(spec, check_state_bytes_per_param(state_bytes_per_param)))


def program_memory(arg_specs, differentiated, state_bytes_per_param: float | None) -> ProgramMemory:
    """The :class:`ProgramMemory` of arguments in ``arg_specs`` (``differentiated[i]``:
    whether argument ``i`` has a gradient)."""
    params = grads = optimizer = 0.0
    per_arg = []
    for spec, d in zip(arg_specs, differentiated, strict=True):
        if not d:
            per_arg.append(0.0)
            continue
        p, g, o = _parts(spec, state_bytes_per_param)
        params, grads, optimizer = params + p, grads + g, optimizer + o
        per_arg.append(p + g + o)
    return ProgramMemory(params, grads, optimizer, tuple(per_arg))


# -- the whole step ---------------------------------------------------------------------

#: ops whose local result shares its input's storage (a view); ``expand`` grows the
#: shape without growing the storage
_VIEWS = frozenset(
    {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "detach", "alias"}
    | {"unsqueeze", "squeeze", "expand", "slice", "select", "as_strided", "unflatten"}
)
_GROWS = frozenset({"expand"})
#: ops whose local result is not contiguous, and views that keep their input's strides;
#: the runner copies such a value to contiguous storage before a move reads it, and
#: before any op outside ``_STRIDE_FREE`` does (``runtime._program``)
_STRIDED = frozenset({"t", "transpose", "permute", "expand"})
_KEEPS_STRIDES = frozenset({"detach", "alias", "unsqueeze", "squeeze"})
_STRIDE_FREE = frozenset(
    {"t", "transpose", "permute", "view", "_unsafe_view", "reshape", "detach", "alias"}
    | {"unsqueeze", "squeeze", "expand", "clone"}
)


def local_bytes(spec: Spec | None) -> float:
    """Bytes of a rank's largest local piece of ``spec`` (0 for None)."""
    if spec is None:
        return 0.0
    return float(local_numel(spec) * dtype_itemsize(spec.dtype))


def saved_values(graph) -> frozenset:
    """The values of the forward's calls that the backward reads (its calls' inputs and
    the arguments' gradients): what the forward keeps for the backward."""
    forward = {i for i in graph.calls if graph.nodes[i].phase is Phase.FORWARD}
    reads = {
        v
        for i in graph.calls
        if graph.nodes[i].phase is Phase.BACKWARD
        for v in graph.nodes[i].inputs
    }
    reads.update(v for v in graph.grads if v is not None)
    return frozenset(v for v in reads if v.node in forward)


def _counted(graph, saved: frozenset) -> frozenset:
    """The saved values a separable estimate counts: not a view of another saved value
    or of an argument (through a chain of views), nor an ``expand`` (a view bigger than
    its storage)."""
    out = set()
    for v in saved:
        call = graph.nodes[v.node].call
        if call is not None and call.op in _GROWS:
            continue
        u, shared = v, False
        while True:
            node = graph.nodes[u.node]
            if node.call is None:  # a view of an argument: its storage is the argument's
                shared = u != v
                break
            if node.call.op not in _VIEWS or not node.inputs:
                break
            u = node.inputs[0]
            if u in saved:
                shared = True
                break
        if not shared:
            out.add(v)
    return frozenset(out)


def activation_bytes(graph, options_of) -> dict[int, list[float]]:
    """Per forward call that makes a saved value, per candidate option, the bytes its
    saved values take in that option's output layouts (see the module docstring: the
    separable lower estimate). ``options_of(node)``: the call's options."""
    counted = _counted(graph, saved_values(graph))
    by_node: dict[int, list[int]] = {}
    for v in counted:
        by_node.setdefault(v.node, []).append(v.index)
    out = {}
    for node, outs in by_node.items():
        out[node] = [
            sum(local_bytes(o.output_specs[j]) for j in outs if j < len(o.output_specs))
            for o in options_of(node)
        ]
    return out


def _last_reads(ops, keep) -> list[list]:
    """Entry ``i``: the values no later op of ``ops`` reads (nor ``keep`` holds): the
    runner drops them once op ``i`` has run."""
    last: dict = {}
    for i, op in enumerate(ops):
        for j in range(len(op.output_specs)):
            last.setdefault(Value(op.node, j), i)
        for v in op.inputs:
            last[v] = i
    out: list[list] = [[] for _ in ops]
    for v, i in last.items():
        if v not in keep:
            out[i].append(v)
    return out


def move_readers(program) -> dict:
    """How many reads each moved copy ``(value, target spec)`` serves over the step (the
    forward's ops, the outputs and the gradients): the copy is made once and dropped after
    its last reader, by the runner and by the memory walk alike."""
    left: dict = {}
    reads = [zip(op.inputs, op.moves, strict=True) for op in program.ops]
    reads.append(zip(program.graph.outputs, program.out_moves, strict=True))
    reads.append(zip(program.graph.grads, program.grad_moves, strict=True))
    for pairs in reads:
        for v, plan in pairs:
            if plan is not None and v is not None:
                key = (v, plan.dst)
                left[key] = left.get(key, 0) + 1
    return left


def _gathers(plan) -> bool:
    """Whether ``plan`` is one all_gather: the runner gathers into a flat buffer from a flat
    copy of the input (``runtime._buckets``), then copies the result out."""
    steps = plan.steps
    return len(steps) == 1 and steps[0].collective == "all_gather"


class _Walk:
    """Live storage over the runner's schedule (one rank, each piece at its largest).

    A buffer is live while a name refers to it (a value in ``env``, a held moved copy, a
    pinned saved value); the walk keeps each buffer's count of names and the running sum
    of the live buffers' bytes, so each op costs its own reads and writes, not the live
    set's size."""

    def __init__(self, program, free_grads: frozenset) -> None:
        self.specs = dict(program.value_specs)
        self.strided: set = set()  # values whose local tensor is not contiguous
        self.size: list[float] = []
        self.refs: list[int] = []  # each buffer's names (env, held, pinned)
        self.total = 0.0  # the bytes of the buffers with a name
        self.env: dict = {}
        self.held: dict = {}
        self.free_grads = free_grads  # gradients that are the .grad itself: counted flat
        self.left: dict = move_readers(program)
        self.peak = 0.0

    def new(self, nbytes: float) -> int:
        self.size.append(nbytes)
        self.refs.append(0)
        return len(self.size) - 1

    def _ref(self, b: int) -> None:
        self.refs[b] += 1
        if self.refs[b] == 1:
            self.total += self.size[b]

    def _unref(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.total -= self.size[b]

    def bind(self, v, b: int) -> None:
        """``env[v] = b``."""
        old = self.env.get(v)
        self.env[v] = b
        self._ref(b)
        if old is not None:
            self._unref(old)

    def drop(self, v) -> None:
        b = self.env.pop(v, None)
        if b is not None:
            self._unref(b)

    def _hold(self, key, b: int) -> None:
        self.held[key] = b
        self._ref(b)

    def _unhold(self, key):
        b = self.held.pop(key, None)
        if b is not None:
            self._unref(b)
        return b

    def reset(self, env: dict, pinned=()) -> None:
        """Restart the names: ``env`` as the values, ``pinned`` buffers held throughout,
        the held copies kept."""
        self.refs = [0] * len(self.size)
        self.total = 0.0
        self.env = {}
        for b in (*pinned, *self.held.values()):
            self._ref(b)
        for v, b in env.items():
            self.bind(v, b)

    def read(self, v, plan, transient: list[int]) -> int:
        if plan is None:
            return self.env[v]
        key = (v, plan.dst)
        b = self._unhold(key)
        if b is None:
            if v in self.strided:  # made contiguous, then moved
                transient.append(self.new(local_bytes(self.specs.get(v))))
            b = self.new(local_bytes(plan.dst))
            if _gathers(plan):  # the runner's flat send and receive buffers, then the copy
                transient.append(self.new(local_bytes(plan.src)))
                transient.append(self.new(local_bytes(plan.dst)))
        self.left[key] -= 1
        if self.left[key] > 0:
            self._hold(key, b)
        else:
            transient.append(b)
        return b

    def live(self, extra=()) -> float:
        """The live bytes, with the buffers ``extra`` (each counted once)."""
        more = {b for b in extra if self.refs[b] == 0}
        return self.total + sum(self.size[b] for b in more)

    def run(self, ops, released) -> None:
        for op, drop in zip(ops, released, strict=True):
            transient: list[int] = []
            ins = [self.read(v, p, transient) for v, p in zip(op.inputs, op.moves, strict=True)]
            name = op.call.op
            if name not in _STRIDE_FREE:  # a strided input is copied contiguous first
                for v, p in zip(op.inputs, op.moves, strict=True):
                    if p is None and v in self.strided:
                        transient.append(self.new(local_bytes(self.specs.get(v))))
            for j, spec in enumerate(op.output_specs):
                if spec is None:
                    continue
                v = Value(op.node, j)
                if j == 0 and ins and name in _VIEWS:
                    self.bind(v, ins[0])
                else:
                    self.bind(v, self.new(0.0 if v in self.free_grads else local_bytes(spec)))
                if j == 0 and op.inputs:
                    unmoved_strided = op.moves[0] is None and op.inputs[0] in self.strided
                    if name in _STRIDED or (name in _KEEPS_STRIDES and unmoved_strided):
                        self.strided.add(v)
            self.peak = max(self.peak, self.live(transient))
            for v in drop:
                self.drop(v)


def step_memory(program, state_bytes_per_param: float | None) -> ProgramMemory:
    """The :class:`ProgramMemory` of one training step of ``program`` as
    :func:`~meshplan.runtime.run_program` runs it (see the module docstring)."""
    graph = program.graph
    differentiated = tuple(s is not None for s in program.grad_specs)
    state = program_memory(program.arg_specs, differentiated, state_bytes_per_param)
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
    args = {Value(k): walk.new(0.0) for k in graph.args}  # counted as state and inputs
    walk.reset(args)
    forward, backward = program.forward_ops, program.backward_ops
    walk.run(forward, _last_reads(forward, saved | set(graph.outputs)))
    outs = [walk.read(v, p, []) for v, p in zip(graph.outputs, program.out_moves, strict=True)]
    kept = {v: walk.env[v] for v in saved if v in walk.env}
    activations = sum(walk.size[b] for b in set(kept.values()))
    moved = sum(walk.size[b] for b in set(walk.held.values()) - set(kept.values()))
    # the backward: the saved values and the held copies stay until it ends
    walk.reset({**args, **kept}, pinned=set(kept.values()) | set(walk.held.values()))
    walk.peak = max(walk.peak, walk.live(outs))
    for k, spec in zip(graph.cotangents, program.cot_specs, strict=True):
        walk.bind(Value(k), walk.new(local_bytes(spec)))
    grads = {v for v in graph.grads if v is not None}
    walk.run(backward, _last_reads(backward, grads))
    final: list[int] = []
    for v, p in zip(graph.grads, program.grad_moves, strict=True):
        if v is not None and p is not None:
            key = (v, p.dst)
            b = walk._unhold(key)
            final.append(b if b is not None else walk.new(0.0))  # the .grad: counted flat
            # the gradients' moves start together after the last op: each one's buffer
            # (a bucket's flat buffer holds every input it packs) is live until they end
            final.append(walk.new(local_bytes(p.src)))
    walk.peak = max(walk.peak, walk.live(final))
    transient = max(0.0, walk.peak - activations - moved)
    return attrs.evolve(
        state,
        inputs=inputs,
        activations=activations,
        moved=moved,
        transient=transient,
        recomputed=len(graph.recomputes),
    )

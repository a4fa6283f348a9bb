"""Lower bounds of the whole step's live bytes op by op, each separable (no torch).

The step's peak (:func:`._memory.step_memory`) walks the runner's schedule; the
separable estimate the solver first bounds (state, inputs, saved activations) leaves out
what is live beside the saved values at the op that reaches the peak: the values the
forward or the backward made and still reads (a gradient of the logits, the attention's
scores). This module counts, per op of the schedule (the forward's, then the
backward's), the values live there that a call's own option decides the bytes of:

* each output of a call (not a view: a view shares its input's storage, not a gradient
  the step keeps, counted with the state), live from its call to its last reader in its
  phase, or to the end of the step when the backward reads it (a saved value), or to the
  end of the forward when it is an output;
* the storage a value's views keep after its last read (a view's input in the view's
  own input layout: the value's storage, or the moved copy the view reads), at each op
  one view alive there; a view of a view where every view above it keeps its size (not
  ``expand``, ``slice``...), and none of an argument (its storage may be the argument's,
  counted with the state);
* at each op, per value it reads, the copy a move makes there: the bytes of the op's
  input layout less those of the value's own layout (0 where they agree; where they
  differ the copy holds at least that), where the value's layout is a variable's.

Every counted piece is a distinct buffer live at that op (or less than one), each at its
largest local size, so for any choice of options a row's sum never exceeds what the walk
holds at that op, and the state and inputs plus the largest row never exceed the peak: each row, like the
estimate, is a relaxation of the peak's budget, and a solve within it bounds the step's
constrained minimum. A row is tighter than the estimate where the peak is: at a backward
op every saved value is live, and so is what that op reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ._graph import Graph, Phase, Value
from ._memory import _VIEWS, local_bytes, saved_values

#: views whose storage is not their result's size: a view of one of them is not counted
_RESIZES = frozenset({"expand", "slice", "select", "as_strided"})

__all__ = ["Held", "PeakRows", "held_values", "live_rows", "row_at", "schedule"]


@attrs.frozen
class Held:
    """Bytes a node's option holds over the ops ``first`` to ``last`` of the schedule:
    its output ``j`` (``read`` False), or (``read`` True) its input ``j`` in its own input
    layout; ``sign`` -1: a piece taken off (the layout a moved read leaves)."""

    node: int
    j: int
    first: int
    last: int
    read: bool = False
    sign: int = 1

    def nbytes(self, option) -> float:
        """The bytes this piece takes under ``option`` (a strategy of its node)."""
        specs = option.input_specs if self.read else option.output_specs
        b = local_bytes(specs[self.j]) if self.j < len(specs) else 0.0
        return -b if self.sign < 0 else b


def schedule(graph: Graph) -> tuple[int, ...]:
    """The calls in the order the runner runs them: the forward's, then the backward's."""
    fwd = [n for n in graph.calls if graph.nodes[n].phase is Phase.FORWARD]
    bwd = [n for n in graph.calls if graph.nodes[n].phase is not Phase.FORWARD]
    return (*fwd, *bwd)


def _is_view(graph: Graph, node: int) -> bool:
    n = graph.nodes[node]
    return n.call is not None and n.call.op in _VIEWS and bool(n.inputs)


def held_values(graph: Graph, free: frozenset = frozenset()) -> tuple[Held, ...]:
    """The pieces the rows count (see the module docstring), with the ops they span
    (``free``: the argument nodes whose layout is chosen)."""
    order = schedule(graph)
    at = {n: t for t, n in enumerate(order)}
    end = len(order) - 1
    n_fwd = sum(1 for n in order if graph.nodes[n].phase is Phase.FORWARD)
    saved = saved_values(graph)
    outputs = set(graph.outputs)
    grads = {v for v in graph.grads if v is not None}
    last: dict[Value, int] = {}  # each value's last read in its own phase
    for t, node in enumerate(order):
        fwd = t < n_fwd
        for v in graph.nodes[node].inputs:
            src = at.get(v.node)
            if src is not None and (src < n_fwd) == fwd:
                last[v] = max(last.get(v, t), t)

    def stop_of(v: Value, t: int) -> int:
        """The last op value ``v`` (made at op ``t``) is live at: a saved value's is the
        step's end, a forward output's at least the forward's, the rest their last read."""
        if v in saved:
            return end
        if v in outputs and t < n_fwd:
            return max(last.get(v, t), n_fwd - 1)
        return last.get(v, t)

    out: list[Held] = []
    for t, node in enumerate(order):
        n = graph.nodes[node]
        for j in range(len(n.metas)):
            if n.metas[j] is None:
                continue
            v = Value(node, j)
            if (j == 0 and _is_view(graph, node)) or v in grads:
                continue
            out.append(Held(node, j, t, stop_of(v, t)))
    out += _view_tails(graph, order, at, stop_of, grads)
    out += _moved_reads(graph, order, free)
    return tuple(out)


def _moved_reads(graph, order, free: frozenset) -> list[Held]:
    """Per op and value it reads, the copy a move makes: its layout's bytes less the
    source's (0 where they agree; where they differ the copy holds at least that). Only
    where the source's layout is a variable's (a call's output, a free argument)."""
    out = []
    for t, node in enumerate(order):
        seen = set()
        for i, v in enumerate(graph.nodes[node].inputs):
            if v in seen:
                continue
            seen.add(v)
            src = graph.nodes[v.node]
            if src.call is None and v.node not in free:
                continue
            out.append(Held(node, i, t, t, read=True))
            out.append(Held(v.node, v.index, t, t, sign=-1))
    return out


def _view_tails(graph, order, at, stop_of, grads) -> list[Held]:
    """Per value viewed (a call's output, not a view's), the storage its views keep after
    its last read: at each op one view alive there, read in its own input layout
    (``stop_of(value, op)``: the last op a value made at ``op`` is live at)."""
    root: dict[int, Value] = {}  # a countable view's value viewed
    spans: dict[Value, list[tuple[int, int, int]]] = {}  # value -> (first, stop, view)
    for t, node in enumerate(order):
        if not _is_view(graph, node):
            continue
        u = graph.nodes[node].inputs[0]
        if u.node not in at or u in grads:
            continue  # a view of an argument (its storage may be the argument's)
        if u.index == 0 and _is_view(graph, u.node):
            # a view of a view: its input's layout is its storage's size only where every
            # view above it keeps its size
            if u.node not in root or graph.nodes[u.node].call.op in _RESIZES:
                continue
            base = root[u.node]
        else:
            base = u
        root[node] = base
        spans.setdefault(base, []).append((t, stop_of(Value(node, 0), t), node))
    out = []
    for u, views in spans.items():
        s = stop_of(u, at[u.node]) + 1
        views.sort()
        while True:
            alive = [(stop, node) for first, stop, node in views if first <= s <= stop]
            if not alive:
                later = [first for first, stop, _ in views if first > s]
                if not later:
                    break
                s = min(later)
                continue
            stop, node = max(alive)
            out.append(Held(node, 0, s, stop, read=True))
            s = stop + 1
    return out


def live_rows(helds: Sequence[Held], nbytes: Sequence[float], n_ops: int):
    """Each op's counted live bytes (numpy), given each piece's bytes."""
    import numpy as np

    diff = np.zeros(n_ops + 1)
    for h, b in zip(helds, nbytes, strict=True):
        diff[h.first] += b
        diff[h.last + 1] -= b
    return np.cumsum(diff[:-1])


def row_at(helds: Sequence[Held], t: int, options_of: Callable[[int], Sequence]) -> dict:
    """The row of op ``t``: per call node, the bytes each of its options holds there."""
    import numpy as np

    out: dict[int, object] = {}
    for h in helds:
        if h.first <= t <= h.last:
            row = np.array([h.nbytes(o) for o in options_of(h.node)], dtype=float)
            out[h.node] = out[h.node] + row if h.node in out else row
    return out


@attrs.frozen
class _Arg:
    """An argument's layout in a program, as its option would hold it."""

    spec: object

    @property
    def output_specs(self) -> tuple:
        return (self.spec,)

    input_specs = ()


class PeakRows:
    """A graph's rows (:func:`held_values`) over the options of its objective's variables
    (``options[var[node]]``: a call's options)."""

    def __init__(self, graph: Graph, options: Sequence, var: dict) -> None:
        free = frozenset(n for n in graph.args if n in var)
        self.helds = held_values(graph, free)
        self.n_ops = len(schedule(graph))
        self.options, self.var = options, var

    def live(self, program):
        """Each op's counted bytes under ``program``'s own strategies (numpy)."""
        ops: dict = {op.node: op for op in program.ops}
        for i, n in enumerate(program.graph.args):
            ops[n] = _Arg(program.arg_specs[i])
        nbytes = [h.nbytes(ops[h.node]) for h in self.helds]
        return live_rows(self.helds, nbytes, self.n_ops)

    def top(self, live) -> int:
        """The op whose row is fullest, of each op's bytes ``live`` (:meth:`live`)."""
        return int(live.argmax()) if live.size else 0

    def by_variable(self, t: int) -> dict:
        """Row ``t`` per variable: the bytes each option holds there (tied calls summed)."""
        out: dict[int, object] = {}
        for node, row in row_at(self.helds, t, lambda n: self.options[self.var[n]]).items():
            v = self.var[node]
            out[v] = out[v] + row if v in out else row
        return out

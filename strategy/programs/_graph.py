"""A traced program as a pure value: :class:`Graph` of :class:`Node` s (no torch).

The tracer (:mod:`meshplan.strategy.programs._trace`) turns a function of global tensors into
this value: one node per argument, per incoming gradient (cotangent) and per aten call
of the joint forward-and-backward computation. Non-tensor constants that name torch
objects (dtypes, devices, layouts, memory formats) are kept as :class:`TorchConst`, so
the graph hashes, compares and pickles without torch.
"""

from __future__ import annotations

import enum
from functools import cached_property
from typing import Any

import attrs

from meshplan.errors import StrategyError

from ..rules._aten import Call, TensorArg
from ..rules._random import is_draw
from ..rules._rule import Meta

__all__ = ["Value", "Node", "Graph", "TorchConst", "TensorArg", "Kind", "Phase", "ConstKind"]


class Kind(enum.StrEnum):
    """What a :class:`Node` is: an argument, a cotangent or an aten call."""

    ARG = "arg"
    COTANGENT = "cotangent"
    CALL = "call"


class Phase(enum.StrEnum):
    """Where a :class:`Node` runs: in the forward or in the backward."""

    FORWARD = "forward"
    BACKWARD = "backward"


class ConstKind(enum.StrEnum):
    """What a :class:`TorchConst` names."""

    DTYPE = "dtype"
    DEVICE = "device"
    LAYOUT = "layout"
    MEMORY_FORMAT = "memory_format"


def _as(enum_type):
    """A converter to ``enum_type`` that passes its members through at no cost (tracing
    builds a node per call)."""

    def convert(value):
        return value if type(value) is enum_type else enum_type(value)

    return convert


@attrs.frozen
class Value:
    """Output ``index`` of node ``node``."""

    node: int
    index: int = 0

    def __str__(self) -> str:
        return f"%{self.node}" + (f".{self.index}" if self.index else "")


@attrs.frozen
class TorchConst:
    """A torch constant by name: ``TorchConst("dtype", "float32")``, ``("device", "cpu")``.

    >>> TorchConst("dtype", "float32").kind is ConstKind.DTYPE
    True
    """

    kind: ConstKind = attrs.field(converter=_as(ConstKind))
    name: str


@attrs.frozen
class Node:
    """An argument, a cotangent (the gradient arriving for an output) or an aten call.

    ``inputs`` are the values feeding the call's tensor inputs, in order; ``metas`` the
    node's outputs (one for arguments and cotangents). ``kind`` and ``phase`` take their
    enum's members or its strings (``"call"``, ``"backward"``).

    >>> Node("arg", "x", ()).kind is Kind.ARG
    True
    """

    kind: Kind = attrs.field(converter=_as(Kind))
    name: str
    metas: tuple[Meta | None, ...] = attrs.field(converter=tuple)
    inputs: tuple[Value, ...] = attrs.field(default=(), converter=tuple)
    call: Call | None = None
    phase: Phase = attrs.field(default=Phase.FORWARD, converter=_as(Phase))


@attrs.frozen
class Graph:
    """A joint forward/backward program over global tensors.

    ``outputs`` are the function's results, then the new value of every argument the
    function writes into (in place: ``buf.mul_(0.9)``, a BatchNorm's running
    statistics), ``writes`` holding those arguments' positions, one per trailing output;
    ``grads`` the gradient of each argument (None where the argument is not
    differentiated or does not reach the outputs). Nodes are in a topological order;
    arguments come first, then cotangents. The graph is functional: a write is a value
    (``slice_scatter``, ``copy``, ``fill``...) that later readers read.
    """

    nodes: tuple[Node, ...] = attrs.field(converter=tuple)
    outputs: tuple[Value, ...] = attrs.field(converter=tuple)
    grads: tuple[Value | None, ...] = attrs.field(converter=tuple)
    writes: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    #: ``(copy, original)`` per call the backward runs again (see :mod:`._recompute`)
    recomputes: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=tuple)

    @property
    def n_results(self) -> int:
        """How many outputs the function returns (the rest are written arguments)."""
        return len(self.outputs) - len(self.writes)

    @cached_property
    def args(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.nodes) if n.kind is Kind.ARG)

    @cached_property
    def cotangents(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.nodes) if n.kind is Kind.COTANGENT)

    @cached_property
    def calls(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.nodes) if n.kind is Kind.CALL)

    @property
    def draws(self) -> tuple[int, ...]:
        """The calls that draw random numbers (:func:`~._random.is_draw`), in order; a
        recomputed call's copy redraws its original's (not listed)."""
        copies = {c for c, _ in self.recomputes}
        return tuple(
            i
            for i, n in enumerate(self.nodes)
            if n.kind is Kind.CALL and i not in copies and is_draw(n.call)
        )

    def meta(self, v: Value) -> Meta:
        m = self.nodes[v.node].metas[v.index]
        if m is None:
            raise StrategyError(f"value {v} of the program is not a tensor", value=v)
        return m

    def consumers(self) -> dict[Value, list[tuple[int, int]]]:
        """Each value's readers as (node, input position)."""
        out: dict[Value, list[tuple[int, int]]] = {}
        for i, n in enumerate(self.nodes):
            for k, v in enumerate(n.inputs):
                out.setdefault(v, []).append((i, k))
        return out


def freeze_arg(value: Any) -> Any:
    """Lists as tuples (recursively); other values as they are."""
    if isinstance(value, list | tuple):
        return tuple(freeze_arg(v) for v in value)
    return value

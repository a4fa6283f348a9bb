"""The value of a planned program: :class:`Program`, its ops and its modeled cost (no torch)."""

from __future__ import annotations

from typing import Any

import attrs

from meshplan.errors import ProgramWarning, StrategyError
from meshplan.placement import Spec

from ..rules._aten import Call
from ._graph import Graph, Phase, Value
from ._local_call import LocalCall, local_call

__all__ = ["Program", "ProgramCost", "ProgramOp", "ProgramWarning"]


@attrs.frozen
class ProgramCost:
    """Modeled seconds of a program's step: ``comm`` (redistributions), ``compute``, ``total``;
    ``bytes`` each rank sends at most, summed over moves; ``collectives`` launched;
    ``recompute`` the part of ``total`` the backward spends recomputing layers (their
    compute and the moves they repeat, see :mod:`._recompute`)."""

    comm: float
    compute: float
    bytes: float
    collectives: int
    recompute: float = 0.0

    @property
    def total(self) -> float:
        return self.comm + self.compute


@attrs.frozen
class ProgramOp:
    """One aten call of a program with its chosen strategy and the moves feeding it.

    ``moves[i]`` is the plan taking input ``i`` from its producer's spec to
    ``input_specs[i]`` (None when they are equal). ``local`` is what every rank runs
    (:class:`LocalCall`: the call with its local sizes, range or draw), read from the
    call's rules when the op is built.
    """

    node: int
    call: Call
    inputs: tuple[Value, ...]
    input_specs: tuple[Spec, ...]
    output_specs: tuple[Spec | None, ...]
    moves: tuple[Any, ...]
    phase: str
    replicated_fallback: bool = False
    local: LocalCall = attrs.field(
        default=attrs.Factory(lambda self: _local_of(self.call), takes_self=True)
    )


def _local_of(call: Any) -> LocalCall:
    """What every rank runs for ``call`` (a :class:`Call` of the program's graph)."""
    if not isinstance(call, Call):
        raise StrategyError(
            f"a ProgramOp's call must be a Call of the traced graph, got {call!r:.80}",
            value=call,
        )
    return local_call(call)


@attrs.frozen(eq=False)
class Program:
    """A planned program: per op its strategy and moves, outputs and gradients placed.

    ``out_moves``/``grad_moves`` take the final values to ``out_specs``/``grad_specs``;
    ``out_specs`` hold the function's outputs, then the new values of the arguments it
    writes into (:attr:`writes`), each in its argument's spec.
    ``cot_specs`` are the layouts the gradient arriving for each output must have.
    ``memory`` is the training state's bytes per rank (:class:`ProgramMemory`).
    ``method`` says in words how the plan was found and bounded; ``exact`` is whether it is
    proven the least-cost plan of its problem (``method`` then reads ``"exact"``).
    """

    graph: Graph
    arg_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    cot_specs: tuple[Spec, ...]
    grad_specs: tuple[Spec | None, ...]
    ops: tuple[ProgramOp, ...]
    value_specs: Any  # FrozenMap-like tuple of (Value, Spec) pairs
    out_moves: tuple[Any, ...]
    grad_moves: tuple[Any, ...]
    cost: ProgramCost
    lower_bound: float
    method: str
    fallbacks: tuple[str, ...]
    memory: Any = None  # a ProgramMemory (set by plan_graph)
    exact: bool = False

    @property
    def writes(self) -> tuple[int, ...]:
        """The positions of the arguments the function writes into (in place): their new
        values are the outputs after the function's own, each in its argument's spec."""
        return self.graph.writes

    @property
    def draws(self) -> tuple[int, ...]:
        """The nodes of the random ops, in program order (the ``k``-th draws from the
        stream's ``k``-th generator, see :mod:`meshplan.strategy.rules._random`)."""
        return self.graph.draws

    @property
    def replicated(self) -> int:
        """How many ops run replicated for want of a rule (``fallbacks`` names them)."""
        return sum(1 for op in self.ops if op.replicated_fallback)

    @property
    def recomputed(self) -> tuple[int, ...]:
        """The forward calls the backward runs again (activation checkpointing: see
        :mod:`._recompute`), by node; empty when nothing is recomputed."""
        return tuple(o for _, o in self.graph.recomputes)

    def spec_of(self, v: Value) -> Spec:
        return dict(self.value_specs)[v]

    @property
    def forward_ops(self) -> tuple[ProgramOp, ...]:
        return tuple(op for op in self.ops if op.phase is Phase.FORWARD)

    @property
    def backward_ops(self) -> tuple[ProgramOp, ...]:
        return tuple(op for op in self.ops if op.phase is Phase.BACKWARD)

    def explain(self) -> str:
        """A table: each op's strategy and, where communication goes, what it costs."""
        from ._program_explain import explain_program

        return explain_program(self)

    def __repr__(self) -> str:
        return (
            f"Program(<{len(self.ops)} ops>, cost={self.cost.total:.3g}s, "
            f"comm={self.cost.comm:.3g}s, method={self.method!r}, "
            f"replicated={self.replicated})"
        )

"""The program planner's inputs checked (no torch): specs, graphs, budgets, rule sets and
output specs, each refused with an error naming the value and the fix."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

from meshplan.errors import StrategyError
from meshplan.layout._ints import brief
from meshplan.placement import Replicate, Spec

from ..rules._ruleset import RuleSet
from ._graph import Graph
from ._memory import as_float
from ._program_value import ProgramWarning

__all__ = [
    "check_budget",
    "check_graph_arguments",
    "check_ruleset",
    "check_specs",
    "check_traced",
    "report_missing",
    "result_specs",
]


def check_specs(fn_name: str, what: str, specs: Sequence[Any]) -> tuple[Spec, ...]:
    out = []
    for i, s in enumerate(specs):
        if not isinstance(s, Spec):
            raise StrategyError(
                f"{fn_name}: {what} {i} is {s!r}, not a Spec; describe each tensor with "
                "Spec(mesh, placements, shape, dtype)",
                value=s,
            )
        out.append(s)
    return tuple(out)


def check_graph_arguments(graph, arg_specs, solver, limits: dict[str, Any]) -> tuple[Spec, ...]:
    """``plan_graph``'s graph, argument specs, solver and size limits, checked."""
    if solver not in ("whole", "op_by_op"):
        raise StrategyError(f"solver must be 'whole' or 'op_by_op', got {solver!r}", value=solver)

    if not isinstance(graph, Graph):
        raise StrategyError(
            f"plan_graph plans a traced Graph (see plan_program), got {graph!r:.80}", value=graph
        )
    if isinstance(arg_specs, Spec) or not isinstance(arg_specs, Sequence):
        raise StrategyError(
            f"arg_specs must be a sequence of Specs, one per argument, got {arg_specs!r:.80}",
            value=arg_specs,
        )
    arg_specs = check_specs("plan_graph", "argument", arg_specs)
    if len(arg_specs) != len(graph.args) or not arg_specs:
        raise StrategyError(
            f"the graph takes {len(graph.args)} arguments, got {len(arg_specs)} specs",
            value=arg_specs,
        )
    for name, value in limits.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < 0
            or (name != "max_priced" and value < 1)
        ):
            raise StrategyError(f"{name} must be a positive int, got {value!r}", value=value)
    return arg_specs


def check_traced(graph: Graph, arg_specs: Sequence[Spec]) -> None:
    for i, (k, spec) in enumerate(zip(graph.args, arg_specs, strict=True)):
        m = graph.nodes[k].metas[0]
        if m.shape != spec.shape or m.dtype != spec.dtype:
            raise StrategyError(
                f"argument {i}'s spec {spec} disagrees with the traced tensor {m}", value=spec
            )


def check_budget(value, name: str = "memory") -> float | None:
    """``value`` as a float of bytes per rank, None for no limit; a StrategyError naming
    it and the range otherwise (an int beyond a float's range too)."""
    if value is None:
        return None
    number = as_float(value)
    if number is None or not number > 0:
        raise StrategyError(
            f"{name}_budget={brief(value)} must be a number of bytes per rank > 0 and <= "
            f"{sys.float_info.max:.2g} (or None: no limit)",
            value=value,
        )
    return number


def check_ruleset(ruleset: Any) -> RuleSet:
    if ruleset is None:
        return RuleSet.default()
    if not isinstance(ruleset, RuleSet):
        raise StrategyError(
            f"ruleset= takes a RuleSet (e.g. RuleSet.default().with_rule(op, rule, "
            f"outputs=...)), got {ruleset!r:.80}",
            value=ruleset,
        )
    return ruleset


def report_missing(fallbacks: Sequence[str], strict: bool) -> None:
    """Every op without a rule, with how often it occurs: an error when ``strict``, else
    one warning (they run replicated)."""
    if not fallbacks:
        return
    counts: dict[str, int] = {}
    for t in fallbacks:
        counts[t] = counts.get(t, 0) + 1
    listing = ", ".join(f"{t} (x{n})" for t, n in sorted(counts.items()))
    add = (
        "add a rule with RuleSet.default().with_rule(op, rule, outputs=...) and pass "
        "ruleset= (op: the name after 'aten.', e.g. 'roll')"
    )
    if strict:
        raise StrategyError(
            f"no sharding rule for {len(counts)} ops ({len(fallbacks)} calls): {listing}; "
            f"{add}, or pass strict=False to run them replicated",
            value=tuple(sorted(counts)),
        )
    warnings.warn(
        f"no sharding rule for {len(counts)} ops, {len(fallbacks)} calls run replicated: "
        f"{listing}. Each rank runs such an op on the whole tensors; that is correct only "
        "if the op is deterministic and pure (writes no input and reads no state beyond "
        "its arguments), which is not checked (random ops draw one stream on every "
        f"rank), and may be slow; {add}, or pass strict=True to refuse",
        ProgramWarning,
        stacklevel=5,
    )


def result_specs(graph: Graph, mesh, out_specs) -> tuple[Spec, ...]:
    """The specs of the function's own outputs (not of the arguments it writes)."""
    metas = [graph.meta(v) for v in graph.outputs[: graph.n_results]]
    if out_specs is None:
        return tuple(Spec(mesh, [Replicate()] * mesh.ndim, m.shape, m.dtype) for m in metas)
    if isinstance(out_specs, Spec):
        out_specs = (out_specs,)
    out_specs = check_specs("plan_program", "output spec", out_specs)
    if len(out_specs) != len(metas):
        raise StrategyError(
            f"out_specs has {len(out_specs)} specs but the function returns {len(metas)} tensors",
            value=out_specs,
        )
    for i, (s, m) in enumerate(zip(out_specs, metas, strict=True)):
        if s.shape != m.shape or s.dtype != m.dtype or s.mesh != mesh:
            raise StrategyError(
                f"output {i}'s spec {s} disagrees with what the function returns ({m}); give "
                "a spec of that shape and dtype on the arguments' mesh",
                value=s,
            )
    return out_specs

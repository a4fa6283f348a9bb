"""A planned program put together: the chosen options, their moves and their cost.

Given the solver's choice, :func:`chosen_specs` reads off the free arguments' layouts
and :func:`assemble` walks the calls in order, planning each move of a value into the
layout its reader wants once (a value moved to a layout once serves all its readers) and
summing the moves' communication and the calls' compute into a :class:`Program`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from meshplan.placement import Spec

from ..selection._price import _plan
from ..solver import Method, Solution
from ._graph import Graph, Value
from ._program_value import Program, ProgramCost, ProgramOp

__all__ = ["assemble", "choice_following", "chosen_specs"]


def chosen_specs(
    graph: Graph,
    arg_specs: Sequence[Spec],
    free: Sequence[int],
    options: Sequence,
    var: dict[int, int],
    sol: Solution,
    fixed: dict[int, Spec],
) -> tuple[list[Spec], dict[int, Spec]]:
    """(every argument's spec, every fixed node's spec): the free arguments take the
    layouts of their chosen options."""
    chosen = list(arg_specs)
    fixed = dict(fixed)
    for i in free:
        chosen[i] = options[var[graph.args[i]]][sol.choice[var[graph.args[i]]]].output_specs[0]
        fixed[graph.args[i]] = chosen[i]
    return chosen, fixed


def assemble(
    graph, arg_specs, outs, cots, grads, fixed, options, var, sol, model, fallbacks, planner=None
):
    """The :class:`Program` of the choice ``sol``: each call's option, its moves (one per
    value and layout) and the total cost."""
    from meshplan.redistribute import cost as plan_cost

    specs: dict[Value, Spec] = {}
    for node, spec in fixed.items():
        specs[Value(node)] = spec
    comm = compute = nbytes = 0.0
    collectives = 0
    copies = {c for c, _ in graph.recomputes}
    again = 0.0  # the recompute's part

    moved: set[tuple[Value, Spec]] = set()  # a value moved to a layout once serves all

    def move(v: Value, dst: Spec, recomputing: bool = False):
        nonlocal comm, nbytes, collectives, again
        src = specs[v]
        if src == dst:
            return None
        p = _plan(src, dst, model, planner)
        if (v, dst) in moved:
            return p
        moved.add((v, dst))
        c = plan_cost(p, model)
        comm += c.total
        again += c.total if recomputing else 0.0
        nbytes += c.bytes
        collectives += sum(1 for s in p.steps if s.collective is not None)
        return p

    ops = []
    for node in graph.calls:
        n = graph.nodes[node]
        o = options[var[node]][sol.choice[var[node]]]
        compute += o.compute
        copy = node in copies
        again += o.compute if copy else 0.0
        moves = tuple(move(v, o.input_specs[i], copy) for i, v in enumerate(n.inputs))
        for j, s in enumerate(o.output_specs):
            if s is not None:
                specs[Value(node, j)] = s
        ops.append(
            ProgramOp(
                node,
                n.call,
                n.inputs,
                o.input_specs,
                o.output_specs,
                moves,
                n.phase,
                n.call.target in fallbacks,
            )
        )
    out_moves = tuple(move(v, s) for v, s in zip(graph.outputs, outs, strict=True))
    grad_moves = tuple(
        move(v, s) if v is not None else None for v, s in zip(graph.grads, grads, strict=True)
    )
    cost = ProgramCost(comm, compute, nbytes, collectives, again)
    bound = sol.bound if not sol.exact else cost.total
    return Program(
        graph,
        tuple(arg_specs),
        outs,
        cots,
        grads,
        tuple(ops),
        tuple(specs.items()),
        out_moves,
        grad_moves,
        cost,
        min(bound, cost.total),
        sol.describe(),
        tuple(sorted(set(fallbacks))),
        exact=sol.exact,
    )


def choice_following(follow: Mapping[int, tuple], options, nodes) -> Solution | None:
    """The choice taking, per variable, the option whose input and output specs ``follow``
    gives for its node (None when one has none such, or a node none)."""
    choice = []
    for n, opts in zip(nodes, options, strict=True):
        want = follow.get(n)
        k = next((k for k, o in enumerate(opts) if (o.input_specs, o.output_specs) == want), None)
        if k is None:
            return None
        choice.append(k)
    return Solution(tuple(choice), 0.0, -math.inf, Method.OP_BY_OP)

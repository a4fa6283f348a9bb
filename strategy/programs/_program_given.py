"""The layouts given beside an unproven plan (no torch): a plan that the solver does not
prove optimal is compared with the given layouts planned as fixed ones, unless a bound
or their state alone rules them out (see :func:`~._program.plan_graph`)."""

from __future__ import annotations

import warnings

import attrs

from meshplan.errors import StrategyError

from ..solver import Options, solve
from ._graph import Graph
from ._memory import state_bytes
from ._program_value import Program, ProgramWarning

__all__ = ["given_cannot_win", "given_state", "never_worse_than_given"]


def given_cannot_win(program, graph, arg_specs, free, whole, prices, max_factor) -> bool:
    """Whether the layouts given cost at least ``program`` whatever their plan: a lower
    bound of the problem with each free argument held to its given layout (a draft solve
    of the objective at hand, every other option of theirs charged ``program``'s cost
    twice over: any choice away from the given costs more than ``program``, so the bound
    is one of the given layouts' minimum or of something dearer than ``program``) at
    least ``program``'s cost. ``whole``: the untied objective and its options per
    variable. False where a given spec is not a candidate (then the given layouts are
    planned whole)."""
    import numpy as np

    obj, options = whole
    held: dict[int, int] = {}
    for i in free:
        v = obj.var[graph.args[i]]
        ks = [k for k, o in enumerate(options[v]) if o.output_specs[0] == arg_specs[i]]
        if not ks or held.setdefault(v, ks[0]) != ks[0]:
            return False
    cost = program.cost.total
    penalty = 2.0 * abs(cost) + 1e-30
    unary = [np.array(u, dtype=float) for u in obj.problem.unary]
    for v, k in held.items():
        away = np.full(len(unary[v]), penalty)
        away[k] = 0.0
        unary[v] = unary[v] + away
    problem = attrs.evolve(obj.at(prices), unary=tuple(unary), budget=None)
    draft = Options(max_factor=max_factor, steps=0, draft=True, lp=False)
    return solve(problem, draft).bound >= cost


def given_state(graph: Graph, arg_specs, free, per_param) -> float:
    """The free arguments' state bytes in their given layouts (a part of any peak of the
    plan keeping them)."""
    return sum(state_bytes(arg_specs[i], graph.grads[i] is not None, per_param) for i in free)


def never_worse_than_given(
    plan, program: Program, graph, arg_specs, per_param, options
) -> Program:
    """An unproven choice of layouts, or the layouts given planned as fixed ones
    (``plan``, the program planner, with ``options``), whichever costs less (the free
    problem's bound holds for both)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProgramWarning)  # warned above already
            given_plan = plan(
                graph, arg_specs, state_bytes_per_param=per_param, name_least=False, **options
            )
    except StrategyError:  # the given layouts do not fit the budget
        return program
    if given_plan.cost.total >= program.cost.total:
        return program
    return attrs.evolve(
        given_plan, lower_bound=program.lower_bound, method=program.method, exact=program.exact
    )

"""A plan's whole-step peak fitted to its memory budget, and its moves whose plan the
planner's budget cut (no torch): parts of :func:`~._program.plan_graph`'s answer."""

from __future__ import annotations

import attrs

from meshplan.errors import MemoryBudgetError

from ..selection._price import redistribute_bound
from ..solver import Method, Solution, min_memory_choice
from ._program_solve import solve_lazily
from ._program_value import Program

__all__ = ["check_peak_feasible", "cut_moves", "fit_peak", "with_cut_pairs"]


def cut_moves(program: Program, model, planner) -> set:
    """The ``(source, target)`` specs of ``program``'s moves that run a plan whose search
    the planner's budget cut (the planner remembers each pair's proven lower price)."""
    moves = [m for op in program.ops for m in op.moves]
    moves += [*program.out_moves, *program.grad_moves]
    pairs = {(m.src, m.dst) for m in moves if m is not None}
    return {pair for pair in pairs if _is_cut(*redistribute_bound(*pair, model, planner))}


def _is_cut(price: float, lower: float) -> bool:
    return lower < price


def with_cut_pairs(program: Program, bound: float, method: str, cut: int) -> Program:
    """``program`` priced with ``cut`` redistribution plans whose search the planner's
    budget cut: its bound is ``bound`` (the solve's, at those pairs' proven lower prices;
    its cost runs the plans found), and unless the cost meets it, its method is not
    "exact"."""
    bound = min(bound, program.cost.total)
    if program.cost.total <= bound * (1 + 1e-12):
        return attrs.evolve(program, lower_bound=bound)
    method = (
        f"{method} at proven prices; {cut} redistribution plan(s) cut by the planner's "
        "budget (raise Planner(max_states=...))"
    )
    return attrs.evolve(program, lower_bound=bound, method=method, exact=False)


def check_peak_feasible(obj, budget: float, program_of) -> None:
    """Raise when no plan can fit ``budget``: the separable estimate of the peak (state,
    inputs, saved activations) at its lightest exceeds it. The message names the peak of
    the lightest such plan: a budget known to be feasible."""
    least = obj.fixed_bytes + min_memory_choice(obj.problem.weights())
    if least <= budget:
        return
    _raise_infeasible(obj, budget, least, program_of)


def _raise_infeasible(obj, budget: float, least: float, program_of) -> None:
    """Raise: ``budget`` is below ``least``; the message names the peak of the lightest plan
    too (``program_of`` None: not planned, only ``least`` named)."""
    if program_of is None:
        raise MemoryBudgetError(
            f"memory_budget={budget:.0f} bytes per rank is infeasible: the smallest feasible "
            f"budget for this program is at least {least:.0f} bytes",
            value=budget,
            least=least,
        )
    lightest = tuple(int(w.argmin()) for w in obj.problem.weights())
    sol = Solution(lightest, 0.0, 0.0, Method.OP_BY_OP)
    peak = program_of(sol).memory.peak
    raise MemoryBudgetError(
        f"memory_budget={budget:.0f} bytes per rank is infeasible: the smallest feasible "
        f"budget for this program is at least {least:.0f} bytes (state, inputs and saved "
        f"activations at their lightest layouts) and at most {max(peak, least):.0f} bytes "
        "(the peak of the plan with every layout at its lightest); raise the budget, free "
        "more arguments (choose=) or shorten the batch",
        value=budget,
        least=least,
        most=max(peak, least),
    )


def fit_peak(program, obj, prices, budget: float, program_of, solve_args) -> Program:
    """``program`` if its whole step's peak fits ``budget``; else the plan of a solve
    whose separable estimate leaves room for what the estimate leaves out (moved copies,
    transients), tightened until the peak fits. The first solve's bound stays: it bounds
    the peak's constrained minimum (the estimate never exceeds the peak)."""
    inner = budget
    bound = program.lower_bound
    least = obj.fixed_bytes + min_memory_choice(obj.problem.weights())
    for _ in range(8):
        if program.memory.peak <= budget * (1 + 1e-9):
            break
        inner -= program.memory.peak - budget
        if inner < least:
            _raise_infeasible(obj, budget, least, program_of)
        sol = solve_lazily(program.graph, obj, prices, budget=inner, progress=None, **solve_args)
        program = program_of(sol)
    else:
        if program.memory.peak > budget * (1 + 1e-9):
            _raise_infeasible(obj, budget, least, program_of)
    cost = program.cost.total
    if cost - bound <= 1e-12 * max(abs(cost), 1e-300):
        return program
    method = "peak fitted, estimate's bound" if program.exact else program.method
    return attrs.evolve(program, lower_bound=min(bound, cost), method=method, exact=False)

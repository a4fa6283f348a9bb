"""A plan's whole-step peak fitted to its memory budget, and its moves whose plan the
planner's budget cut (no torch): parts of :func:`~._program.plan_graph`'s answer."""

from __future__ import annotations

import attrs

from meshplan.errors import MemoryBudgetError

from ..selection._price import redistribute_bound
from ..solver import (
    Limit,
    MemoryRow,
    Method,
    Solution,
    has_lp,
    min_memory_choice,
    solve_lp_within,
)
from ._program_solve import _GAP, solve_lazily
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
    peak = _lightest_plan(obj, program_of).memory.peak
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


def _lightest_plan(obj, program_of) -> Program:
    """The plan with every layout at its lightest (under the separable estimate)."""
    lightest = tuple(int(w.argmin()) for w in obj.problem.weights())
    return program_of(Solution(lightest, 0.0, 0.0, Method.OP_BY_OP))


def fit_peak(
    program, obj, prices, budget: float, program_of, solve_args, rows=None, untied=False,
    choice=None,
) -> Program:  # fmt: skip
    """``program`` if its whole step's peak fits ``budget``; else the plan of a solve
    whose separable estimate leaves room for what the estimate leaves out (moved copies,
    transients), tightened until the peak fits, or a plan the rows' solves met that fits
    and costs less. The first solve's bound stays: it bounds the peak's constrained
    minimum (the estimate never exceeds the peak).

    ``rows`` (:class:`._peak_rows.PeakRows`, with ``untied``: the objective has a variable
    per call, so its bounds are the program's): the step's live bytes op by op, each a
    separable lower bound of the peak. Solves within weighted sums of the rows of the ops
    where the plans peak bound the constrained minimum more tightly (see
    :func:`_bound_by_rows`); the larger bound holds. Where one of their plans fits, the
    cheapest such is the plan (the solve of a model closer to the peak, in the budget
    itself), and the estimate is not tightened. Where that leaves a gap, the transportation
    LP within the rows of the ops where plans peak bounds it more tightly still, and its MIP
    chooses (:func:`_by_limits`; ``choice``: ``program``'s, a start)."""
    bound = program.lower_bound
    least = obj.fixed_bytes + min_memory_choice(obj.problem.weights())
    met: list = []
    done = _fits(program, budget) and _proven(program, bound)
    by_rows = rows is not None and untied and not done
    if by_rows:
        bound, met, chosen, seen = _bound_by_rows(
            program, obj, prices, budget, program_of, solve_args, rows
        )
        if choice is not None and _fits(program, budget):
            chosen.append(tuple(choice))
        best_met = min(met, key=_cost) if met else None
        if best_met is None or not _proven_within(best_met, bound):
            lim_bound, lim_plans = _by_limits(obj, prices, budget, program_of, rows, chosen, seen)
            bound = max(bound, lim_bound)
            met += lim_plans
    if met:  # the cheapest of the rows' relaxations that fits: the estimate's fit, in a
        # tighter budget of a looser model, is not solved
        best = min(met, key=_cost)
    else:
        best = _fit_estimate(program, obj, prices, budget, program_of, solve_args, least)
    cost = best.cost.total
    bound = min(bound, cost)
    if _proven(best, bound):
        return attrs.evolve(best, lower_bound=bound) if best.lower_bound != bound else best
    method = best.method
    if best.exact:
        by = "the step's rows" if by_rows else "the estimate"
        method = f"peak fitted, bound by {by}"
    return attrs.evolve(best, lower_bound=bound, method=method, exact=False)


def _fits(program, budget: float) -> bool:
    return program.memory.peak <= budget * (1 + 1e-9)


def _proven(program, bound: float) -> bool:
    cost = program.cost.total
    return cost - bound <= 1e-12 * max(abs(cost), 1e-300)


#: the solves within weighted sums of the step's rows a fit runs at most (each bounds)
ROW_SOLVES = 4


def _bound_by_rows(program, obj, prices, budget, program_of, solve_args, rows):
    """A bound of the step's constrained minimum, the plans met that fit and their choices,
    and every plan met: a surrogate search over the rows of the ops where the plans peak.

    Each solve is within a weighted sum of those rows (weights summing to 1: a choice
    within every row is within the sum, so each solve's bound holds). Two rows: the
    first's weight is halved towards the row the last plan exceeds more; more: each row's
    weight grows with what the plan exceeds it by, and shrinks with the room it leaves."""
    import math

    bound = program.lower_bound
    met, weights = [rows.top(rows.live(program))], [1.0]
    span = [0.0, 1.0]  # two rows: where the first's weight is still searched
    fitting = [program] if _fits(program, budget) else []
    chosen: list = []  # the choices of the solves' plans that fit
    seen = [program]  # every plan met
    for _ in range(ROW_SOLVES):
        if fitting and _proven_within(min(fitting, key=_cost), bound):
            break
        within = _within(obj, rows, met, weights)
        sol = solve_lazily(
            program.graph, within, prices, budget=budget, progress=None, **solve_args
        )
        bound = max(bound, sol.bound)
        plan = program_of(sol)
        seen.append(plan)
        if _fits(plan, budget):
            fitting.append(plan)
            chosen.append(tuple(sol.choice))
        live = rows.live(plan)
        top = rows.top(live)
        if top not in met:
            met.append(top)
            weights.append(0.0 if len(met) == 2 else sum(weights) / len(weights))
        elif len(met) == 1:
            break  # the plan peaks where the row it was solved in: no other row to weigh
        base = plan.memory.total + plan.memory.inputs
        over = [base + float(live[t]) - budget for t in met]
        if len(met) == 2:
            span[0 if over[0] >= over[1] else 1] = weights[0]
            w = (span[0] + span[1]) / 2
            weights = [w, 1.0 - w]
            continue
        scale = max(abs(x) for x in over) or 1.0
        weights = [w * math.exp(x / scale) for w, x in zip(weights, over, strict=True)]
        weights = [w / sum(weights) for w in weights]
    return bound, fitting, chosen, seen


def _cost(program) -> float:
    return program.cost.total


def _proven_within(program, bound: float) -> bool:
    """Whether ``program``'s cost is within the planner's budget gap of ``bound``."""
    cost = program.cost.total
    return cost - bound <= _GAP * abs(cost)


def _within(obj, rows, met, weights):
    """``obj`` whose memory rows are its free arguments' state and, per call variable, the
    ``weights``-weighted sum of what its option holds at the ops ``met`` (weights summing
    to 1: a relaxation of every one of those rows)."""
    calls = {obj.var[n] for n in obj.calls}
    kept = [r for r in obj.problem.memory if r.variable not in calls]
    summed: dict[int, object] = {}
    for t, w in zip(met, weights, strict=True):
        for v, row in rows.by_variable(t).items():
            summed[v] = summed[v] + w * row if v in summed else w * row
    kept += [MemoryRow(v, row) for v, row in sorted(summed.items())]
    return attrs.evolve(obj, problem=attrs.evolve(obj.problem, memory=tuple(kept)))


#: the ops whose rows the LP of :func:`_by_limits` keeps to (the fullest under the plans met)
LIMIT_OPS = 32
#: the MIP's seconds over the LP's columns in each round of :func:`_by_limits`, and the
#: gap to the best among them it stops at (a choice, not the bound: the LP's bound stays)
LIMIT_MIP_SECONDS = 20.0
LIMIT_MIP_GAP = 0.005
#: the rounds of :func:`_by_limits` (each tightens the rows' budget by what the last
#: plan's walked peak exceeded its fullest row by)
LIMIT_ROUNDS = 3


def _by_limits(obj, prices, budget, program_of, rows, starts, plans):
    """A bound of the step's constrained minimum and the plans found that fit: the
    transportation LP of ``obj`` at the prices known (each at most its exact price)
    within the rows of the :data:`LIMIT_OPS` ops fullest under ``plans`` (each row a
    :class:`~.solver.Limit`: every choice whose step fits ``budget`` fits each row, so the
    LP's bound holds), and a MIP over its columns for the choice (from ``starts``: the
    choices of plans that fit, and the lightest choice where it fits the rows). A plan
    over the budget adds the row of the op where its rows peak, where not kept yet, and
    what its walked peak exceeds its fullest row by (moved copies held between two
    readers, a gather's buffers) the next round takes off the rows' budget, so the next
    choice leaves that room; the first round's bound stays.
    (``(-inf, [])`` without highspy; a round without a choice known to fit the rows ends
    the search.)"""
    import math

    import numpy as np

    if not has_lp() or not plans:
        return -math.inf, []
    calls = {obj.var[n] for n in obj.calls}
    state = [r for r in obj.problem.memory if r.variable not in calls]
    lives = [rows.live(p) for p in plans]
    fullest = np.max(np.stack(lives), axis=0)
    ops = [int(t) for t in np.argsort(-fullest, kind="stable")[:LIMIT_OPS]]

    def row(t: int) -> list:
        return [MemoryRow(v, r) for v, r in sorted(rows.by_variable(t).items())]

    by_op = {t: row(t) for t in ops}
    room = budget - obj.fixed_bytes
    bound, found, margin = -math.inf, [], 0.0
    starts = list(dict.fromkeys(starts))
    for k in range(LIMIT_ROUNDS):
        limits = [Limit((*state, *by_op[t]), room - margin) for t in ops]
        problem = attrs.evolve(obj.at(prices), budget=room, limits=limits)
        # (each round's LP afresh: started from the last round's columns and basis, the
        # MIP found no plan that fit where a fresh one did, Llama 1 layer on (2, 4))
        sol = solve_lp_within(
            problem, starts, time_limit=LIMIT_MIP_SECONDS, rel_gap=LIMIT_MIP_GAP
        )
        if sol is None:
            break
        if k == 0:
            bound = sol.bound
        known = [problem.evaluate(c) for c in starts]
        if known and sol.cost >= min(known) * (1 - 1e-9):
            break  # no cheaper than a plan known to fit: a tighter room only costs more
        prices.learn_used(obj.at(prices), sol.choice)
        cost = obj.at(prices).evaluate(sol.choice)
        plan = program_of(Solution(sol.choice, cost, bound, Method.TRANSPORT_LP))
        if _fits(plan, budget):
            found.append(plan)
            starts.append(tuple(sol.choice))
            break
        live = rows.live(plan)
        top = rows.top(live)
        if top not in by_op:
            ops.append(top)
            by_op[top] = row(top)
        # the room the rows leave out at this plan, off the next round's budget
        fixed = plan.memory.total + plan.memory.inputs
        margin = max(margin, plan.memory.peak - (fixed + float(live[top])))
    return bound, found


#: the solves a fit runs at most to tighten the estimate's budget until the peak fits
FIT_ROUNDS = 8
#: the solves halving the estimate's budget between the tightest known not to fit and
#: the loosest known to fit, once a plan fits (a looser budget's plan may cost less)
FIT_HALVINGS = 1


def _fit_estimate(program, obj, prices, budget, program_of, solve_args, least) -> Program:
    """The estimate's budget tightened until the plan's peak fits (each time by what the
    peak exceeds the budget by), then halved between the two budgets on either side: the
    cheapest plan that fits."""
    inner, over = budget, None  # over: the tightest estimate budget whose plan did not fit
    for _ in range(FIT_ROUNDS):
        if _fits(program, budget):
            break
        over = inner
        inner -= program.memory.peak - budget
        if inner < least:
            break
        program = _solved(program, obj, prices, inner, program_of, solve_args)
    if not _fits(program, budget):
        # the tightening ran out (of rounds, or below the estimate's least): the plan with
        # every layout at its lightest, where it fits, else no plan does that we know of
        program = _lightest_plan(obj, program_of)
        if not _fits(program, budget):
            _raise_infeasible(obj, budget, least, program_of)
        return program
    best = program
    for _ in range(FIT_HALVINGS if over is not None else 0):
        mid = (inner + over) / 2
        plan = _solved(program, obj, prices, mid, program_of, solve_args)
        if _fits(plan, budget):
            inner = mid
            best = plan if plan.cost.total < best.cost.total else best
        else:
            over = mid
    return best


def _solved(program, obj, prices, inner: float, program_of, solve_args) -> Program:
    """The plan of a solve within the estimate's budget ``inner``."""
    sol = solve_lazily(program.graph, obj, prices, budget=inner, progress=None, **solve_args)
    return program_of(sol)

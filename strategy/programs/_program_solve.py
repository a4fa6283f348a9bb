"""A program's objective and its lazily priced solve (no torch; numpy when used).

The program becomes a solver :class:`~.solver.Problem`: its variables are the calls (one
candidate option each), then the free arguments (one candidate layout each); its shared
values are the redistributions (see :mod:`._program_terms`): into each call's inputs, out
to the fixed output and gradient specs, and each free argument's gradient into its
layout, a value moved to a layout once serving all its readers; its memory rows are the
free arguments' state bytes and, under a whole-step budget, each call's saved activations
in its option's output layouts (:func:`._memory.activation_bytes`).

Lazy pricing: each round solves with exact prices where known and lower bounds elsewhere,
then prices exactly the pairs the answer uses; it stops once the answer uses exact prices
only. No other choice can then be cheaper (its every term is at most its true price), so
the answer is the exact minimum whenever the solver's is.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import MemoryBudgetError
from meshplan.placement import Spec

from ..solver import (
    InfeasibleBudget,
    MemoryRow,
    Method,
    Options,
    Problem,
    Reader,
    Searcher,
    SharedValue,
    Solution,
    Warm,
    budget_binds,
    mix_within,
    proven,
    run_bound,
    solve,
    solve_shared,
)
from ._auto import memory_weights
from ._graph import Graph, Value
from ._memory import activation_bytes, local_bytes
from ._program_parts import parts_bound
from ._program_prices import Prices
from ._program_terms import greedy, order_too_wide
from ._progress import Progress, report

__all__ = [
    "Objective",
    "Planning",
    "content_key",
    "objective",
    "shared_values",
    "solve_lazily",
    "tied_bound",
    "variables",
    "with_layer",
]

_GAP = 0.01  # a budget's branch and bound stops once its gap is within 1% of the cost

#: a budget's search per solve round starts no relaxation past this many CPU seconds (its
#: best choice and bound kept: both stay true). On small programs the search ends first;
#: on Llama-3 70B's 80 tied layers on 1,024 ranks one relaxation takes tens of seconds,
#: and the branch and bound's 32 ran past half an hour without closing its gap
BUDGET_SECONDS = 60.0


class Planning(enum.Enum):
    """How a program's choice is made: over the whole graph, or op by op in order."""

    WHOLE = "whole"
    OP_BY_OP = "op_by_op"


@attrs.frozen(eq=False)
class Objective:
    """A program as a solver :class:`~.solver.Problem` (``problem``: its variables are
    the calls, then the free arguments; prices are those known when it was built, see
    :meth:`at`), with what maps the program onto it: ``calls`` (the graph's call nodes,
    in order), ``var`` (each node's variable), ``sinks`` (the fixed targets ``(value,
    spec)``), ``free_grads`` (the free arguments' gradients ``(value, argument node)``)
    and ``fixed_bytes`` (the fixed arguments' state bytes; under a whole-step budget the
    inputs' too), ``node_weights`` (under a whole-step budget, each call node's saved
    activation bytes per option)."""

    problem: Problem
    calls: tuple[int, ...]
    var: dict[int, int]
    sinks: tuple = ()
    free_grads: tuple = ()
    fixed_bytes: float = 0.0
    node_weights: dict = attrs.field(factory=dict)

    def at(self, prices: Prices) -> Problem:
        """The problem at the prices known now (exact where planned, else bounds)."""
        return attrs.evolve(self.problem, price=prices.frozen())


def variables(graph: Graph, free: Sequence[int], tie=None) -> tuple[dict[int, int], list[int]]:
    """The variables: ``(node -> variable, each variable's node)``: the calls, then the
    free arguments, one each; a node of ``tie`` (:mod:`._repeats`) shares its
    representative's."""
    tie = tie or {}
    nodes = [n for n in (*graph.calls, *(graph.args[i] for i in free)) if n not in tie]
    var = {node: i for i, node in enumerate(nodes)}
    for n, r in tie.items():
        var[n] = var[r]
    return var, nodes


def objective(
    graph: Graph,
    options: Sequence,
    free: Sequence[int],
    fixed: dict[int, Spec],
    targets: tuple[Sequence[Spec], Sequence[Spec | None]],
    prices: Prices,
    memory: tuple[Sequence[Spec], float | None, float | None],
    var: dict[int, int] | None = None,
) -> Objective:
    """The program as a solver problem over choosing one of ``options`` per variable
    (``var``: each node's, see :func:`variables`; default: one per call and free
    argument): ``targets`` are the output and gradient specs, ``memory`` the argument
    specs, state bytes per parameter and budget (see :func:`._auto.memory_weights`; the
    problem's budget is left to the solve)."""
    import numpy as np

    calls = graph.calls
    if var is None:
        var = variables(graph, free)[0]
    sid = prices.sid
    ins, outs = prices.number(options)
    out_specs, grads = targets
    sinks = [(v, s) for v, s in zip(graph.outputs, out_specs, strict=True)]
    sinks += [
        (v, s)
        for i, (v, s) in enumerate(zip(graph.grads, grads, strict=True))
        if v is not None and i not in free
    ]
    arg_specs, per_param, budget, *whole = memory
    step = bool(whole and whole[0])  # the whole step's peak: checked by the caller
    differentiated = tuple(g is not None for g in graph.grads)
    free_weights, fixed_bytes = memory_weights(
        arg_specs,
        differentiated,
        free,
        [options[var[graph.args[i]]] for i in free],
        [],
        per_param,
        None if step else budget,
    )
    rows = [MemoryRow(var[graph.args[i]], w) for i, w in zip(free, free_weights, strict=True)]
    node_weights: dict = {}
    if step:  # the inputs and each call's saved activations count too
        fixed_bytes += sum(
            local_bytes(s) for s, d in zip(arg_specs, differentiated, strict=True) if not d
        )
        for n, row in activation_bytes(graph, lambda n: options[var[n]]).items():
            node_weights[n] = np.asarray(row, dtype=float)
            rows.append(MemoryRow(var[n], row))
    # each value once: one move per distinct layout its readers want
    grad_reads = [(graph.grads[i], var[graph.args[i]]) for i in free if graph.grads[i] is not None]
    values = shared_values(graph, calls, var, fixed, sid, sinks, grad_reads)
    times = [0] * len(options)  # how many nodes each variable stands for
    for n in (*calls, *(graph.args[i] for i in free)):
        times[var[n]] += 1
    compute = [
        np.array([o.compute for o in opts], dtype=float) * k
        for opts, k in zip(options, times, strict=True)
    ]
    free_grads = [(graph.grads[i], graph.args[i]) for i in free if graph.grads[i] is not None]
    problem = Problem(compute, values=values, ins=ins, outs=outs, price=prices.price, memory=rows)
    return Objective(
        problem, tuple(calls), var, tuple(sinks), tuple(free_grads), fixed_bytes, node_weights
    )


def shared_values(graph: Graph, calls, var, fixed, sid, sinks, grad_reads=()) -> list[SharedValue]:
    """Each value read by an op, a fixed target or a free argument (its gradient, moved
    into the chosen option's grad spec: ``grad_reads`` pairs of value and variable), with
    its source and its readers."""
    readers: dict[Value, list[Reader]] = {}
    for node in calls:
        for i, v in enumerate(graph.nodes[node].inputs):
            readers.setdefault(v, []).append(Reader(var[node], i))
    for v, a in grad_reads:
        readers.setdefault(v, []).append(Reader(a, 0))
    for v, target in sinks:
        readers.setdefault(v, []).append(Reader(-1, 0, sid(target)))
    alike: dict[tuple, int] = {}  # values of tied nodes alike: one, counted
    for v, rs in readers.items():
        if v.node in fixed:
            key = (-1, 0, sid(fixed[v.node]), tuple(rs))
        else:
            key = (var[v.node], v.index, -1, tuple(rs))
        alike[key] = alike.get(key, 0) + 1
    return [SharedValue(*key, count=n) for key, n in alike.items()]


def _solve_round(
    obj: Objective,
    prices: Prices,
    planning: Planning,
    options: Options,
    budget: float | None,
    seeds,
    warm: Warm,
) -> Solution:
    """One solve at the current prices: op by op, or the whole graph (within a budget, a
    branch and bound of ``options.max_branches`` relaxation solves, drafts unless
    ``options.draft`` is off for the final one: see :func:`.solver.solve`)."""
    problem = obj.at(prices)
    if planning is Planning.OP_BY_OP:
        return greedy(problem, [obj.var[n] for n in obj.calls], prices.learn_exact)
    starts = ()
    if order_too_wide(problem, options.max_factor):
        starts = (greedy(problem, [obj.var[n] for n in obj.calls], prices.learn_exact).choice,)
        problem = obj.at(prices)  # greedy planned some moves exactly
    if budget is not None:
        problem = attrs.evolve(problem, budget=budget - obj.fixed_bytes)
    try:
        return solve(problem, options, starts=starts, seeds=seeds, warm=warm)
    except InfeasibleBudget as e:  # the least counted with the fixed arguments' bytes
        least = e.least + obj.fixed_bytes
        raise MemoryBudgetError(str(e), value=budget, least=least) from e


def solve_lazily(
    graph: Graph,
    obj: Objective,
    prices: Prices,
    *,
    planning: Planning,
    max_factor: int,
    max_rounds: int,
    budget: float | None,
    seeds: Sequence[dict[int, int]],
    progress: Progress | None,
    settle: bool = True,
) -> Solution:
    """Solve, price exactly what the answer uses, and again, until the answer uses exact
    prices only (or ``max_rounds`` rounds ran). ``settle=False``: the rounds end there,
    the last answer a draft, without the settled round (a final solve and a budget's
    branch and bound) that tightens the bound and improves the choice: for a caller that
    keeps neither (a tied program's bound is its parts'). The answer is the cheapest of
    those priced exactly throughout (a later round's choice, at prices it raised, may
    cost more than an earlier one's), with the best bound of every round.

    The planner keeps each whole-program answer under the content of its objective
    (:func:`content_key`): the same objective planned again takes the exact prices and
    the answer from there, once the answer's cost is checked at the exact prices
    (the same answer the solve gives: it is a pure function of that content)."""
    weights = obj.problem.weights()
    if budget is not None and not budget_binds(weights, budget - obj.fixed_bytes):
        budget = None  # every choice fits: the budget constrains nothing
    key = None
    if planning is Planning.WHOLE:
        key = content_key(obj, prices, (max_factor, max_rounds, budget, seeds, settle))
        known = _recall(obj, prices, key)
        if known is not None:
            report(progress, "solve", 1, 0)
            return known
    args = (max_factor, max_rounds, budget, seeds, settle)
    sol = _solve_rounds(obj, prices, planning, *args, progress)
    if key is not None:
        prices.owner().remember_program(key, (dict(prices.exact), sol))
    return sol


def _solve_rounds(obj, prices, planning, max_factor, max_rounds, budget, seeds, settle, progress):
    """The rounds of :func:`solve_lazily`."""
    rounds = 0
    # a budget's branch and bound, and the tightening of the shared bound, run once the
    # prices the solver sees are exact
    settled = False
    warm = Warm()  # what one solve leaves the next
    bound = -math.inf  # the best bound of any round (prices only rise)
    best = None  # the cheapest answer whose moves were all priced exactly (its cost final)
    while True:
        rounds += 1
        report(progress, "solve", rounds, 0)
        # unsettled prices: a draft; settled: one search over the rounds, 32 solves in all
        options = Options(
            max_factor=max_factor,
            steps=30,
            draft=not settled,
            max_branches=32 if settled else 0,
            gap=_GAP,
            max_seconds=BUDGET_SECONDS,
            # the whole step's rows are an estimate under its peak: repaired plans at their
            # edge do not fit it (measured: costlier fitted plans); the state's are exact
            repair=not obj.node_weights,
        )
        sol = _solve_round(obj, prices, planning, options, budget, seeds, warm)
        new = prices.learn_used(obj.at(prices), sol.choice)
        if sol.method is not Method.OP_BY_OP:  # a bound at prices at most the exact ones holds on
            bound = max(bound, sol.bound)
        if not new and (best is None or sol.cost < best.cost):
            best = sol
        if rounds >= max_rounds:  # the last answer at the prices it raised, or the best
            last = sol.cost if not new else obj.at(prices).evaluate(sol.choice)
            return _with_bound(sol if best is None or last <= best.cost else best, bound)
        if not new and (settled or sol.exact or not settle):
            return _with_bound(best, bound)
        settled = settled or not new


def _with_bound(sol: Solution, bound: float) -> Solution:
    """``sol`` with the best of its bound and ``bound`` (an earlier round's)."""
    if bound <= sol.bound:
        return sol
    bound = min(bound, sol.cost)
    method = Method.EXACT if proven(sol.cost, bound) else sol.method
    return attrs.evolve(sol, bound=bound, method=method)


def content_key(obj: Objective, prices: Prices, settings: tuple) -> tuple:
    """What a whole-program solve's answer depends on, as a hashable value: the specs the
    problem's numbers stand for, its values, each option's spec numbers, compute and
    state bytes, the cost model, the solve's ``settings`` and the pairs priced already."""
    import numpy as np

    def arrays(xs) -> tuple:
        return tuple((len(x), bytes(memoryview(np.asarray(x, dtype=float)))) for x in xs)

    p = obj.problem
    budget = settings[2] if len(settings) > 2 else None
    seeds = settings[3] if len(settings) > 3 else ()
    return (
        tuple(prices.table),
        prices.model,
        p.ins,
        p.outs,
        arrays(p.unary),
        p.values,
        p.memory if budget is not None else None,
        obj.fixed_bytes if budget is not None else None,
        (*settings[:3], tuple(tuple(sorted(s.items())) for s in seeds), *settings[4:]),
        tuple(prices.exact),  # the pairs priced before the solve (all of them, when few)
    )


def _recall(obj: Objective, prices: Prices, key: tuple) -> Solution | None:
    """The answer the planner keeps for ``key``, with its exact prices learned, if its
    cost checks out at those prices (else None: solve)."""
    known = prices.owner().programs.get(key)
    if known is None:
        return None
    exact, sol = known

    def price(a: int, b: int) -> float:
        c = exact.get((a, b))
        return prices.price(a, b) if c is None else c

    cost = attrs.evolve(obj.problem, price=price).evaluate(sol.choice)
    if abs(cost - sol.cost) > 1e-12 * max(abs(sol.cost), 1e-300):
        return None  # solved again from the same prices as the first time
    prices.learn(exact)
    return sol


def tied_bound(
    graph: Graph,
    obj: Objective,
    repeats,
    options,
    env,
    prices: Prices,
    max_factor,
    choice,
    budget: tuple[float, float] | None = None,
) -> tuple[float, dict[int, int]]:
    """A true lower bound of the program's minimum when ``obj`` ties its repeated layers
    (``repeats``, see :mod:`._program_parts`): the parts' bounds summed; ``choice``
    the tied program's. With it, the options the bound's layer takes by call node
    (empty: none; see :func:`with_layer`). ``budget``: ``(multiplier, bytes)``, a memory
    budget left to the free arguments and a Lagrange multiplier for it: each free
    argument's state bytes times the multiplier join its part, and the multiplier times
    the budget is taken off (a true bound of the budgeted minimum for any multiplier
    >= 0). Kept by the planner, as solves are (:func:`solve_lazily`)."""
    key = ("tied bound", content_key(obj, prices, (max_factor,)), tuple(choice), budget)
    known = prices.owner().programs.get(key)
    if known is None:

        def reprice(part: Problem, choice) -> Any:
            return prices.frozen() if prices.learn_used(part, choice) else None

        args = (graph, obj, repeats, options, env, prices.frozen(), max_factor, choice)
        known = _tied_bound(*args, budget, reprice)
        prices.owner().remember_program(key, known)
    return known


def _tied_bound(
    graph, obj, repeats, options, env, price, max_factor, choice, budget, reprice=None
) -> tuple:
    # the parts' dual steps each solve a pairwise problem: exact elimination of a wide
    # one costs more per step than message passing, for about the same bound
    max_factor = min(max_factor, 1 << 16)

    linked = Warm()  # the linked layer's LP, bounded again at repriced moves

    def solve_part(part: Problem, n: int, links=(), choice=(), lp=True) -> tuple[float, list, Any]:
        if links:  # the layers' links priced (see solver.run_bound)
            return run_bound(part, links, n=n, max_factor=max_factor, choice=choice, warm=linked)
        return n * solve_shared(part, Options(max_factor=max_factor, lp=lp)).bound, [], None

    tied = (obj.var, options, obj.problem.ins, obj.problem.outs, choice)
    node_unary, taken = None, 0.0
    if budget is not None and budget[0] > 0:
        mu, room = budget
        args = [a for _, a in env[3]]
        times: dict[int, int] = {}
        for a in args:
            times[obj.var[a]] = times.get(obj.var[a], 0) + 1
        # a tied variable's weights sum its arguments' (alike: equal shares)
        weights = obj.problem.weights()
        node_unary = {a: mu * weights[obj.var[a]] / times[obj.var[a]] for a in args}
        # a call's saved activations: its own row (a tied variable's sums its calls')
        node_unary.update({n: mu * w for n, w in obj.node_weights.items()})
        taken = mu * room
    parts = (graph, repeats.blocks, dict(repeats.tie), tied, env, solve_part, price, node_unary)
    # the parts alone bounded again as one where the bound is looser than MERGE_GAP
    target = attrs.evolve(obj.problem, price=price).evaluate(choice) * (1 - MERGE_GAP) + taken
    bound, _, layer = parts_bound(*parts, reprice, target)
    return bound - taken, layer


#: a tied program's gap past which its bound by parts bounds the parts alone beside the
#: run of layers again as one (:func:`._program_parts.parts_bound`): below it, the time
#: that takes (Llama-3 8B: 3.9 s of LP for a bound 0.10% -> 0.008% under the plan) buys
#: little
MERGE_GAP = 0.005


def with_layer(
    obj: Objective, prices: Prices, sol: Solution, layer: Mapping[int, int], budget: float | None
) -> Solution:
    """``sol`` (a tied program's answer, priced exactly) or, where it costs less at exact
    prices and fits ``budget``, its choice with every layer's calls taking ``layer``'s
    options (the parts bound's choice of one layer, :func:`tied_bound`), improved by
    local search, or, where that holds too much, the best mix of the two choices that
    fits (:func:`.solver.mix_within`). The rounds' drafts improve one call at a time;
    the bound's layer is the layer's LP optimum, often a coordinated change of many
    calls (Llama-3 8B: 0.28% below the draft per layer)."""
    start = list(sol.choice)
    for n, k in layer.items():
        start[obj.var[n]] = k
    if tuple(start) == tuple(sol.choice):
        return sol
    tries = [start]
    for _ in range(_LAYER_ROUNDS):  # until the search's moves are priced exactly
        problem = obj.at(prices)
        found = Searcher(problem)(tries[-1], problem.unary)
        tries.append(found)
        if not prices.learn_used(problem, found):
            break
    problem = obj.at(prices)
    if budget is not None:
        problem = attrs.evolve(problem, budget=budget - obj.fixed_bytes)
    if not all(map(problem.fits, tries)):
        # the layer's plan (its bound's, the budget priced by the tied draft's multiplier
        # or not at all) holds more than the budget: the best of the draft's and its
        # options per call that fits (a MIP over their LP's columns)
        mixed = mix_within(problem, [sol.choice, *tries])
        tries += [] if mixed is None else [mixed]
    best = sol
    for choice in tries:
        # a choice's cost counts only once its moves are priced exactly
        if prices.learn_used(problem, choice):
            problem = attrs.evolve(obj.at(prices), budget=problem.budget)
        cost = problem.evaluate(choice)
        if problem.fits(choice) and cost < best.cost * (1 - 1e-12):
            best = attrs.evolve(sol, choice=tuple(choice), cost=cost)
    return best


#: the local searches :func:`with_layer` runs at most, each after pricing the moves the
#: last one chose
_LAYER_ROUNDS = 4

"""A program's objective and its lazily priced solve (no torch; numpy when used).

The variables are the calls (one candidate option each), then the free arguments (one
candidate layout each). The objective's terms are redistributions (see
:mod:`._program_terms`): into each call's inputs, out to the fixed output and gradient
specs, and each free argument's gradient into its layout; a value moved to a layout once
serves all its readers (:mod:`._shared`).

Lazy pricing: each round solves with exact prices where known and lower bounds elsewhere,
then prices exactly the pairs the answer uses; it stops once the answer uses exact prices
only. No other choice can then be cheaper (its every term is at most its true price), so
the answer is the exact minimum whenever the solver's is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.placement import Spec

from ._auto import budget_binds, free_grad_terms, memory_weights, solve_within
from ._graph import Graph, Value
from ._periodic import run_bound
from ._program_parts import parts_bound
from ._program_prices import Prices
from ._program_terms import greedy, matrix, order_too_wide
from ._progress import Progress, report
from ._shared import Reader, SharedValue, reader_weights, shared_solver, solve_shared
from ._solve import Solution

__all__ = [
    "Objective",
    "content_key",
    "objective",
    "shared_values",
    "solve_lazily",
    "tied_bound",
    "variables",
]

_GAP = 0.01  # a budget's branch and bound stops once its gap is within 1% of the cost


@attrs.frozen(eq=False)
class Objective:
    """A program's terms over its variables, with what the solver needs to price them:
    ``ins``/``outs`` each option's spec numbers, ``compute`` each option's compute cost,
    ``values`` the shared values and ``lams`` each term's lower-bound weights,
    ``weights`` each option's state bytes and ``fixed_bytes`` the fixed arguments';
    ``sinks`` the fixed targets ``(value, spec)`` and ``free_grads`` the free arguments'
    gradients ``(value, argument node)``."""

    calls: tuple[int, ...]
    var: dict[int, int]
    terms: list[tuple]
    ins: list
    outs: list
    compute: list
    values: list[SharedValue]
    lams: list
    weights: list
    fixed_bytes: float
    sinks: list = attrs.field(factory=list)
    free_grads: list = attrs.field(factory=list)


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
    """The objective of choosing one of ``options`` per variable (``var``: each node's,
    see :func:`variables`; default: one per call and free argument): ``targets`` are
    the output and gradient specs, ``memory`` the argument specs, state bytes per
    parameter and budget (see :func:`._auto.memory_weights`)."""
    import numpy as np

    calls = graph.calls
    if var is None:
        var = variables(graph, free)[0]
    sid = prices.sid
    ins, outs = prices.number(options)
    # the terms: ("fixed", c, i, src) | ("pair", p, j, c, i) | ("sink", c, j, dst)
    terms: list[tuple] = []
    for node in calls:
        c = var[node]
        for i, v in enumerate(graph.nodes[node].inputs):
            if v.node in fixed:
                terms.append(("fixed", c, i, sid(fixed[v.node])))
            else:
                terms.append(("pair", var[v.node], v.index, c, i))
    out_specs, grads = targets
    sinks = [(v, s) for v, s in zip(graph.outputs, out_specs, strict=True)]
    sinks += [
        (v, s)
        for i, (v, s) in enumerate(zip(graph.grads, grads, strict=True))
        if v is not None and i not in free
    ]
    for v, target in sinks:
        if v.node not in fixed:
            terms.append(("sink", var[v.node], v.index, sid(target)))
    terms += free_grad_terms(graph, free, fixed, var, sid)
    arg_specs, per_param, budget = memory
    differentiated = tuple(g is not None for g in graph.grads)
    free_weights, fixed_bytes = memory_weights(
        arg_specs,
        differentiated,
        free,
        [options[var[graph.args[i]]] for i in free],
        [],
        per_param,
        budget,
    )
    weights = [np.zeros(len(o)) for o in options]
    for i, w in zip(free, free_weights, strict=True):
        weights[var[graph.args[i]]] = weights[var[graph.args[i]]] + w
    # the same terms grouped by value: one move per distinct layout its readers want
    grad_reads = [(graph.grads[i], var[graph.args[i]]) for i in free if graph.grads[i] is not None]
    values = shared_values(graph, calls, var, fixed, sid, sinks, grad_reads)
    shares = reader_weights(values, ins)
    lams = [_term_weights(t, shares, ins) for t in terms]
    times = [0] * len(options)  # how many nodes each variable stands for
    for n in (*calls, *(graph.args[i] for i in free)):
        times[var[n]] += 1
    compute = [
        np.array([o.compute for o in opts], dtype=float) * k
        for opts, k in zip(options, times, strict=True)
    ]
    free_grads = [(graph.grads[i], graph.args[i]) for i in free if graph.grads[i] is not None]
    return Objective(
        calls, var, terms, ins, outs, compute, values, lams, weights, fixed_bytes, sinks, free_grads
    )


def _term_weights(t, shares, ins):
    """The lower-bound weights of a term's reader, per option of the reader (or one)."""
    import numpy as np

    if t[0] == "sink":
        _, c, j, dst = t
        return shares[("sink", c, j)][dst]
    c, i = (t[1], t[2]) if t[0] == "fixed" else (t[3], t[4])
    mine = shares[(c, i)]
    return np.array([mine[row[i]] for row in ins[c]], dtype=float)


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


def _pairwise(obj: Objective, price) -> tuple[tuple[list, dict], tuple[list, dict]]:
    """The pairwise problems above and below the shared objective at the current prices:
    ``(unary, pairs)`` with every reader paying its own move, and with each paying its
    share (see :mod:`._shared`)."""
    import numpy as np

    ins, outs = obj.ins, obj.outs
    unary = [u.copy() for u in obj.compute]
    unary_lo = [u.copy() for u in obj.compute]
    pairs: dict[tuple[int, int], Any] = {}
    pairs_lo: dict[tuple[int, int], Any] = {}
    alike: dict[tuple, list] = {}  # terms of tied layers repeat: priced once, counted
    for t, lam in zip(obj.terms, obj.lams, strict=True):
        if t in alike:
            alike[t][1] += 1
        else:
            alike[t] = [lam, 1]
    for t, (lam, k) in alike.items():
        if t[0] == "fixed":
            _, c, i, src = t
            row = matrix([src], [row[i] for row in ins[c]], price)[0] * k
            unary[c] += row
            unary_lo[c] += row * lam
        elif t[0] == "sink":
            _, c, j, dst = t
            col = matrix([row[j] for row in outs[c]], [dst], price)[:, 0] * k
            unary[c] += col
            unary_lo[c] += col * lam
        else:
            _, p, j, c, i = t
            m = matrix([row[j] for row in outs[p]], [row[i] for row in ins[c]], price) * k
            if p == c:  # a tied op reading its own output in the layer before
                unary[c] += np.diagonal(m)
                unary_lo[c] += np.diagonal(m) * lam
                continue
            pairs[(p, c)] = m if (p, c) not in pairs else pairs[(p, c)] + m
            m = m * lam[None, :]
            pairs_lo[(p, c)] = m if (p, c) not in pairs_lo else pairs_lo[(p, c)] + m
    return (unary, pairs), (unary_lo, pairs_lo)


def _solve_round(
    graph, obj: Objective, prices: Prices, solver, max_factor, budget, seeds, effort, memo
):
    """One solve at the current prices: op by op, or the whole graph (``effort[1]`` steps
    tightening the shared bound; ``effort[2]``: a draft, see :func:`._shared.solve_shared`).
    Within a budget, up to ``effort[0]`` solves of its search, drafts all, and unless a
    draft, one solve with the steps at the search's root whose bound holds for all."""
    branches, steps, draft = effort
    (unary, pairs), below = _pairwise(obj, prices.price)
    greedy_args = (obj.calls, obj.var, graph, obj.terms, obj.ins, obj.outs, unary, pairs)
    if solver == "op_by_op":
        return greedy(*greedy_args, prices.price, prices.learn_exact)
    starts = ()
    if order_too_wide(unary, pairs, max_factor):
        starts = (greedy(*greedy_args, prices.price, prices.learn_exact).choice,)
    free_budget = None if budget is None else budget - obj.fixed_bytes
    shared_solve, shared_cost = shared_solver(
        (unary, pairs), below, (obj.compute, obj.values, obj.ins, obj.outs, prices.price)
    )
    within = free_budget is not None  # a search solving many times: drafts
    return solve_within(
        shared_solve,
        unary,
        pairs,
        obj.weights,
        free_budget,
        max_branches=branches,
        gap=_GAP,
        cost=shared_cost,
        seeds=() if draft else seeds,  # the given layouts matter to the answer only
        final=None if draft or not within else {"steps": steps, "draft": False},
        # the settled rounds' branch and bound: one search, prices learned as it goes
        state=memo.setdefault("search", {}) if branches else None,
        lines=memo.setdefault("lines", {}),
        max_factor=max_factor,
        starts=starts,
        steps=0 if within else steps,
        memo=memo,
        draft=draft or within,
    )


def solve_lazily(
    graph: Graph,
    obj: Objective,
    prices: Prices,
    *,
    solver: str,
    max_factor: int,
    max_rounds: int,
    budget: float | None,
    seeds: Sequence[dict[int, int]],
    progress: Progress | None,
) -> Solution:
    """Solve, price exactly what the answer uses, and again, until the answer uses exact
    prices only (or ``max_rounds`` rounds ran).

    The planner keeps each whole-program answer under the content of its objective
    (:func:`content_key`): the same objective planned again takes the exact prices and
    the answer from there, once the answer's cost is checked at the exact prices
    (the same answer the solve gives: it is a pure function of that content)."""
    if budget is not None and not budget_binds(obj.weights, budget - obj.fixed_bytes):
        budget = None  # every choice fits: the budget constrains nothing
    key = None
    if solver == "whole":
        key = content_key(obj, prices, (max_factor, max_rounds, budget, seeds))
        known = _recall(obj, prices, key)
        if known is not None:
            report(progress, "solve", 1, 0)
            return known
    sol = _solve_rounds(graph, obj, prices, solver, max_factor, max_rounds, budget, seeds, progress)
    if key is not None:
        prices.owner().remember_program(key, (dict(prices.exact), sol))
    return sol


def _solve_rounds(graph, obj, prices, solver, max_factor, max_rounds, budget, seeds, progress):
    """The rounds of :func:`solve_lazily`."""
    rounds = 0
    # a budget's branch and bound, and the tightening of the shared bound, run once the
    # prices the solver sees are exact
    settled = False
    memo: dict = {}  # what one solve leaves the next (see solve_shared)
    bound = -math.inf  # the best bound of an earlier round (prices only rise)
    while True:
        rounds += 1
        report(progress, "solve", rounds, 0)
        branches = 32 if settled else 0  # solves of one search, over the settled rounds
        effort = (branches, 30, not settled)  # unsettled prices: a draft
        sol = _solve_round(graph, obj, prices, solver, max_factor, budget, seeds, effort, memo)
        new = prices.learn_used(obj.terms, obj.ins, obj.outs, sol.choice)
        if rounds >= max_rounds:
            return _with_bound(sol, bound)
        if not new and (settled or sol.method == "exact"):
            return _with_bound(sol, bound)
        settled = settled or not new
        if sol.method != "op by op":  # a bound at prices at most the exact ones holds on
            bound = max(bound, sol.lower_bound)


def _with_bound(sol: Solution, bound: float) -> Solution:
    """``sol`` with the best of its bound and ``bound`` (an earlier round's)."""
    if bound <= sol.lower_bound:
        return sol
    bound = min(bound, sol.cost)
    method = "exact" if sol.cost - bound <= 1e-12 * max(abs(sol.cost), 1e-300) else sol.method
    return attrs.evolve(sol, lower_bound=bound, method=method)


def content_key(obj: Objective, prices: Prices, settings: tuple) -> tuple:
    """What a whole-program solve's answer depends on, as a hashable value: the specs the
    objective's numbers stand for, its terms, values, each option's spec numbers, compute
    and state bytes, the cost model, the solve's ``settings`` and the pairs priced
    already."""

    def arrays(xs) -> tuple:
        return tuple((len(x), bytes(memoryview(np.asarray(x, dtype=float)))) for x in xs)

    def numbers(xs) -> tuple:  # per variable, per option, the spec numbers
        return tuple(tuple(map(tuple, opts)) for opts in xs)

    import numpy as np

    budget = settings[2] if len(settings) > 2 else None
    seeds = settings[3] if len(settings) > 3 else ()
    return (
        tuple(prices.table),
        prices.model,
        tuple(obj.terms),
        numbers(obj.ins),
        numbers(obj.outs),
        arrays(obj.compute),
        tuple(obj.values),
        arrays(obj.weights) if budget is not None else None,
        obj.fixed_bytes if budget is not None else None,
        (*settings[:3], tuple(tuple(sorted(s.items())) for s in seeds)),
        tuple(prices.exact),  # the pairs priced before the solve (all of them, when few)
    )


def _recall(obj: Objective, prices: Prices, key: tuple) -> Solution | None:
    """The answer the planner keeps for ``key``, with its exact prices learned, if its
    cost checks out at those prices (else None: solve)."""
    from ._shared import shared_total

    known = prices.owner().programs.get(key)
    if known is None:
        return None
    exact, sol = known

    def price(a: int, b: int) -> float:
        c = exact.get((a, b))
        return prices.price(a, b) if c is None else c

    cost = shared_total(sol.choice, obj.compute, obj.values, obj.ins, obj.outs, price)
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
) -> float:
    """A true lower bound of the program's minimum when ``obj`` ties its repeated layers
    (``repeats``, see :mod:`._program_parts`): the parts' bounds summed; ``choice``
    the tied program's. ``budget``: ``(multiplier, bytes)``, a memory budget left to the
    free arguments and a Lagrange multiplier for it: each free argument's state bytes
    times the multiplier join its part, and the multiplier times the budget is taken
    off (a true bound of the budgeted minimum for any multiplier >= 0). Kept by the
    planner, as solves are (:func:`solve_lazily`)."""
    key = ("tied bound", content_key(obj, prices, (max_factor,)), tuple(choice), budget)
    known = prices.owner().programs.get(key)
    if known is None:
        args = (graph, obj, repeats, options, env, prices.price, max_factor, choice)
        known = _tied_bound(*args, budget)
        prices.owner().remember_program(key, known)
    return known


def _tied_bound(graph, obj, repeats, options, env, price, max_factor, choice, budget) -> float:
    import numpy as np

    # the parts' dual steps each solve a pairwise problem: exact elimination of a wide
    # one costs more per step than message passing, for about the same bound
    max_factor = min(max_factor, 1 << 16)

    def solve_part(part, n, links=()) -> tuple[float, list]:
        unary, terms, ins, outs, values, choice = part
        if links:  # the layers' links priced (see _periodic)
            shared = (values, ins, outs, price)
            return run_bound(unary, shared, links, n=n, max_factor=max_factor, choice=choice)
        shares = reader_weights(values, ins)
        for v in values:  # a value read by several parts: each pays its share
            for r in v.readers:
                key = ("sink", v.producer, v.j) if r.op < 0 else (r.op, r.i)
                shares[key] = {b: w * v.count for b, w in shares[key].items()}
        lams = [_term_weights(t, shares, ins) for t in terms]
        weights = [np.zeros(len(u)) for u in unary]
        part = Objective((), {}, terms, ins, outs, unary, values, lams, weights, 0.0)
        above, below = _pairwise(part, price)
        shared = (unary, values, ins, outs, price)
        return n * solve_shared(above, below, shared, max_factor=max_factor).lower_bound, []

    tied = (obj.var, options, obj.ins, obj.outs, choice)
    node_unary, taken = None, 0.0
    if budget is not None and budget[0] > 0:
        mu, room = budget
        args = [a for _, a in env[3]]
        times: dict[int, int] = {}
        for a in args:
            times[obj.var[a]] = times.get(obj.var[a], 0) + 1
        # a tied variable's weights sum its arguments' (alike: equal shares)
        node_unary = {a: mu * obj.weights[obj.var[a]] / times[obj.var[a]] for a in args}
        taken = mu * room
    parts = (graph, repeats.blocks, dict(repeats.tie), tied, env, solve_part, node_unary)
    return parts_bound(*parts)[0] - taken

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

from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.placement import Spec

from ._auto import budget_binds, free_grad_terms, memory_weights, solve_within
from ._graph import Graph, Value
from ._program_prices import Prices
from ._program_terms import greedy, matrix, order_too_wide
from ._progress import Progress, report
from ._shared import Reader, SharedValue, reader_weights, shared_solver
from ._solve import Solution

__all__ = ["Objective", "objective", "shared_values", "solve_lazily"]

_GAP = 0.01  # a budget's branch and bound stops once its gap is within 1% of the cost


@attrs.frozen(eq=False)
class Objective:
    """A program's terms over its variables, with what the solver needs to price them:
    ``ins``/``outs`` each option's spec numbers, ``compute`` each option's compute cost,
    ``values`` the shared values and ``lams`` each term's lower-bound weights,
    ``weights`` each option's state bytes and ``fixed_bytes`` the fixed arguments'."""

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


def objective(
    graph: Graph,
    options: Sequence,
    free: Sequence[int],
    fixed: dict[int, Spec],
    targets: tuple[Sequence[Spec], Sequence[Spec | None]],
    prices: Prices,
    memory: tuple[Sequence[Spec], float | None, float | None],
) -> Objective:
    """The objective of choosing one of ``options`` per variable: ``targets`` are the
    output and gradient specs, ``memory`` the argument specs, state bytes per parameter
    and budget (see :func:`._auto.memory_weights`)."""
    import numpy as np

    calls = graph.calls
    free_nodes = tuple(graph.args[i] for i in free)  # free arguments: variables after the calls
    var = {node: i for i, node in enumerate((*calls, *free_nodes))}
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
    weights, fixed_bytes = memory_weights(
        arg_specs,
        differentiated,
        free,
        options[len(calls) :],
        [len(o) for o in options[: len(calls)]],
        per_param,
        budget,
    )
    # the same terms grouped by value: one move per distinct layout its readers want
    grad_reads = [(graph.grads[i], var[graph.args[i]]) for i in free if graph.grads[i] is not None]
    values = shared_values(graph, calls, var, fixed, sid, sinks, grad_reads)
    shares = reader_weights(values, ins)
    lams = [_term_weights(t, shares, ins) for t in terms]
    compute = [np.array([o.compute for o in opts], dtype=float) for opts in options]
    return Objective(calls, var, terms, ins, outs, compute, values, lams, weights, fixed_bytes)


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
    out = []
    for v, rs in readers.items():
        if v.node in fixed:
            out.append(SharedValue(-1, 0, sid(fixed[v.node]), tuple(rs)))
        else:
            out.append(SharedValue(var[v.node], v.index, -1, tuple(rs)))
    return out


def _pairwise(obj: Objective, price) -> tuple[tuple[list, dict], tuple[list, dict]]:
    """The pairwise problems above and below the shared objective at the current prices:
    ``(unary, pairs)`` with every reader paying its own move, and with each paying its
    share (see :mod:`._shared`)."""
    ins, outs = obj.ins, obj.outs
    unary = [u.copy() for u in obj.compute]
    unary_lo = [u.copy() for u in obj.compute]
    pairs: dict[tuple[int, int], Any] = {}
    pairs_lo: dict[tuple[int, int], Any] = {}
    for t, lam in zip(obj.terms, obj.lams, strict=True):
        if t[0] == "fixed":
            _, c, i, src = t
            row = matrix([src], [row[i] for row in ins[c]], price)[0]
            unary[c] += row
            unary_lo[c] += row * lam
        elif t[0] == "sink":
            _, c, j, dst = t
            col = matrix([row[j] for row in outs[c]], [dst], price)[:, 0]
            unary[c] += col
            unary_lo[c] += col * lam
        else:
            _, p, j, c, i = t
            m = matrix([row[j] for row in outs[p]], [row[i] for row in ins[c]], price)
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
    prices only (or ``max_rounds`` rounds ran)."""
    if budget is not None and not budget_binds(obj.weights, budget - obj.fixed_bytes):
        budget = None  # every choice fits: the budget constrains nothing
    rounds = 0
    # a budget's branch and bound, and the tightening of the shared bound, run once the
    # prices the solver sees are exact
    settled = False
    memo: dict = {}  # what one solve leaves the next (see solve_shared)
    while True:
        rounds += 1
        report(progress, "solve", rounds, 0)
        branches = 32 if settled else 0  # solves of one search, over the settled rounds
        effort = (branches, 30, not settled)  # unsettled prices: a draft
        sol = _solve_round(graph, obj, prices, solver, max_factor, budget, seeds, effort, memo)
        new = prices.learn_used(obj.terms, obj.ins, obj.outs, sol.choice)
        if rounds >= max_rounds or (not new and (settled or sol.method == "exact")):
            return sol
        settled = settled or not new

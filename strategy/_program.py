"""Whole programs: :func:`plan_program` and the :class:`Program` value.

A program is a function of global tensors traced into aten calls, forward and backward
together (:mod:`._trace`). Each call's candidate N-D strategies come from its
single-mesh-dim rules (:mod:`._aten`) combined over the mesh; each candidate costs its
local compute (:class:`ComputeModel`) plus the redistributions into it, priced by the
planner's cost model — from the arguments' specs, from the producers' chosen output
specs, and out of it to the program's output specs and to each argument's gradient
spec. The cheapest assignment over the whole graph is found by :func:`._solve.solve`
(exact dynamic programming where the graph allows, else a forest bound plus local
search, with the gap reported).

Pricing every pair of candidate layouts with the planner is most of the work (on a 3-D
mesh a transformer has tens of thousands of distinct pairs), so big programs are priced
lazily: the solver first sees the strategy search's cheap lower bounds
(:func:`~meshplan.strategy._price.input_bound`) where no exact price is known; the pairs
its answer uses (and their neighbours) are then planned, and it solves again, until the
answer uses exact prices only. Every other answer is then priced at most at its true
cost, so the result is the same exact minimum as with every pair planned.

Gradient layouts follow by construction: the backward calls are ops like any other,
and each argument's gradient is moved to the argument's own layout (:func:`grad_spec`
of it: a Partial argument gets a replicated gradient, Shard and Replicate keep), so a
parameter stored ``Shard`` on the data-parallel dim gets its partial gradient
reduce-scattered once, and a row-parallel partial sum is reduced once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from meshplan.errors import StrategyError
from meshplan.placement import Replicate, Spec
from meshplan.redistribute._steps import grad_spec

from ._candidates import ComputeModel, Option, is_float
from ._candidates import options as candidate_options
from ._graph import Graph, Value
from ._price import _plan, check_model, check_planner, input_bound, redistribute_cost
from ._program_terms import all_pairs, greedy, matrix, order_too_wide, pair_count
from ._program_value import Program, ProgramCost, ProgramOp, ProgramWarning

__all__ = [
    "ComputeModel",
    "Program",
    "ProgramOp",
    "ProgramCost",
    "ProgramWarning",
    "grad_spec",
    "plan_program",
    "plan_graph",
]


# -- planning -------------------------------------------------------------------------------


def _check_specs(fn_name: str, what: str, specs: Sequence[Any]) -> tuple[Spec, ...]:
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


def plan_program(
    fn: Callable[..., Any],
    *arg_specs: Spec,
    out_specs: Sequence[Spec] | None = None,
    requires_grad: Sequence[bool] | None = None,
    cost_model: Any = None,
    compute: ComputeModel | None = None,
    strict: bool = False,
    max_factor: int = 1 << 22,
    max_options: int = 32,
    planner: Any = None,
) -> Program:
    """Trace ``fn`` (written for global tensors) and plan it whole, forward and backward.

    ``arg_specs`` say how each argument lies on the mesh; ``out_specs`` how each
    output must (default: replicated). ``requires_grad`` marks the differentiated
    arguments (default: the floating-point ones). Ops without a rule run replicated
    with a :class:`ProgramWarning` (``strict=True`` raises instead). Each op keeps at
    most ``max_options`` candidate strategies on meshes of 3+ dims (full replication
    and the most sharded; every candidate on 1-D and 2-D meshes), and the choice over them is
    exact unless a factor of the elimination would exceed ``max_factor`` entries
    (``program.method`` says which, ``program.lower_bound`` bounds the gap).
    Redistributions are planned and priced by ``planner`` (a
    :class:`meshplan.redistribute.Planner`; the default one when None).

    >>> import torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2,), ("dp",))
    >>> x = Spec(mesh, [Shard(0)], (8, 4), "float64")
    >>> w = Spec(mesh, [Replicate()], (4, 3), "float64")
    >>> prog = plan_program(lambda x, w: (x @ w).sum(), x, w)
    >>> [str(s) for s in prog.grad_specs]
    ['f64[8,4](S(0))', 'f64[4,3](R)']
    """
    from ._trace import trace

    arg_specs = _check_specs("plan_program", "argument", arg_specs)
    if not arg_specs:
        raise StrategyError("plan_program needs at least one argument spec", value=arg_specs)
    mesh = arg_specs[0].mesh
    for s in arg_specs:
        if s.mesh != mesh:
            raise StrategyError(
                f"argument specs lie on different meshes ({s.mesh} and {mesh}); a program "
                "runs on one mesh",
                value=s,
            )
    if requires_grad is None:
        requires_grad = tuple(is_float(s.dtype) for s in arg_specs)
    else:
        requires_grad = tuple(bool(g) for g in requires_grad)
        if len(requires_grad) != len(arg_specs):
            raise StrategyError(
                f"requires_grad has {len(requires_grad)} entries for {len(arg_specs)} arguments",
                value=requires_grad,
            )
    graph = trace(fn, arg_specs, requires_grad)
    return plan_graph(
        graph,
        arg_specs,
        out_specs=out_specs,
        cost_model=cost_model,
        compute=compute,
        strict=strict,
        max_factor=max_factor,
        max_options=max_options,
        planner=planner,
    )


def plan_graph(
    graph: Graph,
    arg_specs: Sequence[Spec],
    *,
    out_specs: Sequence[Spec] | None = None,
    cost_model: Any = None,
    compute: ComputeModel | None = None,
    strict: bool = False,
    max_factor: int = 1 << 22,
    max_options: int = 32,
    max_rounds: int = 100,
    max_priced: int = 20_000,
    solver: str = "whole",
    planner: Any = None,
) -> Program:
    """Plan an already traced :class:`Graph` (pure: no torch).

    ``solver="whole"`` (default) minimizes over the whole graph; ``"op_by_op"`` picks
    each op's cheapest strategy given its inputs' layouts as they come, in order (what
    a planner without look-ahead does): the baseline whole-program planning beats.
    """
    if solver not in ("whole", "op_by_op"):
        raise StrategyError(f"solver must be 'whole' or 'op_by_op', got {solver!r}", value=solver)
    from ._solve import solve

    if not isinstance(graph, Graph):
        raise StrategyError(
            f"plan_graph plans a traced Graph (see plan_program), got {graph!r:.80}", value=graph
        )
    if isinstance(arg_specs, Spec) or not isinstance(arg_specs, Sequence):
        raise StrategyError(
            f"arg_specs must be a sequence of Specs, one per argument, got {arg_specs!r:.80}",
            value=arg_specs,
        )
    arg_specs = _check_specs("plan_graph", "argument", arg_specs)
    if len(arg_specs) != len(graph.args) or not arg_specs:
        raise StrategyError(
            f"the graph takes {len(graph.args)} arguments, got {len(arg_specs)} specs",
            value=arg_specs,
        )
    for name, value in (
        ("max_factor", max_factor),
        ("max_options", max_options),
        ("max_rounds", max_rounds),
        ("max_priced", max_priced),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < 0
            or (name != "max_priced" and value < 1)
        ):
            raise StrategyError(f"{name} must be a positive int, got {value!r}", value=value)
    model = check_model(cost_model)
    planner = check_planner(planner)
    compute = ComputeModel() if compute is None else compute
    if not isinstance(compute, ComputeModel):
        raise StrategyError(f"compute must be a ComputeModel, got {compute!r}", value=compute)
    mesh = arg_specs[0].mesh
    for i, (k, spec) in enumerate(zip(graph.args, arg_specs, strict=True)):
        m = graph.nodes[k].metas[0]
        if m.shape != spec.shape or m.dtype != spec.dtype:
            raise StrategyError(
                f"argument {i}'s spec {spec} disagrees with the traced tensor {m}", value=spec
            )
    outs = _out_specs(graph, mesh, out_specs)
    cots = tuple(grad_spec(s) for s in outs)
    grads = tuple(
        grad_spec(s) if g is not None else None for s, g in zip(arg_specs, graph.grads, strict=True)
    )
    fixed: dict[int, Spec] = dict(zip(graph.args, arg_specs, strict=True))
    fixed.update(zip(graph.cotangents, cots, strict=True))

    calls = graph.calls
    var = {node: i for i, node in enumerate(calls)}
    options: list[tuple[Option, ...]] = []
    fallbacks = []
    for node in calls:
        call = graph.nodes[node].call
        limit = max_options if mesh.ndim >= 3 else 1 << 30  # 1-D, 2-D: every candidate
        opts, fb = candidate_options(call, mesh, compute, strict, limit)
        if fb:
            fallbacks.append(call.target)
        options.append(opts)
    for target in sorted(set(fallbacks)):
        warnings.warn(
            f"no sharding rule for {target}: it runs replicated (correct, maybe slow); add a "
            "rule or pass strict=True to refuse",
            ProgramWarning,
            stacklevel=3,
        )

    import numpy as np

    # every distinct spec gets a number once; prices are memoized on pairs of numbers
    ids: dict[Spec, int] = {}
    table: list[Spec] = []

    def sid(spec: Spec) -> int:
        k = ids.get(spec)
        if k is None:
            k = ids[spec] = len(table)
            table.append(spec)
        return k

    ins = [[[sid(s) for s in o.input_specs] for o in opts] for opts in options]
    outs_ = [
        [[sid(s) if s is not None else -1 for s in o.output_specs] for o in opts]
        for opts in options
    ]
    exact: dict[tuple[int, int], float] = {}
    bounds: dict[tuple[int, int], float] = {}

    def learn_exact(a: int, b: int) -> float:
        c = exact.get((a, b))
        if c is None:
            c = exact[(a, b)] = (
                0.0 if a == b else redistribute_cost(table[a], table[b], model, planner)
            )
        return c

    def price(a: int, b: int) -> float:
        """The exact price where known, else a lower bound of it (cheap: no planning)."""
        c = exact.get((a, b))
        if c is None:
            c = bounds.get((a, b))
            if c is None:
                c = bounds[(a, b)] = (
                    0.0 if a == b else input_bound(table[a], table[b].placements, model)
                )
        return c

    # the terms of the objective: (node, its option's spec numbers) -> which pair it prices
    terms: list[tuple] = []  # ("fixed", c, i, src) | ("pair", p, j, c, i) | ("sink", c, j, dst)
    for node in calls:
        c = var[node]
        for i, v in enumerate(graph.nodes[node].inputs):
            if v.node in fixed:
                terms.append(("fixed", c, i, sid(fixed[v.node])))
            else:
                terms.append(("pair", var[v.node], v.index, c, i))
    sinks = [(v, s) for v, s in zip(graph.outputs, outs, strict=True)]
    sinks += [(v, s) for v, s in zip(graph.grads, grads, strict=True) if v is not None]
    for v, target in sinks:
        if v.node not in fixed:
            terms.append(("sink", var[v.node], v.index, sid(target)))

    # lazy pricing: solve with exact prices where known and lower bounds elsewhere; price
    # exactly the pairs the solution uses; repeat until it uses only exact prices. Then
    # no other choice can be cheaper (its every term is at most its true price), so the
    # solution is the exact minimum whenever the solver's is.
    compute_cost = [np.array([o.compute for o in opts], dtype=float) for opts in options]
    if pair_count(terms, ins, outs_) <= max_priced:
        # few enough distinct pairs: price them all up front, one round
        for a, b in all_pairs(terms, ins, outs_):
            if (a, b) not in exact:
                exact[(a, b)] = (
                    0.0 if a == b else redistribute_cost(table[a], table[b], model, planner)
                )
    rounds = 0
    while True:
        rounds += 1
        unary = [u.copy() for u in compute_cost]
        pairs: dict[tuple[int, int], Any] = {}
        for t in terms:
            if t[0] == "fixed":
                _, c, i, src = t
                unary[c] += matrix([src], [row[i] for row in ins[c]], price)[0]
            elif t[0] == "sink":
                _, c, j, dst = t
                unary[c] += matrix([row[j] for row in outs_[c]], [dst], price)[:, 0]
            else:
                _, p, j, c, i = t
                m = matrix([row[j] for row in outs_[p]], [row[i] for row in ins[c]], price)
                pairs[(p, c)] = m if (p, c) not in pairs else pairs[(p, c)] + m
        if solver == "op_by_op":
            sol = greedy(calls, var, graph, terms, ins, outs_, unary, pairs, price, learn_exact)
        else:
            starts = ()
            if order_too_wide(unary, pairs, max_factor):
                starts = (
                    greedy(
                        calls, var, graph, terms, ins, outs_, unary, pairs, price, learn_exact
                    ).choice,
                )
            sol = solve(unary, pairs, max_factor=max_factor, starts=starts)
        new = 0

        def learn(a: int, b: int) -> None:
            nonlocal new
            if (a, b) not in exact:
                exact[(a, b)] = (
                    0.0 if a == b else redistribute_cost(table[a], table[b], model, planner)
                )
                new += 1

        used_before = new
        for t in terms:
            if t[0] == "fixed":
                _, c, i, src = t
                learn(src, ins[c][sol.choice[c]][i])
            elif t[0] == "sink":
                _, c, j, dst = t
                learn(outs_[c][sol.choice[c]][j], dst)
            else:
                _, p, j, c, i = t
                learn(outs_[p][sol.choice[p]][j], ins[c][sol.choice[c]][i])
        if new > used_before:
            # the solution used guessed prices: learn its neighbourhood too (each term's
            # chosen producer spec against every consumer option, and the reverse), so
            # the next rounds do not walk through ties one pair at a time
            for t in terms:
                if t[0] != "pair":
                    continue
                _, p, j, c, i = t
                a = outs_[p][sol.choice[p]][j]
                b = ins[c][sol.choice[c]][i]
                for d in dict.fromkeys(row[i] for row in ins[c]):
                    learn(a, d)
                for e in dict.fromkeys(row[j] for row in outs_[p]):
                    learn(e, b)
        if not new or rounds >= max_rounds:
            break
    return _assemble(
        graph, arg_specs, outs, cots, grads, fixed, options, var, sol, model, fallbacks, planner
    )


def _out_specs(graph: Graph, mesh, out_specs) -> tuple[Spec, ...]:
    metas = [graph.meta(v) for v in graph.outputs]
    if out_specs is None:
        return tuple(Spec(mesh, [Replicate()] * mesh.ndim, m.shape, m.dtype) for m in metas)
    if isinstance(out_specs, Spec):
        out_specs = (out_specs,)
    out_specs = _check_specs("plan_program", "output spec", out_specs)
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


def _assemble(
    graph, arg_specs, outs, cots, grads, fixed, options, var, sol, model, fallbacks, planner=None
):
    from meshplan.redistribute import cost as plan_cost

    specs: dict[Value, Spec] = {}
    for node, spec in fixed.items():
        specs[Value(node)] = spec
    comm = compute = nbytes = 0.0
    collectives = 0

    def move(src: Spec, dst: Spec):
        nonlocal comm, nbytes, collectives
        if src == dst:
            return None
        p = _plan(src, dst, model, planner)
        c = plan_cost(p, model)
        comm += c.total
        nbytes += c.bytes
        collectives += sum(1 for s in p.steps if s.collective is not None)
        return p

    ops = []
    for node in graph.calls:
        n = graph.nodes[node]
        o = options[var[node]][sol.choice[var[node]]]
        compute += o.compute
        moves = tuple(move(specs[v], o.input_specs[i]) for i, v in enumerate(n.inputs))
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
    out_moves = tuple(move(specs[v], s) for v, s in zip(graph.outputs, outs, strict=True))
    grad_moves = tuple(
        move(specs[v], s) if v is not None else None
        for v, s in zip(graph.grads, grads, strict=True)
    )
    cost = ProgramCost(comm, compute, nbytes, collectives)
    bound = sol.lower_bound if sol.method != "exact" else cost.total
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
        sol.method,
        tuple(sorted(set(fallbacks))),
    )

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
from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.placement import Replicate, Spec
from meshplan.redistribute._steps import grad_spec

from ._auto import (
    free_grad_terms,
    free_options,
    memory_weights,
    resolve_choose,
    solve_within,
)
from ._candidates import ComputeModel, Option, is_float
from ._candidates import options as candidate_options
from ._graph import Graph, Value
from ._memory import check_state_bytes_per_param, program_memory
from ._price import _plan, check_model, check_planner, input_bound, redistribute_cost
from ._program_terms import all_pairs, greedy, matrix, order_too_wide, pair_count
from ._program_value import Program, ProgramCost, ProgramOp, ProgramWarning
from ._progress import Progress, check_progress, report
from ._ruleset import RuleSet
from ._shared import Reader, SharedValue, reader_weights, shared_solver

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
    ruleset: RuleSet | None = None,
    choose: Collection[int] | None = None,
    memory_budget: float | None = None,
    state_bytes_per_param: float | None = None,
    progress: Progress | None = None,
    planner: Any = None,
) -> Program:
    """Trace ``fn`` (written for global tensors) and plan it whole, forward and backward.

    ``arg_specs`` say how each argument lies on the mesh; ``out_specs`` how each
    output must (default: replicated). ``requires_grad`` marks the differentiated
    arguments (default: the floating-point ones). Each traced aten call takes its rule
    from ``ruleset`` (default: ``RuleSet.default()``; the same table
    :func:`~meshplan.strategy.select` reads, so a rule added there with
    :meth:`RuleSet.with_rule` serves here too). Ops without a rule run replicated
    with a :class:`ProgramWarning` naming them all (``program.replicated`` counts
    them); ``strict=True`` raises instead, listing every op without a rule. Each op keeps at
    most ``max_options`` candidate strategies on meshes of 3+ dims (full replication
    and the most sharded; every candidate on 1-D and 2-D meshes), and the choice over them is
    exact unless a factor of the elimination would exceed ``max_factor`` entries
    (``program.method`` says which, ``program.lower_bound`` bounds the gap).
    ``progress`` is called as ``progress(stage, done, total)`` as planning goes (see
    :data:`PROGRESS_STAGES`; ``total`` 0 when not known ahead), e.g. to print how far a
    long plan has come.

    Auto-sharding: ``choose`` lists argument indices whose layouts the planner picks
    (their specs give mesh, shape and dtype; their placements only seed the search), and
    ``memory_budget`` bounds the bytes per rank of the training state, parameters +
    gradients + optimizer state (``state_bytes_per_param`` bytes per element; None: two
    moments in the parameter's dtype, as AdamW keeps). ``program.arg_specs`` holds the
    chosen specs, ``program.memory`` the bytes per rank (see :mod:`._auto`).

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
    check_progress(progress)
    report(progress, "trace", 0, 1)
    graph = trace(fn, arg_specs, requires_grad)
    report(progress, "trace", 1, 1)
    return plan_graph(
        graph,
        arg_specs,
        out_specs=out_specs,
        cost_model=cost_model,
        compute=compute,
        strict=strict,
        max_factor=max_factor,
        max_options=max_options,
        ruleset=ruleset,
        choose=choose,
        memory_budget=memory_budget,
        state_bytes_per_param=state_bytes_per_param,
        progress=progress,
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
    ruleset: RuleSet | None = None,
    choose: Collection[int] | None = None,
    memory_budget: float | None = None,
    state_bytes_per_param: float | None = None,
    progress: Progress | None = None,
    planner: Any = None,
) -> Program:
    """Plan an already traced :class:`Graph` (pure: no torch).

    ``solver="whole"`` (default) minimizes over the whole graph; ``"op_by_op"`` picks
    each op's cheapest strategy given its inputs' layouts as they come, in order (what
    a planner without look-ahead does): the baseline whole-program planning beats.
    ``choose``, ``memory_budget`` and ``state_bytes_per_param``: as in :func:`plan_program`.
    ``progress`` as in :func:`plan_program`.
    """
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
    import numpy as np

    check_progress(progress)
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
    free = resolve_choose(choose, len(arg_specs))
    budget = _check_budget(memory_budget)
    per_param = check_state_bytes_per_param(state_bytes_per_param)
    fixed: dict[int, Spec] = {
        k: s for i, (k, s) in enumerate(zip(graph.args, arg_specs, strict=True)) if i not in free
    }
    fixed.update(zip(graph.cotangents, cots, strict=True))

    calls = graph.calls
    free_nodes = tuple(graph.args[i] for i in free)  # free arguments: variables after the calls
    var = {node: i for i, node in enumerate((*calls, *free_nodes))}
    ruleset = _check_ruleset(ruleset)
    options: list[tuple[Option, ...]] = []
    fallbacks = []
    for done, node in enumerate(calls):
        report(progress, "strategies", done, len(calls))
        call = graph.nodes[node].call
        limit = max_options if mesh.ndim >= 3 else 1 << 30  # 1-D, 2-D: every candidate
        opts, fb = candidate_options(call, mesh, compute, False, limit, ruleset)
        if fb:
            fallbacks.append(call.target)
        options.append(opts)
    _report_missing(fallbacks, strict)
    options += [free_options(arg_specs[i]) for i in free]

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
    sinks += [
        (v, s)
        for i, (v, s) in enumerate(zip(graph.grads, grads, strict=True))
        if v is not None and i not in free
    ]
    for v, target in sinks:
        if v.node not in fixed:
            terms.append(("sink", var[v.node], v.index, sid(target)))
    terms += free_grad_terms(graph, free, fixed, var, sid)
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

    # lazy pricing: solve with exact prices where known and lower bounds elsewhere; price
    # exactly the pairs the solution uses; repeat until it uses only exact prices. Then
    # no other choice can be cheaper (its every term is at most its true price), so the
    # solution is the exact minimum whenever the solver's is.
    compute_cost = [np.array([o.compute for o in opts], dtype=float) for opts in options]
    report(progress, "strategies", len(calls), len(calls))
    count = pair_count(terms, ins, outs_)
    if count <= max_priced:
        # few enough distinct pairs: price them all up front, one round
        every = max(1, count // 20)
        for done, (a, b) in enumerate(all_pairs(terms, ins, outs_)):
            if done % every == 0:
                report(progress, "prices", done, count)
            if (a, b) not in exact:
                exact[(a, b)] = (
                    0.0 if a == b else redistribute_cost(table[a], table[b], model, planner)
                )
        report(progress, "prices", count, count)
    # the given specs of the free arguments, where they are candidates: a seed of the search
    given = {
        var[graph.args[i]]: k
        for i in free
        for k, o in enumerate(options[var[graph.args[i]]])
        if o.output_specs[0] == arg_specs[i]
    }
    seeds = (given,) if given and budget is not None else ()
    rounds = 0
    branched = False  # a budget's branch and bound runs once the prices it sees are exact
    while True:
        rounds += 1
        report(progress, "solve", rounds, 0)
        unary = [u.copy() for u in compute_cost]
        unary_lo = [u.copy() for u in compute_cost]
        pairs: dict[tuple[int, int], Any] = {}
        pairs_lo: dict[tuple[int, int], Any] = {}
        for t, lam in zip(terms, lams, strict=True):
            if t[0] == "fixed":
                _, c, i, src = t
                row = matrix([src], [row[i] for row in ins[c]], price)[0]
                unary[c] += row
                unary_lo[c] += row * lam
            elif t[0] == "sink":
                _, c, j, dst = t
                col = matrix([row[j] for row in outs_[c]], [dst], price)[:, 0]
                unary[c] += col
                unary_lo[c] += col * lam
            else:
                _, p, j, c, i = t
                m = matrix([row[j] for row in outs_[p]], [row[i] for row in ins[c]], price)
                pairs[(p, c)] = m if (p, c) not in pairs else pairs[(p, c)] + m
                m = m * lam[None, :]
                pairs_lo[(p, c)] = m if (p, c) not in pairs_lo else pairs_lo[(p, c)] + m
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
            free_budget = None if budget is None else budget - fixed_bytes
            shared_solve, shared_cost = shared_solver(
                (unary, pairs), (unary_lo, pairs_lo), (compute_cost, values, ins, outs_, price)
            )
            sol = solve_within(
                shared_solve,
                unary,
                pairs,
                weights,
                free_budget,
                max_branches=64 if branched else 0,
                cost=shared_cost,
                seeds=seeds,
                max_factor=max_factor,
                starts=starts,
            )
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
        if rounds >= max_rounds or (
            not new and (branched or budget is None or sol.method == "exact")
        ):
            break
        branched = branched or not new
    chosen = list(arg_specs)
    for i in free:
        chosen[i] = options[var[graph.args[i]]][sol.choice[var[graph.args[i]]]].output_specs[0]
        fixed[graph.args[i]] = chosen[i]
    grads = tuple(
        grad_spec(s) if g is not None else None for s, g in zip(chosen, graph.grads, strict=True)
    )
    report(progress, "moves", 0, len(calls))
    program = _assemble(
        graph, chosen, outs, cots, grads, fixed, options, var, sol, model, fallbacks, planner
    )
    return attrs.evolve(program, memory=program_memory(chosen, differentiated, per_param))


def _check_budget(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise StrategyError(
            f"memory_budget={value!r} must be a number of bytes per rank > 0 (or None: no limit)",
            value=value,
        )
    return float(value)


def _check_ruleset(ruleset: Any) -> RuleSet:
    if ruleset is None:
        return RuleSet.default()
    if not isinstance(ruleset, RuleSet):
        raise StrategyError(
            f"ruleset= takes a RuleSet (e.g. RuleSet.default().with_rule(op, rule, "
            f"outputs=...)), got {ruleset!r:.80}",
            value=ruleset,
        )
    return ruleset


def _report_missing(fallbacks: Sequence[str], strict: bool) -> None:
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
        f"no sharding rule for {len(counts)} ops, {len(fallbacks)} calls run replicated "
        f"(correct, maybe slow): {listing}; {add}, or pass strict=True to refuse",
        ProgramWarning,
        stacklevel=4,
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
    out = []
    for v, rs in readers.items():
        if v.node in fixed:
            out.append(SharedValue(-1, 0, sid(fixed[v.node]), tuple(rs)))
        else:
            out.append(SharedValue(var[v.node], v.index, -1, tuple(rs)))
    return out


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

    moved: set[tuple[Value, Spec]] = set()  # a value moved to a layout once serves all

    def move(v: Value, dst: Spec):
        nonlocal comm, nbytes, collectives
        src = specs[v]
        if src == dst:
            return None
        p = _plan(src, dst, model, planner)
        if (v, dst) in moved:
            return p
        moved.add((v, dst))
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
        moves = tuple(move(v, o.input_specs[i]) for i, v in enumerate(n.inputs))
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

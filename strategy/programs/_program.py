"""Whole programs: :func:`plan_program` and the :class:`Program` value.

A program is a function of global tensors traced into aten calls, forward and backward
together (:mod:`._trace`). Each call's candidate N-D strategies come from its
single-mesh-dim rules (:mod:`._aten`) combined over the mesh; each candidate costs its
local compute (:class:`ComputeModel`) plus the redistributions into it, priced by the
planner's cost model — from the arguments' specs, from the producers' chosen output
specs, and out of it to the program's output specs and to each argument's gradient
spec. The cheapest assignment over the whole graph is found by :func:`.solver.solve`
(exact dynamic programming where the graph allows; else message passing on the
pairwise relaxations, :func:`.solver.lp_bound`, with the readers' shares of a shared move tuned
by the sharing dual and local search, the gap to a true bound reported).

Pricing every pair of candidate layouts with the planner is most of the work (on a 3-D
mesh a transformer has tens of thousands of distinct pairs), so big programs are priced
lazily: the solver first sees the strategy search's cheap lower bounds
(:func:`~meshplan.strategy.selection._price.input_bound`) where no exact price is known; the pairs
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

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.placement import Spec
from meshplan.redistribute._steps import grad_spec

from ..rules._ruleset import RuleSet
from ..selection._price import check_model, check_planner
from ..solver import Method, Solution, proven
from ._auto import free_options, resolve_choose
from ._candidates import ComputeModel, Option, is_float
from ._candidates import options as candidate_options
from ._graph import Graph
from ._memory import check_state_bytes_per_param, step_memory
from ._peak_rows import PeakRows
from ._program_assemble import assemble, choice_following, chosen_specs
from ._program_checks import (
    check_budget,
    check_graph_arguments,
    check_ruleset,
    check_specs,
    check_traced,
    report_missing,
    result_specs,
)
from ._program_fit import check_peak_feasible, cut_moves, fit_peak, with_cut_pairs
from ._program_given import given_cannot_win, given_state, never_worse_than_given
from ._program_prices import Prices
from ._program_solve import (
    Planning,
    objective,
    solve_lazily,
    tied_bound,
    variables,
    with_layer,
)
from ._program_value import Program, ProgramCost, ProgramOp, ProgramWarning
from ._progress import Progress, check_progress, report
from ._recompute import check_recompute, layer_groups
from ._recompute_search import plan_recompute
from ._repeats import MIN_LAYERS, exact_untied, find_repeats

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
    tie_layers: bool = True,
    state_budget: float | None = None,
    recompute: str | None = None,
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

    Repeated layers: with ``tie_layers`` (default), the calls of four or more identical
    layers (equal calls reading from equal places, parameters of equal specs:
    :mod:`._repeats`) share one choice, so a model of many layers plans in about the
    time of a few. That restricts the choice; ``program.lower_bound`` still bounds the
    untied minimum (each layer bounded alone, its links to its neighbours priced:
    :mod:`._program_parts`), more loosely than an untied plan does
    (``tie_layers=False``: every call chosen on its own, in time growing with depth); where
    the tied gap exceeds 2% at up to 8 layers, the untied problem is solved too and the
    tighter bound (and the cheaper plan) kept, so tying never reports a looser bound there.
    Under a ``memory_budget`` tied layers also take one layout per parameter of a
    layer, so a budget that only a mix fits (some layers sharded, some whole) is met
    by the lighter layout everywhere: ``tie_layers=False`` finds the mix.

    Auto-sharding: ``choose`` lists argument indices whose layouts the planner picks
    (their specs give mesh, shape and dtype; their placements only seed the search), and
    ``memory_budget`` bounds the peak bytes per rank of the whole step: parameters +
    gradients + optimizer state (``state_bytes_per_param`` bytes per element; None: two
    moments in the parameter's dtype, as AdamW keeps) + the inputs, the activations the
    backward reads, the moved copies it reads again and the transient values of the op at
    the peak, as :func:`~meshplan.runtime.run_program` runs the step
    (:func:`._memory.step_memory`). ``state_budget`` bounds the training state alone
    (give one of the two). ``program.arg_specs`` holds the chosen specs,
    ``program.memory`` the bytes per rank with their parts (see :mod:`._auto`).

    Recompute (activation checkpointing): ``recompute`` says whether the backward may run
    repeated layers' forward calls again instead of keeping their saved activations
    (:mod:`._recompute`; a layer's input, its parameters and its output are kept, the rest
    lives only while that layer's backward runs). ``"auto"`` (the default, also None)
    recomputes only under a ``memory_budget``: the cheapest fitting plan of recomputing
    every layer, none, or the fewest layers that fit; ``"never"`` never; ``"always"``
    every layer. The recompute's compute and the moves it repeats are priced in the step
    (``program.cost.recompute``); ``program.recomputed`` lists the calls recomputed,
    ``program.memory.recomputed`` counts them; ``program.lower_bound`` bounds every choice
    of recompute.

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

    arg_specs = check_specs("plan_program", "argument", arg_specs)
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
        tie_layers=tie_layers,
        state_budget=state_budget,
        recompute=recompute,
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
    tie_layers: bool = True,
    state_budget: float | None = None,
    recompute: str | None = None,
) -> Program:
    """Plan an already traced :class:`Graph` (pure: no torch).

    ``solver="whole"`` (default) minimizes over the whole graph; ``"op_by_op"`` picks
    each op's cheapest strategy given its inputs' layouts as they come, in order (what
    a planner without look-ahead does): the baseline whole-program planning beats.
    ``choose``, ``memory_budget`` and ``state_bytes_per_param``: as in :func:`plan_program`;
    a choice the solver does not prove optimal is compared with the given layouts (planned
    as fixed ones) and the cheaper is returned: never worse than the specs given.
    ``progress``, ``tie_layers`` and ``recompute`` as in :func:`plan_program`.
    """
    return _plan_graph(
        graph,
        arg_specs,
        out_specs=out_specs,
        cost_model=cost_model,
        compute=compute,
        strict=strict,
        max_factor=max_factor,
        max_options=max_options,
        max_rounds=max_rounds,
        max_priced=max_priced,
        solver=solver,
        ruleset=ruleset,
        choose=choose,
        memory_budget=memory_budget,
        state_bytes_per_param=state_bytes_per_param,
        progress=progress,
        planner=planner,
        tie_layers=tie_layers,
        state_budget=state_budget,
        recompute=recompute,
    )


def _plan_graph(
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
    tie_layers: bool = True,
    state_budget: float | None = None,
    recompute: str | None = None,
    name_least: bool = True,
    follow: Mapping[int, tuple] | None = None,
    bound_only: bool = False,
    known_bound: float | None = None,
    answer: Program | None = None,
) -> Program:
    """:func:`plan_graph`; ``name_least=False``: a budget no plan meets raises without
    planning the lightest plan to name its peak (for a caller that drops the error).
    ``bound_only``: the caller reads only the plan's lower bound, so an unproven plan is
    not compared with the given layouts' plan (which bounds nothing lower).
    ``known_bound``: a true lower bound of this program's minimum the caller already has
    (the recompute search's bound over every recompute choice): a tied program takes it
    instead of bounding its parts again.
    ``follow``: no solve, the program of the strategies given per call node (its input
    and output specs; :func:`._program_assemble.choice_following`), None when a call has
    no such candidate.
    ``answer``: a plan of this graph the caller holds that fits ``memory_budget`` (the
    plan over every recompute choice, where it fits with its activations): taken as the
    solve's answer with ``known_bound``, only compared with the given layouts' plan."""
    limits = {
        "max_factor": max_factor,
        "max_options": max_options,
        "max_rounds": max_rounds,
        "max_priced": max_priced,
    }
    arg_specs = check_graph_arguments(graph, arg_specs, solver, limits)
    planning = Planning(solver)
    check_progress(progress)
    model = check_model(cost_model)
    planner = check_planner(planner)
    compute = ComputeModel() if compute is None else compute
    if not isinstance(compute, ComputeModel):
        raise StrategyError(f"compute must be a ComputeModel, got {compute!r}", value=compute)
    mesh = arg_specs[0].mesh
    check_traced(graph, arg_specs)
    outs = result_specs(graph, mesh, out_specs)
    # an argument the function writes into gets its new value in its own (chosen) spec
    outs += tuple(arg_specs[k] for k in graph.writes)
    cots = tuple(grad_spec(s) for s in outs[: graph.n_results])
    grads = _grad_specs(graph, arg_specs)
    free = resolve_choose(choose, len(arg_specs))
    peak_budget = check_budget(memory_budget)
    budget = peak_budget if peak_budget is not None else check_budget(state_budget, "state")
    if peak_budget is not None and state_budget is not None:
        raise StrategyError(
            f"give memory_budget= (the step's peak, {memory_budget!r}) or state_budget= (the "
            f"training state alone, {state_budget!r}), not both",
            value=state_budget,
        )
    per_param = check_state_bytes_per_param(state_bytes_per_param)
    fixed: dict[int, Spec] = {
        k: s for i, (k, s) in enumerate(zip(graph.args, arg_specs, strict=True)) if i not in free
    }
    fixed.update(zip(graph.cotangents, cots, strict=True))
    ruleset = check_ruleset(ruleset)
    mode = check_recompute(recompute)
    if mode == "always" and planning is not Planning.WHOLE:
        raise StrategyError(
            f"recompute='always' is planned with the whole program, not solver={solver!r}; "
            "drop one of the two",
            value=solver,
        )
    if (
        mode != "never"
        and not graph.recomputes
        and planning is Planning.WHOLE
        and (mode == "always" or peak_budget is not None)
    ):
        found = find_repeats(graph, fixed, [graph.args[i] for i in free])
        groups = () if found is None else layer_groups(graph, found.blocks)
        if not groups and mode == "always":
            raise StrategyError(
                "recompute='always' recomputes repeated layers, and this program has none "
                f"(a layer is a block of forward calls repeated at least {MIN_LAYERS} times "
                "alike); plan with recompute='never' (or 'auto')",
                value=mode,
            )
        if groups:
            again = dict(out_specs=out_specs, cost_model=model, compute=compute, strict=strict)
            again.update(limits, solver=solver, ruleset=ruleset, choose=choose)
            again.update(memory_budget=memory_budget, state_bytes_per_param=state_bytes_per_param)
            again.update(progress=progress, planner=planner, tie_layers=tie_layers)
            again.update(recompute="never")
            return plan_recompute(_plan_graph, graph, arg_specs, groups, mode, again)
    options, fallbacks = _options(graph, mesh, compute, max_options, ruleset, strict, progress)
    options += [free_options(arg_specs[i]) for i in free]
    # repeated layers: one variable per call of a layer (see _repeats)
    if not isinstance(tie_layers, bool):
        raise StrategyError(
            f"tie_layers must be True or False, got {tie_layers!r}", value=tie_layers
        )
    repeats = None
    if tie_layers and planning is Planning.WHOLE:
        repeats = find_repeats(graph, fixed, [graph.args[i] for i in free])
        nodes_ = (*graph.calls, *(graph.args[i] for i in free))
        sizes = dict(zip(nodes_, map(len, options), strict=True))
        if repeats is not None and (not repeats.blocks or exact_untied(graph, sizes, max_factor)):
            repeats = None  # no layers to bound alone, or the untied plan is proven anyway
    var, nodes = variables(graph, free, _ties(graph, repeats))
    at = {n: k for k, n in enumerate((*graph.calls, *(graph.args[i] for i in free)))}
    every_option, options = options, [options[at[n]] for n in nodes]

    prices = Prices(model, planner)
    if follow is not None:
        sol = choice_following(follow, options, nodes)
        if sol is None:
            return None
        chosen, fixed = chosen_specs(graph, arg_specs, free, options, var, sol, fixed)
        results = outs[: graph.n_results] + tuple(chosen[k] for k in graph.writes)
        grads = _grad_specs(graph, chosen)
        program = assemble(
            graph, chosen, results, cots, grads, fixed, options, var, sol, model, fallbacks,
            planner,
        )  # fmt: skip
        return attrs.evolve(program, memory=step_memory(program, per_param))
    memory = (arg_specs, per_param, budget, peak_budget is not None)
    obj = objective(graph, options, free, fixed, (outs, grads), prices, memory, var)
    calls = graph.calls
    report(progress, "strategies", len(calls), len(calls))
    prices.price_all(obj.problem, max_priced, progress)
    # the given specs of the free arguments, where they are candidates: a seed of the search
    given = {
        obj.var[graph.args[i]]: k
        for i in free
        for k, o in enumerate(options[obj.var[graph.args[i]]])
        if o.output_specs[0] == arg_specs[i]
    }
    seeds = (given,) if given and budget is not None else ()
    solve_args = dict(planning=planning, max_factor=max_factor, max_rounds=max_rounds, seeds=seeds)

    bound_by = None  # the untied solve's method, where its bound is the tighter one

    def program_of(sol: Solution, fixed=fixed) -> Program:
        chosen, fixed = chosen_specs(graph, arg_specs, free, options, obj.var, sol, fixed)
        # a written argument's new value goes back in the layout chosen for the argument
        results = outs[: graph.n_results] + tuple(chosen[k] for k in graph.writes)
        grads = _grad_specs(graph, chosen)
        program = assemble(
            graph, chosen, results, cots, grads, fixed, options, obj.var, sol, model, fallbacks,
            planner,
        )  # fmt: skip
        if repeats is not None and sol.method is Method.TIED:
            how = "parts" if known_bound is None else "the plan over every recompute choice"
            how = how if bound_by is None else f"the untied problem's {bound_by}"
            method = f"{repeats.layers} layers planned as one, bound by {how}"
            program = attrs.evolve(program, method=method)
        cut = {(prices.table[a], prices.table[b]) for a, b in prices.cut}
        if prices.owner().cut_plans:  # (no plan of this planner was ever cut: none here)
            cut |= cut_moves(program, model, planner)
        if cut:
            program = with_cut_pairs(program, sol.bound, program.method, len(cut))
        return attrs.evolve(program, memory=step_memory(program, per_param))

    def untie() -> tuple:
        """The objective with a variable per call (and its options per variable)."""
        var_u, nodes_u = variables(graph, free, _ties(graph, None))
        untied = [every_option[at[n]] for n in nodes_u]
        return objective(graph, untied, free, fixed, (outs, grads), prices, memory, var_u), untied

    if answer is not None:  # the caller's plan, which fits: nothing to solve
        program = attrs.evolve(answer, lower_bound=min(known_bound, answer.cost.total))
    else:
        if peak_budget is not None:
            check_peak_feasible(obj, peak_budget, program_of if name_least else None)
        # a tied program's bound is its parts' (or the caller's): no settled round (a final
        # solve that tightens the tied problem's own bound, 40 s of the 70B case's, improving
        # its choice by ~0.1%) where the caller holds the bound or reads only the bound
        settle = repeats is None or not (bound_only or known_bound is not None)
        sol = solve_lazily(
            graph, obj, prices, budget=budget, progress=progress, settle=settle, **solve_args
        )
        if repeats is not None:  # the tied problem's bound bounds only its own restriction
            if known_bound is None:
                env = (fixed, prices.sid, obj.sinks, obj.free_grads)
                priced = None if budget is None else (sol.multiplier, budget - obj.fixed_bytes)
                args = (graph, obj, repeats, options, env, prices, max_factor, sol.choice, priced)
                bound, layer = tied_bound(*args)
                # every layer in the layer's plan the bound proves, where that costs less
                sol = with_layer(obj, prices, sol, layer, budget)
            else:
                bound = known_bound
            sol = attrs.evolve(sol, bound=min(bound, sol.cost), method=Method.TIED)
            if repeats.layers <= UNTIE_LAYERS and not proven(
                sol.cost, sol.bound, untie_gap(repeats.layers)
            ):
                # the parts' bound is loose: the untied problem's own solve bounds the same
                # minimum (the larger of the two holds), and its plan may cost less
                obj_u, untied = untie()
                prices.price_all(obj_u.problem, max_priced, progress)
                args_u = dict(solve_args, seeds=())
                sol_u = solve_lazily(
                    graph, obj_u, prices, budget=budget, progress=progress, **args_u
                )
                if sol_u.bound > sol.bound:
                    bound_by = str(sol_u.method)
                bound = max(sol.bound, sol_u.bound)
                if sol_u.cost < sol.cost:  # the untied plan, with the better of the bounds
                    obj, options, repeats, sol = obj_u, untied, None, sol_u
                bound = min(bound, sol.cost)
                method = Method.EXACT if proven(sol.cost, bound) else sol.method
                sol = attrs.evolve(sol, bound=bound, method=method)
        report(progress, "moves", 0, len(calls))
        program = program_of(sol)
        if peak_budget is not None:
            # the rows' bounds bound this program's minimum: not a tied restriction's, nor
            # (a caller's bound given) the minimum over every choice of recompute
            own = repeats is None and known_bound is None
            fit = (prices, peak_budget, program_of, solve_args, PeakRows(graph, options, obj.var))
            fit += (own, sol.choice)
            program = fit_peak(program, obj, *fit)
    if not free or planning is not Planning.WHOLE or program.exact or bound_only:
        return program
    if (
        budget is not None
        and given_state(graph, arg_specs, free, per_param) + obj.fixed_bytes > budget
    ):
        return program  # the given layouts' state alone exceeds the budget: no plan of them fits
    # the given layouts' plan may untie the layers: bounded untied (where that is cheap:
    # the untied draft of 32 layers of Llama-3 8B took 56 s, more than the given plan)
    if repeats is None or repeats.layers <= UNTIE_LAYERS:
        whole = (obj, options) if repeats is None else untie()
        if given_cannot_win(program, graph, arg_specs, free, whole, prices, max_factor):
            return program
    again = dict(out_specs=out_specs, cost_model=model, compute=compute, ruleset=ruleset)
    again.update(limits, memory_budget=memory_budget, planner=planner, tie_layers=tie_layers)
    again.update(state_budget=state_budget, recompute="never")
    return never_worse_than_given(
        _plan_graph, program, graph, arg_specs, state_bytes_per_param, again
    )


def _ties(graph: Graph, repeats) -> dict[int, int] | None:
    """Each tied node's representative: the repeated layers' (``repeats``), and each
    recomputed call's copy tied to its original (it runs the same strategy)."""
    tie = {} if repeats is None else dict(repeats.tie)
    if not graph.recomputes:
        return tie or None
    for c, o in graph.recomputes:
        tie[c] = o
    out = {}
    for n in tie:
        r = n
        while r in tie:
            r = tie[r]
        if r != n:
            out[n] = r
    return out


#: a tied plan's gap past which the untied problem is solved too, at depths up to
#: ``UNTIE_LAYERS`` (its bound is often tighter than the parts' one, and its plan may cost
#: less): 1% up to ``UNTIE_SHALLOW`` layers, the gap ``benchmarks/program_speed.py`` holds
#: every case to (4-layer GPT-2 and nanoGPT on (2, 4) were proven within 1.3% and 1.4% by the
#: parts alone; the untied solve about doubles their time), and 2% deeper, where the untied
#: solve costs far more than the tied one (an 8-layer Llama on (2, 4): minutes of CPU)
UNTIE_GAP = 0.01
UNTIE_GAP_DEEP = 0.02
UNTIE_SHALLOW = 4
UNTIE_LAYERS = 8


def untie_gap(layers: int) -> float:
    """The tied plan's gap past which a program of ``layers`` repeated layers (at most
    :data:`UNTIE_LAYERS`) solves the untied problem too.

    >>> untie_gap(4), untie_gap(8)
    (0.01, 0.02)
    """
    return UNTIE_GAP if layers <= UNTIE_SHALLOW else UNTIE_GAP_DEEP


def _grad_specs(graph: Graph, arg_specs: Sequence[Spec]) -> tuple[Spec | None, ...]:
    """Each differentiated argument's gradient spec (None for the others)."""
    return tuple(
        grad_spec(s) if g is not None else None for s, g in zip(arg_specs, graph.grads, strict=True)
    )


def _options(graph, mesh, compute, max_options, ruleset, strict, progress):
    """(each call's candidate options, the ops that had no rule and run replicated)."""
    calls = graph.calls
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
    report_missing(fallbacks, strict)
    return options, fallbacks


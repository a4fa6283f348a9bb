"""Auto-sharding: plan_program(choose=..., memory_budget=...) picks argument layouts.

The oracle is brute force: every combination of the free arguments' candidate layouts
planned with fixed specs, its modeled cost and its training-state memory; the planner's
choice must fit the budget, cost no more than the cheapest combination that fits, and
its lower bound must not exceed it.
"""

from __future__ import annotations

import functools
import itertools
import re
import warnings

import attrs
import pytest
import torch
from _program_cases import build, programs
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.redistribute import CostModel, HardwareProfile
from meshplan.strategy import plan_graph, plan_program
from meshplan.strategy.programs._auto import layout_candidates, resolve_choose
from meshplan.strategy.programs._memory import state_bytes
from meshplan.strategy.solver import (
    InfeasibleBudget,
    MemoryRow,
    Method,
    Options,
    Problem,
    Solution,
    Warm,
    solve_pairwise,
    total,
)
from meshplan.strategy.solver import solve_within as _solve_within


def solve(problem, options=None):
    """The exact pairwise solver as a relaxation of ``solve_within``."""
    return solve_pairwise(problem.unary, problem.pairs)


def solve_within(
    relax,
    unary,
    pairs,
    weights,
    budget,
    *,
    max_branches=64,
    gap=0.0,
    seeds=(),
    final=None,
    state=None,
    lines=None,
    draft=None,
    max_seconds=None,
):
    """``solve_within`` on the problem of ``unary``, ``pairs`` and memory ``weights``."""
    rows = [MemoryRow(v, w) for v, w in enumerate(weights)]
    problem = Problem(unary, pairs, memory=rows, budget=budget)
    warm = Warm(search=state, lines=lines if lines is not None else {})
    draft = final is not None if draft is None else draft  # the search's solves: drafts
    options = Options(max_branches=max_branches, gap=gap, draft=draft, max_seconds=max_seconds)
    return _solve_within(problem, relax, options, seeds=seeds, final=final, warm=warm)


R = Replicate()


def mlp(x, w1, w2):
    return (torch.relu(x @ w1) @ w2).square().mean()


def _mlp_specs(mesh: Mesh, dp_dims: int = 1):
    data = [Shard(0)] + [R] * (mesh.ndim - 1)
    x = Spec(mesh, data, (64, 16), "float32")
    rep = [R] * mesh.ndim
    return [x, Spec(mesh, rep, (16, 64), "float32"), Spec(mesh, rep, (64, 16), "float32")]


GRAD = [False, True, True]


def _brute_force(graph, specs, free, cost_model=None, exact=True):
    """(cost, memory, specs) of every combination of the free arguments' candidates.

    ``exact=False`` admits plans the solver did not prove (a shared elimination too wide
    for ``max_factor``): their costs are then upper bounds of each combination's minimum."""
    out = []
    for combo in itertools.product(*(layout_candidates(specs[i]) for i in free)):
        given_ = list(specs)
        for i, s in zip(free, combo, strict=True):
            given_[i] = s
        p = plan_graph(graph, given_, cost_model=cost_model)
        assert p.method == "exact" or not exact, p.method
        out.append((p.cost.total, p.memory.total, tuple(given_)))
    return out


@functools.cache
def _traced(program: tuple, shape: tuple[int, ...]):
    mesh = Mesh.create(shape)
    specs = [Spec(mesh, [Shard(0)] + [R] * (mesh.ndim - 1), (4, 4), "float64")]
    specs += [Spec(mesh, [R] * mesh.ndim, (4, 4), "float64")] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = plan_program(build(program, 2), *specs, requires_grad=[False, True, True])
    return prog.graph, specs


def _check_against_brute_force(program, shape, fraction, exact=True):
    graph, specs = _traced(program, shape)
    free = [i for i in (1, 2) if graph.grads[i] is not None]
    if not free:
        return
    every = _brute_force(graph, specs, free, exact=exact)
    lightest, heaviest = min(m for _, m, _ in every), max(m for _, m, _ in every)
    budget = lightest + fraction * (heaviest - lightest)
    # within the budget as the planner counts it: 1e-12 relative of rounding allowed
    best = min(c for c, m, _ in every if m <= budget * (1 + 1e-12))
    prog = plan_graph(graph, specs, choose=free, state_budget=budget)
    tol = 1e-9 * best
    assert prog.memory.total <= budget * (1 + 1e-12)  # the budget's own tolerance
    assert prog.lower_bound <= best + tol, (prog.lower_bound, best)
    if not exact:  # ``best`` may lie above the true minimum: only the bound is checked
        return
    assert prog.cost.total >= best - tol  # never below the minimum: the prices are true
    if prog.method == "exact":
        assert abs(prog.cost.total - best) <= tol, (prog.cost.total, best, prog.arg_specs)
    # the chosen specs, given as fixed ones, cost what the choice said
    again = plan_graph(graph, list(prog.arg_specs))
    assert abs(again.cost.total - prog.cost.total) <= tol


@given(programs(max_ops=3), st.floats(0, 1))
def test_the_choice_under_a_budget_is_the_brute_force_minimum_on_a_line(program, fraction):
    _check_against_brute_force(program, (2,), fraction)


@pytest.mark.slow
@given(programs(max_ops=3), st.floats(0, 1))
@settings(max_examples=10)
def test_the_choice_under_a_budget_is_the_brute_force_minimum_on_a_square(program, fraction):
    # on (2, 2) a value read by several ops makes shared eliminations wider than the
    # default max_factor: the combinations are then priced by bounded plans
    _check_against_brute_force(program, (2, 2), fraction, exact=False)


def _random_problem(rnd):
    """Unary costs, chain pairs, integer weights and a budget between the extremes."""
    n = rnd.randint(1, 4)
    unary = [[rnd.randint(0, 10) for _ in range(rnd.randint(1, 3))] for _ in range(n)]
    weights = [[rnd.randint(0, 8) for _ in u] for u in unary]
    pairs = {
        (a, a + 1): [[rnd.randint(0, 5) for _ in unary[a + 1]] for _ in unary[a]]
        for a in range(n - 1)
        if rnd.random() < 0.5
    }
    budget = rnd.randint(sum(min(w) for w in weights), sum(max(w) for w in weights))
    return unary, pairs, weights, budget


def _check_solve_within(unary, pairs, weights, budget):
    n = len(unary)

    def cost(ch):
        s = sum(unary[v][ch[v]] for v in range(n))
        return s + sum(m[ch[a]][ch[b]] for (a, b), m in pairs.items())

    fits = [
        ch
        for ch in itertools.product(*(range(len(u)) for u in unary))
        if sum(weights[v][ch[v]] for v in range(n)) <= budget
    ]
    best = min(cost(ch) for ch in fits)
    sol = solve_within(solve, unary, pairs, weights, budget, max_branches=10_000)
    assert sum(weights[v][sol.choice[v]] for v in range(n)) <= budget
    assert sol.lower_bound <= best + 1e-9
    assert sol.method == "exact" and abs(sol.cost - best) <= 1e-9 * max(best, 1), (sol, best)


@given(st.randoms(use_true_random=False))
@settings(max_examples=100)  # pure and fast; duality gaps need draws to show up
def test_solve_within_is_the_constrained_minimum_of_a_pairwise_problem(rnd):
    _check_solve_within(*_random_problem(rnd))


def test_solve_within_closes_a_duality_gap():
    # the budget falls between the relaxation's breakpoints: the dual alone stops at 13
    _check_solve_within([[6, 1], [9, 5, 9], [2]], {}, [[1, 8], [3, 7, 3], [5]], 18)


def test_a_budget_below_pure_data_parallel_state_shards_the_parameters():
    mesh = Mesh.create((4,), ("dp",))
    specs = _mlp_specs(mesh)
    free = plan_program(mlp, *specs, choose=[1, 2], requires_grad=GRAD)
    # no budget: pure data parallelism (the gradient all_reduce is the cheapest)
    assert [s.placements for s in free.arg_specs[1:]] == [(R,), (R,)]
    dp_state = free.memory.total
    assert dp_state == sum(state_bytes(s, True, None) for s in specs[1:])
    tight = plan_graph(free.graph, specs, choose=[1, 2], state_budget=dp_state * 0.3)
    assert tight.memory.total <= dp_state * 0.3
    assert all(s.placements != (R,) for s in tight.arg_specs[1:])  # FSDP-like: sharded on dp
    assert tight.cost.total > free.cost.total
    assert tight.method == "exact"


def test_an_unlimited_budget_on_a_slow_inter_node_link_replicates_there():
    # two nodes of two ranks: dp crosses the slow link, tp stays within a node
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    slow = CostModel(HardwareProfile(ranks_per_node=2))
    specs = _mlp_specs(mesh)
    hand = [
        specs[0],
        Spec(mesh, [Shard(0), Shard(1)], (16, 64)),
        Spec(mesh, [Shard(1), Shard(0)], (64, 16)),
    ]
    fsdp_tp = plan_program(mlp, *hand, requires_grad=GRAD, cost_model=slow)
    free = plan_graph(fsdp_tp.graph, specs, choose=[1, 2], cost_model=slow)
    assert all(s.placements[0] == R for s in free.arg_specs[1:])  # nothing sharded on dp
    assert free.cost.total < fsdp_tp.cost.total
    # the FSDP x TP budget: a layout that fits it and costs less than the hand-written one
    fit = plan_graph(
        fsdp_tp.graph, specs, choose=[1, 2], cost_model=slow, state_budget=fsdp_tp.memory.total
    )
    assert fit.memory.total <= fsdp_tp.memory.total
    assert fit.cost.total <= fsdp_tp.cost.total
    assert fit.lower_bound <= fit.cost.total


def test_an_infeasible_budget_names_the_smallest_feasible_one():
    mesh = Mesh.create((4,), ("dp",))
    specs = _mlp_specs(mesh)
    prog = plan_program(mlp, *specs, choose=[1, 2], requires_grad=GRAD)
    with pytest.raises(StrategyError, match="smallest feasible budget") as info:
        plan_graph(prog.graph, specs, choose=[1, 2], state_budget=1000)
    least = float(re.search(r"is (\d+) bytes", str(info.value)).group(1))
    fits = plan_graph(prog.graph, specs, choose=[1, 2], state_budget=least)
    assert fits.memory.total == least
    with pytest.raises(StrategyError, match="smallest feasible budget"):
        plan_graph(prog.graph, specs, choose=[1, 2], state_budget=least - 1)


def test_fixed_arguments_count_against_the_budget():
    mesh = Mesh.create((4,), ("dp",))
    specs = _mlp_specs(mesh)
    prog = plan_program(mlp, *specs, requires_grad=GRAD)
    assert prog.memory.total == sum(state_bytes(s, True, None) for s in specs[1:])
    assert prog.memory.per_arg[0] == 0.0  # the batch has no gradient: not training state
    with pytest.raises(StrategyError, match="fixed arguments"):
        plan_graph(prog.graph, specs, state_budget=prog.memory.total - 1)
    sgd = plan_graph(prog.graph, specs, state_bytes_per_param=0)
    assert sgd.memory.optimizer == 0 and sgd.memory.total == prog.memory.total / 2


@given(st.sampled_from([(2,), (2, 2), (3,), (2, 1, 2)]), st.integers(1, 3))
def test_candidates_are_distinct_layouts_replicated_first(shape, ndim):
    mesh = Mesh.create(shape)
    spec = Spec(mesh, [R] * mesh.ndim, (6,) * ndim, "float32")
    cands = layout_candidates(spec)
    assert cands[0].placements == (R,) * mesh.ndim
    assert len(set(cands)) == len(cands)
    plain = (ndim + 1) ** sum(1 for k in shape if k > 1)
    assert len(cands) >= plain
    assert all(not s.is_partial and s.shape == spec.shape for s in cands)


@pytest.mark.parametrize(
    "choose, error",
    [(5, "out of range"), ([True], "not an argument index"), (["w*"], "not an argument index")],
)
def test_choose_names_arguments_or_raises(choose, error):
    with pytest.raises(StrategyError, match=error):
        resolve_choose(choose, 3)


def test_choose_takes_name_patterns():
    assert resolve_choose(["h*.w1", "head"], 4, names=["tok", "h0.w1", "h1.w1", "head"]) == (
        1,
        2,
        3,
    )
    with pytest.raises(StrategyError, match="matches no argument"):
        resolve_choose(["nope*"], 2, names=["a", "b"])


def test_a_bad_budget_is_refused():
    mesh = Mesh.create((2,), ("dp",))
    specs = _mlp_specs(mesh)
    for bad in (0, -1, "1kB", True):
        with pytest.raises(StrategyError, match="memory_budget"):
            plan_program(mlp, *specs, choose=[1], memory_budget=bad, requires_grad=GRAD)
    with pytest.raises(StrategyError, match="state_bytes_per_param"):
        plan_program(mlp, *specs, state_bytes_per_param=-2, requires_grad=GRAD)


def test_free_arguments_plan_op_by_op_and_with_a_bounded_search():
    # the op-by-op baseline and the bounded search's start both walk the calls only; the
    # free arguments after them keep their first (replicated) option there
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    specs = _mlp_specs(mesh)
    exact = plan_program(mlp, *specs, choose=[1, 2], requires_grad=GRAD)
    greedy = plan_graph(exact.graph, specs, choose=[1, 2], solver="op_by_op")
    assert greedy.cost.total >= exact.cost.total
    bounded = plan_graph(exact.graph, specs, choose=[1, 2], max_factor=2)
    assert bounded.lower_bound <= exact.cost.total * (1 + 1e-9) <= bounded.cost.total * (1 + 1e-9)


def test_given_specs_that_fit_seed_the_search_so_the_choice_never_costs_more():
    # a knapsack whose relaxation stops at a choice dearer than the seed; no branches
    unary, weights = [[6, 1], [9, 5, 9], [2]], [[1, 8], [3, 7, 3], [5]]
    unseeded = solve_within(solve, unary, {}, weights, 18, max_branches=0)
    seeded = solve_within(solve, unary, {}, weights, 18, max_branches=0, seeds=({0: 1, 1: 0},))
    assert unseeded.cost == 13 and seeded.cost == 12


@settings(max_examples=25, deadline=None)
@given(programs(max_ops=3), st.data())
def test_an_unproven_choice_never_costs_more_than_the_given_layouts(program, data):
    # max_factor=2 leaves the solver no exact elimination: the search is bounded
    graph, specs = _traced(program, (2, 2))
    free = [i for i in (1, 2) if graph.grads[i] is not None]
    if not free:
        return
    given_ = list(specs)
    for i in free:
        given_[i] = data.draw(st.sampled_from(layout_candidates(specs[i])), label=f"given {i}")
    hand = plan_graph(graph, given_, max_factor=2)
    chosen = plan_graph(graph, given_, choose=free, max_factor=2)
    assert chosen.cost.total <= hand.cost.total * (1 + 1e-12), (chosen.method, hand.method)
    assert chosen.lower_bound <= chosen.cost.total
    again = plan_graph(graph, list(chosen.arg_specs), max_factor=2)
    assert again.cost.total <= chosen.cost.total * (1 + 1e-12)


def test_given_layouts_whose_state_exceeds_the_budget_are_not_planned(monkeypatch):
    # an unproven choice (each solve's bound halved: still true) is compared with the
    # given layouts' plan, unless their state alone is over the budget: no plan of them
    # fits, so none is planned
    import meshplan.strategy.programs._program as program_module

    mesh = Mesh.create((4,), ("dp",))
    specs = _mlp_specs(mesh)
    prog = plan_program(mlp, *specs, requires_grad=GRAD)
    real_solve = program_module.solve_lazily

    def unproven(*a, **kw):
        sol = real_solve(*a, **kw)
        return attrs.evolve(sol, bound=sol.bound / 2, method=Method.LAGRANGIAN)

    compared = []
    real_given = program_module.never_worse_than_given
    real_draft = program_module.given_cannot_win
    monkeypatch.setattr(program_module, "solve_lazily", unproven)
    monkeypatch.setattr(
        program_module, "never_worse_than_given", lambda *a: compared.append(a) or real_given(*a)
    )
    monkeypatch.setattr(
        program_module, "given_cannot_win", lambda *a: compared.append(a) or real_draft(*a)
    )
    budget = prog.memory.total * 0.6  # the given layouts replicate both weights
    chosen = plan_graph(prog.graph, specs, choose=[1, 2], state_budget=budget)
    assert not chosen.exact and compared == []
    assert chosen.memory.total <= budget
    assert chosen.lower_bound <= chosen.cost.total
    # a budget the given layouts fit: they are compared (drafted or planned)
    roomy = plan_graph(prog.graph, specs, choose=[1, 2], state_budget=2 * prog.memory.total)
    assert not roomy.exact and compared
    assert roomy.cost.total <= prog.cost.total * (1 + 1e-12)


def test_a_budget_every_choice_fits_constrains_nothing():
    """A budget above the heaviest choice plans as no budget does (one unconstrained
    solve, not a branch and bound, even where the solve is not exact); one below the
    lightest is still refused."""
    from meshplan.strategy.solver import budget_binds

    assert not budget_binds([[1.0, 3.0], [2.0]], 5.0)
    assert budget_binds([[1.0, 3.0], [2.0]], 4.0)
    assert not budget_binds([[1.0]], None)
    mesh = Mesh.create((2, 2))
    specs = _mlp_specs(mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = plan_program(mlp, *specs, requires_grad=GRAD, choose=[1, 2], max_factor=4)
        roomy = plan_program(mlp, *specs, requires_grad=GRAD, choose=[1, 2], state_budget=1e12)
    assert roomy.cost.total == free.cost.total
    assert roomy.arg_specs == free.arg_specs
    assert "branch and bound" not in roomy.method
    with pytest.raises(StrategyError, match="smallest feasible budget"):
        plan_program(mlp, *specs, requires_grad=GRAD, choose=[1, 2], state_budget=1.0)


def _brute_best(unary, pairs, weights, budget, rises=None):
    n = len(unary)
    best = None
    for ch in itertools.product(*(range(len(u)) for u in unary)):
        if sum(weights[v][ch[v]] for v in range(n)) <= budget:
            c = sum(unary[v][ch[v]] for v in range(n))
            c += sum(m[ch[a]][ch[b]] for (a, b), m in pairs.items())
            best = c if best is None else min(best, c)
    return best


@given(st.randoms(use_true_random=False), st.sampled_from([0.0, 0.05, 0.3]))
@settings(max_examples=60)
def test_the_branch_and_bound_stops_within_its_gap_and_its_bound_stays_true(rnd, gap):
    unary, pairs, weights, budget = _random_problem(rnd)
    best = _brute_best(unary, pairs, weights, budget)
    sol = solve_within(solve, unary, pairs, weights, budget, max_branches=10_000, gap=gap)
    assert sum(w[k] for w, k in zip(weights, sol.choice, strict=True)) <= budget
    assert sol.lower_bound <= best + 1e-9
    assert sol.cost - sol.lower_bound <= gap * sol.cost + 1e-9  # the gap honored
    assert sol.cost - best <= gap * sol.cost + 1e-9


@given(st.randoms(use_true_random=False))
@settings(max_examples=60)
def test_a_search_out_of_time_answers_a_choice_that_fits_and_a_true_bound(rnd):
    # no time at all: the multiplier's first two solves (the cheapest choice, the
    # lightest), then no more; the lightest fits, and every solve's bound is true
    unary, pairs, weights, budget = _random_problem(rnd)
    best = _brute_best(unary, pairs, weights, budget)
    calls = []

    def counted(problem, options):
        calls.append(options)
        return solve(problem, options)

    sol = solve_within(counted, unary, pairs, weights, budget, max_branches=10_000, max_seconds=0)
    assert sum(w[k] for w, k in zip(weights, sol.choice, strict=True)) <= budget
    assert sol.lower_bound <= best + 1e-9 <= sol.cost + 2e-9
    assert len(calls) <= 2


def test_a_search_time_limit_is_a_number_of_seconds_or_none():
    with pytest.raises(ValueError, match="max_seconds"):
        Options(max_seconds=-1.0)
    with pytest.raises(ValueError, match="max_seconds"):
        Options(max_seconds="60")


def _unary_greedy(unary, pairs, **kwargs):
    """An inexact solver: each variable's cheapest unary option (pairs ignored), with a
    true but loose bound (the exact minimum less 3)."""
    unary, pairs = unary.unary, unary.pairs  # (a Problem, the search's options)
    choice = tuple(min(range(len(u)), key=lambda k: u[k]) for u in unary)
    exact = solve_pairwise(unary, pairs)
    return Solution(choice, total(choice, unary, pairs), exact.cost - 3.0, Method.FOREST)


def test_a_leaf_an_inexact_solver_leaves_open_keeps_its_bound():
    # the budget decides variable 0; the greedy solver misses the pairing of variables
    # 1 and 2, so the one leaf's choice costs 10 where 1 is the minimum: its bound must
    # stay open
    unary, weights = [[0, 0], [0, 0], [0, 1]], [[1, 2], [0, 0], [0, 0]]
    pairs = {(1, 2): [[10, 0], [10, 0]]}
    sol = solve_within(_unary_greedy, unary, pairs, weights, 1, max_branches=100)
    assert sol.cost == 10 and sol.lower_bound <= 1 and sol.method != "exact"


@given(st.randoms(use_true_random=False))
@settings(max_examples=60)
def test_an_inexact_solver_never_makes_the_search_claim_a_bound_above_the_minimum(rnd):
    # the search may close every branch with choices dearer than the minimum: the
    # branches it leaves unproven keep their bounds in the result's
    unary, pairs, weights, budget = _random_problem(rnd)
    best = _brute_best(unary, pairs, weights, budget)
    try:
        sol = solve_within(_unary_greedy, unary, pairs, weights, budget, max_branches=10_000)
    except InfeasibleBudget:
        return  # the greedy choice missed every choice that fits: refused, not wrong
    assert sum(w[k] for w, k in zip(weights, sol.choice, strict=True)) <= budget
    assert sol.lower_bound <= best + 1e-9, (sol, best)
    assert sol.method != "exact" or abs(sol.cost - best) <= 1e-9


@given(st.randoms(use_true_random=False), st.integers(0, 3))
@settings(max_examples=60)
def test_a_search_resumed_after_the_objective_rose_keeps_a_true_bound(rnd, few):
    # prices learned between rounds only raise the objective: the tree goes on
    unary, pairs, weights, budget = _random_problem(rnd)
    state: dict = {}
    solve_within(solve, unary, pairs, weights, budget, max_branches=few + 2, state=state)
    risen = [[c + rnd.randint(0, 4) for c in u] for u in unary]
    best = _brute_best(risen, pairs, weights, budget)
    sol = solve_within(solve, risen, pairs, weights, budget, max_branches=10_000, state=state)
    assert sum(w[k] for w, k in zip(weights, sol.choice, strict=True)) <= budget
    assert sol.lower_bound <= best + 1e-9, (sol, best)
    assert sol.method == "exact" and abs(sol.cost - best) <= 1e-9, (sol, best)


def test_a_final_solve_at_the_root_tightens_the_bound():
    calls = []

    def loose(problem, options):
        tight = not options.draft
        calls.append(tight)
        s = solve(problem)
        return attrs.evolve(s, bound=s.cost - (0.0 if tight else 4.0), method=Method.FOREST)

    unary, weights = [[6, 1], [9, 5, 9], [2]], [[1, 8], [3, 7, 3], [5]]
    plain = solve_within(loose, unary, {}, weights, 18, max_branches=0, draft=True)
    tight = solve_within(loose, unary, {}, weights, 18, max_branches=0, final=Options())
    assert calls.count(True) == 1
    assert plain.lower_bound < tight.lower_bound <= 12  # 12: the constrained minimum
    with pytest.raises(ValueError, match="gap"):
        solve_within(solve, unary, {}, weights, 18, gap=1.5)


@given(st.randoms(use_true_random=False))
@settings(max_examples=60)
def test_a_multiplier_search_from_the_last_ones_sides_finds_the_same_minimum(rnd):
    # the second problem's prices differ either way: its bounds come from its own solves
    unary, pairs, weights, budget = _random_problem(rnd)
    lines: dict = {}
    solve_within(solve, unary, pairs, weights, budget, max_branches=10_000, lines=lines)
    other = [[max(c + rnd.randint(-4, 4), 0) for c in u] for u in unary]
    best = _brute_best(other, pairs, weights, budget)
    sol = solve_within(solve, other, pairs, weights, budget, max_branches=10_000, lines=lines)
    assert sum(w[k] for w, k in zip(weights, sol.choice, strict=True)) <= budget
    assert sol.lower_bound <= best + 1e-9, (sol, best)
    assert sol.method == "exact" and abs(sol.cost - best) <= 1e-9, (sol, best)
    warm = solve_within(solve, other, pairs, weights, budget, max_branches=0, lines=lines)
    assert warm.lower_bound <= best + 1e-9 <= warm.cost + 2e-9

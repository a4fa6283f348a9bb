"""The solver against an exact solver written here from a :class:`Problem`'s fields alone:
a HiGHS MILP (binary ``x[v, k]``; per value, source layout and wanted layout a move
indicator ``w >= s[a] + want[b] - 1``, with ``want[b] >= t_r[b]`` for every reader; pair
tables linearized the same way; the memory budget a row). Its minimum is the problem's;
the solver's bound must lie below it and its cost above it (and equal
:meth:`Problem.evaluate` of its choice), within and without budgets, on random problems."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.strategy.solver import MemoryRow, Options, Problem, Reader, SharedValue, solve

highspy = pytest.importorskip("highspy")


def milp_minimum(problem: Problem) -> float:
    """The exact minimum of ``problem`` by HiGHS's MILP (a formulation of its own)."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    cost: list[float] = []
    lower: list[float] = []
    upper: list[float] = []
    integer: list[int] = []
    rows: list[tuple[float, float, dict[int, float]]] = []

    def col(c: float, binary: bool = False) -> int:
        cost.append(float(c))
        lower.append(0.0)
        upper.append(1.0)
        if binary:
            integer.append(len(cost) - 1)
        return len(cost) - 1

    x = [[col(c, binary=True) for c in u] for u in problem.unary]
    for xs in x:
        rows.append((1.0, 1.0, dict.fromkeys(xs, 1.0)))
    const = 0.0
    for (a, b), m in problem.pairs.items():
        for k in range(m.shape[0]):
            for q in range(m.shape[1]):
                z = col(m[k, q])
                if m[k, q] >= 0:  # z >= x_ak + x_bq - 1
                    rows.append((-1.0, np.inf, {z: 1.0, x[a][k]: -1.0, x[b][q]: -1.0}))
                else:  # z <= x_ak, z <= x_bq
                    rows.append((0.0, np.inf, {x[a][k]: 1.0, z: -1.0}))
                    rows.append((0.0, np.inf, {x[b][q]: 1.0, z: -1.0}))
    for v in problem.values:
        # the source: layout -> the columns choosing it (None: fixed, always)
        if v.producer < 0:
            src = {v.layout: None}
        else:
            src = {}
            for k, o in enumerate(problem.outs[v.producer]):
                src.setdefault(o[v.j], []).append(x[v.producer][k])
        want: dict[int, int | None] = {}  # layout -> its indicator column (None: always)
        for r in v.readers:
            if r.op < 0:
                want[r.layout] = None
                continue
            by: dict[int, list[int]] = {}
            for k, o in enumerate(problem.ins[r.op]):
                by.setdefault(o[r.i], []).append(x[r.op][k])
            for b, cols in by.items():
                if b in want and want[b] is None:
                    continue
                if b not in want:
                    want[b] = col(0.0)
                rows.append((0.0, np.inf, {want[b]: 1.0, **{c: -1.0 for c in cols}}))
        for a, scols in src.items():
            for b, wcol in want.items():
                c = 0.0 if a == b else v.count * problem.price(a, b)
                if c == 0:
                    continue
                if scols is None and wcol is None:
                    const += c
                    continue
                w = col(c)
                need = {w: 1.0}
                lo = -1.0 if scols is not None and wcol is not None else 0.0
                for s in scols or ():
                    need[s] = need.get(s, 0.0) - 1.0
                if wcol is not None:
                    need[wcol] = need.get(wcol, 0.0) - 1.0
                rows.append((lo, np.inf, need))
    if problem.budget is not None:
        bytes_of: dict[int, float] = {}
        for row in problem.memory:
            for k, nb in enumerate(row.bytes):
                c = x[row.variable][k]
                bytes_of[c] = bytes_of.get(c, 0.0) + nb
        rows.append((-np.inf, problem.budget * (1 + 1e-12), bytes_of))
    lp = highspy.HighsLp()
    n = len(cost)
    lp.num_col_, lp.num_row_ = n, len(rows)
    lp.col_cost_ = np.array(cost)
    lp.col_lower_, lp.col_upper_ = np.array(lower), np.array(upper)
    lp.row_lower_ = np.array([r[0] for r in rows])
    lp.row_upper_ = np.array([r[1] for r in rows])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.cumsum([0] + [len(r[2]) for r in rows]).astype(np.int32)
    lp.a_matrix_.index_ = np.array([i for r in rows for i in r[2]], dtype=np.int32)
    lp.a_matrix_.value_ = np.array([v for r in rows for v in r[2].values()], dtype=float)
    integrality = np.zeros(n, dtype=np.int32)
    integrality[integer] = 1
    lp.integrality_ = [highspy.HighsVarType(int(i)) for i in integrality]
    h.passModel(lp)
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal, h.getModelStatus()
    return h.getInfo().objective_function_value + const


@st.composite
def problems(draw, max_ops: int = 6, max_options: int = 4, layouts: int = 4):
    """Random problems with every kind of term: shared values (fixed and produced, with
    counts), fixed targets, pair tables and memory rows."""
    n = draw(st.integers(1, max_ops))
    sizes = [draw(st.integers(1, max_options)) for _ in range(n)]
    n_in = [draw(st.integers(0, 2)) for _ in range(n)]
    layout = st.integers(0, layouts - 1)
    ins = [[[draw(layout) for _ in range(n_in[c])] for _ in range(sizes[c])] for c in range(n)]
    outs = [[[draw(layout)] for _ in range(sizes[c])] for c in range(n)]
    unary = [[draw(st.integers(0, 8)) / 4 for _ in range(sizes[c])] for c in range(n)]
    readers: dict[int, list] = {}
    n_fixed = draw(st.integers(0, 2))
    for c in range(n):
        for i in range(n_in[c]):
            if c or n_fixed:
                readers.setdefault(draw(st.integers(-n_fixed, c - 1)), []).append(Reader(c, i))
    for c in range(n):
        if draw(st.booleans()):
            readers.setdefault(c, []).append(Reader(-1, 0, draw(layout)))
    count = st.sampled_from([1, 1, 2, 0.5])
    values = [
        SharedValue(-1, 0, draw(layout), tuple(rs), draw(count))
        if key < 0
        else SharedValue(key, 0, -1, tuple(rs), draw(count))
        for key, rs in sorted(readers.items())
    ]
    pairs = {}
    for _ in range(draw(st.integers(0, 2)) if n > 1 else 0):
        a, b = sorted(draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True)))
        pairs[(a, b)] = [
            [draw(st.integers(-2, 6)) / 4 for _ in range(sizes[b])] for _ in range(sizes[a])
        ]
    table = [
        [0.0 if a == b else draw(st.integers(1, 8)) / 2 for b in range(layouts)]
        for a in range(layouts)
    ]
    memory = [MemoryRow(c, [draw(st.integers(0, 4)) for _ in range(sizes[c])]) for c in range(n)]
    return Problem(unary, pairs, values, ins, outs, lambda a, b: table[a][b], memory)


def _check(problem: Problem, options: Options) -> None:
    best = milp_minimum(problem)
    sol = solve(problem, options)
    tol = 1e-7 * max(1.0, abs(best))
    assert sol.bound <= best + tol, (sol, best)
    assert sol.cost == pytest.approx(problem.evaluate(sol.choice), rel=1e-12, abs=1e-12)
    assert sol.cost >= best - tol, (sol, best)
    assert problem.fits(sol.choice)


@settings(max_examples=min(settings.default.max_examples, 40), deadline=None)
@given(problems(), st.sampled_from([1, 1 << 21]))
def test_bound_below_the_milp_minimum_below_the_cost(problem, max_factor):
    """``max_factor=1``: no exact elimination, the transportation LP or the sharing dual
    bounds it."""
    _check(problem.without_budget(), Options(max_factor=max_factor))


def _within(problem: Problem, room: float) -> Problem:
    """``problem`` under a budget ``room`` of the way from its lightest choice's bytes to
    its heaviest's."""
    weights = problem.weights()
    least = sum(float(w.min()) for w in weights)
    most = sum(float(w.max()) for w in weights)
    return attrs.evolve(problem, budget=least + room * (most - least))


@settings(max_examples=min(settings.default.max_examples, 30), deadline=None)
@given(problems(), st.floats(0.0, 1.0), st.booleans())
def test_within_a_budget_bound_below_the_milp_minimum_below_the_cost(problem, room, lp):
    """``lp``: the transportation LP with its memory row and the mixing MIP, or (as
    without highspy) the Lagrangian search alone."""
    _check(_within(problem, room), Options(max_factor=1, lp=lp))


@settings(max_examples=min(settings.default.max_examples, 30), deadline=None)
@given(problems(max_ops=8, max_options=5), st.floats(0.0, 1.0))
def test_the_lp_with_its_memory_row_bounds_below_the_milp_minimum(problem, room):
    """The LP's bound under a budget (its Lagrangian at the simplex's duals and the memory
    row's multiplier) and its MIP's choice, which fits."""
    from meshplan.strategy.solver import solve_lp_within, transport_lp

    problem = _within(problem, room)
    best = milp_minimum(problem)
    tol = 1e-7 * max(1.0, abs(best))
    assert transport_lp(problem).bound <= best + tol
    sol = solve_lp_within(problem)
    assert sol.bound <= best + tol
    assert problem.fits(sol.choice)
    assert sol.cost == pytest.approx(problem.evaluate(sol.choice), rel=1e-12, abs=1e-12)
    assert sol.cost >= best - tol


@settings(max_examples=min(settings.default.max_examples, 30), deadline=None)
@given(problems(max_ops=8, max_options=5), st.floats(0.0, 1.0), st.data())
def test_a_mix_of_choices_fits_and_costs_less_than_those_that_fit(problem, room, data):
    from meshplan.strategy.solver import mix_within

    problem = _within(problem, room)
    choice = st.tuples(*(st.integers(0, k - 1) for k in problem.sizes))
    choices = data.draw(st.lists(choice, min_size=1, max_size=4))
    mixed = mix_within(problem, choices)
    fit = [problem.evaluate(c) for c in choices if problem.fits(c)]
    if mixed is not None:
        assert problem.fits(mixed)
        assert all(problem.evaluate(mixed) < c for c in fit)
        assert all(any(c[v] == k for c in choices) for v, k in enumerate(mixed))


def _blocks(k: int, seed: int) -> Problem:
    """``k`` blocks of a producer and its reader, each either heavy and free or light at
    a price (both sides agreeing on the layout: a move between costs 5), under a budget
    half-way between all heavy and all light: a knapsack, whose budget falls between
    the Lagrangian's breakpoints."""
    rng = np.random.default_rng(seed)
    unary, ins, outs, values, memory = [], [], [], [], []
    for i in range(k):
        unary += [[0.0, float(rng.integers(1, 9))], [0.0, 0.0]]
        outs += [[[0], [1]], [[], []]]
        ins += [[[], []], [[0], [1]]]
        values.append(SharedValue(2 * i, 0, -1, (Reader(2 * i + 1, 0),)))
        memory.append(MemoryRow(2 * i, [float(rng.integers(2, 9)), 1.0]))
    heavy = sum(m.bytes[0] for m in memory)

    def price(a: int, b: int) -> float:
        return 0.0 if a == b else 5.0

    return Problem(unary, {}, values, ins, outs, price, memory, (heavy + k) / 2)


@pytest.mark.parametrize("seed", range(4))
def test_a_budget_between_breakpoints_mixes_both_sides_to_the_optimum(seed):
    """Regression: the multiplier search alone ends on one side of the budget (all
    blocks' trade-offs at one multiplier) and, without branching, paid up to 2.8x the
    optimum; the mix of the choices it saw reaches the MILP's minimum."""
    problem = _blocks(8, seed)
    best = milp_minimum(problem)
    sol = solve(problem, Options(max_factor=1, max_branches=0))
    assert sol.cost == pytest.approx(best, rel=1e-9)
    assert sol.bound <= best + 1e-9


@settings(max_examples=min(settings.default.max_examples, 30), deadline=None)
@given(problems(max_ops=8, max_options=5))
def test_the_lp_alone_bounds_below_the_milp_minimum(problem):
    """The transportation LP's own bound (its Lagrangian dual) and rounding."""
    from meshplan.strategy.solver import solve_lp

    problem = problem.without_budget()
    best = milp_minimum(problem)
    sol = solve_lp(problem)
    assert sol.bound <= best + 1e-7 * max(1.0, abs(best))
    assert sol.cost >= best - 1e-7 * max(1.0, abs(best))


def test_an_inexact_search_that_misses_every_fitting_choice_answers_the_lightest():
    # the budget leaves room for the lightest choice only; the draft solver of the
    # Lagrangian search (no exact elimination, no LP) never proposes it, and the search
    # answered with an error: it takes the lightest choice, which fits by construction
    problem = Problem(
        [np.array([0.0]), np.array([0.0, 0.0])],
        values=[SharedValue(1, 0, -1, (Reader(-1, 0, 1),))],
        ins=[[()], [(), ()]],
        outs=[[(0,)], [(0,), (0,)]],
        price=lambda a, b: 0.0 if a == b else 1.0,
        memory=[MemoryRow(0, [0.0]), MemoryRow(1, [1.0, 0.0])],
        budget=0.0,
    )
    _check(problem, Options(max_factor=1, lp=False))
    assert solve(problem, Options(max_factor=1, lp=False)).choice == (0, 1)

"""The whole-program solver on random small problems: its minimum equals brute force over
every choice (a value moved to a layout once for all its readers), its bound is a true
bound, and the heap elimination order is the greedy one."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.strategy.solver import Options, Problem, Reader, SharedValue, solve_shared, split
from meshplan.strategy.solver._eliminate import _neighbours, _order


@st.composite
def problems(draw, max_ops: int = 5, max_options: int = 3, layouts: int = 4):
    """Random ops (options reading/writing layout numbers), values and a price table."""
    n = draw(st.integers(1, max_ops))
    sizes = [draw(st.integers(1, max_options)) for _ in range(n)]
    n_in = [draw(st.integers(0, 2)) for _ in range(n)]
    layout = st.integers(0, layouts - 1)
    ins = [[[draw(layout) for _ in range(n_in[c])] for _ in range(sizes[c])] for c in range(n)]
    outs = [[[draw(layout)] for _ in range(sizes[c])] for c in range(n)]
    unary = [[draw(st.integers(0, 5)) / 4 for _ in range(sizes[c])] for c in range(n)]
    readers: dict[int, list] = {}  # value key: -1 - k for fixed value k, c for op c's output
    n_fixed = draw(st.integers(0, 2))
    for c in range(n):
        for i in range(n_in[c]):
            src = draw(st.integers(-n_fixed, c - 1)) if c or n_fixed else None
            if src is None:
                continue
            readers.setdefault(src, []).append(Reader(c, i))
    for c in range(n):
        if draw(st.booleans()):
            readers.setdefault(c, []).append(Reader(-1, 0, draw(layout)))
    values = []
    for key, rs in sorted(readers.items()):
        if key < 0:
            values.append(SharedValue(-1, 0, draw(layout), tuple(rs)))
        else:
            values.append(SharedValue(key, 0, -1, tuple(rs)))
    table = [
        [0.0 if a == b else draw(st.integers(1, 8)) / 2 for b in range(layouts)]
        for a in range(layouts)
    ]
    return Problem(unary, values=values, ins=ins, outs=outs, price=lambda a, b: table[a][b])


def _pairwise(problem):
    """The pairwise problems the planner hands the solver: every reader paying its own
    move (above), or its share of it (below)."""
    import numpy as np

    from meshplan.strategy.solver import reader_weights

    unary, values, ins, outs, price = (
        problem.unary,
        problem.values,
        problem.ins,
        problem.outs,
        problem.price,
    )
    weights = reader_weights(problem)
    un = [np.array(u, dtype=float) for u in unary]
    lo = [np.array(u, dtype=float) for u in unary]
    pairs: dict = {}
    pairs_lo: dict = {}
    for v, lams in zip(values, weights, strict=True):
        for r, mine in zip(v.readers, lams, strict=True):
            if r.op < 0:
                if v.producer < 0:
                    continue
                col = np.array([price(o[v.j], r.layout) for o in outs[v.producer]])
                lam = mine[r.layout]
                un[v.producer] += col
                lo[v.producer] += col * lam
                continue
            lam = np.array([mine[row[r.i]] for row in ins[r.op]])
            if v.producer < 0:
                row = np.array([price(v.layout, o[r.i]) for o in ins[r.op]])
                un[r.op] += row
                lo[r.op] += row * lam
                continue
            m = np.array([[price(a[v.j], b[r.i]) for b in ins[r.op]] for a in outs[v.producer]])
            if v.producer == r.op:  # an op reading its own output cannot happen in a trace
                continue
            key = (v.producer, r.op)
            pairs[key] = pairs.get(key, 0) + m
            pairs_lo[key] = pairs_lo.get(key, 0) + m * lam[None, :]
    return (un, pairs), (lo, pairs_lo)


def _brute(problem):
    return min(problem.evaluate(c) for c in itertools.product(*map(range, problem.sizes)))


def _pairwise_total(choice, unary, pairs):
    s = sum(float(u[k]) for u, k in zip(unary, choice, strict=True))
    return s + sum(float(m[choice[a]][choice[b]]) for (a, b), m in pairs.items())


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(problems(), st.data())
def test_the_split_brackets_the_shared_objective_as_a_plain_reading_does(problem, data):
    """Every choice costs at least its below problem and at most its above one, and both
    equal the pairwise problems read off the values one reader at a time."""
    (un, pairs), (lo, pairs_lo) = _pairwise(problem)
    moves = split(problem)
    above, below = moves.above(problem.unary), moves.below(problem.unary)
    c = [data.draw(st.integers(0, k - 1)) for k in problem.sizes]
    assert below.evaluate(c) <= problem.evaluate(c) + 1e-9 <= above.evaluate(c) + 2e-9
    assert abs(above.evaluate(c) - _pairwise_total(c, un, pairs)) <= 1e-9
    assert abs(below.evaluate(c) - _pairwise_total(c, lo, pairs_lo)) <= 1e-9


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(problems(), st.sampled_from([1, 4, 1 << 20]))
def test_the_solver_equals_brute_force_and_its_bound_is_a_true_bound(problem, max_factor):
    sol = solve_shared(problem, Options(max_factor=max_factor))
    best = _brute(problem)
    assert sol.cost == problem.evaluate(sol.choice)
    assert sol.bound <= best + 1e-9
    assert sol.cost >= best - 1e-9
    if sol.method == "exact":
        assert abs(sol.cost - best) <= 1e-9
    if max_factor >= 1 << 20:  # every factor fits: the elimination is exact
        assert sol.method == "exact" and abs(sol.cost - best) <= 1e-9


def _scan_order(n, sizes, edges, max_factor):
    """The elimination order by rescanning every live vertex (the reference)."""
    nb = _neighbours(n, edges)
    alive = set(range(n))
    order = []
    while alive:
        best = min(alive, key=lambda v: (math.prod(sizes[u] for u in nb[v]), v))
        if math.prod(sizes[u] for u in nb[best]) > max_factor:
            return None
        order.append(best)
        for u in nb[best]:
            nb[u] |= nb[best] - {u}
            nb[u].discard(best)
        alive.remove(best)
    return order


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(st.data())
def test_the_heap_order_is_the_greedy_smallest_factor_order(data):
    n = data.draw(st.integers(1, 12))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    edges = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n)
    )
    max_factor = data.draw(st.sampled_from([1, 8, 64, 1 << 30]))
    assert _order(n, sizes, edges, max_factor) == _scan_order(n, sizes, edges, max_factor)


@settings(max_examples=min(settings.default.max_examples, 100), deadline=None)
@given(st.data())
def test_the_forest_bound_with_folded_terms_lies_below_the_pairwise_minimum(data):
    """With every factor refused, ``solve``'s bound (a spanning forest, the other terms
    folded into row and column minima) is at most the brute-force minimum."""
    from meshplan.strategy.solver import solve_pairwise, total

    n = data.draw(st.integers(2, 6))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    cost = st.integers(0, 6).map(lambda k: k / 2)
    unary = [data.draw(st.lists(cost, min_size=k, max_size=k)) for k in sizes]
    pairs = {}
    for a, b in data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)))):
        if a < b and (a, b) not in pairs:
            pairs[(a, b)] = [
                data.draw(st.lists(cost, min_size=sizes[b], max_size=sizes[b]))
                for _ in range(sizes[a])
            ]
    sol = solve_pairwise(unary, pairs, max_factor=1)
    best = min(total(c, unary, pairs) for c in itertools.product(*map(range, sizes)))
    assert sol.lower_bound <= best + 1e-9
    assert sol.cost >= best - 1e-9


def _reference_local_search(choice, problem):
    """Local search as plain loops: each op in a worklist re-chosen by pricing each of its
    options on the shared objective, one at a time (the reference)."""
    from collections import deque

    unary = problem.unary
    choice = list(choice)
    touching = [[] for _ in unary]
    near = [set() for _ in unary]
    for v in problem.values:
        ops = {r.op for r in v.readers if r.op >= 0} | ({v.producer} - {-1})
        for c in ops:
            touching[c].append(v)
            near[c] |= ops

    def part(c, k):
        choice[c] = k
        return float(unary[c][k]) + sum(problem.move_cost(v, choice) for v in touching[c])

    queue, queued = deque(range(len(unary))), [True] * len(unary)
    visits = 0
    while queue and visits < 50 * len(unary):
        c = queue.popleft()
        queued[c] = False
        visits += 1
        orig = choice[c]
        best_k, best = orig, part(c, orig)
        for k in range(len(unary[c])):
            if k != orig:
                s = part(c, k)
                if s < best - 1e-18:
                    best_k, best = k, s
        choice[c] = best_k
        if best_k != orig:
            for u in sorted(near[c]):
                if u != c and not queued[u]:
                    queued[u] = True
                    queue.append(u)
    return choice


@settings(max_examples=min(settings.default.max_examples, 200), deadline=None)
@given(problems(max_ops=6, max_options=4), st.data())
def test_local_search_prices_all_options_at_once_as_the_loop_does_one_by_one(problem, data):
    """Prices in quarters: sums are exact, so both pick the very same options."""
    from meshplan.strategy.solver import local_search

    start = [data.draw(st.integers(0, k - 1)) for k in problem.sizes]
    got = local_search(problem, start)
    assert got == _reference_local_search(start, problem)
    cost = problem.evaluate(got)
    assert cost <= problem.evaluate(start)
    for c, size in enumerate(problem.sizes):  # no op alone can do better
        for k in range(size):
            other = list(got)
            other[c] = k
            assert problem.evaluate(other) >= cost - 1e-12

"""The transportation LP of a shared problem: a bound as tight as an exact MILP's on
whole programs, and a choice rounded off it (numpy; highspy when installed).

Variables ``x[v, k] >= 0`` with ``sum_k x[v, k] = 1`` relax each variable's choice. A
value's source takes layout ``a`` with weight ``s[a]`` (the sum of its producer's
``x`` over the options writing ``a``), a reader wants layout ``b`` with weight
``t_r[b]``. Per reader a transportation plan ``mu_r[a, b] >= 0`` has row sums ``s`` and
column sums ``t_r`` (at an integral choice, the one move the reader makes), and per
value and wanted layout ``y[a, b] >= mu_r[a, b]`` for every reader that may want ``b``
pays ``count * price(a, b)`` once. Every choice is a feasible point costing exactly what
:meth:`~._problem.Problem.evaluate` says, so the LP's minimum is a true lower bound of
the problem's. A pair table ``m[k, l]`` gets the local-marginal polytope (``mu[k, l]``
with marginals ``x[a]`` and ``x[b]``).

The choice: each variable's heaviest option, improved by local search.
"""

from __future__ import annotations

import attrs

from ._local_search import Searcher
from ._problem import Problem
from ._solution import Effort, Method, Solution

__all__ = ["LPRelaxation", "has_lp", "transport_lp"]


def has_lp() -> bool:
    """Whether highspy (the ``meshplan[solver]`` extra) is installed."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


@attrs.frozen(eq=False)
class LPRelaxation:
    """The LP's optimum ``bound`` (a true lower bound, less a tolerance), each variable's
    fractional ``x`` and the simplex iterations it took."""

    bound: float
    x: list
    iterations: int

    def fractional(self, tol: float = 1e-6) -> list[int]:
        """The variables the LP leaves fractional."""
        return [v for v, row in enumerate(self.x) if row.max() < 1 - tol]


class _Builder:
    """Columns (cost, upper bound) and rows (lower, upper, sparse entries) of an LP."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.rows: list[tuple[float, float, list[int], list[float]]] = []

    def col(self, cost: float = 0.0) -> int:
        self.cost.append(cost)
        return len(self.cost) - 1

    def row(self, lo: float, hi: float, idx: list[int], val: list[float]) -> None:
        self.rows.append((lo, hi, idx, val))

    def solve(self):
        import highspy
        import numpy as np

        lp = highspy.HighsLp()
        n = len(self.cost)
        lp.num_col_, lp.num_row_ = n, len(self.rows)
        lp.col_cost_ = np.asarray(self.cost, dtype=float)
        lp.col_lower_ = np.zeros(n)
        lp.col_upper_ = np.full(n, highspy.kHighsInf)
        lp.row_lower_ = np.array([r[0] for r in self.rows], dtype=float)
        lp.row_upper_ = np.array([r[1] for r in self.rows], dtype=float)
        starts = np.zeros(len(self.rows) + 1, dtype=np.int32)
        starts[1:] = np.cumsum([len(r[2]) for r in self.rows])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = np.array([i for r in self.rows for i in r[2]], dtype=np.int32)
        lp.a_matrix_.value_ = np.array([x for r in self.rows for x in r[3]], dtype=float)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.passModel(lp)
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        info = h.getInfo()
        return (
            np.asarray(h.getSolution().col_value),
            info.objective_function_value,
            int(info.simplex_iteration_count),
        )


def transport_lp(problem: Problem) -> LPRelaxation | None:
    """The LP relaxation of ``problem`` (see the module docstring), or None when highspy
    is missing or the LP does not solve to optimality."""
    if not has_lp():
        return None
    import numpy as np

    lp = _Builder()
    xs = []
    for u in problem.unary:
        cols = [lp.col(float(c)) for c in u]
        xs.append(cols)
        lp.row(1.0, 1.0, cols, [1.0] * len(cols))
    for (a, b), m in problem.pairs.items():
        mu = [[lp.col(float(m[k, q])) for q in range(m.shape[1])] for k in range(m.shape[0])]
        for k in range(m.shape[0]):
            lp.row(0.0, 0.0, [*mu[k], xs[a][k]], [1.0] * m.shape[1] + [-1.0])
        for q in range(m.shape[1]):
            col = [mu[k][q] for k in range(m.shape[0])]
            lp.row(0.0, 0.0, [*col, xs[b][q]], [1.0] * m.shape[0] + [-1.0])
    price, ins, outs = problem.price, problem.ins, problem.outs
    const = 0.0

    def indicator(options, pick):
        """Layout -> the option columns choosing it (in first-seen order)."""
        out: dict[int, list[int]] = {}
        for k, opt in enumerate(options):
            out.setdefault(pick(opt), []).append(k)
        return out

    for v in problem.values:
        src = {v.layout: None} if v.fixed else indicator(outs[v.producer], lambda o, j=v.j: o[j])
        # per wanted layout b != a: the readers' plans' entries mu_r[a, b] (or, for a fixed
        # source, the readers' indicator columns)
        wants: dict[tuple[int, int], list[tuple[list[int], list[float]]]] = {}
        for r in v.readers:
            dst = {r.layout: None} if r.fixed else indicator(ins[r.op], lambda o, i=r.i: o[i])
            if v.fixed and r.fixed:
                if r.layout != v.layout:
                    wants.setdefault((v.layout, r.layout), []).append(([], [1.0]))
                continue
            if v.fixed:  # mu_r[a0, b] = t_r[b]
                for b, ks in dst.items():
                    if b != v.layout:
                        wants.setdefault((v.layout, b), []).append(([xs[r.op][k] for k in ks], []))
                continue
            if r.fixed:  # mu_r[a, b0] = s[a]
                for a, ks in src.items():
                    if a != r.layout:
                        wants.setdefault((a, r.layout), []).append(
                            ([xs[v.producer][k] for k in ks], [])
                        )
                continue
            mu = {(a, b): lp.col() for a in src for b in dst}
            for a, ks in src.items():
                idx = [mu[(a, b)] for b in dst] + [xs[v.producer][k] for k in ks]
                lp.row(0.0, 0.0, idx, [1.0] * len(dst) + [-1.0] * len(ks))
            for b, ks in dst.items():
                idx = [mu[(a, b)] for a in src] + [xs[r.op][k] for k in ks]
                lp.row(0.0, 0.0, idx, [1.0] * len(src) + [-1.0] * len(ks))
            for (a, b), c in mu.items():
                if a != b:
                    wants.setdefault((a, b), []).append(([c], []))
        for (a, b), reads in wants.items():
            cost = v.count * price(a, b)
            if cost == 0:
                continue
            if any(not idx for idx, _ in reads):  # a fixed source read by a fixed target
                const += cost
                continue
            if len(reads) == 1:  # one reader: it pays the move itself
                for c in reads[0][0]:
                    lp.cost[c] += cost
                continue
            y = lp.col(cost)
            for idx, _ in reads:
                lp.row(-np.inf, 0.0, [*idx, y], [1.0] * len(idx) + [-1.0])
    out = lp.solve()
    if out is None:
        return None
    col, value, iterations = out
    x = [np.clip(col[cols], 0.0, 1.0) for cols in xs]
    # the simplex's optimum holds to its tolerances: a little off, for a true bound
    bound = value + const - 1e-7 * max(abs(value), 1.0)
    return LPRelaxation(float(bound), x, iterations)


def solve_lp(problem: Problem, search: Searcher | None = None) -> Solution | None:
    """The LP's bound and its rounded choice (each variable's heaviest option), improved
    by local search; None without highspy."""
    relaxed = transport_lp(problem)
    if relaxed is None:
        return None
    choice = [int(row.argmax()) for row in relaxed.x]
    search = Searcher(problem) if search is None else search
    choice = search(choice, problem.unary)
    cost = problem.evaluate(choice)
    effort = Effort(simplex=relaxed.iterations)
    bound = min(relaxed.bound, cost)
    method = Method.EXACT if cost - bound <= 1e-7 * max(abs(cost), 1.0) else Method.TRANSPORT_LP
    return Solution(choice, cost, bound, method, effort)

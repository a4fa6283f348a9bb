"""The transportation LP of a shared problem: a bound as tight as an exact MILP's on
whole programs, and a choice rounded off it (numpy; highspy when installed).

Variables ``x[v, k] >= 0`` with ``sum_k x[v, k] = 1`` relax each variable's choice. A
value's source takes layout ``a`` with weight ``s[a]`` (the sum of its producer's
``x`` over the options writing ``a``; 1 for a fixed layout), a reader wants layout ``b``
with weight ``t_r[b]``. Per reader a transportation plan ``mu_r[a, b] >= 0`` has row sums
``s`` and column sums ``t_r`` (at an integral choice, the one move the reader makes), and
per value and wanted layout ``y[a, b] >= mu_r[a, b]`` for every reader that may want
``b`` pays ``count * price(a, b)`` once. Every choice is a feasible point costing
exactly what :meth:`~._problem.Problem.evaluate` says, so the LP's minimum is a true
lower bound of the problem's. A pair table ``m[k, l]`` gets the local-marginal polytope
(a plan between the two variables' options, paying ``m[k, l]`` per unit).

The LP is solved by column generation: the plans' entries start from those a known
choice uses, and each round adds the entries (for a shared move: the entry of every
reader of that move, with its ``y``) whose reduced cost at the round's duals is
negative, until none is. The bound is not the simplex's objective but the Lagrangian
dual at its duals (:func:`_Model.bound`): the equality rows relaxed with those duals,
every variable in ``[0, 1]``, each shared move's ``y >= mu_r`` kept, which is a true
lower bound for *any* duals (and the LP's minimum at optimal ones), so neither the
simplex's tolerances nor stopping early can make it claim too much.

The choice: each variable's heaviest option, improved by local search.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from ._budget import lightest_choice
from ._local_search import Searcher
from ._problem import Problem, summed_bytes
from ._solution import Effort, Method, Solution
from ._transport_highs import _Restricted

__all__ = ["LPRelaxation", "has_lp", "solve_lp", "transport_lp"]


#: the CPU seconds (of this process) one LP's column generation may take (then its best
#: bound stands): at real sizes (a tied 8B program) the restricted LPs can run for minutes
#: while the search's own bound is already within a fraction of a percent. CPU, not wall:
#: a machine busy with other work gives the same bound, later (Llama-3 70B's linked
#: layer, 10-16 s of LP alone, was cut at 30 wall seconds beside another planning
#: process: its plan's proven gap 0.2% -> 5.5%)
LP_SECONDS = 30.0

#: a restricted LP's run may take this many times its CPU seconds left in wall time (a
#: process getting a share of a core; HiGHS's own limit is wall time)
LP_WALL_SLACK = 4.0


def has_lp() -> bool:
    """Whether highspy (the ``meshplan[solver]`` extra) is installed."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


@attrs.frozen(eq=False)
class LPRelaxation:
    """The LP's ``bound`` (a true lower bound: the Lagrangian dual at the simplex's
    duals), each variable's fractional ``x``, the simplex iterations it took, the
    rounds of column generation and, given links, per link the multipliers (by option)
    its rows' duals put on the copy (and take off its own call); under a budget, the
    memory row's ``multiplier`` (cost per byte) and the ``restricted`` LP it solved
    (its columns: what a rounding by MIP chooses among)."""

    bound: float
    x: list
    iterations: int
    rounds: int = 0
    links: list = attrs.field(factory=list)
    multiplier: float = 0.0
    restricted: Any = attrs.field(default=None, repr=False)

    def fractional(self, tol: float = 1e-6) -> list[int]:
        """The variables the LP leaves fractional."""
        return [v for v, row in enumerate(self.x) if row.max() < 1 - tol]


class _Model:
    """The full LP, enumerated in arrays (costs divided by ``scale``).

    Rows: one simplex row per variable, then per edge (a reader of a value, or a pair
    table) its plan's row sums (one per source layout) and column sums (one per wanted
    layout), each ``= rhs`` (1 where that side is fixed, else 0). Columns: the ``x`` (all
    in every round), the plans' entries (``e``: rows ``P[e]`` and ``Q[e]``, unit
    ``unit[e]``) and per shared unit a ``y``. A *unit* is what a round adds at once: one
    entry paying ``cost[u]`` itself, or (``shared[u]``) the entries of every reader of
    one value wanting one move, paying ``cost[u]`` once through their ``y``."""

    def __init__(self, problem: Problem, links: Sequence[tuple[int, int]] = ()) -> None:
        import numpy as np

        sizes = problem.sizes
        n = len(sizes)
        self.n = n
        self.off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.nx = int(self.off[-1])
        un = np.concatenate([np.asarray(u, dtype=float) for u in problem.unary]) if n else []
        self.var_of_x = np.repeat(np.arange(n), sizes)
        prices: dict[tuple[int, int], float] = {}
        price = problem.price

        def priced(a: int, b: int) -> float:
            c = prices.get((a, b))
            if c is None:
                c = prices[(a, b)] = 0.0 if a == b else float(price(a, b))
            return c

        rhs = [np.ones(n)]
        xr = [self.var_of_x]  # x entries: rows, columns, values
        xc = [np.arange(self.nx)]
        xv = [np.ones(self.nx)]
        rows = n
        entries = 0
        P, Q, cost, key = [], [], [], []  # per entry; key: (value, a, b) shared, else -1
        # per edge, to find the entries a choice uses: (base, width, src var, src index per
        # option, reader var, wanted index per option)
        self.edges: list[tuple] = []

        def side(var: int, index, fixed: bool) -> tuple:
            nonlocal rows
            width = 1 if fixed else int(index.max()) + 1
            first = rows
            rows += width
            rhs.append(np.full(width, 1.0 if fixed else 0.0))
            if not fixed:
                cols = self.off[var] + np.arange(len(index))
                xr.append(first + index)
                xc.append(cols)
                xv.append(-np.ones(len(index)))
            return first, width

        def edge(src, dst, table, keys) -> None:
            """A plan between ``src`` and ``dst`` (each ``(var, index per option, fixed)``)
            paying ``table[a, b]``; ``keys[a, b]``: its shared unit's key, or -1."""
            nonlocal entries
            (sv, si, sf), (dv, di, df) = src, dst
            p0, na = side(sv, si, sf)
            q0, nb = side(dv, di, df)
            base = entries
            entries += na * nb
            ia, ib = np.divmod(np.arange(na * nb), nb)
            P.append(p0 + ia)
            Q.append(q0 + ib)
            cost.append(np.asarray(table, dtype=float).reshape(-1))
            key.append(np.asarray(keys, dtype=np.int64).reshape(-1))
            self.edges.append((base, nb, sv, None if sf else si, dv, None if df else di))

        # links: rows x[c, k] - x[o, k] = 0 (a copy takes its own call's option)
        self.link_rows = []
        for c, o in links:
            k = sizes[c]
            first = rows
            rows += k
            rhs.append(np.zeros(k))
            xr.extend([first + np.arange(k)] * 2)
            xc.extend([self.off[c] + np.arange(k), self.off[o] + np.arange(k)])
            xv.extend([np.ones(k), -np.ones(k)])
            self.link_rows.append(first + np.arange(k))
        zero = np.zeros(1, dtype=np.int64)
        for (a, b), m in problem.pairs.items():
            ka, kb = m.shape
            edge((a, np.arange(ka), False), (b, np.arange(kb), False), m, np.full(m.shape, -1))
        nkeys = 0
        for v in problem.values:
            if v.fixed:
                srcs, si = [v.layout], zero
            else:
                outs = [row[v.j] for row in problem.outs[v.producer]]
                srcs = list(dict.fromkeys(outs))
                at = {a: i for i, a in enumerate(srcs)}
                si = np.array([at[a] for a in outs], dtype=np.int64)
            reads = []
            for r in v.readers:
                if r.fixed:
                    reads.append(([r.layout], zero))
                else:
                    ins = [row[r.i] for row in problem.ins[r.op]]
                    dsts = list(dict.fromkeys(ins))
                    at = {b: i for i, b in enumerate(dsts)}
                    reads.append((dsts, np.array([at[b] for b in ins], dtype=np.int64)))
            wanted = list(dict.fromkeys(b for dsts, _ in reads for b in dsts))
            col = {b: i for i, b in enumerate(wanted)}
            table = np.array([[priced(a, b) for b in wanted] for a in srcs]) * v.count
            many = np.zeros(len(wanted))  # how many readers may want each layout
            for dsts, _ in reads:
                many[[col[b] for b in dsts]] += 1
            for r, (dsts, di) in zip(v.readers, reads, strict=True):
                cols = np.array([col[b] for b in dsts])
                t = table[:, cols]
                # shared: a move more readers may want (whatever its price, so that the
                # units stay the same as prices change between solves)
                shared = (np.array(srcs)[:, None] != np.array(dsts)[None, :]) & (many[cols] > 1)[
                    None, :
                ]
                k = nkeys + np.arange(len(srcs))[:, None] * len(wanted) + cols[None, :]
                edge((v.producer, si, v.fixed), (r.op, di, r.fixed), t, np.where(shared, k, -1))
            nkeys += len(srcs) * len(wanted)
        self.rows = rows
        self.rhs = np.concatenate(rhs)
        self.xr, self.xc, self.xv = (np.concatenate(z) for z in (xr, xc, xv))
        self.P = np.concatenate(P) if P else np.zeros(0, dtype=np.int64)
        self.Q = np.concatenate(Q) if Q else np.zeros(0, dtype=np.int64)
        ecost = np.concatenate(cost) if cost else np.zeros(0)
        ekey = np.concatenate(key) if key else np.zeros(0, dtype=np.int64)
        # units: each shared key one, each other entry its own
        shared = ekey >= 0
        uniq, inv = np.unique(ekey[shared], return_inverse=True)
        self.unit = np.empty(len(ekey), dtype=np.int64)
        self.unit[shared] = inv
        self.unit[~shared] = len(uniq) + np.arange(int((~shared).sum()))
        nu = len(uniq) + int((~shared).sum())
        self.ucost = np.zeros(nu)
        self.ucost[self.unit] = ecost  # a shared unit's entries all hold its price
        self.ushared = np.zeros(nu, dtype=bool)
        self.ushared[: len(uniq)] = True
        order = np.argsort(self.unit, kind="stable")
        self.by_unit = order  # entries grouped by unit
        self.unit_start = np.searchsorted(self.unit[order], np.arange(nu + 1))
        self.raw = (np.asarray(un, dtype=float), self.ucost)
        self.memory_row(problem)
        self.rescale(
            max(
                float(np.abs(un).max()) if len(un) else 0.0,
                float(np.abs(self.ucost).max()) if nu else 0.0,
                1e-300,
            )
        )

    def memory_row(self, problem: Problem) -> None:
        """Under a budget (and per limit, see :class:`~._problem.Limit`) a memory row
        ``sum mem[k, x] * x <= room[k]``: each option's bytes over its variable's lightest,
        divided by the largest of those (the row's right side ``room[k]``: its budget's room
        over the lightest choice, in those units; ``norm[k]``: the unit); ``out`` marks the
        options heavier than some row's room (no choice in budget takes them: they are held
        at 0, which leaves the budgeted minimum alone). ``mem`` is None without any row."""
        import numpy as np

        self.mem = None
        self.out = np.zeros(self.nx, dtype=bool)
        self.room, self.norm = np.zeros(0), np.ones(0)
        sides = [(problem.weights(), problem.budget)] if _budgeted(problem) else []
        sides += [(summed_bytes(lim.memory, problem.sizes), lim.budget) for lim in problem.limits]
        if not sides:
            return
        mem, room, norm = [], [], []
        for w, budget in sides:
            light = [float(x.min()) if len(x) else 0.0 for x in w]
            over = np.concatenate([x - m for x, m in zip(w, light, strict=True)]) if w else []
            unit = float(np.max(over, initial=0.0))
            unit = unit if unit > 0 else 1.0
            mem.append(np.asarray(over, dtype=float) / unit)
            room.append((float(budget) - sum(light)) / unit)
            norm.append(unit)
        self.mem = np.array(mem).reshape(len(sides), self.nx)
        self.room, self.norm = np.array(room), np.array(norm)
        self.out = (self.mem > self.room[:, None] * (1 + 1e-12) + 1e-12).any(axis=0)

    def rescale(self, scale: float) -> None:
        """Costs divided by ``scale`` (the simplex works best near 1)."""
        self.scale = scale
        self.xcost = self.raw[0] / scale
        self.ucost = self.raw[1] / scale

    def same_terms(self, other: _Model) -> bool:
        """Whether ``other`` has this model's rows, columns and units (prices aside)."""
        import numpy as np

        return (
            self.rows == other.rows
            and self.nx == other.nx
            and len(self.P) == len(other.P)
            and len(self.ucost) == len(other.ucost)
            and (self.mem is None) == (other.mem is None)
            and all(
                np.array_equal(a, b)
                for a, b in (
                    (self.P, other.P),
                    (self.Q, other.Q),
                    (self.unit, other.unit),
                    (self.rhs, other.rhs),
                    (self.xr, other.xr),
                    (self.xc, other.xc),
                    *(() if self.mem is None else ((self.mem, other.mem),)),
                )
            )
        )

    def units_of(self, choice: Sequence[int]):
        """The units the entries ``choice`` uses belong to."""
        import numpy as np

        es = []
        for base, nb, sv, si, dv, di in self.edges:
            a = 0 if si is None else int(si[choice[sv]])
            b = 0 if di is None else int(di[choice[dv]])
            es.append(base + a * nb + b)
        return np.unique(self.unit[np.array(es, dtype=np.int64)]) if es else np.zeros(0, int)

    def terms(self, dual, lam=0.0):
        """Per unit its Lagrangian term at the row duals ``dual`` (each ``<= 0``), and the
        ``x``'s reduced costs (``lam >= 0``: the memory rows' multipliers, see
        :meth:`memory_row`)."""
        import numpy as np

        g = dual[self.P] + dual[self.Q]
        gain = np.where(self.ushared[self.unit], np.maximum(g, 0.0), g)
        paid = np.bincount(self.unit, weights=gain, minlength=len(self.ucost))
        xrc = self.xcost - np.bincount(self.xc, weights=self.xv * dual[self.xr], minlength=self.nx)
        if self.mem is not None and np.any(lam):
            xrc = xrc + (np.asarray(lam, dtype=float).reshape(-1, 1) * self.mem).sum(axis=0)
        return np.minimum(self.ucost - paid, 0.0), xrc

    def bound(self, dual, lam=0.0) -> float:
        """The Lagrangian dual at ``dual`` and the memory rows' multipliers ``lam >= 0``
        (see the module docstring), in the problem's units: a true lower bound of the
        problem's minimum (within its budget) for any ``dual`` and ``lam``."""
        import numpy as np

        units, xrc = self.terms(dual, lam)
        xs = np.minimum(xrc, 0.0)[~self.out].sum()  # options out of budget held at 0
        taken = 0.0 if self.mem is None else float(np.sum(np.asarray(lam, float) * self.room))
        return float((self.rhs @ dual - taken + xs + units.sum()) * self.scale)


def _budgeted(problem: Problem) -> bool:
    """Whether ``problem``'s own budget gives the LP a memory row (its first)."""
    return problem.budget is not None and bool(problem.memory)


def transport_lp(
    problem: Problem,
    starts: Sequence[Sequence[int]] = (),
    *,
    max_rounds: int = 100,
    target: float | None = None,
    warm=None,
    links: Sequence[tuple[int, int]] = (),
    seconds: float = LP_SECONDS,
) -> LPRelaxation | None:
    """The LP relaxation of ``problem`` (see the module docstring) by column generation
    from the entries ``starts`` (choices) use, for at most ``max_rounds`` rounds or
    ``seconds`` (CPU time of this process, see :data:`LP_SECONDS`), or until the bound
    meets ``target`` (a known cost); None when highspy is missing or no restricted LP
    solved to optimality. Stopped early (rounds or
    time), the best bound of the rounds run stands (true at any duals) and ``x`` is the
    last optimal restricted LP's. ``warm``: a :class:`~._solution.Warm` whose ``lp``
    (the restricted LP an earlier solve over the same terms left, at other prices) the
    LP starts from, with its columns and basis, and which it leaves its own in.
    ``links``: ``(copy, own)`` variable pairs whose options must agree (rows
    ``x[copy, k] = x[own, k]``; see :func:`._periodic.run_bound`)."""
    if not has_lp():
        return None
    import numpy as np

    model = _Model(problem, links)
    lp = None if warm is None else warm.lp
    if lp is not None and lp.m.same_terms(model):
        lp.reprice(model)
    else:
        lp = _Restricted(model)
    if warm is not None:
        warm.lp = lp
    first = list(starts) or [[0] * len(problem.sizes)]
    if model.mem is not None:  # a choice within the budget: the restricted LP is feasible
        first.append(lightest_choice(problem))
    lp.add(np.unique(np.concatenate([model.units_of(c) for c in first])))
    best, rounds, dual, lam, col = -np.inf, 0, None, np.zeros(0), None
    deadline = time.process_time() + seconds
    while rounds < max_rounds:
        left = deadline - time.process_time()
        if left <= 0:
            break
        rounds += 1
        ran = lp.run(left * LP_WALL_SLACK)
        if ran is None:  # out of time (else not solved): the rounds before stand, if any
            break
        col = np.asarray(lp.h.getSolution().col_value)[: model.nx]
        d, mu = ran
        bound = model.bound(d, mu)
        if bound > best:
            best, dual, lam = bound, d, mu
        if target is not None and best >= target - 1e-9 * max(abs(target), 1e-300):
            break
        terms, _ = model.terms(d, mu)
        # the simplex's own tolerance: entries priced out within it do not move it
        new = np.flatnonzero((terms < -1e-7) & ~lp.added)
        if not len(new):
            break
        lp.add(new)
    if dual is None:
        return None
    x = [np.clip(col[model.off[v] : model.off[v + 1]], 0.0, 1.0) for v in range(model.n)]
    iterations = int(lp.h.getInfo().simplex_iteration_count)
    links_lam = [-dual[r] * model.scale for r in model.link_rows]
    per_byte = 0.0
    if _budgeted(problem):  # the budget's memory row's multiplier in cost per byte
        per_byte = float(lam[0]) * model.scale / float(model.norm[0])
    return LPRelaxation(float(best), x, iterations, rounds, links_lam, per_byte, lp)


def solve_lp(
    problem: Problem,
    search: Searcher | None = None,
    starts: Sequence[Sequence[int]] = (),
    warm=None,
) -> Solution | None:
    """The LP's bound and its rounded choice (each variable's heaviest option), improved
    by local search; None without highspy. ``starts``: choices whose entries the column
    generation starts from (the cheapest of them is a candidate too); ``warm``: see
    :func:`transport_lp`."""
    target = min((problem.evaluate(s) for s in starts), default=None)
    relaxed = transport_lp(problem, starts, target=target, warm=warm)
    if relaxed is None:
        return None
    search = Searcher(problem) if search is None else search
    choice = search([int(row.argmax()) for row in relaxed.x], problem.unary)
    cost = problem.evaluate(choice)
    for s in starts:
        c = problem.evaluate(s)
        if c < cost:
            cost, choice = c, list(s)
    effort = Effort(simplex=relaxed.iterations)
    bound = min(relaxed.bound, cost)
    method = Method.EXACT if cost - bound <= 1e-9 * max(abs(cost), 1e-300) else Method.TRANSPORT_LP
    return Solution(choice, cost, bound, method, effort)

"""A choice within a memory budget: Lagrangian relaxation and branch and bound (numpy).

A problem's memory rows (:class:`~._problem.MemoryRow`) bound the bytes its choice
holds. :func:`solve_within` minimizes the objective subject to ``problem.budget`` by
Lagrangian relaxation: for a multiplier ``lam >= 0`` the minimum of ``cost + lam *
(memory - budget)`` over *all* choices is a lower bound of the constrained minimum, and
a choice it returns that fits the budget is an upper bound. The multiplier is searched
by intersecting the lines of the cheapest over-budget and the cheapest within-budget
choices found (the dual is concave and piecewise linear: it reaches its maximum in
finitely many steps). Where a gap remains (the budget falls between two of the dual's
breakpoints) a best-first branch and bound over the variables with memory closes it,
each branch bounded by the same relaxation, up to ``options.max_branches`` solves (or
``options.max_seconds``) or until the gap is within ``options.gap`` of the cost; the gap left, if any, is what
``Solution.bound`` reports. With an inexact solver the search's solves may be cheap
drafts: one costlier solve at the root's multiplier then gives the bound (``final``),
and a search can go on over calls whose objective only rises (``warm.search``: the
lazily priced rounds of a program, whose bound prices become exact ones).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import attrs

from ._local_search import repair_within
from ._problem import Problem
from ._solution import Method, Options, Solution, Warm

__all__ = [
    "InfeasibleBudget",
    "budget_binds",
    "check_room",
    "lightest_choice",
    "min_memory_choice",
    "solve_within",
]

_MIX = 24  # the last choices the search saw that a mix combines
_REPAIRED = 3  # the cheapest choices over the budget a search brings within it


class InfeasibleBudget(ValueError):
    """No choice fits the budget (``least``: the fewest bytes any choice holds)."""

    def __init__(self, message: str, budget: float, least: float) -> None:
        super().__init__(message)
        self.budget, self.least = budget, least


def min_memory_choice(weights: Sequence[Sequence[float]]) -> float:
    """The least memory any choice takes (each variable at its lightest option)."""
    return float(sum(min(w) for w in weights))


def lightest_choice(problem: Problem) -> list[int]:
    """Each variable's lightest option (of those, its cheapest alone): a choice within
    any budget that any choice fits."""
    import numpy as np

    out = []
    for u, w in zip(problem.unary, problem.weights(), strict=True):
        light = np.flatnonzero(w <= w.min() + 1e-12 * max(abs(float(w.min())), 1.0))
        out.append(int(light[np.argmin(np.asarray(u)[light])]))
    return out


def budget_binds(weights: Sequence[Sequence[float]], budget: float | None) -> bool:
    """Whether ``budget`` rules out any choice (the heaviest choice does not fit)."""
    if budget is None:
        return False
    return float(sum(max(w, default=0.0) for w in weights)) > budget * (1 + 1e-12)


def check_room(problem: Problem) -> None:
    """Raise :class:`InfeasibleBudget` when no choice fits ``problem.budget``."""
    budget = problem.budget
    least = min_memory_choice(problem.weights())
    if budget is not None and least > budget * (1 + 1e-12):
        raise InfeasibleBudget(
            f"no choice fits the memory budget: the least the choice can take is "
            f"{least:.0f} bytes per rank, the budget leaves {budget:.0f}",
            budget,
            least,
        )


@attrs.frozen
class _Point:
    choice: tuple[int, ...]
    cost: float
    memory: float


def solve_within(
    problem: Problem,
    relax: Callable[[Problem, Options], Solution],
    options: Options | None = None,
    *,
    seeds: Sequence[dict[int, int]] = (),
    final: Options | None = None,
    warm: Warm | None = None,
    above: Problem | None = None,
    mix: Callable[[Problem, list], Sequence[int] | None] | None = None,
) -> Solution:
    """The least-cost choice of ``problem`` whose memory stays within ``problem.budget``.

    ``relax(p, options)`` is the unconstrained solver (any, returning a
    :class:`Solution` with a true lower bound) of ``p``: ``problem`` with other unary
    rows (a multiplier times memory, a branch's exclusions). The result's ``bound``
    bounds the constrained minimum (exact when the solver is and no gap is left).
    ``seeds`` are partial choices (variable -> option) completed by one solve each
    before the search: with an exact solver, a known layout that fits (the specs given
    by hand) is then never beaten by the result. The branching stops once the gap left
    is at most ``options.gap`` times the cost of the best choice (0: until it is closed,
    or ``options.max_branches`` solves ran). ``final``: the options of one more solve at
    the root's maximizing multiplier, before any branching (a costlier, tighter bound:
    the search's solves may then be drafts whose bounds are loose). ``warm.search``: a
    search carried between calls on one problem whose objective only rises from call to
    call (prices learned exactly where bounds stood): it goes on where the last call
    left it, its bounds still true, its choices costed anew, ``max_branches`` solves in
    all (None: a fresh search, not kept). ``warm.lines``: the root's multiplier search
    starts from the choices on both sides of the budget the last call ended with.
    ``above``: a pairwise problem costing every choice at least as much as ``problem``
    (its spread of costs sets the multiplier that makes memory decide; default:
    ``problem``). ``mix(problem, choices)``: a choice within the budget combining the
    choices the root's search saw (on both sides of the budget; see
    :func:`._transport_mip.mix_within`), kept where it costs less, before any branching.

    >>> from meshplan.strategy.solver import MemoryRow, solve
    >>> p = Problem([[0.0, 5.0]], memory=[MemoryRow(0, [10.0, 1.0])], budget=4.0)
    >>> s = solve(p)
    >>> s.choice, s.cost, s.method
    ((1,), 5.0, <Method.EXACT: 'exact'>)
    """
    options = Options() if options is None else options
    if problem.budget is None:
        return relax(problem, options)
    check_room(problem)
    search = _Search(problem, relax, options, above)
    search.lines = None if warm is None else warm.lines
    state = None if warm is None else warm.search
    if state:
        tree = search.resume(state)
    else:
        for seed in seeds:
            search.at(0.0, {v: frozenset({k}) for v, k in seed.items()})
        tree = search.start(final)
    if options.repair:
        search.repair()
    if mix is not None:  # before any branching: a mix that meets the bound ends it
        mixed = mix(problem, list(search.seen)[-_MIX:])
        if mixed is not None:
            search._costed(tuple(mixed))
    best, bound = search.run(tree, options.max_branches, options.gap)
    if state is not None:
        state.update(tree=tree, solves=search.solves, fits=search.fits)
    method = (
        Method.EXACT
        if best.cost - bound <= 1e-12 * max(abs(best.cost), 1e-30)
        else Method.LAGRANGIAN
    )
    multiplier = float(tree.get("multiplier", 0.0))
    return Solution(best.choice, best.cost, min(bound, best.cost), method, multiplier=multiplier)


def _condition(un: list, pairs: dict, allowed: dict[int, frozenset]) -> tuple[list, dict]:
    """The problem with the variables a branch decides folded into their neighbours: a
    pairwise term with a decided side becomes a unary one of the other side (what a fixed
    argument is to the planner), so the solver sees the smaller problem."""
    import numpy as np

    decided = {v: next(iter(ks)) for v, ks in allowed.items() if len(ks) == 1}
    if not decided:
        return un, pairs
    un = list(un)
    kept = {}
    for (a, b), m in pairs.items():
        if a not in decided and b not in decided:
            kept[(a, b)] = m
            continue
        m = np.asarray(m, dtype=float)
        if a in decided and b in decided:
            un[a] = un[a] + m[decided[a], decided[b]]
        elif a in decided:
            un[b] = un[b] + m[decided[a], :]
        else:
            un[a] = un[a] + m[:, decided[b]]
    return un, kept


class _Search:
    """The relaxation's solves over one problem, counted (a search's working memory).

    A branch is a map variable -> the options it may still take (the others are
    penalized out of the relaxation).
    """

    def __init__(self, problem: Problem, relax, options: Options, above: Problem | None) -> None:
        self.problem, self.relax, self.options = problem, relax, options
        self.un, self.pairs, self.w = list(problem.unary), problem.pairs, problem.weights()
        self.spread_of = problem if above is None else above
        # folding a branch's decided variables into pairwise terms is only right for a
        # pairwise problem: a solver of shared moves sees the whole problem
        self.condition = not problem.values
        self.cost = problem.evaluate
        self.budget = problem.budget
        self.solves = 0
        self.best: _Point | None = None
        self._heavy: float | None = None
        self._spread: float | None = None  # the costs' and the bytes' spreads
        self._bytes = 0.0
        self.fits: dict[tuple[int, ...], None] = {}  # the choices seen within the budget
        self.seen: dict[tuple[int, ...], None] = {}  # the relaxation's choices, in order
        self.lines: dict | None = None  # the root dual's two sides, kept for the next search
        self.lightest = [float(x.min()) for x in self.w]
        # CPU seconds, not the wall clock's: a loaded machine cuts no search shorter
        self.deadline = (
            math.inf if options.max_seconds is None else time.process_time() + options.max_seconds
        )

    def repair(self, count: int = _REPAIRED) -> None:
        """The cheapest ``count`` choices the relaxation returned over the budget, each
        brought within it a variable at a time and improved there
        (:func:`._local_search.repair_within`): the Lagrangian's minimizers jump from
        over the budget to far under it, and a plan just within it lies between."""
        over = [c for c in self.seen if c not in self.fits]
        for choice in sorted(over, key=self.cost)[:count]:
            fixed = repair_within(self.problem, choice)
            if fixed is not None:
                self._costed(fixed)

    def late(self) -> bool:
        """Whether the search's time (``options.max_seconds`` of CPU) is spent."""
        return time.process_time() > self.deadline

    def memory(self, choice) -> float:
        return float(sum(self.w[v][k] for v, k in enumerate(choice)))

    def heavy(self) -> float:
        """A multiplier under which any memory saved outweighs any cost: the relaxation
        then returns a lightest choice (and, among those, a cheapest)."""
        import numpy as np

        if self._heavy is None:
            spread = sum(float(u.max() - u.min()) for u in self.spread_of.unary)
            spread += sum(float(np.max(m) - np.min(m)) for m in self.spread_of.pairs.values())
            steps = [np.diff(np.unique(x)) for x in self.w]
            step = min((float(d.min()) for d in steps if d.size), default=1.0)
            self._heavy = 2.0 * (spread + 1e-30) / step
        return self._heavy

    def _rows(self, lam: float, allowed: dict[int, frozenset]) -> list | None:
        """The relaxation's unary rows; None when the branch admits no choice in budget.

        Options that cannot fit whatever the others choose (heavier than the budget's
        slack over the lightest choice) are excluded too: that tightens the bound and
        leaves the constrained minimum alone.
        """
        import numpy as np

        light = list(self.lightest)
        for v, ks in allowed.items():
            light[v] = min(float(self.w[v][k]) for k in ks)
        slack = self.budget - sum(light)
        if slack < -1e-9 * max(self.budget, 1.0):
            return None
        rows = []
        for v, (u, x) in enumerate(zip(self.un, self.w, strict=True)):
            row = u + lam * x if lam else u
            out = x - light[v] > slack * (1 + 1e-12) + 1e-9
            if v in allowed:
                out = out | ~np.isin(np.arange(len(x)), list(allowed[v]))
            if out.any():
                row = row + self.penalty(lam) * out
            rows.append(row)
        return rows

    def penalty(self, lam: float) -> float:
        """What an excluded option pays in the relaxation at ``lam``: more than any two
        choices' costs plus ``lam`` times their bytes differ (so an exact relaxation
        never takes it while the branch has a choice), and no more (a penalty of 1e30
        left the relaxation's bound to rounding: 160 claimed where a choice of the branch
        cost 110). A pairwise problem keeps 1e30: eliminated exactly, it needs none."""
        if self.condition:  # pairwise: exact elimination compares sums, no rounding
            return 1e30
        if self._spread is None:
            import numpy as np

            spread = sum(float(u.max() - u.min()) for u in self.spread_of.unary if len(u))
            spread += sum(float(np.max(m) - np.min(m)) for m in self.spread_of.pairs.values())
            self._spread = spread
            self._bytes = sum(float(x.max() - x.min()) for x in self.w if len(x))
        total = self._spread + lam * self._bytes
        return 4.0 * total + 1e-9 * max(total, 1e-30) + 1e-30

    def at(
        self, lam: float, allowed: dict[int, frozenset], options: Options | None = None
    ) -> tuple[_Point | None, float]:
        """The relaxation at ``lam`` within a branch: its minimizer and its bound
        (``options``: the solver's in place of the search's)."""
        un = self._rows(lam, allowed)
        if un is None:
            return None, math.inf
        if self.condition:
            un, pairs = _condition(un, self.pairs, allowed)
            relaxed = Problem(un, pairs)
        else:
            relaxed = attrs.evolve(self.problem, unary=un, budget=None)
        sol = self.relax(relaxed, self.options if options is None else options)
        self.solves += 1
        p = _Point(sol.choice, self.cost(sol.choice), self.memory(sol.choice))
        self.seen[p.choice] = None
        if any(p.choice[v] not in ks for v, ks in allowed.items()):
            # outside the branch: its bound still bounds the branch (the penalty only
            # raises the others), but an inexact solver proves no branch empty
            return None, sol.bound - lam * self.budget
        self._offer(p)
        return p, sol.bound - lam * self.budget

    def dual(
        self, allowed: dict[int, frozenset]
    ) -> tuple[float, float, _Point | None, _Point | None]:
        """The Lagrangian dual's maximum within a branch: (bound, the maximizing
        multiplier, the over-budget and within-budget minimizers there). At the root,
        from the two sides a last search's root left (``lines``), costed anew, if any."""
        lines = self.lines if not allowed and self.lines is not None else {}
        if "lo" in lines:
            lo, hi = (self._costed(lines[k]) for k in ("lo", "hi"))
            out = self._intersect(allowed, -math.inf, lo, hi)
            if out[0] > -math.inf:  # else no solve ran: from the start
                return self._keep(lines, out)
        lo, bound = self.at(0.0, allowed)
        if lo is None or lo.memory <= self.budget:
            return bound, 0.0, lo, lo
        lam_hi = self.heavy()
        hi, b_hi = self.at(lam_hi, allowed)  # memory first: the lightest choice
        if hi is None:  # the relaxation left the branch: its bounds hold, nothing more
            return max(bound, b_hi), lam_hi, lo, None
        if hi.memory > self.budget:
            return math.inf, lam_hi, lo, None
        return self._keep(lines, self._intersect(allowed, bound, lo, hi))

    def _costed(self, choice) -> _Point:
        p = _Point(tuple(choice), self.cost(choice), self.memory(choice))
        self._offer(p)
        return p

    def _keep(self, lines: dict, out: tuple) -> tuple:
        if self.lines is not None and lines is self.lines:
            lines.update(lo=out[2].choice, hi=out[3].choice)
        return out

    def _intersect(self, allowed, bound, lo: _Point, hi: _Point) -> tuple:
        """The multiplier search between an over-budget and a within-budget choice."""
        lam = 0.0
        for _ in range(60):
            if lo.memory <= hi.memory or self.late():
                break
            lam = (hi.cost - lo.cost) / (lo.memory - hi.memory)
            if not lam > 0:
                break
            p, b = self.at(lam, allowed)
            bound = max(bound, b)
            line = hi.cost + lam * hi.memory
            if p is None or p.cost + lam * p.memory >= line - 1e-12 * max(abs(line), 1e-30):
                break  # no choice lies below both lines: lam maximizes the dual
            if p.memory > self.budget:
                lo = p
            else:
                hi = p
        return bound, lam, lo, hi

    def _close(self, bound: float, gap: float) -> bool:
        cost = abs(self.best.cost)
        return self.best.cost - bound <= max(gap * cost, 1e-12 * max(cost, 1e-30))

    def _offer(self, p: _Point) -> None:
        if p.memory <= self.budget * (1 + 1e-12):
            self.fits[p.choice] = None
            if self.best is None or p.cost < self.best.cost:
                self.best = p

    def start(self, final: Options | None) -> dict:
        """The search tree's root: the dual's maximum, and (``final``: the solver's
        options) one solve at its multiplier whose bound holds beside the tree's."""
        root, lam, lo, hi = self.dual({})
        if self.best is None:
            # an inexact solver can miss every choice within the budget (the heaviest
            # penalty still leaving a heavier option cheapest in its draft): the lightest
            # choice fits (check_room), each variable's cheapest of its lightest options
            self._costed(lightest_choice(self.problem))
        proven = self.at(lam, {}, final)[1] if final is not None else -math.inf
        # frontier entries: (bound, tie-break, branch, multiplier, lo, hi, refined); floor:
        # the least bound of the branches left without a proof
        return {
            "frontier": [(root, 0, {}, lam, lo, hi, True)],
            "closed": [],
            "floor": math.inf,
            "proven": proven,
            "count": 1,
            "multiplier": lam,
        }

    def resume(self, state: dict) -> dict:
        """The tree a last search left, its choices costed at today's prices, the
        branches it closed open again, and each to be bounded anew before it branches
        (its bound still true, but perhaps looser than today's prices allow)."""
        self.solves = state["solves"]
        for choice in state["fits"]:
            self._offer(_Point(choice, self.cost(choice), self.memory(choice)))
        tree = state["tree"]
        tree["frontier"] = [(*e[:6], False) for e in tree["frontier"] + tree["closed"]]
        tree["closed"] = []
        return tree

    def run(self, tree: dict, max_branches: int, gap: float = 0.0) -> tuple[_Point, float]:
        """(the best choice, a lower bound of the constrained minimum): best first over
        the ``tree``'s branches (updated in place); each branch's bound is the dual at its
        parent's multiplier until it is expanded, then its own dual's maximum."""
        frontier, proven = tree["frontier"], tree["proven"]
        while frontier:
            frontier.sort(key=lambda e: (e[0], e[1]))
            bound = max(proven, min(frontier[0][0], tree["floor"]))
            if self._close(bound, gap) or self.solves >= max_branches or self.late():
                return self.best, min(bound, self.best.cost)
            b, _, allowed, lam, lo, hi, refined = frontier.pop(0)
            if b < self.best.cost and not refined:
                rb, lam, lo, hi = self.dual(allowed)
                frontier.append((max(b, rb), tree["count"], allowed, lam, lo, hi, True))
                tree["count"] += 1
                continue
            if b >= self.best.cost:  # closed, unless a later call's best costs more
                tree["closed"].append((b, tree["count"], allowed, lam, lo, hi, False))
                tree["count"] += 1
                continue
            v = self._branch_var(allowed, lo, hi)
            if v is None:  # its memory decided: an inexact solver leaves its bound open
                tree["floor"] = min(tree["floor"], b)
                continue
            ks = allowed.get(v, frozenset(range(len(self.w[v]))))
            mine = lo is not None and lo.choice[v] in ks
            heavy = lo.choice[v] if mine else max(ks, key=lambda k: self.w[v][k])
            for part in (frozenset({heavy}), ks - {heavy}):
                child = {**allowed, v: part}
                _, cb = self.at(lam, child)
                if cb < math.inf:
                    frontier.append((max(b, cb), tree["count"], child, lam, lo, hi, False))
                    tree["count"] += 1
        return self.best, min(max(proven, tree["floor"]), self.best.cost)

    def _branch_var(self, allowed, lo, hi) -> int | None:
        """A free variable the two sides of the dual disagree on (else any undecided one)."""
        open_ = [
            v
            for v in range(len(self.w))
            if self.w[v].max() > self.w[v].min() and len(allowed.get(v, self.w[v])) > 1
        ]
        if hi is not None and lo is not None:
            # of those the two sides disagree on, the one whose choice moves most memory
            split = [v for v in open_ if lo.choice[v] != hi.choice[v]]
            if split:
                return max(
                    split, key=lambda v: abs(self.w[v][lo.choice[v]] - self.w[v][hi.choice[v]])
                )
        return open_[0] if open_ else None

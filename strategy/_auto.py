"""Auto-sharding: free arguments, their candidate layouts, and a choice under a memory budget.

:func:`~meshplan.strategy.plan_program` with ``choose=`` lets the planner pick the layouts
of some arguments (the parameters, typically): each free argument becomes one more
variable of the whole-program problem, its options the layouts of :func:`candidates`
(Replicate or Shard of any tensor dim on every mesh dim, and where several mesh dims
shard one tensor dim, each order of them: the ``StridedShard`` layouts FSDP over a
tensor-parallel split uses). An option is priced like an op that reads the argument's
gradient in the option's :func:`grad_spec` and hands the argument to its readers in the
option's spec: the moves to every reader and the gradient's move back (the data-parallel
reduction included) are terms of the objective like any other.

A ``memory_budget`` bounds the training state per rank (:mod:`._memory`), a sum over
arguments. :func:`solve_within` minimizes the modeled step time subject to it by
Lagrangian relaxation: for a multiplier ``lam >= 0`` the minimum of ``cost + lam *
(memory - budget)`` over *all* choices is a lower bound of the constrained minimum, and
a choice it returns that fits the budget is an upper bound. The multiplier is searched
by intersecting the lines of the cheapest over-budget and the cheapest within-budget
choices found (the dual is concave and piecewise linear: it reaches its maximum in
finitely many steps). Where a gap remains (the budget falls between two of the dual's
breakpoints) a best-first branch and bound over the free arguments closes it, each
branch bounded by the same relaxation, up to ``max_branches`` solves or until the gap
is within ``gap`` of the cost; the gap left, if any, is what ``Solution.lower_bound``
reports. With an inexact solver the search's solves may be cheap drafts: one costlier
solve at the root's multiplier then gives the bound (``final``), and a search can go on
over calls whose objective only rises (``state``: the lazily priced rounds of a
program, whose bound prices become exact ones).

Repeated layers are not forced to share a layout. Sharing is exact when identical
layers (identical subgraphs between identical boundary specs) each minimize the
relaxation on their own at the multiplier that closes the dual with no gap, and that
minimizer is unique: then every layer takes it. When the budget falls between two
breakpoints of the dual, the constrained minimum may split the budget unevenly between
identical layers (one layer's norms replicated, the next one's sharded), and forcing
them equal would cost more.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections.abc import Callable, Collection, Sequence

import attrs

from meshplan.errors import PlacementError, StrategyError
from meshplan.placement import Replicate, Shard, Spec

from ._candidates import Option
from ._memory import state_bytes
from ._solve import Solution, total

__all__ = [
    "candidates",
    "free_options",
    "free_grad_terms",
    "memory_weights",
    "resolve_choose",
    "solve_within",
    "min_memory_choice",
]

_PENALTY = 1e30  # added to the options a branch excludes


def resolve_choose(choose, n_args: int, names: Sequence[str] | None = None) -> tuple[int, ...]:
    """The sorted argument indices ``choose`` names: indices, or (given ``names``) argument
    names and glob patterns such as ``"h*.w1"``.

    >>> resolve_choose([2, 0], 3)
    (0, 2)
    >>> resolve_choose(["w*"], 3, names=["x", "w1", "w2"])
    (1, 2)
    """
    if choose is None:
        return ()
    if isinstance(choose, str | int):
        choose = (choose,)
    if not isinstance(choose, Collection):
        raise StrategyError(
            f"choose must be a collection of argument indices (or names), got {choose!r}",
            value=choose,
        )
    out: set[int] = set()
    for item in choose:
        if isinstance(item, bool):
            raise StrategyError(f"choose: {item!r} is not an argument index", value=item)
        if isinstance(item, int):
            if not -n_args <= item < n_args:
                raise StrategyError(
                    f"choose: argument {item} is out of range for {n_args} arguments", value=item
                )
            out.add(item % n_args)
        elif isinstance(item, str) and names is not None:
            hits = [i for i, name in enumerate(names) if fnmatch.fnmatchcase(name, item)]
            if not hits:
                raise StrategyError(
                    f"choose: {item!r} matches no argument name (names: {list(names)[:8]!r}...)",
                    value=item,
                )
            out.update(hits)
        else:
            raise StrategyError(
                f"choose: {item!r} is not an argument index"
                + ("" if names is None else " or name pattern"),
                value=item,
            )
    return tuple(sorted(out))


def candidates(spec: Spec) -> tuple[Spec, ...]:
    """Every layout the planner may give a free argument shaped like ``spec``.

    Per mesh dim Replicate or Shard of any tensor dim; where several mesh dims shard one
    tensor dim, every order of them. Replicated first; no Partial (a stored parameter
    is whole). Equivalent layouts appear once.

    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2,))
    >>> [str(s) for s in candidates(Spec(mesh, [Replicate()], (4, 6)))]
    ['f32[4,6](R)', 'f32[4,6](S(0))', 'f32[4,6](S(1))']
    """
    mesh = spec.mesh
    per_dim = [
        [Replicate()] + ([Shard(d) for d in range(len(spec.shape))] if size > 1 else [])
        for size in mesh.shape
    ]
    out: dict[Spec, None] = {}
    for placements in itertools.product(*per_dim):
        by_dim: dict[int, list[int]] = {}
        for m, p in enumerate(placements):
            if isinstance(p, Shard):
                by_dim.setdefault(p.dim, []).append(m)
        multi = [(d, ms) for d, ms in by_dim.items() if len(ms) > 1]
        orders = itertools.product(*(itertools.permutations(ms) for _, ms in multi))
        for order in orders:
            shard_order = {d: o for (d, _), o in zip(multi, order, strict=True)}
            try:
                cand = Spec(mesh, placements, spec.shape, spec.dtype, shard_order or None)
            except PlacementError:
                continue
            out.setdefault(cand, None)
    return tuple(out)


def free_options(spec: Spec) -> tuple[Option, ...]:
    """A free argument's options: read its gradient in a candidate, hand out the candidate."""
    return tuple(Option((c,), (c,), 0.0) for c in candidates(spec))


def free_grad_terms(graph, free, fixed, var, sid) -> list[tuple]:
    """The terms moving each free argument's gradient into its option's grad spec: the
    option reads it as its one input (from a fixed value, or from the op producing it)."""
    terms = []
    for i in free:
        v, a = graph.grads[i], var[graph.args[i]]
        if v is None:
            continue
        if v.node in fixed:
            terms.append(("fixed", a, 0, sid(fixed[v.node])))
        else:
            terms.append(("pair", var[v.node], v.index, a, 0))
    return terms


def memory_weights(arg_specs, differentiated, free, free_opts, call_sizes, per_param, budget):
    """(each variable's options' state bytes, the fixed arguments' bytes): the calls weigh
    nothing, a free argument's option its state in that layout. Raises when even the
    lightest choice exceeds ``budget``, naming the smallest feasible one."""
    import numpy as np

    fixed_bytes = sum(
        state_bytes(s, d, per_param)
        for i, (s, d) in enumerate(zip(arg_specs, differentiated, strict=True))
        if i not in free
    )
    weights = [np.zeros(k) for k in call_sizes]
    weights += [
        np.array([state_bytes(o.output_specs[0], differentiated[i], per_param) for o in opts])
        for i, opts in zip(free, free_opts, strict=True)
    ]
    least = fixed_bytes + min_memory_choice(weights)
    if budget is not None and least > budget:
        raise StrategyError(
            f"memory_budget={budget:.0f} bytes per rank is infeasible: the smallest feasible "
            f"budget for this program is {least:.0f} bytes (fixed arguments {fixed_bytes:.0f}, "
            "free ones at their most sharded); raise the budget or free more arguments",
            value=budget,
        )
    return weights, fixed_bytes


def min_memory_choice(weights: Sequence[Sequence[float]]) -> float:
    """The least memory any choice takes (each variable at its lightest option)."""
    return float(sum(min(w) for w in weights))


def budget_binds(weights: Sequence[Sequence[float]], budget: float | None) -> bool:
    """Whether ``budget`` rules out any choice (the heaviest choice does not fit)."""
    if budget is None:
        return False
    return float(sum(max(w, default=0.0) for w in weights)) > budget * (1 + 1e-12)


@attrs.frozen
class _Point:
    choice: tuple[int, ...]
    cost: float
    memory: float


def solve_within(
    solve: Callable[..., Solution],
    unary: Sequence,
    pairs: dict,
    weights: Sequence[Sequence[float]],
    budget: float | None,
    *,
    max_branches: int = 64,
    gap: float = 0.0,
    cost: Callable[[Sequence[int]], float] | None = None,
    seeds: Sequence[dict[int, int]] = (),
    final: dict | None = None,
    state: dict | None = None,
    lines: dict | None = None,
    **solve_kwargs,
) -> Solution:
    """The least-cost choice whose ``sum weights[v][x_v]`` is at most ``budget``.

    ``solve(unary, pairs, **solve_kwargs)`` is the unconstrained solver (any, returning a
    :class:`Solution` with a true lower bound); ``cost(choice)`` is the objective it
    minimizes (default: the pairwise total of ``unary`` and ``pairs``); ``budget=None``
    calls it once. The
    result's ``lower_bound`` bounds the constrained minimum (exact when the solver is and
    no gap is left). ``seeds`` are partial choices (variable -> option) completed by one
    solve each before the search: with an exact solver, a known layout that fits (the
    specs given by hand) is then never beaten by the result (an inexact one completes the
    seed as well as it can). The branching stops once the gap left is at most ``gap``
    times the cost of the best choice (0: until it is closed, or ``max_branches`` solves
    ran). ``final``: keyword arguments of one more solve at the root's maximizing
    multiplier, before any branching (a solver's costlier, tighter bound: the search's
    solves may then be drafts whose bounds are loose). ``state``: a dict carried between
    calls on one problem whose objective only rises from call to call (prices learned
    exactly where bounds stood): the search goes on where the last call left it, its
    bounds still true, its choices costed anew, ``max_branches`` solves in all.
    ``lines``: a dict carried between calls on one problem (any objective): the root's
    multiplier search starts from the choices on both sides of the budget that the last
    call's ended with (every bound still from a solve of this call).

    >>> from meshplan.strategy._solve import solve
    >>> s = solve_within(solve, [[0.0, 5.0]], {}, [[10.0, 1.0]], 4.0)
    >>> s.choice, s.cost, s.method
    ((1,), 5.0, 'exact')
    """
    import numpy as np

    if budget is None:
        return solve(unary, pairs, **solve_kwargs)
    un = [np.asarray(u, dtype=float) for u in unary]
    w = [np.asarray(x, dtype=float) for x in weights]
    least = min_memory_choice(w)
    if least > budget * (1 + 1e-12):
        raise StrategyError(
            f"no choice fits the memory budget: the least the free arguments can take is "
            f"{least:.0f} bytes per rank, the budget leaves {budget:.0f}",
            value=budget,
        )
    if not (isinstance(gap, int | float) and 0 <= gap < 1):
        raise StrategyError(f"gap must be a fraction in [0, 1), got {gap!r}", value=gap)
    search = _Search(solve, un, pairs, w, budget, solve_kwargs, cost)
    search.lines = lines
    if state:
        tree = search.resume(state)
    else:
        for seed in seeds:
            search.at(0.0, {v: frozenset({k}) for v, k in seed.items()})
        tree = search.start(final)
    best, bound = search.run(tree, max_branches, gap)
    if state is not None:
        state.update(tree=tree, solves=search.solves, fits=search.fits)
    gap_free = best.cost - bound <= 1e-12 * max(abs(best.cost), 1e-30)
    method = "exact" if gap_free else "lagrangian bound + branch and bound"
    multiplier = float(tree.get("multiplier", 0.0))
    return Solution(best.choice, best.cost, min(bound, best.cost), method, multiplier)


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

    def __init__(self, solve, un, pairs, w, budget, solve_kwargs, cost=None) -> None:
        self.solve, self.un, self.pairs, self.w = solve, un, pairs, w
        # a solver of its own objective (``cost``) sees the whole problem: folding a
        # branch's decided variables into pairwise terms is only right for the pairwise one
        self.condition = cost is None
        self.cost = cost or (lambda choice: total(choice, un, pairs))
        self.budget, self.kwargs = budget, solve_kwargs
        self.solves = 0
        self.best: _Point | None = None
        self._heavy: float | None = None
        self.fits: dict[tuple[int, ...], None] = {}  # the choices seen within the budget
        self.lines: dict | None = None  # the root dual's two sides, kept for the next search
        self.lightest = [float(x.min()) for x in w]

    def memory(self, choice) -> float:
        return float(sum(self.w[v][k] for v, k in enumerate(choice)))

    def heavy(self) -> float:
        """A multiplier under which any memory saved outweighs any cost: the relaxation
        then returns a lightest choice (and, among those, a cheapest)."""
        import numpy as np

        if self._heavy is None:
            spread = sum(float(u.max() - u.min()) for u in self.un)
            spread += sum(float(np.max(m) - np.min(m)) for m in self.pairs.values())
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
                row = row + _PENALTY * out
            rows.append(row)
        return rows

    def at(
        self, lam: float, allowed: dict[int, frozenset], kwargs: dict | None = None
    ) -> tuple[_Point | None, float]:
        """The relaxation at ``lam`` within a branch: its minimizer and its bound
        (``kwargs``: the solver's keyword arguments in place of the search's)."""
        un = self._rows(lam, allowed)
        if un is None:
            return None, math.inf
        problem = _condition(un, self.pairs, allowed) if self.condition else (un, self.pairs)
        sol = self.solve(*problem, **(self.kwargs if kwargs is None else {**self.kwargs, **kwargs}))
        self.solves += 1
        p = _Point(sol.choice, self.cost(sol.choice), self.memory(sol.choice))
        if any(p.choice[v] not in ks for v, ks in allowed.items()):
            return None, math.inf  # every choice of the branch is excluded
        self._offer(p)
        return p, sol.lower_bound - lam * self.budget

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
        if hi is None or hi.memory > self.budget:
            return math.inf, lam_hi, lo, None
        return self._keep(lines, self._intersect(allowed, bound, lo, hi))

    def _costed(self, choice) -> _Point:
        p = _Point(choice, self.cost(choice), self.memory(choice))
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
            if lo.memory <= hi.memory:
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

    def start(self, final: dict | None) -> dict:
        """The search tree's root: the dual's maximum, and (``final``: the solver's
        keyword arguments) one solve at its multiplier whose bound holds beside the tree's."""
        root, lam, lo, hi = self.dual({})
        if self.best is None:  # only an inexact solver misses the lightest choice
            raise StrategyError(
                "the solver found no choice within the memory budget although the lightest "
                "fits; raise max_factor so that it solves exactly",
                value=self.budget,
            )
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
            if self._close(bound, gap) or self.solves >= max_branches:
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
            heavy = lo.choice[v] if lo.choice[v] in ks else max(ks, key=lambda k: self.w[v][k])
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

"""Choosing the cheapest strategy: :class:`Choice`, :func:`select` (search or enumerate).

The price of an N-D strategy is what redistributing every input to the strategy's
input specs costs under the planner's cost model (the built-in rules run the op
locally, so the op itself adds no communication). ``"enumerate"`` prices every
combination of single-dim strategies. ``"search"`` finds the same minimum while
pricing few of them: each mesh dim's strategies are sorted by a lower bound of what
they cost on that dim (zero for keeping the current placements), combinations are
generated in order of their summed bounds, from the current placements outward,
each popped combination is priced exactly, and the search stops when the cheapest
priced one costs no more than the next bound — a proven minimum. Ties break on the
rules' order (mesh dim 0 first), never on hash order, so both methods return the
same strategy.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError, StrategyError
from meshplan.placement import Partial, Replicate, Shard, Spec, dtype_itemsize

from ..rules._ruleset import RuleSet
from ._expand import Candidate, Strategy, candidates, realize
from ._price import (
    _dim_steps,
    _share,
    check_model,
    check_planner,
    input_bound,
    redistribute_cost,
    transition_bound,
)
from ._problem import OpProblem, prepare

__all__ = ["Choice", "select", "METHODS", "clear_strategy_cache"]

METHODS = ("search", "enumerate")


class _Way(enum.Enum):
    """How :func:`select` searches (``method=``, one of :data:`METHODS`)."""

    SEARCH = "search"
    ENUMERATE = "enumerate"


@attrs.frozen(repr=False)
class Choice:
    """The selected strategy with its price and how much work finding it took.

    ``cost`` is the total price in seconds: ``input_costs`` per input, plus
    ``future_cost``, what reducing a Partial output will cost (its cheapest reduction to
    Shard or Replicate; zero when the caller said the consumer accepts Partial).
    ``visited`` counts the combinations (states) examined, ``priced`` the
    redistributions priced with the planner, ``states`` the size of the full enumeration.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2))
    >>> a = Spec(mesh, (Shard(0), Replicate()), (8, 4))
    >>> b = Spec(mesh, (Replicate(), Replicate()), (4, 6))
    >>> c = select("mm", (a, b))
    >>> print(c.output_spec)
    f32[8,6](S(0) R)
    >>> c.cost, c.visited
    (0.0, 1)
    """

    strategy: Strategy
    cost: float
    input_costs: tuple[float, ...]
    visited: int
    priced: int
    states: int
    method: str
    future_cost: float = 0.0

    @property
    def input_specs(self) -> tuple[Spec, ...]:
        """What each input must be redistributed to."""
        return self.strategy.input_specs

    @property
    def output_specs(self) -> tuple[Spec, ...]:
        return self.strategy.output_specs

    @property
    def output_spec(self) -> Spec:
        return self.strategy.output_spec

    def __repr__(self) -> str:
        return (
            f"Choice({self.strategy}, cost={self.cost:.3g}, visited={self.visited}/"
            f"{self.states}, method={self.method!r})"
        )


class _Pricer:
    """Exact input prices (memoized per target within one selection) and their bounds."""

    def __init__(
        self, problem: OpProblem, model: Any, accept_partial: bool = False, planner: Any = None
    ) -> None:
        self.problem = problem
        self.model = model
        self.planner = planner
        self.accept_partial = accept_partial
        self.futures: dict[Candidate, float] = {}
        self.memo: dict[tuple[int, Spec], float] = {}
        for i, src in enumerate(problem.sources):
            self.memo[(i, src)] = 0.0

    def known(self, i: int, spec: Spec) -> float | None:
        return self.memo.get((i, spec))

    def price(self, i: int, spec: Spec) -> float:
        key = (i, spec)
        c = self.memo.get(key)
        if c is None:
            c = redistribute_cost(self.problem.sources[i], spec, self.model, self.planner)
            self.memo[key] = c
        return c

    def future(self, cand: Candidate) -> float:
        """What reducing the candidate's Partial outputs will cost (0 if accepted/none)."""
        if self.accept_partial or not any(
            isinstance(p, Partial) for pl in cand.output_placements for p in pl
        ):
            return 0.0
        c = self.futures.get(cand)
        if c is None:
            strategy = realize(self.problem, cand)
            c = sum(reduction_cost(s, self.model, self.planner) for s in strategy.output_specs)
            self.futures[cand] = c
        return c

    def bound(self, i: int, spec: Spec) -> float:
        return input_bound(self.problem.sources[i], spec.placements, self.model)

    def priced(self) -> int:
        return len(self.memo) - len(self.problem.sources)


def select(
    op: str,
    input_specs: Sequence[Spec],
    ruleset: RuleSet | None = None,
    cost_model: Any = None,
    method: str = "search",
    accept_partial: bool = False,
    planner: Any = None,
    **args: Any,
) -> Choice:
    """The strategy of minimum total cost for ``op`` on inputs laid out as ``input_specs``.

    ``method="search"`` (default) visits few combinations and proves its answer
    minimal; ``"enumerate"`` prices all of them. Both return the same strategy.

    With no consumer known, a Partial output carries the price of its cheapest
    reduction (to Shard or Replicate on each Partial mesh dim): a partial sum is cheap
    now and dear later, and that later is counted. ``accept_partial=True`` says the
    consumer takes Partial values as they are (a linear op, or a whole-program
    planner pricing the consumer itself). Redistributions are priced by ``planner`` (a
    :class:`meshplan.redistribute.Planner`; the default one when None), which remembers
    their plans.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2, 2))
    >>> a = Spec(mesh, (Shard(1), Replicate(), Replicate()), (64, 32))
    >>> b = Spec(mesh, (Replicate(), Replicate(), Shard(1)), (32, 16))
    >>> c = select("mm", (a, b), accept_partial=True)  # slice b's rows: a Partial output
    >>> print(c.input_specs[1], c.output_spec)
    f32[32,16](S(0) R S(1)) f32[64,16](P(sum) R S(1))
    >>> c = select("mm", (a, b))   # reducing that Partial later costs more: gather b's rows
    >>> print(c.input_specs[1], c.output_spec)
    f32[32,16](R R S(1)) f32[64,16](S(0) R S(1))
    >>> c.cost == select("mm", (a, b), method="enumerate").cost, c.visited < c.states
    (True, True)
    """
    if method not in METHODS:
        raise StrategyError(f"unknown method {method!r}; use one of {METHODS!r}", value=method)
    if not isinstance(accept_partial, bool):
        raise StrategyError(
            f"accept_partial must be True or False, got {accept_partial!r}", value=accept_partial
        )
    model = check_model(cost_model)
    problem = prepare(op, input_specs, ruleset, args)
    pricer = _Pricer(problem, model, accept_partial, check_planner(planner))
    if _Way(method) is _Way.ENUMERATE:
        return _enumerate(problem, pricer)
    return _search(problem, pricer)


def _choice(
    problem: OpProblem, pricer: _Pricer, cand: Candidate, visited: int, method: str
) -> Choice:
    costs = tuple(pricer.price(i, s) for i, s in enumerate(cand.input_specs))
    strategy = realize(problem, cand)
    future = pricer.future(cand)
    return Choice(
        strategy,
        sum(costs) + future,
        costs,
        visited,
        pricer.priced(),
        problem.n_states(),
        method,
        future,
    )


def _enumerate(problem: OpProblem, pricer: _Pricer) -> Choice:
    best: tuple[float, Candidate] | None = None
    visited = 0
    for combo in itertools.product(*(range(len(r)) for r in problem.dim_rules)):
        visited += 1
        for cand in candidates(problem, combo):
            total = sum(pricer.price(i, s) for i, s in enumerate(cand.input_specs))
            total += pricer.future(cand)
            if best is None or total < best[0]:
                best = (total, cand)
    if best is None:
        raise StrategyError(f"{problem.op}: no valid strategy at all", value=problem)
    return _choice(problem, pricer, best[1], visited, "enumerate")


_BOUND, _REFINED, _PARTIAL, _EXACT = 0, 1, 2, 3


def _search(problem: OpProblem, pricer: _Pricer) -> Choice:
    model = pricer.model
    srcs = problem.sources
    k_in = len(srcs)
    # per mesh dim: each rule's lower bound, and the rules sorted by it
    bounds: list[list[float]] = []
    orders: list[list[int]] = []
    for m, rules in enumerate(problem.dim_rules):
        seen: dict[tuple[int, Any], float] = {}
        lb = []
        for r in rules:
            total = 0.0
            for i, p in enumerate(r.inputs):
                b = seen.get((i, p))
                if b is None:
                    b = seen[(i, p)] = transition_bound(srcs[i], m, p, model)
                total += b
            if not pricer.accept_partial:
                total += _future_bound(problem, m, r, model)
            lb.append(total)
        bounds.append(lb)
        orders.append(sorted(range(len(rules)), key=lambda j, lb=lb: (lb[j], j)))
    n = len(bounds)
    heap: list[tuple] = []

    def push_combo(pos: tuple[int, ...], last: int) -> None:
        combo = tuple(orders[m][pos[m]] for m in range(n))
        key = sum(bounds[m][combo[m]] for m in range(n))
        heapq.heappush(heap, (key, _BOUND, combo, -1, (pos, last)))

    def push_refined(combo: tuple[int, ...]) -> None:
        # each input's whole-redistribution bound, before assembling anything
        rules = [problem.dim_rules[m][j] for m, j in enumerate(combo)]
        key = 0.0
        for i in range(k_in):
            key += input_bound(srcs[i], tuple(r.inputs[i] for r in rules), model)
        heapq.heappush(heap, (key, _REFINED, combo, -1, None))

    def push_candidate(combo: tuple[int, ...], v: int, cand: Candidate) -> None:
        # exact prices where known, bounds elsewhere: refined one input per pop
        key = 0.0
        kind = _EXACT
        for i, spec in enumerate(cand.input_specs):
            c = pricer.known(i, spec)
            if c is None:
                c = pricer.bound(i, spec)
                kind = _PARTIAL
            key += c
        if kind == _EXACT:
            key = sum(pricer.price(i, s) for i, s in enumerate(cand.input_specs))
            key += pricer.future(cand)
        heapq.heappush(heap, (key, kind, combo, v, cand))

    push_combo((0,) * n, 0)
    visited = 0
    while heap:
        key, kind, combo, v, payload = heapq.heappop(heap)
        if kind == _EXACT:
            return _choice(problem, pricer, payload, visited, "search")
        if kind == _PARTIAL:
            for i, spec in enumerate(payload.input_specs):
                if pricer.known(i, spec) is None:
                    pricer.price(i, spec)  # one planner call, then back in line
                    break
            push_candidate(combo, v, payload)
        elif kind == _REFINED:
            for v, cand in enumerate(candidates(problem, combo)):
                push_candidate(combo, v, cand)
        else:
            visited += 1
            push_refined(combo)
            pos, last = payload
            for m in range(last, n):
                if pos[m] + 1 < len(orders[m]):
                    push_combo(pos[:m] + (pos[m] + 1,) + pos[m + 1 :], m)
    raise StrategyError(f"{problem.op}: no valid strategy at all", value=problem)


def _future_bound(problem: OpProblem, m: int, rule: Any, model: Any) -> float:
    """A lower bound of reducing the outputs a rule leaves Partial on mesh dim ``m``."""
    total = 0.0
    for out, p in zip(problem.outputs, rule.outputs, strict=False):
        if isinstance(p, Partial):
            nbytes = (
                dtype_itemsize(out.dtype) * math.prod(out.shape) / math.prod(problem.mesh.shape)
            )
            steps = _dim_steps(model, problem.mesh, m, nbytes)
            total += min(steps[4], steps[5]) / _share(problem.mesh, m)  # all_reduce, reduce_scatter
    return total * (1 - 1e-9)


def reduction_cost(spec: Spec, model: Any, planner: Any = None) -> float:
    """The cheapest reduction of ``spec``'s Partial dims, each to Replicate or a Shard.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.redistribute import CostModel
    >>> mesh = Mesh.create((2,))
    >>> reduction_cost(Spec(mesh, [Replicate()], (8,)), CostModel()) == 0.0
    True
    >>> reduction_cost(Spec(mesh, [Partial()], (8,)), CostModel()) > 0
    True
    """
    partial = [m for m, p in enumerate(spec.placements) if isinstance(p, Partial)]
    if not partial:
        return 0.0
    choices = [Replicate()] + [Shard(d) for d in range(len(spec.shape))]
    best = None
    for combo in itertools.product(choices, repeat=len(partial)):
        placements = list(spec.placements)
        for m, p in zip(partial, combo, strict=True):
            placements[m] = p
        try:
            target = Spec(spec.mesh, placements, spec.shape, spec.dtype)
        except PlacementError:
            continue
        c = redistribute_cost(spec, target, model, planner)
        if best is None or c < best:
            best = c
    return 0.0 if best is None else best


def clear_strategy_cache() -> None:
    """Forget every cached rule evaluation, assembly and price (the planner's plans stay)."""
    from . import _expand, _price, _problem

    for fn in (
        _problem._prepare,
        _expand.candidates,
        _expand._spec,
        _price._dim_bound,
        _price._dim_steps,
        _price.input_bound,
        _price.min_local_bytes,
        _price._n_sharding,
        _price._step_bound,
        _price._share,
    ):
        fn.cache_clear()

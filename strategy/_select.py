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

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.placement import Spec

from ._expand import Problem, Strategy, assemble, prepare
from ._price import default_model, redistribute_cost, transition_bound
from ._ruleset import RuleSet

__all__ = ["Choice", "select", "METHODS"]

METHODS = ("search", "enumerate")


@attrs.frozen(repr=False)
class Choice:
    """The selected strategy with its price and how much work finding it took.

    ``cost`` is the total price in seconds (``input_costs`` per input), ``visited``
    the combinations priced, ``states`` the size of the full enumeration.

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
    states: int
    method: str

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
    """Exact prices of combinations, memoized per input target within one selection."""

    def __init__(self, problem: Problem, model: Any) -> None:
        self.problem = problem
        self.model = model
        self.memo: dict[tuple[int, Spec], float] = {}

    def input_cost(self, i: int, spec: Spec) -> float:
        key = (i, spec)
        c = self.memo.get(key)
        if c is None:
            c = redistribute_cost(self.problem.sources[i], spec, self.model)
            self.memo[key] = c
        return c

    def best(self, combo: tuple[int, ...]) -> tuple[float, int, Strategy, tuple[float, ...]] | None:
        """The cheapest shard-order variant of a combination (None if it has none)."""
        found = None
        for v, strategy in enumerate(assemble(self.problem, combo)):
            costs = tuple(self.input_cost(i, s) for i, s in enumerate(strategy.input_specs))
            total = sum(costs)
            if found is None or total < found[0]:
                found = (total, v, strategy, costs)
        return found


def select(
    op: str,
    input_specs: Sequence[Spec],
    ruleset: RuleSet | None = None,
    cost_model: Any = None,
    method: str = "search",
    **args: Any,
) -> Choice:
    """The strategy of minimum total cost for ``op`` on inputs laid out as ``input_specs``.

    ``method="search"`` (default) visits few combinations and proves its answer
    minimal; ``"enumerate"`` prices all of them. Both return the same strategy.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2, 2))
    >>> a = Spec(mesh, (Shard(1), Replicate(), Replicate()), (64, 32))
    >>> b = Spec(mesh, (Replicate(), Replicate(), Shard(1)), (32, 16))
    >>> c = select("mm", (a, b))   # slice b's rows locally: the output becomes Partial
    >>> print(c.input_specs[1], c.output_spec)
    f32[32,16](S(0) R S(1)) f32[64,16](P(sum) R S(1))
    >>> c.cost == select("mm", (a, b), method="enumerate").cost, c.visited < c.states
    (True, True)
    """
    if method not in METHODS:
        raise StrategyError(f"unknown method {method!r}; use one of {METHODS!r}", value=method)
    problem = prepare(op, input_specs, ruleset, args)
    pricer = _Pricer(problem, cost_model if cost_model is not None else default_model())
    if method == "enumerate":
        return _enumerate(problem, pricer)
    return _search(problem, pricer)


def _choice(problem: Problem, found, visited: int, method: str) -> Choice:
    total, _, strategy, costs = found
    return Choice(strategy, total, costs, visited, problem.n_states(), method)


def _enumerate(problem: Problem, pricer: _Pricer) -> Choice:
    best = None
    visited = 0
    for combo in itertools.product(*(range(len(r)) for r in problem.dim_rules)):
        visited += 1
        found = pricer.best(combo)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    if best is None:
        raise StrategyError(f"{problem.op}: no valid strategy at all", value=problem)
    return _choice(problem, best, visited, "enumerate")


def _search(problem: Problem, pricer: _Pricer) -> Choice:
    model = pricer.model
    srcs = problem.sources
    # per mesh dim: each rule's lower bound, and the rules sorted by it
    bounds: list[list[float]] = []
    orders: list[list[int]] = []
    for m, rules in enumerate(problem.dim_rules):
        lb = [
            sum(transition_bound(srcs[i], m, p, model) for i, p in enumerate(r.inputs))
            for r in rules
        ]
        bounds.append(lb)
        orders.append(sorted(range(len(rules)), key=lambda j, lb=lb: (lb[j], j)))
    n = len(bounds)

    def entry(pos: tuple[int, ...], last: int):
        combo = tuple(orders[m][pos[m]] for m in range(n))
        key = sum(bounds[m][combo[m]] for m in range(n))
        return (key, 0, combo, pos, last)

    heap: list[tuple] = [entry((0,) * n, 0)]
    visited = 0
    while heap:
        item = heapq.heappop(heap)
        if item[1] == 1:
            return _choice(problem, item[3], visited, "search")
        _, _, combo, pos, last = item
        visited += 1
        found = pricer.best(combo)
        if found is not None:
            heapq.heappush(heap, (found[0], 1, combo, found))
        for m in range(last, n):
            if pos[m] + 1 < len(orders[m]):
                nxt = pos[:m] + (pos[m] + 1,) + pos[m + 1 :]
                heapq.heappush(heap, entry(nxt, m))
    raise StrategyError(f"{problem.op}: no valid strategy at all", value=problem)

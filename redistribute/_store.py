"""The planner's memory: :class:`Planner`, the one object that owns every memo of ``plan``.

A plan is a pure function of its arguments; what makes planning fast is remembered
work, and all of it lives in a :class:`Planner`: the plans made, the search contexts
(one per :class:`~._engine._problem.Problem`) with their interned states and priced moves, the
shape-free moves the contexts of one mesh share, the all-pairs plan tables, the plans
shared across the tensor sizes of a family, the specs' encodings (and the specs and
steps of plans, decoded), and which mesh shapes a missed merge has warned about. ``plan(..., planner=None)`` uses the module's default
planner; ``plan(..., planner=Planner())`` plans with memos of its own, so nothing
another planner remembered (or forgot) reaches it. The answers are the same either way.

Thread safety: one lock per planner guards its stores (contexts, tables, families);
each context has its own lock, held while a search or table walk uses its memo tables
(a context's lock is taken before the planner's, never the other way round).
"""

from __future__ import annotations

import math
import sys
import threading

import attrs

from meshplan.errors import PlanError
from meshplan.layout._ints import brief
from meshplan.placement import Spec

from ._engine._context import Context, SharedMoves
from ._engine._encoding import State, decode, encode
from ._engine._family import Families
from ._engine._problem import Problem
from ._engine._table import TABLE_MODES, Tables
from ._steps import Step

__all__ = ["Planner", "SearchBudget", "default_planner", "STATE_BUDGET", "SECONDS_BUDGET"]

_PLANS_KEPT = 4096  # plans per planner before the oldest are dropped
_PRICES_KEPT = 65536  # plan prices (``plan_cost``) per planner
_PROGRAMS_KEPT = 64  # whole-program solves per planner
_CONTEXTS_KEPT = 256  # search contexts per planner
_ENCODED_KEPT = 65536  # spec encodings (and decodings, steps) per planner

STATE_BUDGET = 1_000_000
"""The default bound on the moves a search may generate before it settles for the best
plan it can prove a gap for (``Planner(max_states=...)``)."""

SECONDS_BUDGET = 0.5
"""The default bound on one plan's search time in seconds (``Planner(max_seconds=...)``):
calibrated on a 2-core machine shared by several jobs, where a search generates some
thousands of moves a second on a (2,)*8 mesh (the bound evaluation of a state costs about
as much at any tensor size, but large tensors make bandwidth, not launches, dominate the
prices, and the search then has many more near-equal plans to tell apart). With the greedy
search that follows a cut (twice the time) and, where that finds none, the plan through the
shard orders' common prefixes (two legs, a quarter of the time each, with their own greedy
searches), a plan's searches take at most about 2.25x this, 1.1 s: a hard pair on (2,)*8
plans in about 2 s with its bookkeeping."""


@attrs.frozen
class SearchBudget:
    """The effort one plan's search may spend: ``states`` moves generated and ``seconds``
    of time (each None: no bound). Past either, the planner takes the best plan a greedy
    search finds, with its proven gap (``Planner(on_budget=...)``).

    >>> SearchBudget(states=1000, seconds=0.25).describe(timed=True)
    'max_seconds=0.25'
    """

    states: int | None = STATE_BUDGET
    seconds: float | None = SECONDS_BUDGET

    def describe(self, timed: bool) -> str:
        """The limit a search ran past, as ``Planner``'s keyword says it."""
        return f"max_seconds={self.seconds!r}" if timed else f"max_states={self.states!r}"


def _check_seconds(value) -> float | None:
    """``Planner(max_seconds=...)``: None, or a finite number of seconds > 0."""
    if value is None:
        return None
    number = None
    if not isinstance(value, bool) and isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            number = None
    if number is None or not 0 < number < math.inf:
        raise PlanError(
            f"Planner(max_seconds=...) must be a finite number of seconds > 0 (at most "
            f"{sys.float_info.max:.2g}) or None (no bound), got {brief(value)}",
            value=value,
        )
    return number

ON_BUDGET = ("best", "raise")


class Planner:
    """Everything ``plan`` remembers, in one object.

    ``tables`` says when a search context builds its all-pairs plan table: ``"lazy"``
    (the default: once it has planned a few pairs by search, more for bigger state
    spaces: ``_table.lazy_pairs``), ``"eager"`` (before its first plan) or ``"off"``
    (never: every plan is searched). Each gives the very same plans.

    ``max_states`` bounds one plan's search: the moves (states reached) it may generate,
    :data:`STATE_BUDGET` by default (None: no bound); ``max_seconds`` its time,
    :data:`SECONDS_BUDGET` by default (None: no bound), so a plan takes a second or two
    on any input (``planner.budget``: the two as a :class:`SearchBudget`). Past either
    ``on_budget="best"`` (the default) returns a plan found by a greedy search (within the
    same budget, or ``_budgeted.GREEDY_ROOM`` moves if more) and warns
    with a :class:`~meshplan.errors.BudgetWarning` giving its proven gap to the cheapest
    plan; ``on_budget="raise"`` raises a :class:`PlanError` naming the limit. A plan made
    within the budget is the cheapest there is.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, Spec
    >>> from meshplan.redistribute import plan
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Shard(0)], (4,)), Spec(mesh, [Replicate()], (4,))
    >>> mine = Planner(tables="off")
    >>> plan(a, b, planner=mine) == plan(a, b)
    True
    >>> mine.clear()
    """

    def __init__(
        self,
        *,
        tables: str = "lazy",
        max_states: int | None = STATE_BUDGET,
        on_budget: str = "best",
        max_seconds: float | None = SECONDS_BUDGET,
    ) -> None:
        if not isinstance(tables, str) or tables not in TABLE_MODES:
            raise PlanError(
                f"Planner(tables=...) must be one of {TABLE_MODES!r}, got {tables!r}",
                value=tables,
            )
        if max_states is not None and (type(max_states) is not int or max_states < 1):
            raise PlanError(
                f"Planner(max_states=...) must be an int >= 1 or None (no bound), got "
                f"{max_states!r}",
                value=max_states,
            )
        if not isinstance(on_budget, str) or on_budget not in ON_BUDGET:
            raise PlanError(
                f"Planner(on_budget=...) must be one of {ON_BUDGET!r}, got {on_budget!r}",
                value=on_budget,
            )
        self.tables_mode = tables
        self.max_states = max_states
        self.max_seconds = _check_seconds(max_seconds)
        self.budget = SearchBudget(max_states, self.max_seconds)
        self.on_budget = on_budget
        self.lock = threading.Lock()
        # (src, dst, cost model, merge, bound, objective) -> (plan, merges a missing
        # alias kept apart, or None while not looked for)
        self.plans: dict = {}
        # (src, dst, cost model) -> ``plan_cost``'s price and the least any plan costs
        # (``price_bound``: below the price only where the budget cut the search)
        self.prices: dict = {}
        self.encoded: dict = {}  # Spec -> its State (``_encoding.encode``)
        self.decoded: dict = {}  # (mesh, shape, dtype, state) -> its Spec (``decode``)
        self.steps: dict = {}  # a Step's fields -> the Step
        self.contexts: dict = {}  # Problem -> its search Context
        self.moves = SharedMoves()  # shape-free moves, shared by the contexts of a mesh
        self.tables = Tables(self.lock, tables)  # all-pairs plan tables of contexts
        self.families = Families(self.lock)  # plans shared across tensor sizes
        self.warned: set = set()  # mesh shapes a missed merge has warned about
        self.cut_plans = 0  # plans made whose search the budget cut (never decreases)
        # whole-program solves (strategy's ``solve_lazily``): the content of a program's
        # objective -> the exact prices its solve learned and its answer
        self.programs: dict = {}

    def __repr__(self) -> str:
        return (
            f"Planner(tables={self.tables_mode!r}, max_states={self.max_states!r}, "
            f"max_seconds={self.max_seconds!r}, on_budget={self.on_budget!r}; "
            f"{len(self.plans)} plans, "
            f"{len(self.contexts)} contexts)"
        )

    def state(self, spec) -> State:
        """The encoded state of ``spec`` (memoized: specs are frozen, their hash cached)."""
        state = self.encoded.get(spec)
        if state is None:
            if len(self.encoded) >= _ENCODED_KEPT:
                self.encoded.clear()
            state = self.encoded[spec] = encode(spec)
        return state

    def spec(self, template, state) -> Spec:
        """The Spec of ``state`` for the tensor and mesh of ``template`` (memoized: plans
        of one context pass through the same specs)."""
        key = (template.mesh, template.shape, template.dtype, state)
        spec = self.decoded.get(key)
        if spec is None:
            if len(self.decoded) >= _ENCODED_KEPT:
                self.decoded.clear()
            spec = self.decoded[key] = decode(template, state)
        return spec

    def step(self, dims, src, dst, collective, alias=None) -> Step:
        """``Step(dims, src, dst, collective, alias)`` (memoized: plans share steps)."""
        key = (dims, src, dst, collective, alias)
        step = self.steps.get(key)
        if step is None:
            if len(self.steps) >= _ENCODED_KEPT:
                self.steps.clear()
            step = self.steps[key] = Step(dims, src, dst, collective, alias)
        return step

    def context(self, problem: Problem) -> Context:
        """The search context of ``problem`` (one per distinct problem)."""
        ctx = self.contexts.get(problem)
        if ctx is None:
            with self.lock:
                ctx = self.contexts.get(problem)
                if ctx is None:
                    if len(self.contexts) >= _CONTEXTS_KEPT:
                        del self.contexts[next(iter(self.contexts))]
                    ctx = self.contexts[problem] = Context(problem, self.moves)
        return ctx

    def remember(self, key: tuple, entry: tuple) -> None:
        """Keep a plan (``entry``) under its arguments (``key``)."""
        plans = self.plans
        with self.lock:
            while len(plans) >= _PLANS_KEPT:
                del plans[next(iter(plans))]
            plans[key] = entry

    def remember_price(self, key: tuple, price: tuple[float, float]) -> None:
        """Keep a plan's price and proven lower price (``price_bound``) under its
        arguments (``key``)."""
        prices = self.prices
        with self.lock:
            if len(prices) >= _PRICES_KEPT:
                prices.clear()
            prices[key] = price

    def remember_program(self, key: tuple, entry: tuple) -> None:
        """Keep a whole program's solve (``entry``) under its objective's content (``key``)."""
        programs = self.programs
        with self.lock:
            while len(programs) >= _PROGRAMS_KEPT:
                del programs[next(iter(programs))]
            programs[key] = entry

    def clear(self, *, tables: bool = True) -> None:
        """Forget the plans made, and with ``tables`` every other memo too: contexts, plan
        tables, shared moves and sizes, spec encodings (which mesh shapes have warned is
        kept: :meth:`forget_warnings`)."""
        with self.lock:
            self.plans.clear()
            self.prices.clear()
            self.programs.clear()
            if tables:
                self.encoded.clear()
                self.decoded.clear()
                self.steps.clear()
                self.contexts.clear()
                self.moves.clear()
        if tables:  # (each takes the lock itself)
            self.tables.clear()
            self.families.clear()

    def forget_warnings(self) -> None:
        """Forget which mesh shapes a missed merge warned about (the next one warns again)."""
        self.warned.clear()


_DEFAULT = Planner()


def default_planner() -> Planner:
    """The planner ``plan`` uses when given none."""
    return _DEFAULT

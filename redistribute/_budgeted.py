"""What a pair's plan does past its search budget (``Planner(max_states=...,
max_seconds=...)``): a greedy search in more room (:func:`bounded_search`), else the plan
through the shard orders' common prefixes (:func:`through_common_prefix`), and the
warning or error that says how far from the cheapest the plan found may be
(:func:`past_budget`), with the price every plan costs at least (:func:`proven_lower`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

from meshplan.errors import BudgetWarning, PlanError
from meshplan.placement import Replicate, Spec

from ._engine._search import GREEDY, OverBudget, search
from ._plan import Plan
from ._store import Planner, SearchBudget

__all__ = [
    "GREEDY_ROOM",
    "GREEDY_TIME",
    "LEG_SHARE",
    "bounded_search",
    "deadline_of",
    "leg_budget",
    "past_budget",
    "proven_lower",
    "through_common_prefix",
]

LegPlanner = Callable[[Spec, Spec], Plan]
"""Plans one leg ``(src, dst)`` within the budget (its warnings silenced by the caller)."""


def proven_lower(over: OverBudget) -> float:
    """The price every plan costs at least, by a search cut at its budget (the least rank
    left in its queue, taken down by more than the tie-breaking factors' share)."""
    return max(0.0, over.lower) * (1.0 - 1e-9)


def through_common_prefix(plan_leg: LegPlanner, src: Spec, dst: Spec) -> Plan | None:
    """A plan from ``src`` to ``dst`` in two legs, each planned on its own (within the
    budget): every mesh dim outside the shard orders' common prefixes gathered or reduced
    to Replicate, then sliced or made Partial as ``dst`` says (a plan that always exists,
    for when no search found one in its time); None when that middle spec is ``src`` or
    ``dst`` (the legs would be the same problem)."""
    keep: dict[int, tuple[int, ...]] = {}
    for d, chain in src.shard_order.items():
        other = dst.shard_order.get(d, ())
        k = 0
        while (
            k < min(len(chain), len(other))
            and chain[k] == other[k]
            and src.placements[chain[k]] == dst.placements[chain[k]]
        ):
            k += 1
        if k:
            keep[d] = chain[:k]
    kept = {m for chain in keep.values() for m in chain}
    placements = [p if m in kept else Replicate() for m, p in enumerate(src.placements)]
    mid = Spec(src.mesh, placements, src.shape, src.dtype, keep)
    if mid in (src, dst):
        return None
    with warnings.catch_warnings():  # (the whole plan's warning says what the legs cost)
        warnings.simplefilter("ignore", BudgetWarning)
        try:
            first = plan_leg(src, mid)
            # (a plan may stop at a spec of its target's layout that says it another way)
            end = first.steps[-1].dst if first.steps else src
            second = plan_leg(end, dst)
        except PlanError:  # a leg found no plan in its time: the caller's error names the pair
            return None
    return Plan(src, dst, first.steps + second.steps)


def past_budget(planner: Planner, src: Spec, dst: Spec, over: OverBudget, total) -> None:
    """Raise or warn for a plan the search budget cut short (``total``: the price of the
    plan found past it, None if none was)."""
    budget = planner.budget
    said = budget.describe(over.timed)  # the limit reached, as Planner's keyword
    limit = budget.seconds if over.timed else budget.states
    knob = said.partition("=")[0]
    if total is None and planner.on_budget != "raise":
        spent = f"in {said} s" if over.timed else f"within {said} moves"
        raise PlanError(
            f"planning {src} -> {dst} found no plan {spent} (neither the search, nor a greedy "
            f"search in {GREEDY_TIME:g}x that, nor the plan through the shard orders' common "
            f"prefixes; every plan costs at least {over.lower:.4g} s); raise the budget "
            f"(Planner({knob}=...), None for no bound)",
            value=limit,
        )
    if planner.on_budget == "raise" or total is None:
        spent = f"ran past {said} s" if over.timed else f"generated more than {said} moves"
        raise PlanError(
            f"planning {src} -> {dst} {spent} without proving a cheapest plan (every plan "
            f"costs at least {over.lower:.4g} s); raise the budget (Planner({knob}=...), "
            "None for no bound), or take the best plan found (Planner(on_budget='best'))",
            value=limit,
        )
    gap = max(0.0, total - over.lower)
    warnings.warn(
        BudgetWarning(
            f"planning {src} -> {dst} stopped at {said}: the plan found costs "
            f"{total:.4g} s, at most {gap:.3g} s above the cheapest (raise "
            f"Planner({knob}=...) for a proven minimum)",
            gap=gap,
            lower=over.lower,
            limit=limit,
        ),
        stacklevel=4,
    )


GREEDY_ROOM = 10_000
"""The least budget of the greedy search that follows a search past the budget."""

GREEDY_TIME = 2.0
"""The greedy search's time, in the budget's seconds (its heuristic costs as much a
state as the search's: it visits fewer states, not cheaper ones)."""


LEG_SHARE = 0.25
"""Each leg's share of the budget's seconds in the plan through the common prefix (two legs,
each with its greedy search: a plan past its budget takes at most ``1 + GREEDY_TIME +
2 * LEG_SHARE * (1 + GREEDY_TIME)`` times the budget's seconds)."""


def leg_budget(budget: SearchBudget) -> SearchBudget:
    """The budget of each leg of the plan through the common prefix: the same moves,
    :data:`LEG_SHARE` of the time (the first search and its greedy search spent theirs)."""
    seconds = None if budget.seconds is None else budget.seconds * LEG_SHARE
    return SearchBudget(budget.states, seconds)


def deadline_of(budget: SearchBudget, start: float, times: float = 1.0) -> float | None:
    """The instant (of ``time.thread_time``: CPU time) a search begun at ``start`` stops
    at, given ``times`` the budget's seconds."""
    return None if budget.seconds is None else start + budget.seconds * times


def bounded_search(budget: SearchBudget, ctx, start: int, goal, deadline: float | None):
    """``search`` within ``budget`` (its time up at ``deadline``): ``(found, None)``, or
    past it ``(found by a greedy search within the budget's moves, at least
    :data:`GREEDY_ROOM`, and twice its time, or None, the OverBudget)``."""
    states = budget.states
    try:
        return search(ctx, start, goal, budget=states, deadline=deadline), None
    except OverBudget as over:
        room = None if states is None else max(states, GREEDY_ROOM)
        more = deadline_of(budget, time.thread_time(), GREEDY_TIME)
        try:
            return search(ctx, start, goal, budget=room, weight=GREEDY, deadline=more), over
        except OverBudget:
            return None, over

"""``recompute=`` as a search over how many repeated layers a plan recomputes.

Under a ``memory_budget`` (``recompute="auto"``) the plan recomputing none is tried
first, then every layer, then halvings of the count; the bound reported holds over every
choice of recompute. Each plan comes from ``plan`` (the program planner, passed in: this
module sits below it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import attrs

from meshplan.errors import MemoryBudgetError

from ._graph import Graph
from ._program_value import Program, ProgramWarning
from ._recompute import with_recompute

__all__ = ["BISECTIONS", "RECOMPUTE_GAP", "plan_recompute"]


#: how many layer counts the budget's search over recompute halves (each a budgeted solve)
BISECTIONS = 3


def plan_recompute(
    plan: Callable[..., Program], graph: Graph, arg_specs, groups, mode: str, kwargs
) -> Program:
    """The plan of ``graph`` with its first ``k`` layers (``groups``) recomputed: every
    layer (``mode`` ``"always"``), or under a ``memory_budget`` the plan recomputing none
    if it fits within :data:`RECOMPUTE_GAP` of the bound below, else the cheapest of the
    plans recomputing every layer, none, and (when none does not fit) the fewest that fit
    as far as :data:`BISECTIONS` halvings of the count find it.

    The bound: a plan recomputing any layers costs at least the plan of the same layouts
    without recompute (the copies add compute and moves; a value's readers split between
    the original and its copy move it at least as often), and its peak is at least its
    training state; so the plan without recompute under ``state_budget`` = the peak's
    budget bounds every choice of recompute."""
    layers = len(groups)

    def plan_k(k: int) -> Program:
        g = graph if k == 0 else with_recompute(graph, groups[:k])
        # only every layer's infeasibility reaches the caller: the others' are not named
        return plan(g, arg_specs, name_least=k == layers, **kwargs)

    if mode == "always":
        return plan_k(layers)
    tried: dict[int, Program | MemoryBudgetError] = {}

    def attempt(k: int):
        if k not in tried:
            try:
                tried[k] = plan_k(k)
            except MemoryBudgetError as e:  # any other error reaches the caller
                tried[k] = e
        return tried[k]

    relaxed = dict(kwargs, state_budget=kwargs["memory_budget"], memory_budget=None)

    def bound_of_all() -> float | None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ProgramWarning)  # warned above already
                return plan(graph, arg_specs, name_least=False, **relaxed).lower_bound
        except MemoryBudgetError:  # the training state alone does not fit
            return None

    # the plan without recompute first: where it fits and costs within RECOMPUTE_GAP of
    # the bound over every choice of recompute, no recomputing plan is worth more solves
    none = attempt(0)
    bound = bound_of_all() if isinstance(none, Program) else None
    close = bound is not None and none.cost.total - bound <= RECOMPUTE_GAP * abs(none.cost.total)
    if not close:
        if isinstance(attempt(layers), MemoryBudgetError):
            raise attempt(layers)  # names the smallest budget, every layer recomputed
        if isinstance(none, MemoryBudgetError):
            lo, hi = 0, layers  # lo does not fit, hi does
            for _ in range(BISECTIONS):
                if hi - lo <= 1:
                    break
                mid = (lo + hi) // 2
                if isinstance(attempt(mid), MemoryBudgetError):
                    lo = mid
                else:
                    hi = mid
    fits = [p for p in tried.values() if isinstance(p, Program)]
    best = min(fits, key=lambda p: p.cost.total)
    if bound is None:
        bound = bound_of_all()
    if bound is None:
        bound = best.lower_bound
    bound = min(bound, best.lower_bound, best.cost.total)
    if best.cost.total - bound > 1e-9 * abs(best.cost.total) and best.exact:
        method = f"exact for its recompute ({len(tried)} of {layers + 1} layer counts tried)"
        best = attrs.evolve(best, method=method, exact=False)
    return attrs.evolve(best, lower_bound=bound)


#: ``recompute="auto"`` under a budget: a plan without recompute that fits and costs
#: within this fraction of the bound over every choice of recompute is kept without
#: planning any recomputing plan (none could be cheaper by more)
RECOMPUTE_GAP = 0.01

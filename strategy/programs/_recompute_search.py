"""``recompute=`` as a search over how many repeated layers a plan recomputes.

Under a ``memory_budget`` (``recompute="auto"``) the bound over every choice of
recompute is solved first, then the plan recomputing none, then every layer, then in
that plan's layouts halvings of the count (assembled and walked, not solved); each plan
takes that bound rather than bounding its own parts. Each plan comes from ``plan`` (the
program planner, passed in: this module sits below it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import attrs

from meshplan.errors import MemoryBudgetError

from ._graph import Graph
from ._program_value import Program, ProgramWarning
from ._recompute import recompute_origins

__all__ = ["RECOMPUTE_GAP", "fewest_recomputed", "plan_recompute"]


def plan_recompute(
    plan: Callable[..., Program], graph: Graph, arg_specs, groups, mode: str, kwargs
) -> Program:
    """The plan of ``graph`` with its first ``k`` layers (``groups``) recomputed: every
    layer (``mode`` ``"always"``), or under a ``memory_budget`` the plan recomputing none
    if it fits within :data:`RECOMPUTE_GAP` of the bound below, else the cheapest of the
    plan recomputing none and those keeping the layouts of the plan recomputing every
    layer with as few layers recomputed as fit (found by halving the count, each count's
    program assembled and its peak walked, not solved: :func:`fewest_recomputed`).

    The bound: a plan recomputing any layers costs at least the plan of the same layouts
    without recompute (the copies add compute and moves; a value's readers split between
    the original and its copy move it at least as often), and its peak is at least its
    training state; so the plan without recompute under ``state_budget`` = the peak's
    budget bounds every choice of recompute. That bound's own plan is a plan without
    recompute: where its whole step fits the budget, it is the plan recomputing none
    (not solved again)."""
    layers = len(groups)
    rewrites: dict[int, tuple] = {0: (graph, tuple(range(len(graph.nodes))))}

    def rewrite(k: int) -> tuple:
        if k not in rewrites:
            rewrites[k] = recompute_origins(graph, groups[:k])
        return rewrites[k]

    def plan_k(k: int, bound: float | None = None) -> Program:
        # only every layer's infeasibility reaches the caller: the others' are not named
        graph_k = rewrite(k)[0]
        return plan(graph_k, arg_specs, name_least=k == layers, known_bound=bound, **kwargs)

    if mode == "always":
        return plan_k(layers)
    tried: dict[int, Program | MemoryBudgetError] = {}

    def attempt(k: int, bound: float | None):
        if k not in tried:
            try:
                tried[k] = plan_k(k, bound)
            except MemoryBudgetError as e:  # any other error reaches the caller
                tried[k] = e
        return tried[k]

    relaxed = dict(kwargs, state_budget=kwargs["memory_budget"], memory_budget=None)

    def plan_of_all() -> Program | None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ProgramWarning)  # warned above already
                return plan(graph, arg_specs, name_least=False, bound_only=True, **relaxed)
        except MemoryBudgetError:  # the training state alone does not fit
            return None

    # the bound over every choice of recompute first: each plan below takes it (none
    # bounds its own tied parts again); None: the training state alone does not fit, so
    # no plan does, and the plan recomputing every layer names the smallest budget
    of_all = plan_of_all()
    if of_all is None:
        return plan_k(layers)  # raises MemoryBudgetError naming the smallest budget
    bound = of_all.lower_bound
    # the plan without recompute: where it fits and costs within RECOMPUTE_GAP of the
    # bound, no recomputing plan is worth more solves. Where the bound's own plan (no
    # recompute, the training state budgeted) fits the budget with its activations, it
    # is that plan's answer (the same objective, its budget's row slack in both): only
    # compared with the given layouts, not solved again
    if of_all.memory.peak <= kwargs["memory_budget"] * (1 + 1e-9):
        tried[0] = plan(
            graph, arg_specs, name_least=False, known_bound=bound, answer=of_all, **kwargs
        )
    none = attempt(0, bound)
    close = isinstance(none, Program) and none.cost.total - bound <= RECOMPUTE_GAP * abs(
        none.cost.total
    )
    fits = [p for p in tried.values() if isinstance(p, Program)]
    if not close:
        full = attempt(layers, bound)
        if isinstance(full, MemoryBudgetError):
            raise full  # names the smallest budget, every layer recomputed
        fits.append(full)

        def follow(k: int) -> Program | None:
            return _followed(plan, rewrite, full, (k, layers), kwargs)

        lo = 0 if isinstance(none, MemoryBudgetError) else -1
        fits += fewest_recomputed(follow, lo, layers, kwargs["memory_budget"])
    best = min(fits, key=lambda p: p.cost.total)
    bound = min(bound, best.cost.total)
    if best.cost.total - bound > 1e-9 * abs(best.cost.total) and best.exact:
        method = f"exact for its recompute ({len(tried)} of {layers + 1} layer counts solved)"
        best = attrs.evolve(best, method=method, exact=False)
    return attrs.evolve(best, lower_bound=bound)


def fewest_recomputed(
    follow: Callable[[int], Program | None], lo: int, hi: int, budget: float
) -> list[Program]:
    """The programs of the counts of recomputed layers a halving search between ``lo``
    (not known to fit; -1: nothing known) and ``hi`` (fits) tries, ``follow(k)`` giving
    the program recomputing ``k`` layers (None: none such); those whose peak fits
    ``budget``. Fewer recomputed layers hold more activations: the peak only grows as the
    count falls, so the search ends at the fewest that fit. Nothing known (the plan without
    recompute fit in its own layouts): the count 0 is tried first, and where it fits
    (Llama-3 70B: its 80 layers in the layouts of the plan recomputing all) it is the
    answer, one program assembled instead of seven."""
    out = []
    while hi - lo > 1:
        mid = 0 if lo == -1 else (lo + hi) // 2
        program = follow(mid)
        if program is not None and program.memory.peak <= budget * (1 + 1e-9):
            out.append(program)
            hi = mid
        else:
            lo = mid
    return out


def _followed(plan, rewrite, full: Program, count: tuple[int, int], kwargs) -> Program | None:
    """The program recomputing the first ``k`` of ``layers`` (``count``) with ``full``'s
    layouts (the plan recomputing every layer): each call of the rewrite runs the
    strategy ``full`` gave the traced call it is or repeats, nothing solved (None: a call
    has no such strategy)."""
    k, layers = count
    origin_full = rewrite(layers)[1]
    by_origin = {origin_full[op.node]: (op.input_specs, op.output_specs) for op in full.ops}
    graph, origin = rewrite(k)
    follow = {n: by_origin.get(origin[n]) for n in graph.calls}
    again = dict(kwargs, choose=(), tie_layers=False, memory_budget=None, state_budget=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProgramWarning)  # warned by the plans already
        program = plan(graph, full.arg_specs, name_least=False, follow=follow, **again)
    if program is None:
        return None
    method = f"{k} of {layers} layers recomputed in the layouts of the plan recomputing all"
    return attrs.evolve(program, method=method)


#: ``recompute="auto"`` under a budget: a plan without recompute that fits and costs
#: within this fraction of the bound over every choice of recompute is kept without
#: planning any recomputing plan (none could be cheaper by more)
RECOMPUTE_GAP = 0.01

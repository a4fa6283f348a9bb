"""Auto-sharding: free arguments, their candidate layouts, and a choice under a memory budget.

:func:`~meshplan.strategy.plan_program` with ``choose=`` lets the planner pick the layouts
of some arguments (the parameters, typically): each free argument becomes one more
variable of the whole-program problem, its options the layouts of :func:`layout_candidates`
(Replicate or Shard of any tensor dim on every mesh dim, and where several mesh dims
shard one tensor dim, each order of them: the ``StridedShard`` layouts FSDP over a
tensor-parallel split uses). An option is priced like an op that reads the argument's
gradient in the option's :func:`grad_spec` and hands the argument to its readers in the
option's spec: the moves to every reader and the gradient's move back (the data-parallel
reduction included) are terms of the objective like any other.

A ``memory_budget`` bounds the training state per rank (:mod:`._memory`), a sum over
arguments. :func:`.solver.solve_within` minimizes the modeled step time subject to it by
Lagrangian relaxation: for a multiplier ``lam >= 0`` the minimum of ``cost + lam *
(memory - budget)`` over *all* choices is a lower bound of the constrained minimum, and
a choice it returns that fits the budget is an upper bound. The multiplier is searched
by intersecting the lines of the cheapest over-budget and the cheapest within-budget
choices found (the dual is concave and piecewise linear: it reaches its maximum in
finitely many steps). Where a gap remains (the budget falls between two of the dual's
breakpoints) a best-first branch and bound over the free arguments closes it, each
branch bounded by the same relaxation, up to ``max_branches`` solves or until the gap
is within ``gap`` of the cost; the gap left, if any, is what ``Solution.bound``
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
from collections.abc import Collection, Sequence

from meshplan.errors import MemoryBudgetError, PlacementError, StrategyError
from meshplan.placement import Replicate, Shard, Spec

from ..solver import min_memory_choice
from ._candidates import Option
from ._memory import state_bytes

__all__ = [
    "layout_candidates",
    "free_options",
    "memory_weights",
    "resolve_choose",
]


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


def layout_candidates(spec: Spec) -> tuple[Spec, ...]:
    """Every layout the planner may give a free argument shaped like ``spec``.

    Per mesh dim Replicate or Shard of any tensor dim; where several mesh dims shard one
    tensor dim, every order of them. Replicated first; no Partial (a stored parameter
    is whole). Equivalent layouts appear once.

    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2,))
    >>> [str(s) for s in layout_candidates(Spec(mesh, [Replicate()], (4, 6)))]
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
    return tuple(Option((c,), (c,), 0.0) for c in layout_candidates(spec))


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
        raise MemoryBudgetError(
            f"memory_budget={budget:.0f} bytes per rank is infeasible: the smallest feasible "
            f"budget for this program is {least:.0f} bytes (fixed arguments {fixed_bytes:.0f}, "
            "free ones at their most sharded); raise the budget or free more arguments",
            value=budget,
            least=least,
            most=least,
        )
    return weights, fixed_bytes

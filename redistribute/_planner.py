"""``plan(src, dst)``: the minimum-cost sequence of steps, by A* search over specs.

The steps a plan may take (each a valid :class:`Step`):

* per mesh dim ``m``: ``R -> S`` (local slice; ``m`` chunks the current piece, so it
  joins the end of its tensor dim's shard order), ``R -> P`` and ``S -> P`` (local),
  ``P(sum) <-> P(avg)`` (local scale), ``S -> R`` (all_gather), ``S(d) -> S(d')``
  (all_to_all; ``m`` moves to the end of ``d'``'s order), ``P -> R`` (all_reduce),
  ``P -> S`` (reduce_scatter); on a tiny dim, ``S(d) -> S'(d)`` as a local step where
  every rank keeps its piece (a StridedShard and a shard order that chunk alike). A
  mesh dim leaves an order from its end (its group then holds the parent piece);
  elsewhere, and joins it elsewhere, only where an exact check on index intervals
  allows (tiny dims, StridedShards);
* ``all_permute`` over several mesh dims sharded in both specs: a change of shard order,
  or of which dims shard which tensor dims, valid when per tensor dim the old and new
  orders share a prefix and differ only in the step's dims. Every such permute is a move;
* ``all_permute`` between specs whose ranks hold the same pieces though they shard with
  other mesh dims (``S(0) R -> R S(0)``): every rank receives one member's whole local
  tensor, over the mesh dims after the orders' common prefixes (:mod:`._engine._general`);
* with ``merge`` (the default), on a mesh with flattened aliases: one all_reduce,
  all_gather, reduce_scatter or all_to_all over every dim of an alias, ending where a
  chain of like-kind single-dim steps over those dims ends, when it is one valid step
  (:mod:`._merge`'s rules). So a plan may slice or turn a dim Partial first to let a
  merged collective serve it.

Searched placements: ``Shard(d)`` for every tensor dim, the StridedShards of
``src``/``dst``, Replicate and the Partial ops of ``src``/``dst``. The price of a plan is
the sum of its steps' prices under the cost model, each times a deterministic
tie-breaking factor below 1 + 5e-10 (``_price.tie``), so the cheapest plan is unique.
A context (mesh, shape, dtype, model, placements, memory bound) plans its first pairs by
A* search (the heuristic is a lower bound, so the result is a minimum over every plan of
such steps: ``tests/redistribute/test_plan_optimal.py`` checks it against a brute force).
A plan may end at any spec holding the target's layout (``same_layout``: a StridedShard
and a shard order that chunk alike, a tiny dim's orders that leave the same pieces): the
search goes to the nearest of them (``_goals.goal_class``; past ``CLASS_LIMIT`` of them to a
pattern admitting each; on a tensor without elements to a pattern: any placement but
Partial of the mesh dims that shard only dims of length 0), and a plan stops where every
rank first holds its target (a relabel to the target's words would move nothing and cost
a launch). After ``_table.lazy_pairs`` pairs, a context small enough builds an all-pairs
table and walks it, to the very same plan (``tests/redistribute/test_table.py``). Contexts
whose prices are all linear in the tensor's bytes (regular shapes, objective "time") form
a family across tensor sizes (:mod:`._engine._family`): a size between two planned sizes with
one plan takes it without a search (``tests/redistribute/test_family.py``). Then
:func:`merge` notes like-kind collectives a missing alias kept apart (for the warning).
Effort is bounded: a search generates at most ``Planner(max_states=...)`` moves
(``_store.STATE_BUDGET`` by default) and spends at most ``Planner(max_seconds=...)`` of
CPU time (``_store.SECONDS_BUDGET``, so a plan takes a second or two on any input; a
permute hub with more targets than the time left buys is not listed); past either a
greedy search finds a plan (or, if none in twice that time, the plan through the shard
orders' common prefixes: gather, then slice, each leg planned in a quarter of the budget,
``_budgeted.leg_budget``) and ``plan``
warns (:class:`~meshplan.errors.BudgetWarning`) with its proven gap to the cheapest, the
distance from its price to the least rank left in the first search's queue (or raises a
:class:`PlanError` naming the limit, with ``on_budget="raise"``).
``objective="collectives"`` adds to every collective's price more than any plan's time,
so the plan has the fewest collectives and, among those, the least time. Plans, contexts,
tables and every other memo belong to a :class:`~._store.Planner` (the default one
unless ``plan`` is given another), keyed by the frozen arguments.

The engine's modules (:mod:`._engine`) say how each part of this is done.
"""

from __future__ import annotations

import math
import time

import attrs

from meshplan.errors import PlanError
from meshplan.layout._ints import as_bool, as_int
from meshplan.layout._ranks import short_repr
from meshplan.placement import (
    Spec,
    dtype_itemsize,
    same_layout,
)

from ._aliases import alias_dims, alias_named
from ._budgeted import (
    bounded_search,
    deadline_of,
    leg_budget,
    past_budget,
    proven_lower,
    through_common_prefix,
)
from ._cost import OBJECTIVES, _plan_cost, collective_weight
from ._engine._encoding import R, universe_of
from ._engine._family import family_of
from ._engine._goals import goal_class
from ._engine._problem import Problem
from ._engine._search import OverBudget, search
from ._engine._table import walk
from ._merge import merge_plan, warn_missed
from ._plan import Plan
from ._profile import CostModel, as_model
from ._sizes import padded_local_bytes
from ._store import Planner, SearchBudget, default_planner

__all__ = ["plan", "plan_cost", "price_bound", "check_plannable", "clear_plan_cache", "Planner"]

# -- input checks ---------------------------------------------------------------------------


def check_plannable(src: Spec, dst: Spec) -> None:
    """Raise :class:`PlanError` naming what differs when ``src`` and ``dst`` cannot be planned.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate
    >>> a = Spec(Mesh.create(2), [Replicate()], (4,))
    >>> check_plannable(a, Spec(Mesh.create(2), [Replicate()], (5,)))
    Traceback (most recent call last):
    ...
    meshplan.errors.PlanError: source and target differ in global shape: (4,) vs (5,); ...
    """
    for name, spec in (("source", src), ("target", dst)):
        if not isinstance(spec, Spec):
            raise PlanError(f"plan needs Specs; the {name} is {spec!r}", value=spec)
    if src.mesh is not dst.mesh and src.mesh != dst.mesh:
        a, b = src.mesh, dst.mesh
        if a.shape != b.shape:
            what = f"mesh shape {a.shape} vs {b.shape}"
        elif a.names != b.names:
            what = f"mesh dim names {a.names!r} vs {b.names!r}"
        elif a.ranks != b.ranks:  # canonical maps: a range never equals a RankTuple
            what = f"rank maps {short_repr(a.ranks)} vs {short_repr(b.ranks)}"
        elif a.aliases != b.aliases:
            what = f"aliases {tuple(a.aliases)!r} vs {tuple(b.aliases)!r}"
        elif a.device_type != b.device_type:
            what = f"device types {a.device_type!r} vs {b.device_type!r}"
        else:
            what = f"layouts {a.layout} vs {b.layout}"
        raise PlanError(
            f"source and target live on different meshes ({what}); redistribute within one "
            "mesh (give both specs the same Mesh value)",
            value=(src.mesh, dst.mesh),
        )
    if src.shape != dst.shape:
        raise PlanError(
            f"source and target differ in global shape: {src.shape} vs {dst.shape}; a plan "
            "moves one tensor, reshape it first",
            value=(src.shape, dst.shape),
        )
    if src.dtype != dst.dtype:
        raise PlanError(
            f"source and target differ in dtype: {src.dtype} vs {dst.dtype}; convert the "
            "tensor first",
            value=(src.dtype, dst.dtype),
        )
    alias_dims(src.mesh)


# -- plan -------------------------------------------------------------------------------------


def _min_cost_plan(
    planner: Planner,
    src: Spec,
    dst: Spec,
    model: CostModel,
    bound,
    objective: str = "time",
    merge: bool = True,
    budget: SearchBudget | None = None,
) -> tuple[Plan, tuple]:
    """The cheapest plan of single-dim steps, permutes and (with ``merge``) steps merged
    onto the mesh's aliases, to ``dst`` or another spec of its layout (``_goals.goal_class``),
    its steps' prices, and None, or where the budget cut the search, the price every plan
    costs at least (the plan is then the best found, not proven the cheapest). ``budget``:
    the search's effort (the planner's by default; the legs of a plan past it get
    :func:`~._budgeted.leg_budget`, so the whole plan's time stays bounded)."""
    budget = planner.budget if budget is None else budget
    start_state, goal_state = planner.state(src), planner.state(dst)
    if start_state == goal_state or (
        _may_share_layout(start_state[0], goal_state[0], 0 in src.shape) and same_layout(src, dst)
    ):
        # every rank holds its target already (the specs may say so in two ways)
        return Plan(src, dst, ()), (), None
    shards, ptargets = universe_of(start_state.codes, goal_state.codes, src.ndim)
    problem = Problem(
        src.mesh, src.shape, src.dtype, model, shards, ptargets, bound, objective, merge
    )
    goals = goal_class(goal_state, src.shape, src.mesh.shape, shards)
    moves, over = _moves_to(planner, problem, start_state, goals, budget)
    lower = None
    if over is not None:
        lower = proven_lower(over)
        if moves is None and planner.on_budget != "raise":
            # (the greedy search found none in its time either; raising, the plan below
            # would be made only to be dropped, and its legs' budget named in the error)
            legs = through_common_prefix(
                lambda a, b: _min_cost_plan(
                    planner, a, b, model, bound, objective, merge, leg_budget(budget)
                )[0],
                src,
                dst,
            )
            if legs is not None:
                past_budget(planner, src, dst, over, _plan_cost(legs, model).total)
                return legs, None, lower
        past_budget(planner, src, dst, over, _path_price(moves))
    if moves is None:
        b_start = padded_local_bytes(src)
        b_goal = padded_local_bytes(dst)
        raise PlanError(
            f"no plan from {src} to {dst} keeps peak local memory within max_local_bytes="
            f"{bound} (source holds {b_start} and target {b_goal} bytes per rank, and "
            "every step holds its input and output); raise the bound",
            value=bound,
        )
    steps = []
    a = src
    last = len(moves) - 1
    empty = 0 in src.shape
    for k, (_, edge, state) in enumerate(moves):
        b = dst if state == goal_state else planner.spec(src, state)
        dims, kind = edge.dims, edge.collective
        alias = alias_named(src.mesh, dims) if len(dims) > 1 and kind != "all_permute" else None
        steps.append(planner.step(dims, a, b, kind, alias))
        if k != last and _may_share_layout(state[0], goal_state[0], empty) and same_layout(b, dst):
            # every rank holds its target already: the rest (a relabel saying the same
            # pieces as the target says them) would move nothing, and costs a launch
            break
        a = b
    prices = tuple(edge.price for _, edge, _ in moves[: len(steps)])
    return Plan(src, dst, tuple(steps)), prices, lower


def _may_share_layout(codes_a: tuple, codes_b: tuple, empty: bool) -> bool:
    """Whether specs of these placement codes may give every rank the same local tensor
    (``same_layout``'s first test, on codes): each Partial dim alike, and unless the
    tensor is empty, each mesh dim sharding the same tensor dim or none."""
    for x, y in zip(codes_a, codes_b, strict=True):
        if x == y:
            continue
        if type(x) is int and x != R or type(y) is int and y != R:
            return False
        if not empty and (type(x) is not tuple or type(y) is not tuple or x[0] != y[0]):
            return False
    return True


def _path_price(moves) -> float | None:
    """The price of a search's path (None: no path)."""
    return None if moves is None else sum(edge.price for _, edge, _ in moves)


def _moves_to(
    planner: Planner, problem: Problem, start_state, goals: tuple, budget: SearchBudget
):
    """The cheapest path from ``start_state`` to the nearest of ``goals`` (states of one
    layout) as ``[(state, edge, next state)]`` (None: none within the memory
    bound): shared across the tensor sizes of a family (no context needed), else the
    context's table (once it has planned enough pairs) or a search; and None, or the
    :class:`OverBudget` of a search past the planner's budget (the path then the best
    a greedy search found, not proven the cheapest); every search within ``budget``."""
    key = goals[0] if len(goals) == 1 else ("layout", goals)  # the pair's key in a family
    deadline = deadline_of(budget, time.thread_time())  # (one for every search)
    ctx = planner.context(problem)
    fam = ctx.family
    if fam is False:  # (not known yet: once per context)
        fam = ctx.family = family_of(problem)
    size = ctx.total_bytes
    tables, families = planner.tables, planner.families
    tab = tables.built(ctx)
    if fam is not None and tab is None:
        moves = families.shared(fam, size, start_state, key)
        if moves is not None:
            return moves, None
        if _extend(planner, fam, ctx, start_state, goals, key, budget.states, deadline):
            moves = families.shared(fam, size, start_state, key)
            if moves is not None:
                return moves, None
    with ctx.lock:
        ctx.trim()
        start = ctx.intern(start_state)
        goal = _interned(ctx, goals)
        if tab is None:
            tab = tables.table(ctx)
        over = None
        if tab is not None:
            found = walk(ctx, tab, start, goal)
        else:
            found, over = bounded_search(budget, ctx, start, goal, deadline)
            if found is not None and fam is not None and over is None:
                families.record(fam, ctx, start_state, key, found)
        if found is None:
            return None, over
        states = ctx.states
        return [(states[i], edge, states[j]) for i, edge, j in found[1]], over


def _interned(ctx, goals: tuple):
    """The ctx id of the one goal, or a tuple of the goals' ids."""
    if len(goals) == 1:
        return ctx.intern(goals[0])
    return tuple(ctx.intern(g) for g in goals)


def _extend(planner: Planner, fam, ctx, start_state, goals, key, states, deadline) -> bool:
    """Plan the pair (``key``: its key in the family, ``goals``: its goal states) at the
    smallest or largest size of family ``fam`` (``ctx``: a context of it) too, when
    ``Families.extremes`` asks (each on its own context, under its own lock); whether it
    asked; every search stops at ``deadline``, the plan's)."""
    shapes = planner.families.extremes(fam, ctx, start_state, key)
    for shape in shapes:
        other = planner.context(attrs.evolve(ctx.problem, shape=shape))
        if other is ctx:
            continue
        with other.lock:
            other.trim()
            start, goal = other.intern(start_state), _interned(other, goals)
            try:
                found = search(other, start, goal, budget=states, deadline=deadline)
            except OverBudget:
                continue  # (the pair is planned on its own context then)
            if found is not None:
                planner.families.record(fam, other, start_state, key, found)
    return bool(shapes)


def _planned(
    planner: Planner, src: Spec, dst: Spec, model: CostModel, merge: bool, bound, objective: str
):
    """The plan, the merges a missing alias kept apart (None: not looked for yet), and
    None, or where the planner's budget cut the search, the price every plan costs at
    least; remembered by ``planner``."""
    key = (src, dst, model, merge, bound, objective)
    entry = planner.plans.get(key)
    if entry is not None:
        return entry
    check_plannable(src, dst)
    p, prices, lower = _min_cost_plan(planner, src, dst, model, bound, objective, merge)
    missed = None
    if merge and len(p.steps) > 1 and src.mesh.aliases:
        # steps merged onto aliases are moves of the search already; this merges what
        # runs one after another onto an alias (a tie) and notes what lacks one
        p, missed = merge_plan(
            p,
            model,
            prices,
            _weight(src, model, objective),
            reorder=False,
            bound=bound,
            planner=planner,
        )
    entry = (p, missed, lower)
    if lower is not None:
        planner.cut_plans += 1
    planner.remember(key, entry)
    return entry


def _plan_cached(
    src: Spec,
    dst: Spec,
    model: CostModel,
    merge: bool,
    bound,
    objective: str,
    planner: Planner | None = None,
):
    """:func:`plan`'s answer on ``planner`` (the default one when None), the merges a
    missing alias kept apart (None: not looked for yet) and the proven lower price of a
    plan the budget cut (None: the plan is the cheapest), without the warning (for pricing
    many candidate redistributions that never run)."""
    return _planned(_planner_of(planner), src, dst, model, merge, bound, objective)


def _planner_of(planner) -> Planner:
    """``planner``, or the default planner for None; a PlanError for anything else."""
    if planner is None:
        return default_planner()
    if not isinstance(planner, Planner):
        raise PlanError(f"planner must be a Planner or None, got {planner!r}", value=planner)
    return planner


def plan_cost(
    src: Spec, dst: Spec, *, cost_model: CostModel | None = None, planner: Planner | None = None
) -> float:
    """The price (seconds) of the minimum-cost plan from ``src`` to ``dst``:
    ``cost(plan(src, dst)).total``, remembered by ``planner`` (the default one when None),
    without the warning about merges a missing alias keeps apart (for callers that price
    many redistributions and run few: strategy selection, whole programs).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> from meshplan.redistribute import cost
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Shard(0)], (8,)), Spec(mesh, [Replicate()], (8,))
    >>> plan_cost(a, b) == cost(plan(a, b)).total
    True
    """
    return price_bound(src, dst, cost_model=cost_model, planner=planner)[0]


def price_bound(
    src: Spec, dst: Spec, *, cost_model: CostModel | None = None, planner: Planner | None = None
) -> tuple[float, float]:
    """``(price, lower)``: :func:`plan_cost`, and a price every plan from ``src`` to ``dst``
    costs at least. The two are equal when the plan is proven the cheapest; where the
    planner's budget cut its search, ``lower`` is the least rank left in its queue (what
    a whole program's bound must use: the plan is only the best found).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Shard(0)], (8,)), Spec(mesh, [Replicate()], (8,))
    >>> price, lower = price_bound(a, b)
    >>> price == lower == plan_cost(a, b)
    True
    """
    if not (isinstance(src, Spec) and isinstance(dst, Spec)):
        check_plannable(src, dst)  # names the one that is not a Spec (before any lookup)
    model = as_model(cost_model)
    planner = _planner_of(planner)
    key = (src, dst, model)
    known = planner.prices.get(key)
    if known is None:
        if src == dst:
            check_plannable(src, dst)
            known = (0.0, 0.0)
        else:
            p, _, lower = _planned(planner, src, dst, model, True, None, "time")
            price = _plan_cost(p, model).total
            known = (price, price if lower is None else min(lower, price))
        planner.remember_price(key, known)
    return known


def _weight(src: Spec, model: CostModel, objective: str) -> float:
    if objective != "collectives":
        return 0.0
    return collective_weight(model, src.mesh, dtype_itemsize(src.dtype) * math.prod(src.shape))


def _missed_merges(p: Plan, model: CostModel, objective: str, bound, planner: Planner) -> tuple:
    """Like-kind steps of ``p`` that an alias the mesh lacks would merge within ``bound``
    (for the warning; on a mesh without aliases nothing merges, so only the first plans of
    a mesh shape, before it has warned, pay for looking)."""
    w = _weight(p.src, model, objective)
    return merge_plan(p, model, None, w, reorder=False, bound=bound, planner=planner)[1]


def _flag(value, name: str) -> bool:
    """``value`` as a bool (True/False, or a numpy bool), or a PlanError naming it."""
    flag = as_bool(value)
    if flag is not None:
        return flag
    raise PlanError(f"{name} must be True or False, got {value!r}", value=value)


def plan(
    src: Spec,
    dst: Spec,
    *,
    cost_model: CostModel | None = None,
    merge: bool = True,
    max_local_bytes: int | None = None,
    objective: str = "time",
    planner: Planner | None = None,
) -> Plan:
    """The minimum-cost plan turning ``src`` into ``dst`` (same mesh, shape and dtype).

    ``merge`` folds adjacent like-kind collectives onto flattened aliases of the mesh
    (see :func:`merge`); ``max_local_bytes`` bounds every step's input plus output bytes
    per rank (raising :class:`PlanError` when no plan fits). ``objective`` is what
    "minimum" means: ``"time"`` (default), the modeled time of the cost model; or
    ``"collectives"``, the fewest collectives, and among plans with that many the least
    time (for when a collective's real price is above the model's: synchronization,
    overlap with compute, launch jitter). Remembered by ``planner`` (a :class:`Planner`;
    the default one when None), keyed by the arguments.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard, Replicate
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> a = Spec(mesh, [Shard(0), Shard(0)], (8, 8))
    >>> b = Spec(mesh, [Shard(0), Shard(0)], (8, 8), shard_order={0: (1, 0)})
    >>> p = plan(a, b)
    >>> p.collectives
    ('all_permute',)
    >>> print(p)  # doctest: +ELLIPSIS
    Plan f32[8,8](S(0) S(0)) -> f32[8,8](S(0)[1,0] S(0)) on Mesh((2, 2), names=('dp', 'tp'))
     #  step         placements                   group  size  example group ...
     0  all_permute  S(0) S(0) -> S(0)[1,0] S(0)  dp,tp  4     (0, 1, 2, 3) ...
    total: 1 step (1 collective), recv 64 B/rank, peak 128 B/rank, cost 10.0 us ...
    """
    cost_model = as_model(cost_model)
    if max_local_bytes is not None:
        bound = as_int(max_local_bytes)
        if bound is None:
            raise PlanError(
                f"max_local_bytes must be an int or None, got {max_local_bytes!r}",
                value=max_local_bytes,
            )
        max_local_bytes = bound
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise PlanError(
            f"objective must be one of {OBJECTIVES!r}, got {objective!r}", value=objective
        )
    merge = _flag(merge, "merge")
    planner = _planner_of(planner)
    try:
        p, missed, lower = _planned(
            planner, src, dst, cost_model, merge, max_local_bytes, objective
        )
    except TypeError:  # unhashable input: validate to raise a clear error
        check_plannable(src, dst)
        raise
    warned = planner.warned
    if missed is None:
        if not merge or len(p.steps) < 2 or src.mesh.shape in warned:
            return p
        missed = _missed_merges(p, cost_model, objective, max_local_bytes, planner)
        key = (src, dst, cost_model, merge, max_local_bytes, objective)
        planner.remember(key, (p, missed, lower))
    if missed:
        warn_missed(p, missed, warned)
    return p


def clear_plan_cache(*, tables: bool = True) -> None:
    """Forget the default planner's plans, and with ``tables`` every other memo of it
    (``Planner.clear``) and the memos of pure functions all planners share (for
    benchmarks: the answers are the same).

    >>> clear_plan_cache(tables=False)
    """
    default_planner().clear(tables=tables)
    _plan_cost.cache_clear()
    if tables:
        for memo in _shared_memos():
            memo.cache_clear()


def _shared_memos() -> list:
    """Every ``functools`` memo of the modules of this package that are loaded."""
    import sys

    prefix = __name__.rpartition(".")[0] + "."
    out = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or module is None:
            continue
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)) and hasattr(value, "cache_info"):
                out.append(value)
    return out

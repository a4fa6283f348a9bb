"""The plan search: A* over a context's states with an admissible bound (no torch).

:func:`search` runs A* from a state to a goal (or the nearest of several goals of one
layout, or a pattern's states: ``_goals``) over the context's edges (``_edges``),
guided by the context's bounds (``_bounds.Bounds.heuristic``, a lower bound of the
remaining price, so the plan found is a minimum). It evaluates the bound lazily (a
state is queued under its parent's bound less the step's price, and ranked by its own
only when popped), generates a state's merged steps, all_permutes and general
all_permutes only once a plan through one may still be the cheapest (each kind queued
under a floor of its prices), prunes commuting single-dim steps taken in the costlier
order, and never turns a dim Partial that the goal does not hold (unless a merged step
may reduce it with an alias's other dims). Each permute through a hub is two edges, the
hub a node of the queue, expanded once per search.
"""

from __future__ import annotations

import heapq
import itertools
import math

from ._edges import hub_edges, hub_member_edges, merges, permute_floor, singles
from ._encoding import Edge, R, mixable, state_order
from ._general import general_permutes
from ._goals import admits, is_pattern
from ._merged_moves import merges_floor
from ._price import tie

__all__ = ["search", "OverBudget", "GREEDY"]

GREEDY = 1000.0
"""The heuristic's weight in the search for a plan past the budget: far above 1, so the
queue ranks by the estimate of the rest and reaches a goal in few expansions."""


class OverBudget(Exception):
    """A search stopped after generating ``budget`` moves; ``lower`` is a lower bound of every
    plan's price (the least rank left in its queue)."""

    def __init__(self, budget: int, lower: float) -> None:
        super().__init__(budget, lower)
        self.budget = budget
        self.lower = lower


def search(ctx, start: int, goal, bounds=None, *, budget: int | None = None, weight: float = 1.0):
    """A* on context ``ctx`` from state ``start`` to ``goal`` (ids; or a tuple of them,
    states of one layout, the first to reach ends the search), guided by ``bounds`` (the
    context's :class:`~._bounds.Bounds` when None); ``(cost, [(state, edge, next)])``.

    With several goals the heuristic is the least of theirs (a lower bound of the price to
    the nearest, consistent as each is), so the first goal taken from the queue is the
    cheapest to reach.

    Prices carry the tie-breaking factor of ``_price.tie``, so the minimum is unique: the
    search and a plan table (``_table``) find the same plan. Partial-order reduction:
    when two structural single-dim steps on different mesh dims and different shard
    orders commute, only the cheaper order is kept, so independent steps are not tried
    in every order.

    ``budget`` bounds the moves generated (the states reached, each counted once per
    move leading to it): past it the search raises :class:`OverBudget`.
    ``weight`` multiplies the heuristic in the queue's ranks: 1 finds the cheapest plan;
    above 1 (:data:`GREEDY`) a plan, fast, with no proof it is the cheapest (and without
    the all_permutes that reorder shards, whose targets are many).
    """
    if bounds is None:
        bounds = ctx.bounds
    heuristic = bounds.heuristic
    kept_bound = bounds.kept_bound
    hmemo = bounds.h
    states = ctx.states

    goals = (goal,) if type(goal) is int else tuple(goal)
    goal = goals[0] if len(goals) == 1 else goals
    # (the goals differ only in how they say shards: their Partial dims are the same)
    goal_codes = states[goals[0]][0]
    # a pattern (``unreduced_goal``, ``class_goal``) is every state it admits
    pattern = is_pattern(states[goals[0]])
    kept_memo = ctx.kept
    kept_bounds = bounds.kept
    merges_on = bool(ctx.aliases)
    merge_dims = ctx.merge_dims
    general = ctx.general
    general_floor = ctx.launch + ctx.per_collective + bounds.latency_floor
    copy = ctx.copy

    def h_of(i):
        key = (i, goal)
        h = hmemo.get(key)
        if h is None:
            h = hmemo[key] = min([heuristic(i, g) for g in goals])
        return h

    memo: dict = {start: h_of(start)}
    best = {start: 0.0}
    parent: dict = {start: None}
    counter = itertools.count()
    heap = [(weight * memo[start], 0.0, 0, start)]
    closed = set()
    done: dict = {}  # permute hub -> the cost it was expanded at
    push = heapq.heappush

    spent = 0  # moves generated

    def relax(i, g, h, succ, floor=0.0):
        # (``floor``: a lower bound of the rest from every state of ``succ``)
        nonlocal spent
        spent += len(succ)
        for trans in succ:
            c, t, dims, collective, _, _, touch = trans
            if collective is None and touch == () and len(dims) == 1:
                # Replicate -> Partial, or sum <-> avg, on a mesh dim the goal keeps
                # un-Partial: whatever reduces it later could have run without it (unless
                # it is reduced in a step merged onto an alias, the only one there may be)
                m = dims[0]
                b = goal_codes[m]
                if (type(b) is not int or b <= R) and m not in merge_dims:
                    continue
            ng = g + c
            old = best.get(t)
            if old is None or ng < old:
                best[t] = ng
                parent[t] = (i, trans)
                ht = memo.get(t)
                if ht is None:
                    ht = h - c if h - c > floor else floor
                push(heap, (ng + weight * ht, -ng, next(counter), t))
                closed.discard(t)

    one = (len(goals) == 1 and not pattern) or weight != 1.0
    reached = limit = None  # goals reached at the least price, and that price
    if budget is None:
        budget = math.inf
    while heap:
        key, neg_g, _, i = heapq.heappop(heap)
        if reached is not None and key > limit:
            break
        if spent > budget:
            ctx.expanded += spent
            raise OverBudget(budget, key)
        g = -neg_g
        if type(i) is tuple:
            # a permute hub, reached at ``g`` with ``key - g`` a lower bound of the rest
            if g <= best[i] and done.get(i, math.inf) > g:
                done[i] = g
                source, via = parent[i]
                kept = kept_bounds.get((source, goal))
                if kept is None:
                    kept = kept_bounds[(source, goal)] = min([kept_bound(source, x) for x in goals])
                rest = (key - g) / weight
                succ = hub_member_edges(ctx, i, via.dims, via.n_send, budget - spent)
                if succ is None:  # (more members than the budget has left)
                    ctx.expanded += spent
                    raise OverBudget(budget, key)
                relax(i, g, rest, succ, kept)
            continue
        if type(i) is _Merges:
            i = i.state
            if g <= best[i]:
                relax(i, g, memo[i], merges(ctx, i))
            continue
        if type(i) is _General:
            i = i.state
            if g <= best[i]:
                relax(i, g, memo[i], general_permutes(ctx, i))
            continue
        if i < 0:
            # the all_permutes of state ~i, queued when it was expanded (at a lower bound
            # of their rank), generated only now: first into their hubs
            i = ~i
            if g <= best[i]:
                relax(i, g, memo[i], hub_edges(ctx, i))
            continue
        if i in closed or g > best[i]:
            continue
        # lazy heuristic: a state was queued under h(parent) - step price (a lower bound
        # of its own, by consistency); evaluate it only now, re-queue if it ranks later
        h = memo.get(i)
        if h is None:
            h = memo[i] = h_of(i)
            if g + weight * h > key:
                push(heap, (g + weight * h, neg_g, next(counter), i))
                continue
        if i in goals or (pattern and any(admits(states[x], states[i]) for x in goals)):
            if one:
                ctx.expanded += spent
                return g, _path(parent, i)
            # of several goals reached at this very price (a tie the tie-breaking factors
            # lost to rounding), the first in ``state_order`` wins, as in a table walk
            if reached is None:
                reached, limit = [], g
            reached.append(i)
            closed.add(i)
            continue
        closed.add(i)
        via = parent[i]
        succ = singles(ctx, i)
        if via is not None:
            prev, edge = via
            if edge.touch is not None and len(edge.dims) == 1:
                # the single-dim steps the commuting-steps reduction keeps
                kkey = (prev, edge.target, edge.dims, edge.collective, i)
                kept_succ = kept_memo.get(kkey)
                if kept_succ is None:
                    kept_succ = kept_memo[kkey] = _commute_filter(ctx, prev, edge, succ)
                succ = kept_succ
        relax(i, g, h, succ)
        if merges_on:
            # the merged steps of state i, generated only once a plan through one may
            # still be the cheapest (``merges_floor``)
            floor = merges_floor(ctx, i)
            if floor < math.inf:
                rank = g + weight * (floor if floor > h else h)
                push(heap, (rank, neg_g, next(counter), _Merges(i)))
        floor = permute_floor(ctx, i) if weight == 1.0 else math.inf
        if floor < math.inf:
            # every permute leads to a state ranked at least this
            push(heap, (g + weight * (floor if floor > h else h), neg_g, next(counter), ~i))
        if general:
            # the general permutes of state i, generated only once one may still be on
            # the cheapest plan (each costs at least a launch, a hop and a copy)
            floor = general_floor + ctx.nbytes(i) * copy
            rank = g + weight * (floor if floor > h else h)
            push(heap, (rank, neg_g, next(counter), _General(i)))
    ctx.expanded += spent
    if reached is None:
        return None
    i = min(reached, key=lambda x: state_order(states[x]))
    return limit, _path(parent, i)


def _path(parent: dict, i: int) -> list:
    """The edges ``[(state, edge, next)]`` of the search's way to state ``i``."""
    moves = []
    while parent[i] is not None:
        prev, trans = parent[i]
        if type(prev) is tuple:
            # through a permute hub: one all_permute, its two halves' prices summed
            prev, first = parent[prev]
            trans = Edge(first.price + trans.price, *trans[1:])
        moves.append((prev, trans, i))
        i = prev
    moves.reverse()
    return moves


class _Merges:
    """A search queue entry: the merged steps of ``state``, generated when it is popped."""

    __slots__ = ("state",)

    def __init__(self, state: int):
        self.state = state


class _General:
    """A search queue entry: the general permutes of ``state``, generated when it is popped."""

    __slots__ = ("state",)

    def __init__(self, state: int):
        self.state = state


def _commute_filter(ctx, prev: int, x: Edge, succ: tuple) -> tuple:
    """The edges of ``succ`` (from the state the edge ``x`` led to out of ``prev``) that the
    partial-order reduction keeps: a structural single-dim step ``y`` after ``x`` on another
    mesh dim and other shard orders is dropped when ``y`` then ``x`` is cheaper (on a tie,
    when ``y`` moves the lower mesh dim)."""
    states, nbytes, price, intern, bound = (
        ctx.states,
        ctx.local_bytes,
        ctx.price,
        ctx.intern,
        ctx.bound,
    )
    mx = x.dims[0]
    touch_x = x.touch
    pc, pch = states[prev]
    out = []
    for trans in succ:
        if trans.touch is not None and len(trans.dims) == 1:
            my = trans.dims[0]
            touch_y = trans.touch
            if my != mx and not any(d in touch_x for d in touch_y):
                # the same two steps the other way round: y from prev, then x
                t = trans.target
                codes_t, chains_t = states[t]
                q_codes = pc[:my] + (codes_t[my],) + pc[my + 1 :]
                q_chains = tuple(chains_t[d] if d in touch_y else pch[d] for d in range(len(pch)))
                cy, cx = codes_t[my], codes_t[mx]
                legal = (type(cy) is not int or cy == R or mixable(pc, cy)) and (
                    type(cx) is not int or cx == R or mixable(q_codes, cx)
                )
                if legal:
                    q = intern((q_codes, q_chains))
                    bp, bq, bt = nbytes[prev], nbytes[q], nbytes[t]
                    if bound is None or (bp + bq <= bound and bq + bt <= bound):
                        q_state = states[q]
                        alt = price(
                            trans.dims, trans.collective, trans.n_send, bp, bq, trans.scaled
                        ) * tie(states[prev], q_state) + price(
                            x.dims, x.collective, x.n_send, bq, bt, x.scaled
                        ) * tie(q_state, states[t])
                        here = x.price + trans.price
                        if alt < here or (alt == here and my < mx):
                            continue
        out.append(trans)
    return tuple(out)

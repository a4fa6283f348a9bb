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
import time

from ._edges import hub_edges, hub_member_edges, merges, permute_floor, singles
from ._encoding import Edge, R, is_partial, mixable, state_order
from ._general import general_permutes
from ._goals import admits, is_pattern
from ._merged_moves import merges_floor
from ._price import tie

__all__ = ["search", "OverBudget", "GREEDY"]

GREEDY = 1000.0
"""The heuristic's weight in the search for a plan past the budget: far above 1, so the
queue ranks by the estimate of the rest and reaches a goal in few expansions."""


MEMBER_SECONDS = 2e-5
"""About the time one permute hub member costs to list and intern (measured on a loaded
2-core machine: 322,000 members of a (2,)*8 mesh's hub took ~5 s): a search under a time
budget refuses a hub with more members than its time left buys."""


class OverBudget(Exception):
    """A search stopped after generating ``budget`` moves, or at its ``deadline``
    (``timed``); ``lower`` is a lower bound of every plan's price (the least rank left in
    its queue)."""

    def __init__(self, budget, lower: float, timed: bool = False) -> None:
        super().__init__(budget, lower)
        self.budget = budget
        self.lower = lower
        self.timed = timed


def search(
    ctx,
    start: int,
    goal,
    bounds=None,
    *,
    budget: int | None = None,
    weight: float = 1.0,
    deadline: float | None = None,
):
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
    move leading to it), ``deadline`` its time (an instant of ``time.thread_time()``: the
    thread's CPU time, so a loaded machine does not cut it short): past either the
    search raises :class:`OverBudget`.
    ``weight`` multiplies the heuristic in the queue's ranks: 1 finds the cheapest plan;
    above 1 (:data:`GREEDY`) a plan, fast, with no proof it is the cheapest (and without
    the all_permutes that reorder shards, whose targets are many).
    """
    run = _AStar(ctx, ctx.bounds if bounds is None else bounds, goal, budget, weight, deadline)
    try:
        return run.run(start)
    finally:
        ctx.expanded += run.spent


class _Deferred:
    """A search queue entry: moves of ``state`` of one kind (``moves(ctx, state)``: merged
    steps, all_permutes into their hubs, general permutes), queued at a lower bound of
    their rank and generated only when popped."""

    __slots__ = ("state", "moves")

    def __init__(self, state: int, moves) -> None:
        self.state = state
        self.moves = moves


class _AStar:
    """One A* search (:func:`search`): its queue and what it has found. Queue entries are
    ``(rank, -price so far, counter, node)``; a node is a state id, a permute hub (a
    tuple: ``_edges.hub_edges``) or a :class:`_Deferred`."""

    def __init__(
        self, ctx, bounds, goal, budget: int | None, weight: float, deadline: float | None
    ) -> None:
        self.ctx = ctx
        self.bounds = bounds
        self.states = states = ctx.states
        self.goals = goals = (goal,) if type(goal) is int else tuple(goal)
        self.goal = goals[0] if len(goals) == 1 else goals  # (the memo tables' key)
        # (the goals differ only in how they say shards: their Partial dims are the same)
        self.goal_codes = states[goals[0]][0]
        # a pattern (``unreduced_goal``, ``class_goal``) is every state it admits
        self.pattern = is_pattern(states[goals[0]])
        self.budget = math.inf if budget is None else budget
        self.weight = weight
        self.deadline = math.inf if deadline is None else deadline
        self.spent = 0  # moves generated
        self.memo: dict = {}  # state -> its heuristic
        self.best: dict = {}  # node -> the least price it was reached at
        self.parent: dict = {}  # node -> (the node before, the edge) or None
        self.heap: list = []
        self.closed: set = set()
        self.done: dict = {}  # permute hub -> the price it was expanded at
        self.counter = itertools.count()

    def h_of(self, i: int) -> float:
        """The heuristic of state ``i``: the least of its goals'."""
        hmemo = self.bounds.h
        key = (i, self.goal)
        h = hmemo.get(key)
        if h is None:
            heuristic = self.bounds.heuristic
            h = hmemo[key] = min([heuristic(i, g) for g in self.goals])
        return h

    def push(self, rank: float, neg_g: float, node) -> None:
        heapq.heappush(self.heap, (rank, neg_g, next(self.counter), node))

    def over_budget(self, key: float, timed: bool = False) -> OverBudget:
        return OverBudget(self.budget, key, timed)

    def run(self, start: int):
        """The search from ``start``: ``(cost, path)``, or None when no goal is reached."""
        memo, best, closed, heap = self.memo, self.best, self.closed, self.heap
        memo[start] = self.h_of(start)
        best[start] = 0.0
        self.parent[start] = None
        self.push(self.weight * memo[start], 0.0, start)
        goals, budget = self.goals, self.budget
        one = (len(goals) == 1 and not self.pattern) or self.weight != 1.0
        reached = limit = None  # goals reached at the least price, and that price
        pop = heapq.heappop
        deadline, clock = self.deadline, time.thread_time
        while heap:
            key, neg_g, _, i = pop(heap)
            if reached is not None and key > limit:
                break
            if self.spent > budget:
                raise self.over_budget(key)
            if clock() > deadline:
                raise self.over_budget(key, timed=True)
            g = -neg_g
            kind = type(i)
            if kind is tuple:
                self.expand_hub(i, g, key)
                continue
            if kind is _Deferred:
                s = i.state
                if g <= best[s]:
                    self.relax(s, g, memo[s], i.moves(self.ctx, s))
                continue
            if i in closed or g > best[i]:
                continue
            h = self.lazy_rank(i, g, key, neg_g)
            if h is None:
                continue
            if self.is_goal(i):
                if one:
                    return g, _path(self.parent, i)
                # of several goals reached at this very price (a tie the tie-breaking
                # factors lost to rounding), the first in ``state_order`` wins, as in a
                # table walk
                if reached is None:
                    reached, limit = [], g
                reached.append(i)
                closed.add(i)
                continue
            closed.add(i)
            self.expand(i, g, h, neg_g)
        if reached is None:
            return None
        states = self.states
        i = min(reached, key=lambda x: state_order(states[x]))
        return limit, _path(self.parent, i)

    def lazy_rank(self, i: int, g: float, key: float, neg_g: float) -> float | None:
        """State ``i``'s heuristic, evaluated only when popped (it was queued under its
        parent's less the step's price, a lower bound of its own by consistency); None
        when it ranks later than it was queued, and is queued again."""
        h = self.memo.get(i)
        if h is None:
            h = self.memo[i] = self.h_of(i)
            rank = g + self.weight * h
            if rank > key:
                self.push(rank, neg_g, i)
                return None
        return h

    def is_goal(self, i: int) -> bool:
        if i in self.goals:
            return True
        if not self.pattern:
            return False
        states = self.states
        return any(admits(states[x], states[i]) for x in self.goals)

    def relax(self, i: int, g: float, h: float, succ, floor: float = 0.0) -> None:
        """Queue the edges ``succ`` out of ``i`` (reached at price ``g``, heuristic ``h``;
        ``floor``: a lower bound of the rest from every state of ``succ``)."""
        self.spent += len(succ)
        goal_codes, merge_dims = self.goal_codes, self.ctx.merge_dims
        best, parent, memo, closed = self.best, self.parent, self.memo, self.closed
        weight, heap, counter, push = self.weight, self.heap, self.counter, heapq.heappush
        for trans in succ:
            c, t, dims, collective, _, _, touch = trans
            if collective is None and touch == () and len(dims) == 1:
                # Replicate -> Partial, or sum <-> avg, on a mesh dim the goal keeps
                # un-Partial: whatever reduces it later could have run without it (unless
                # it is reduced in a step merged onto an alias, the only one there may be)
                m = dims[0]
                if not is_partial(goal_codes[m]) and m not in merge_dims:
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

    def expand_hub(self, hub: tuple, g: float, key: float) -> None:
        """A permute hub, reached at ``g`` with ``key - g`` a lower bound of the rest:
        the all_permutes into its members, once per search at its least price."""
        if g > self.best[hub] or self.done.get(hub, math.inf) <= g:
            return
        source, via = self.parent[hub]
        kept_bounds, goal = self.bounds.kept, self.goal
        kept = kept_bounds.get((source, goal))
        if kept is None:
            kept_bound = self.bounds.kept_bound
            kept = kept_bounds[(source, goal)] = min([kept_bound(source, x) for x in self.goals])
        rest = (key - g) / self.weight
        if kept > rest:
            # every member's rest is at least ``kept``: rank the hub by it, and generate
            # its members only if it is still among the cheapest when popped again
            rank = g + self.weight * kept
            if rank > key:
                self.push(rank, -g, hub)
                return
        self.done[hub] = g
        room = self.budget - self.spent
        if self.deadline < math.inf:  # (members listed within the time left)
            room = min(room, (self.deadline - time.thread_time()) / MEMBER_SECONDS)
        succ = hub_member_edges(self.ctx, hub, via.dims, via.n_send, room)
        if succ is None:  # (more members than the budget has left)
            raise self.over_budget(key, timed=room < self.budget - self.spent)
        self.relax(hub, g, rest, succ, kept)

    def expand(self, i: int, g: float, h: float, neg_g: float) -> None:
        """Queue the moves out of state ``i``: its single-dim steps now, the other kinds
        as :class:`_Deferred` entries at a floor of their ranks."""
        ctx, weight = self.ctx, self.weight
        succ = singles(ctx, i)
        via = self.parent[i]
        if via is not None:
            prev, edge = via
            if edge.touch is not None and len(edge.dims) == 1:
                # the single-dim steps the commuting-steps reduction keeps
                key = (prev, edge.target, edge.dims, edge.collective, i)
                kept = ctx.kept.get(key)
                if kept is None:
                    kept = ctx.kept[key] = _commute_filter(ctx, prev, edge, succ)
                succ = kept
        self.relax(i, g, h, succ)
        if ctx.aliases:
            # the merged steps, generated only once a plan through one may still be the
            # cheapest (``merges_floor``)
            floor = merges_floor(ctx, i)
            if floor < math.inf:
                self.push(g + weight * (floor if floor > h else h), neg_g, _Deferred(i, merges))
        floor = permute_floor(ctx, i) if weight == 1.0 else math.inf
        if floor < math.inf:
            # every permute leads to a state ranked at least this
            self.push(g + weight * (floor if floor > h else h), neg_g, _Deferred(i, hub_edges))
        if ctx.general:
            # the general permutes, generated only once one may still be on the cheapest
            # plan (each costs at least a launch, a hop and a copy)
            floor = ctx.launch + ctx.per_collective + self.bounds.latency_floor
            floor += ctx.nbytes(i) * ctx.copy
            rank = g + weight * (floor if floor > h else h)
            self.push(rank, neg_g, _Deferred(i, general_permutes))


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

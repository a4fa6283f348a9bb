"""The per-mesh-dim lower bound of a plan's price, the search's heuristic (no torch).

:func:`dim_bound` sums what each mesh dim needs (``_bound_parts.dim_need``, one
:class:`~._bound_parts.DimNeed` record per dim) into a :class:`Tally`: the collectives,
launches and latencies, local steps, and a bandwidth floor of the bytes the collectives
move and the first rank lacks. ``_bounds.Bounds.heuristic`` takes the least of it and
the bound of plans through a general permute (``_general_bound``).

Launches: every mesh dim that must reduce, or go from a shard to Replicate, needs
a collective; any other mesh dim in the wrong shard placement or order position
needs at least one more collective between them (one over all of them moves
its whole group's share, (k-1)/k on the slowest link; more cost a launch each,
unless an alias lets them ride the others: ``reshard_group``); a step merged onto an
alias serves up to ``widest`` of those needs at once; alpha * log2(size) per such dim;
one local launch per dim that must become a shard or Partial from Replicate, or
change Partial kind. The "collectives" objective's weight rides on every launch.

Bandwidth: each of those collectives moves at least its share of the smallest
local tensor it can run on (the tensor split over every mesh dim sharded in
``state`` or ``goal``, and over dims replicated in both that the plan might shard
for a while, paying a slice and a gather for each: a :class:`Detour`), on its own
dim's link; and the first rank must receive what it lacks, at the fastest link (at the
price the model charges a received byte at least: ``missing_rate``). Dims to gather
(sharded here, replicated in the goal) gather one at a time: the k-th runs on a
tensor the dims gathered before it have grown, so they count in the cheapest
order, slowest links first; a dim sharded for a while gathers among them.
Partial dims to reduce-scatter likewise, counted from the last. A Partial dim
reduces on an input its own dim does not split; one that is never sharded reduces
by an all_reduce (twice a reduce-scatter's latency and bytes). Gathers leave a
shard order at its end and reduce-scatters join it there, so an order that keeps
the shard orders may cost more; breaking one takes a collective the count leaves
out (or a local step and an all_reduce's gather half: :func:`_order_break`).

Alias dims count less (``_bounds.Bounds``): a merged all_reduce moves (N-1)/N of its
input, less than its dims' shares summed, but on an input none of the alias's dims
splits (``reduce_weight``); a merged all_gather moves no fewer bytes than its dims'
gathers in sequence, so it counts among them; a gather to undo a detour, or to re-shard
by gather and slice, may ride in a merged step (no launch of its own, unless no
collective the count holds shares an alias with it); but no step serves two dims no
alias holds together, nor one dim twice (``apart_count``).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from ._bound_parts import (
    IDLE,
    LOCAL,
    NONE,
    ORDER,
    OWN,
    RELABEL,
    apart_count,
    collective_cover,
    dim_need,
    first_rank_missing,
    goal_table,
    may_relabel,
    reduce_weight,
    reshard_group,
)
from ._encoding import R, is_partial, is_wildcard
from ._sequence import sequence_weights

__all__ = ["dim_bound", "Tally", "Detour"]


class Detour(NamedTuple):
    """A mesh dim a plan may shard for a while (Replicate in both specs, or Partial in
    one) to shrink the other collectives' inputs, and what that costs at least."""

    dim: int
    price: float  # its extra launches and latencies (a slice, a gather or a reduction)
    gathers: tuple  # items it adds to the gather sequence (``_sequence``)
    adds: int  # 1: it adds a collective the count may not hold
    paid: int  # 1: that collective's launch is in ``price`` already


class Tally:
    """What the mesh dims of one (state, goal) pair need, summed over the dims."""

    __slots__ = (
        "single", "other", "smask", "omask", "lat", "local", "reduce", "split", "unsplit",
        "lw", "loose", "spare", "w_single", "w_other", "gathers", "scatters", "red",
        "shard_mask", "relabel", "rel_lat", "rel_w",
    )  # fmt: skip

    def __init__(self) -> None:
        self.single = 0  # dims needing a collective of their own
        self.other = False  # whether some dims need a collective between them
        self.smask = self.omask = 0  # the mesh dims of ``single`` and ``other`` (bit masks)
        self.lat = 0.0  # their latencies
        self.local = 0  # local steps
        self.reduce = False  # whether a Partial dim reduces
        self.split = 1  # the pieces the smallest local tensor is cut into
        self.unsplit = 1  # sizes of dims Partial in state or goal (a plan may shard them)
        self.lw = 0  # local steps, each weighted by the split its output cannot have
        self.loose: tuple = ()  # Detours of those dims
        self.spare: tuple = ()  # dims replicated in both
        self.w_single = 0.0  # bandwidth weights of the own collectives summed
        self.w_other = 0.0  # the heaviest of the collectives between dims
        self.gathers = None  # (weight, size, tensor dim, order position) of dims to gather
        self.scatters = None  # the same of the Partial dims to reduce-scatter
        self.red = None  # (mesh dim, weight) of the other Partial dims to reduce
        self.shard_mask = 0  # the mesh dims sharded here or in the goal
        self.relabel = 0  # dims to take another shard placement of the same tiny tensor dim
        self.rel_lat = self.rel_w = 0.0  # their latencies and heaviest weight

    def add_other(self, m: int, latency: float, weight: float) -> None:
        """Mesh dim ``m`` needs some collective, maybe one it shares with other dims."""
        self.other = True
        self.omask |= 1 << m
        self.lat += latency
        if weight > self.w_other:
            self.w_other = weight


def dim_bound(b, state, goal) -> float:
    """A lower bound on the price of any plan from ``state`` to ``goal`` (ids) of
    single-dim steps, permutes and merged steps (``b``: a :class:`~._bounds.Bounds`; the
    module doc says what it counts)."""
    info = b.goal_info.get(goal) or goal_table(b, goal)
    t = _tally(b, b.states[state], info, goal)
    count, o_gap, o_pen = _launches(b, t)
    h = count * (b.launch + b.per_collective) + t.lat + t.local * b.local_launch
    full = b.total_bytes / t.split
    n_spare = 1
    for x in t.spare:
        n_spare *= b.sizes[x]
    # each local step writes at least the smallest local tensor it can run on
    local_copy = t.lw * b.copy * full / (t.unsplit * n_spare)
    least = full / (t.unsplit * n_spare)
    if t.relabel and not t.other:
        # dims to take another shard placement of a tiny dim: each by a local step of its
        # own (said another way: it writes a local tensor), or together in a collective
        # the count leaves out (one that re-shards them, or a merged gather and then a
        # slice each); with dims to re-shard, they may ride its collective
        h += min(
            t.relabel * (b.local_launch + b.copy * least),
            b.launch + b.per_collective + t.rel_lat + t.rel_w * least,
        )
    bw_free, bw_kept = _bandwidth(b, t, count, o_gap, o_pen, full)
    missing = 0.0
    if not info.partial:
        missing = first_rank_missing(b, state, goal, t.reduce) * b.itemsize * b.missing_rate
    best = bw_free + local_copy
    missing += local_copy
    if bw_kept > bw_free and not t.other:
        return h + _order_break(b, t, best, bw_kept + local_copy, missing, least)
    return h + (missing if missing > best else best)


def _tally(b, state, info, goal: int) -> Tally:
    """Each mesh dim's :class:`~._bound_parts.DimNeed`, summed into a :class:`Tally`
    (``state``: a State, ``goal``: an id)."""
    codes, chains = state
    tables, _, goal_chains, goal_codes = info
    t = Tally()
    for m, table in tables:
        a = codes[m]
        e = table.get(a)
        if e is None:
            e = table[a] = dim_need(b, m, a, goal_codes[m])
        kind, n_split, dlat, dlocal, dw = e
        t.split *= n_split
        if n_split > 1:
            t.shard_mask |= 1 << m
        elif kind != IDLE:
            t.unsplit *= b.sizes[m]
            t.loose += (_loose_detour(b, m, a, kind, goal_codes[m]),)
        if kind == NONE:
            continue
        if kind == OWN:  # a collective of its own
            t.single += 1
            t.smask |= 1 << m
            t.lat += dlat
            if dlocal:
                t.local += 1
                t.lw += b.sizes[m]  # its local step writes a tensor unsplit on m
            if type(a) is int:
                _add_reduction(b, t, m, dw, goal_codes[m], goal_chains)
            else:
                d = a[0]
                g = (dw * b.gather_share[m], b.sizes[m], -1 if b.tiny[d] else d, chains[d].index(m))
                t.gathers = (g,) if t.gathers is None else t.gathers + (g,)
        elif kind == LOCAL:
            t.local += 1
            t.lw += b.sizes[m] if is_partial(goal_codes[m]) else 1
        elif kind == IDLE:  # replicated in both
            t.spare += (m,)
        elif kind == RELABEL and may_relabel(b, m, a[0], state, goal):
            # a local step or a collective (``dim_bound``)
            t.relabel += 1
            t.rel_lat += dlat
            if dw > t.rel_w:
                t.rel_w = dw
        elif kind != ORDER or _misplaced(b, m, a[0], state, info, goal):
            # another shard placement (or a tiny dim's that its coordinate reads from
            # other index bits, or the right one at a wrong order position): some
            # collective
            t.add_other(m, dlat, dw)
    return t


def _loose_detour(b, m: int, a, kind, bc) -> Detour:
    """The cheapest way to shard a dim Partial in state or goal for a while: R -> S -> P
    takes one more local step; P -> S -> P' (P' not sum/avg of P) none; any other needs
    a collective (and one that ends in a gather counts it in the gather sequence)."""
    if a == R:
        return Detour(m, b.local_launch, (), 0, 0)
    if kind == OWN and bc != R:
        return Detour(m, 0.0, (), 0, 0)
    if m in b.merge_dims:
        return Detour(m, 0.0, b.detour_items[m] if kind == OWN else (), 1, 0)
    collective = b.launch + b.per_collective + b.alpha_log[m]
    if is_partial(bc):
        # Partial here and in the goal: a reduce_scatter, and a local step back to
        # Partial (no gather; a sum <-> avg change counts that step already)
        return Detour(m, collective + (b.local_launch if kind == NONE else 0.0), (), 1, 1)
    return Detour(m, collective, b.detour_items[m], 1, 1)


def _add_reduction(b, t: Tally, m: int, dw: float, bc, goal_chains) -> None:
    """Count Partial mesh dim ``m`` reducing on its way to the goal's code ``bc``."""
    t.reduce = True
    if is_wildcard(bc):
        # (ANY, or a SHARD_ANY code) reduced by an all_reduce or a reduce_scatter: the
        # cheaper
        t.w_single += dw
    elif type(bc) is not tuple:
        t.red = ((m, dw),) if t.red is None else t.red + ((m, dw),)
    elif m not in b.merge_dims:
        # reduce-scattered: the later it runs, the smaller its input
        d = bc[0]
        g = (dw, b.sizes[m], -1 if b.tiny[d] else d, goal_chains[d].index(m))
        t.scatters = (g,) if t.scatters is None else t.scatters + (g,)
    else:
        t.w_single += dw


def _misplaced(b, m: int, d: int, state, info, goal: int) -> bool:
    """Whether mesh dim ``m``, sharding tensor dim ``d`` as the goal does, sits at a wrong
    position of its shard order (so it needs a collective)."""
    codes, chains = state
    _, _, goal_chains, goal_codes = info
    chain, gchain = chains[d], goal_chains[d]
    k = chain.index(m)
    wrong = (
        k >= len(gchain)
        or gchain[k] != m
        or any(
            x != y or codes[x] != goal_codes[y] for x, y in zip(chain[:k], gchain[:k], strict=True)
        )
    )
    # (on a tiny dim, another dim's local step that moves nothing may reorder the chain
    # around it, unless its coordinate must read other index bits: then only a
    # collective over it will do)
    return wrong and not (b.tiny[d] and may_relabel(b, m, d, state, goal))


def _launches(b, t: Tally) -> tuple[int, float, float]:
    """The collectives a plan needs at least, and the gap and penalty of re-sharding
    dims apart from them: ``(count, o_gap, o_pen)``."""
    # a merged step serves up to ``widest`` dims, a dim to re-shard among them: gathered
    # with the others, then sliced
    count = -(-(t.single + (1 if t.other else 0)) // b.widest)
    if b.aliases and count:
        key = (t.smask, t.omask)
        c = b.covers.get(key)
        if c is None:
            c = b.covers[key] = collective_cover(b, t.smask, t.omask)
        if c > count:
            count = c
    o_gap = o_pen = 0.0
    if t.other:
        # the dims to re-shard take one collective over all of them (an all_to_all or
        # all_permute, or a merged gather and slices: its group's share, at least), or
        # more; those are apart from the collectives of ``smask`` unless an alias holds
        # dims of both
        alone, o_count, w_group = reshard_group(b, t.smask, t.omask)
        if alone:
            if o_count > count:
                count = o_count
            if w_group > t.w_other:
                o_gap, o_pen = w_group - t.w_other, b.launch + b.per_collective
    return count, o_gap, o_pen


def _bandwidth(b, t: Tally, count: int, o_gap: float, o_pen: float, full: float):
    """The bandwidth floor ``(free, kept)``: of any plan, and of one that keeps every
    tensor dim's shard order (gathers leave it from its end; reduce-scatters join it at
    its end); ``full`` is the smallest local tensor's bytes."""
    # dims sharded here and replicated in the goal, gathered one at a time: when a dim's
    # last gather runs, every dim whose last gather ran before is replicated (sharding
    # it again would need another), so the k-th gather's input is at least the sizes of
    # the dims gathered before it times the smallest local tensor. Likewise a Partial dim
    # to reduce-scatter: when it first reduces, every such dim reducing after it is still
    # Partial (unsharded), so counted from the last one back, the k-th's input grows by
    # the sizes of those after it (``sequence_weights``)
    w_base = t.w_single + t.w_other
    if t.red is None:
        w_rest, red_lat = w_base, 0.0
    else:
        w_red, red_lat = reduce_weight(b, t.red, t.shard_mask)
        w_rest = w_base + w_red
    if t.gathers is None and t.scatters is None:
        seq = (0.0, 0.0)
    else:
        seq = sequence_weights(t.gathers, t.scatters, ())
    bw_free, bw_kept = w_rest + seq[0], w_rest + seq[1]
    if not bw_free:
        return bw_free, bw_kept
    red_lat += min(o_gap * full, o_pen)
    bw_free = bw_free * full + red_lat
    bw_kept = bw_kept * full + red_lat
    if t.spare:
        detour, items, merge_dims = b.detour, b.detour_items, b.merge_dims
        spare_all = tuple(
            Detour(x, detour[x], items[x], 1, 0 if x in merge_dims else 1) for x in t.spare
        )
        spare_all += t.loose
    else:
        spare_all = t.loose
    if spare_all and (bw_free > b.detour_floor or t.loose):
        # sharding dims replicated in both (``spare``) or Partial (``loose``) for a while
        # shrinks every collective's input; a spare dim then gathers once more (unless
        # that may ride a merged step), in the gather sequence
        for k in range(1, len(spare_all) + 1):
            for combo in itertools.combinations(spare_all, k):
                n, extra, w, more = _detour_price(b, t, combo, count, w_base, w_rest)
                if o_gap:
                    v = o_gap * full / n
                    extra += v if v < o_pen else o_pen
                v = sequence_weights(t.gathers, t.scatters, more) if more else seq
                wf, wk = w + v[0], w + v[1]
                v = extra + wf * full / n
                if v < bw_free:
                    bw_free = v
                if wk != wf:
                    v = extra + wk * full / n
                if v < bw_kept:
                    bw_kept = v
    return bw_free, bw_kept


def _detour_price(b, t: Tally, combo: tuple, count: int, w_base: float, w_rest: float):
    """What sharding the dims of ``combo`` (:class:`Detour` values) for a while splits the
    tensor by, and costs: ``(split, extra price, bandwidth weight, gather items)``."""
    sizes, reach = b.sizes, b.alias_reach
    n = 1
    extra = 0.0
    more = ()
    dmask = ride = 0
    adds = charged = 0
    for x, e, item, add, paid in combo:
        n *= sizes[x]
        extra += e
        more += item
        dmask |= 1 << x
        if item:
            ride |= reach[x]
        if add:
            adds |= 1 << x
            charged += paid
    if ride and not ride & ((t.smask & ~dmask) | t.omask):
        # alias dims' detours end in gathers that ride a merged step (no launch counted).
        # That step serves none of the counted collectives unless one of their dims
        # shares an alias with them (a detoured Partial dim's counted collective is its
        # reduce-scatter, before): else it is one more
        extra += b.launch + b.per_collective + b.alpha_floor
        charged += 1
    if adds and b.aliases:
        # collectives apart: no step serves two dims no alias holds both of, nor one dim
        # twice (a detoured Partial dim reduces, then gathers)
        apart = apart_count(b, t.smask, adds, t.omask) - count - charged
        if apart > 0:
            extra += apart * (b.launch + b.per_collective)
    if t.red is None:  # (a Partial dim reduces unsharded: ``reduce_weight``)
        return n, extra, w_rest, more
    w, lat_red = reduce_weight(b, t.red, t.shard_mask | dmask)
    return n, extra + lat_red, w + w_base, more


def _order_break(b, t: Tally, best: float, kept: float, missing: float, least: float) -> float:
    """The bandwidth floor when keeping the shard orders costs more than the free one:
    a plan either keeps them (``kept``) or breaks one (``best`` plus a penalty)."""
    # breaking an order takes a collective the count leaves out (an all_permute, or an
    # all_to_all of a dim it must still gather or reduce), at least a launch, its latency
    # and (k-1)/k of the smallest tensor any collective runs on; or, with Partial
    # targets, a shard made Partial (a local step) to reduce later; or a Partial dim
    # all-reduced and sliced later (a local step and the all_reduce's gather half)
    pen_lat = b.launch + b.per_collective + b.alpha_floor
    pen_bw = b.missing_rate * least
    if b.ptargets and t.gathers is not None:
        pen_lat, pen_bw = b.local_launch, 0.0
    if t.scatters is not None:
        lat_ar = b.local_launch
        bw_ar = least * min(b.weights[m].gather for m in b.active)
        if lat_ar + bw_ar < pen_lat + pen_bw:
            pen_lat, pen_bw = lat_ar, bw_ar
    broken = best + pen_bw
    if missing > kept:
        kept = missing
    if missing > broken:
        broken = missing
    return min(kept, pen_lat + broken)

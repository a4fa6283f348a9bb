"""The per-mesh-dim lower bound of a plan's price, the search's heuristic (no torch).

:func:`dim_bound` counts what each mesh dim needs (``_bound_parts.dim_need``): the
collectives, launches and latencies, local steps, and a bandwidth floor of the bytes the
collectives move and the first rank lacks. ``_bounds.Bounds.heuristic`` takes the least
of it and the bound of plans through a general permute (``_general_bound``).
"""

from __future__ import annotations

import itertools

from ._bound_parts import (
    IDLE,
    LOCAL,
    NONE,
    OWN,
    RELABEL,
    RESHARD,
    apart_count,
    collective_cover,
    dim_need,
    first_rank_missing,
    goal_table,
    may_relabel,
    reduce_weight,
    reshard_group,
)
from ._encoding import R
from ._sequence import sequence_weights

__all__ = ["dim_bound"]


def dim_bound(b, state, goal) -> float:
    """A lower bound on the price of any plan from ``state`` to ``goal`` (ids) of
    single-dim steps, permutes and merged steps (``b``: a :class:`~._bounds.Bounds`).

    Launches: every mesh dim that must reduce, or go from a shard to Replicate, needs
    a collective; any other mesh dim in the wrong shard placement or order position
    needs at least one more collective between them (one over all of them moves
    its whole group's share, (k-1)/k on the slowest link; more cost a launch each,
    unless an alias lets them ride the others: ``_group``); a step merged onto an alias
    serves up to ``widest`` of those needs at once; alpha * log2(size) per such dim;
    one local launch per dim that must become a shard or Partial from Replicate, or
    change Partial kind. The "collectives" objective's weight rides on every launch.
    Bandwidth: each of those collectives moves at least its share of the smallest
    local tensor it can run on (the tensor split over every mesh dim sharded in
    ``state`` or ``goal``, and over dims replicated in both that the plan might shard
    for a while, paying a slice and a gather for each), on its own dim's link; and
    the first rank must receive what it lacks, at the fastest link (at the price the
    model charges a received byte at least: ``missing_rate``). Dims to gather
    (sharded here, replicated in the goal) gather one at a time: the k-th runs on a
    tensor the dims gathered before it have grown, so they count in the cheapest
    order, slowest links first; a dim sharded for a while gathers among them.
    Partial dims to reduce-scatter likewise, counted from the last. A Partial dim
    reduces on an input its own dim does not split; one that is never sharded reduces
    by an all_reduce (twice a reduce-scatter's latency and bytes). Gathers leave a
    shard order at its end and reduce-scatters join it there, so an order that keeps
    the shard orders may cost more; breaking one takes a collective the count leaves
    out (or a local step and an all_reduce's gather half). Alias dims count less
    (``_bounds.Bounds``): a merged all_reduce moves (N-1)/N of its
    input, less than its dims' shares summed, but on an input none of the alias's
    dims splits (:meth:`_reduce_weight`); a merged all_gather moves no fewer bytes
    than its dims' gathers in sequence, so it counts among them; a gather to undo a
    detour, or to re-shard by gather and slice, may ride in a merged step (no launch
    of its own, unless no collective the count holds shares an alias with it); but
    no step serves two dims no alias holds together, nor one dim twice
    (:meth:`_apart`).
    """
    sid = state
    codes, chains = state = b.states[state]
    info = b.goal_info.get(goal) or goal_table(b, goal)
    tables, goal_partial, goal_chains, goal_codes = info
    single = 0
    other = False
    smask = omask = 0  # the mesh dims of ``single`` and ``other``, as bit masks
    lat = 0.0
    local = 0
    reduce = False
    split = 1
    unsplit = 1  # sizes of dims Partial in state or goal (a plan may shard them)
    lw = 0  # local steps, each weighted by the split its output cannot have
    loose = None  # those dims: a plan may shard them for a while at an extra step
    spare = None
    w_single = 0.0
    w_other = 0.0
    gathers = None  # (weight, size, tensor dim, order position) of the dims to gather
    scatters = None  # the same of the Partial dims to reduce-scatter (see below)
    red = None  # (mesh dim, weight) of the other Partial dims to reduce
    shard_mask = 0  # the mesh dims sharded here or in the goal
    relabel = 0  # dims to take another shard placement of the same tiny tensor dim
    rel_lat = rel_w = 0.0  # their latencies and heaviest weight, by a collective
    for m, table in tables:
        a = codes[m]
        e = table.get(a)
        if e is None:
            e = table[a] = dim_need(b, m, a, goal_codes[m])
        kind, n_split, dlat, dlocal, dw = e
        split *= n_split
        if n_split > 1:
            shard_mask |= 1 << m
        elif kind != IDLE:
            unsplit *= b.sizes[m]
            # the cheapest way to shard it for a while: R -> S -> P takes one more local
            # step; P -> S -> P' (P' not sum/avg of P) none; any other needs a collective
            bc = goal_codes[m]
            # (and one that ends in a gather counts it in the gather sequence)
            # (with the collectives it adds, and of those the ones charged here)
            if a == R:
                e = (m, b.local_launch, (), 0, 0)
            elif kind == OWN and bc != R:
                e = (m, 0.0, (), 0, 0)
            elif m in b.merge_dims:
                e = (m, 0.0, b.detour_items[m] if kind == OWN else (), 1, 0)
            elif type(bc) is int and bc > R:
                # Partial here and in the goal: a reduce_scatter, and a local step back
                # to Partial (no gather; a sum <-> avg change counts that step already)
                back = b.local_launch if kind == NONE else 0.0
                e = (m, b.launch + b.per_collective + b.alpha_log[m] + back, (), 1, 1)
            else:
                e = (
                    m,
                    b.launch + b.per_collective + b.alpha_log[m],
                    b.detour_items[m],
                    1,
                    1,
                )
            loose = (e,) if loose is None else loose + (e,)
        if kind == NONE:
            continue
        if kind == OWN:  # a collective of its own
            single += 1
            smask |= 1 << m
            lat += dlat
            if dlocal:
                local += 1
                lw += b.sizes[m]  # its local step writes a tensor unsplit on m
            if type(a) is int:
                reduce = True
                bc = goal_codes[m]
                if type(bc) is int and bc < R:
                    # (ANY, or a SHARD_ANY code) reduced by an all_reduce or a
                    # reduce_scatter: the cheaper
                    w_single += dw
                elif type(bc) is not tuple:
                    red = ((m, dw),) if red is None else red + ((m, dw),)
                elif m not in b.merge_dims:
                    # reduce-scattered: the later it runs, the smaller its input
                    d = bc[0]
                    g = (dw, b.sizes[m], -1 if b.tiny[d] else d, goal_chains[d].index(m))
                    scatters = (g,) if scatters is None else scatters + (g,)
                else:
                    w_single += dw
            else:
                d = a[0]
                g = (
                    dw * b.gather_share[m],
                    b.sizes[m],
                    -1 if b.tiny[d] else d,
                    chains[d].index(m),
                )
                gathers = (g,) if gathers is None else gathers + (g,)
        elif kind == RESHARD:  # some collective
            other = True
            omask |= 1 << m
            lat += dlat
            if dw > w_other:
                w_other = dw
        elif kind == LOCAL:
            local += 1
            bc = goal_codes[m]
            lw += b.sizes[m] if type(bc) is int and bc > R else 1
        elif kind == IDLE:  # replicated in both
            spare = (m,) if spare is None else spare + (m,)
        elif kind == RELABEL and may_relabel(b, m, a[0], state, goal):
            # a local step or a collective (see below)
            relabel += 1
            rel_lat += dlat
            if dw > rel_w:
                rel_w = dw
        elif kind == RELABEL:  # its coordinate picks other indices: some collective
            other = True
            omask |= 1 << m
            lat += dlat
            if dw > w_other:
                w_other = dw
        else:  # ORDER: same shard placement; is its order position right?
            d = a[0]
            chain, gchain = chains[d], goal_chains[d]
            k = chain.index(m)
            if (
                k >= len(gchain)
                or gchain[k] != m
                or any(
                    x != y or codes[x] != goal_codes[y]
                    for x, y in zip(chain[:k], gchain[:k], strict=True)
                )
            ) and not (b.tiny[d] and may_relabel(b, m, d, state, goal)):
                # (on a tiny dim, another dim's local step that moves nothing may
                # reorder the chain around it, unless its coordinate must read other
                # index bits: then only a collective over it will do)
                other = True
                omask |= 1 << m
                lat += dlat
                if dw > w_other:
                    w_other = dw
    # collectives the plan needs at least (a merged step serves up to ``widest`` dims,
    # a dim to re-shard among them: gathered with the others, then sliced)
    count = -(-(single + (1 if other else 0)) // b.widest)
    if b.aliases and count:
        c = b.covers.get((smask, omask))
        if c is None:
            c = b.covers[(smask, omask)] = collective_cover(b, smask, omask)
        if c > count:
            count = c
    o_gap = o_pen = 0.0
    if other:
        # the dims to re-shard take one collective over all of them (an all_to_all or
        # all_permute, or a merged gather and slices: its group's share, at least), or
        # more; those are apart from the collectives of ``smask`` unless an alias holds
        # dims of both
        alone, o_count, w_group = reshard_group(b, smask, omask)
        if alone:
            if o_count > count:
                count = o_count
            if w_group > w_other:
                o_gap, o_pen = w_group - w_other, b.launch + b.per_collective
    h = count * (b.launch + b.per_collective) + lat + local * b.local_launch
    # dims sharded here and replicated in the goal, gathered one at a time: when a
    # dim's last gather runs, every dim whose last gather ran before is replicated
    # (sharding it again would need another), so the k-th gather's input is at least
    # the sizes of the dims gathered before it times the smallest local tensor.
    # Likewise a Partial dim to reduce-scatter: when it first reduces, every such dim
    # reducing after it is still Partial (unsharded), so counted from the last one
    # back, the k-th's input grows by the sizes of those after it. ``_orders`` gives
    # the cheapest order's weights, and the cheapest that keeps each tensor dim's
    # shard order (gathers leave it from its end; reduce-scatters join it at its end)
    w_base = w_single + w_other
    if red is None:
        w_rest, red_lat = w_base, 0.0
    else:
        w_red, red_lat = reduce_weight(b, red, shard_mask)
        w_rest = w_base + w_red
    full = b.total_bytes / split
    n_spare = 1
    for x in spare or ():
        n_spare *= b.sizes[x]
    # each local step writes at least the smallest local tensor it can run on
    local_copy = lw * b.copy * full / (unsplit * n_spare)
    if relabel and not other:
        # dims to take another shard placement of a tiny dim: each by a local step
        # of its own (said another way: it writes a local tensor), or together in a
        # collective the count leaves out (one that re-shards them, or a merged
        # gather and then a slice each); with dims to re-shard, they may ride its
        # collective
        least = full / (unsplit * n_spare)
        h += min(
            relabel * (b.local_launch + b.copy * least),
            b.launch + b.per_collective + rel_lat + rel_w * least,
        )
    if gathers is None and scatters is None:
        seq = (0.0, 0.0)
    else:
        seq = sequence_weights(gathers, scatters, ())
    bw_free, bw_kept = w_rest + seq[0], w_rest + seq[1]
    if bw_free:
        red_lat += min(o_gap * full, o_pen)
        bw_free = bw_free * full + red_lat
        bw_kept = bw_kept * full + red_lat
        if spare:
            detour, items = b.detour, b.detour_items
            merge_dims = b.merge_dims
            spare_all = tuple(
                (x, detour[x], items[x], 1, 0 if x in merge_dims else 1) for x in spare
            )
            if loose:
                spare_all += loose
        else:
            spare_all = loose
        if spare_all and (bw_free > b.detour_floor or loose):
            # sharding dims replicated in both (``spare``) or Partial (``loose``) for
            # a while shrinks every collective's input; a spare dim then gathers once
            # more (unless that may ride a merged step), in the gather sequence
            sizes, reach = b.sizes, b.alias_reach
            ride_launch = b.launch + b.per_collective + b.alpha_floor
            for k in range(1, len(spare_all) + 1):
                for combo in itertools.combinations(spare_all, k):
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
                    mask = shard_mask | dmask
                    if ride and not ride & ((smask & ~dmask) | omask):
                        # alias dims' detours end in gathers that ride a merged step
                        # (no launch counted). That step serves none of the counted
                        # collectives unless one of their dims shares an alias with
                        # them (a detoured Partial dim's counted collective is its
                        # reduce-scatter, before): else it is one more
                        extra += ride_launch
                        charged += 1
                    if adds and b.aliases:
                        # collectives apart: no step serves two dims no alias holds
                        # both of, nor one dim twice (a detoured Partial dim reduces,
                        # then gathers)
                        apart = apart_count(b, smask, adds, omask) - count - charged
                        if apart > 0:
                            extra += apart * (b.launch + b.per_collective)
                    # (a Partial dim reduces unsharded: ``_reduce_weight``)
                    if red is None:
                        w = w_rest
                    else:
                        w, lat_red = reduce_weight(b, red, mask)
                        w += w_base
                        extra += lat_red
                    if o_gap:
                        v = o_gap * full / n
                        extra += v if v < o_pen else o_pen
                    v = sequence_weights(gathers, scatters, more) if more else seq
                    wf, wk = w + v[0], w + v[1]
                    v = extra + wf * full / n
                    if v < bw_free:
                        bw_free = v
                    if wk != wf:
                        v = extra + wk * full / n
                    if v < bw_kept:
                        bw_kept = v
    missing = 0.0
    if not goal_partial:
        missing = first_rank_missing(b, sid, goal, reduce) * b.itemsize * b.missing_rate
    best = bw_free + local_copy
    if bw_kept > bw_free and not other:
        # a plan either keeps the shard orders or breaks one: by a collective the
        # count above leaves out (an all_permute, or an all_to_all of a dim it must
        # still gather or reduce), at least a launch, its latency and (k-1)/k of the
        # smallest tensor any collective runs on; or, with Partial targets, by a
        # shard made Partial (a local step) to reduce later; or by a Partial dim
        # all-reduced and sliced later (a local step and the all_reduce's gather half)
        least = full / (unsplit * n_spare)
        pen_lat = b.launch + b.per_collective + b.alpha_floor
        pen_bw = b.missing_rate * least
        if b.ptargets and gathers is not None:
            pen_lat, pen_bw = b.local_launch, 0.0
        if scatters is not None:
            lat_ar = b.local_launch
            bw_ar = least * min(b.weights[m].gather for m in b.active)
            if lat_ar + bw_ar < pen_lat + pen_bw:
                pen_lat, pen_bw = lat_ar, bw_ar
        kept = bw_kept + local_copy
        broken = best + pen_bw
        missing += local_copy
        if missing > kept:
            kept = missing
        if missing > broken:
            broken = missing
        return h + min(kept, pen_lat + broken)
    missing += local_copy
    if missing > best:
        best = missing
    return h + best

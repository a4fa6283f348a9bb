"""The search's heuristic: a lower bound of what a plan from a state to a goal costs (no torch).

A mix-in of the search context (``_search._Context``), whose tables it reads: the
per-mesh-dim weights, latencies and launch prices set up there, and its memo tables.
"""

from __future__ import annotations

import functools
import itertools
import math

from ._exact import _bit_owners, even_base, links, piece

R = 0  # the code of Replicate; Partial sum/avg/max/min are 1..4 (see ``_search``)
ANY = -2  # a goal's code for "any placement but Partial" (a tensor without elements)
# a goal's code for "any shard placement of tensor dim d" is ``SHARD_ANY - d`` (a pattern
# of a big goal class: ``_search.class_goal``)
SHARD_ANY = -3
SUMAVG = (1, 2)  # the Partial codes that mix
_SUMAVG = SUMAVG


class _Bounds:
    def heuristic(self, state, goal) -> float:
        """A lower bound on the price of any plan from ``state`` to ``goal``.

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
        (``_search._Context._set_aliases``): a merged all_reduce moves (N-1)/N of its
        input, less than its dims' shares summed, but on an input none of the alias's
        dims splits (:meth:`_reduce_weight`); a merged all_gather moves no fewer bytes
        than its dims' gathers in sequence, so it counts among them; a gather to undo a
        detour, or to re-shard by gather and slice, may ride in a merged step (no launch
        of its own, unless no collective the count holds shares an alias with it); but
        no step serves two dims no alias holds together, nor one dim twice
        (:meth:`_apart`).
        """
        sid = state
        codes, chains = state = self.states[state]
        info = self._goal_info.get(goal) or self._goal_table(goal)
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
                e = table[a] = self._entry(m, a, goal_codes[m])
            kind, n_split, dlat, dlocal, dw = e
            split *= n_split
            if n_split > 1:
                shard_mask |= 1 << m
            elif kind != 4:
                unsplit *= self.sizes[m]
                # the cheapest way to shard it for a while: R -> S -> P takes one more local
                # step; P -> S -> P' (P' not sum/avg of P) none; any other needs a collective
                b = goal_codes[m]
                # (and one that ends in a gather counts it in the gather sequence)
                # (with the collectives it adds, and of those the ones charged here)
                if a == R:
                    e = (m, self.local_launch, (), 0, 0)
                elif kind == 1 and b != R:
                    e = (m, 0.0, (), 0, 0)
                elif m in self.merge_dims:
                    e = (m, 0.0, self.detour_items[m] if kind == 1 else (), 1, 0)
                elif type(b) is int and b > R:
                    # Partial here and in the goal: a reduce_scatter, and a local step back
                    # to Partial (no gather; a sum <-> avg change counts that step already)
                    back = self.local_launch if kind == 0 else 0.0
                    e = (m, self.launch + self.per_collective + self.alpha_log[m] + back, (), 1, 1)
                else:
                    e = (
                        m,
                        self.launch + self.per_collective + self.alpha_log[m],
                        self.detour_items[m],
                        1,
                        1,
                    )
                loose = (e,) if loose is None else loose + (e,)
            if kind == 0:
                continue
            if kind == 1:  # a collective of its own
                single += 1
                smask |= 1 << m
                lat += dlat
                if dlocal:
                    local += 1
                    lw += self.sizes[m]  # its local step writes a tensor unsplit on m
                if type(a) is int:
                    reduce = True
                    b = goal_codes[m]
                    if type(b) is int and b < R:
                        # (ANY, or a SHARD_ANY code) reduced by an all_reduce or a
                        # reduce_scatter: the cheaper
                        w_single += dw
                    elif type(b) is not tuple:
                        red = ((m, dw),) if red is None else red + ((m, dw),)
                    elif m not in self.merge_dims:
                        # reduce-scattered: the later it runs, the smaller its input
                        d = b[0]
                        g = (dw, self.sizes[m], -1 if self.tiny[d] else d, goal_chains[d].index(m))
                        scatters = (g,) if scatters is None else scatters + (g,)
                    else:
                        w_single += dw
                else:
                    d = a[0]
                    g = (
                        dw * self.gather_share[m],
                        self.sizes[m],
                        -1 if self.tiny[d] else d,
                        chains[d].index(m),
                    )
                    gathers = (g,) if gathers is None else gathers + (g,)
            elif kind == 2:  # some collective
                other = True
                omask |= 1 << m
                lat += dlat
                if dw > w_other:
                    w_other = dw
            elif kind == 3:  # local
                local += 1
                b = goal_codes[m]
                lw += self.sizes[m] if type(b) is int and b > R else 1
            elif kind == 4:  # replicated in both
                spare = (m,) if spare is None else spare + (m,)
            elif kind == 6 and self._may_relabel(m, a[0], state, goal):
                # a local step or a collective (see below)
                relabel += 1
                rel_lat += dlat
                if dw > rel_w:
                    rel_w = dw
            elif kind == 6:  # its coordinate picks other indices: some collective
                other = True
                omask |= 1 << m
                lat += dlat
                if dw > w_other:
                    w_other = dw
            else:  # same shard placement: is its order position right?
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
                ) and not (self.tiny[d] and self._may_relabel(m, d, state, goal)):
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
        count = -(-(single + (1 if other else 0)) // self.widest)
        if self.aliases and count:
            c = self._covers.get((smask, omask))
            if c is None:
                c = self._covers[(smask, omask)] = self._cover(smask, omask)
            if c > count:
                count = c
        o_gap = o_pen = 0.0
        if other:
            # the dims to re-shard take one collective over all of them (an all_to_all or
            # all_permute, or a merged gather and slices: its group's share, at least), or
            # more; those are apart from the collectives of ``smask`` unless an alias holds
            # dims of both
            alone, o_count, w_group = self._group(smask, omask)
            if alone:
                if o_count > count:
                    count = o_count
                if w_group > w_other:
                    o_gap, o_pen = w_group - w_other, self.launch + self.per_collective
        h = count * (self.launch + self.per_collective) + lat + local * self.local_launch
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
            w_red, red_lat = self._reduce_weight(red, shard_mask)
            w_rest = w_base + w_red
        full = self.total_bytes / split
        n_spare = 1
        for x in spare or ():
            n_spare *= self.sizes[x]
        # each local step writes at least the smallest local tensor it can run on
        local_copy = lw * self.copy * full / (unsplit * n_spare)
        if relabel and not other:
            # dims to take another shard placement of a tiny dim: each by a local step
            # of its own (said another way: it writes a local tensor), or together in a
            # collective the count leaves out (one that re-shards them, or a merged
            # gather and then a slice each); with dims to re-shard, they may ride its
            # collective
            least = full / (unsplit * n_spare)
            h += min(
                relabel * (self.local_launch + self.copy * least),
                self.launch + self.per_collective + rel_lat + rel_w * least,
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
                detour, items = self.detour, self.detour_items
                merge_dims = self.merge_dims
                spare_all = tuple(
                    (x, detour[x], items[x], 1, 0 if x in merge_dims else 1) for x in spare
                )
                if loose:
                    spare_all += loose
            else:
                spare_all = loose
            if spare_all and (bw_free > self.detour_floor or loose):
                # sharding dims replicated in both (``spare``) or Partial (``loose``) for
                # a while shrinks every collective's input; a spare dim then gathers once
                # more (unless that may ride a merged step), in the gather sequence
                sizes, reach = self.sizes, self.alias_reach
                ride_launch = self.launch + self.per_collective + self.alpha_floor
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
                        if adds and self.aliases:
                            # collectives apart: no step serves two dims no alias holds
                            # both of, nor one dim twice (a detoured Partial dim reduces,
                            # then gathers)
                            apart = self._apart(smask, adds, omask) - count - charged
                            if apart > 0:
                                extra += apart * (self.launch + self.per_collective)
                        # (a Partial dim reduces unsharded: ``_reduce_weight``)
                        if red is None:
                            w = w_rest
                        else:
                            w, lat_red = self._reduce_weight(red, mask)
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
            missing = self._missing(sid, goal, reduce) * self.itemsize * self.missing_rate
        best = bw_free + local_copy
        if bw_kept > bw_free and not other:
            # a plan either keeps the shard orders or breaks one: by a collective the
            # count above leaves out (an all_permute, or an all_to_all of a dim it must
            # still gather or reduce), at least a launch, its latency and (k-1)/k of the
            # smallest tensor any collective runs on; or, with Partial targets, by a
            # shard made Partial (a local step) to reduce later; or by a Partial dim
            # all-reduced and sliced later (a local step and the all_reduce's gather half)
            least = full / (unsplit * n_spare)
            pen_lat = self.launch + self.per_collective + self.alpha_floor
            pen_bw = self.missing_rate * least
            if self.ptargets and gathers is not None:
                pen_lat, pen_bw = self.local_launch, 0.0
            if scatters is not None:
                lat_ar = self.local_launch
                bw_ar = least * min(self.weights[m][0] for m in self.active)
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

    def kept_bound(self, state, goal) -> float:
        """A lower bound on the price from any state an all_permute out of ``state`` leads
        to, to ``goal`` (ids): a permute keeps every mesh dim Partial, Replicate or
        sharding, so the collectives of the dims to gather or reduce and the local steps
        the heuristic counts stay due (its launch and latency terms for them)."""
        codes = self.states[state][0]
        tables, _, _, goal_codes = self._goal_info.get(goal) or self._goal_table(goal)
        single = local = 0
        lat = 0.0
        for m, table in tables:
            a = codes[m]
            e = table.get(a)
            if e is None:
                e = table[a] = self._entry(m, a, goal_codes[m])
            kind = e[0]
            if kind == 1:
                single += 1
                lat += e[2]
                local += e[3]
            elif kind == 3:
                local += 1
        count = -(-single // self.widest)
        return count * (self.launch + self.per_collective) + lat + local * self.local_launch

    def _reduce_weight(self, red, mask: int) -> tuple[float, float]:
        """The least bandwidth weight of reducing the Partial dims ``red`` ((mesh dim,
        reduce-scatter weight) each) when the mesh dims of the bit ``mask`` may shard the
        tensor, and the latency it adds. A dim outside ``mask`` is never sharded, so it
        reduces by an all_reduce: twice the latency and the bytes of a reduce-scatter.
        (Where a reduce_scatter runs as an all_reduce, ``reduce_alpha`` holds both halves.)
        A reduction runs with its own dim unsharded; a merged one over an alias
        (``alias_shares``) moves ``r`` of its dims' share, but with all of them Partial,
        so on an input as many times bigger as they could otherwise split it."""
        key = (red, mask)
        v = self._red_memo.get(key)
        if v is None:
            sizes, shares, weights = self.sizes, self.alias_shares, self.weights
            w = lat = 0.0
            for m, dw in red:
                if mask >> m & 1:
                    best = sizes[m]
                else:
                    best = 1
                    dw = weights[m][3]
                    if self.reduce_twice:
                        lat += self.alpha_log[m]
                for amask, r in shares[m]:
                    grow = 1
                    both = amask & mask
                    x = 0
                    while both:
                        if both & 1:
                            grow *= sizes[x]
                        both >>= 1
                        x += 1
                    if r * grow < best:
                        best = r * grow
                w += dw * best
            v = self._red_memo[key] = (w, lat)
        return v

    def _apart(self, smask: int, adds: int, omask: int) -> int:
        """Collectives a plan needs at least when each dim of ``smask`` needs one (a
        gather or reduction), each of ``adds`` one more (a detour's gather, or a Partial
        dim's reduce-scatter) and the dims of ``omask`` one among them (a re-shard): the
        heaviest set of those needs no step can serve two of (dims no alias holds
        together; a permute serves re-shards only)."""
        key = (smask, adds, omask)
        v = self._apart_memo.get(key)
        if v is None:
            nodes = [
                (1 << m, (smask >> m & 1) + (adds >> m & 1), self.alias_reach[m] | 1 << m)
                for m in range(len(self.sizes))
                if (smask | adds) >> m & 1
            ]
            if omask:
                nodes.append((0, 1, omask | self._reach(omask)))
            v = 0
            for k in range(1, len(nodes) + 1):
                for combo in itertools.combinations(nodes, k):
                    chosen = blocked = weight = 0
                    for bit, w, reach in combo:
                        if (bit & blocked) if bit else (reach & chosen):
                            break
                        chosen |= bit
                        blocked |= reach
                        weight += w
                    else:
                        v = max(v, weight)
            self._apart_memo[key] = v
        return v

    def _reach(self, mask: int) -> int:
        """The mesh dims (a bit mask) some alias holds together with a dim of ``mask``."""
        reach = 0
        for m, r in enumerate(self.alias_reach):
            if mask >> m & 1:
                reach |= r
        return reach

    def _group(self, smask: int, omask: int) -> tuple[bool, int, float]:
        """For the dims to re-shard (bit mask ``omask``) and to gather or reduce
        (``smask``): whether no alias holds dims of both (so no collective serves both),
        then the collectives the plan needs at least (those covering ``smask``, and one
        more), and the bandwidth weight of one collective re-sharding every dim of
        ``omask`` (0.0 for a single dim: its own weight counts)."""
        key = (smask, omask)
        v = self._group_memo.get(key)
        if v is None:
            dims = [m for m in range(len(self.sizes)) if omask >> m & 1]
            reach = self._reach(omask)
            alone = not reach & smask
            count = 1 + (self._cover(smask, 0) if self.aliases else bin(smask).count("1"))
            w = 0.0
            if len(dims) > 1:
                k = math.prod(self.sizes[m] for m in dims)
                w = (k - 1) / k / min(self.dim_bw[m] for m in dims)
                if not reach:
                    w += self.copy  # an all_to_all or all_permute: it copies its output
            v = self._group_memo[key] = (alone, count, w)
        return v

    def _cover(self, smask: int, omask: int) -> int:
        """Collectives a plan needs at least for the dims of ``smask`` (each must gather
        or reduce: in a collective of its own or merged over an alias holding it) and
        ``omask`` (re-shard: some collective on one of them, which serves none of
        ``smask`` unless it is a merged step). The fewest aliases and single dims that
        cover ``smask``, plus one when no alias holds a dim of ``omask``."""
        masks = [sum(1 << m for m in dims) for _, dims in self.aliases]
        best = bin(smask).count("1")
        for k in range(1, len(masks) + 1):
            for combo in itertools.combinations(masks, k):
                covered = 0
                for x in combo:
                    covered |= x
                best = min(best, k + bin(smask & ~covered).count("1"))
        reach = 0
        for x in masks:
            reach |= x
        return best + (1 if omask and not omask & reach else 0)

    def _goal_table(self, goal: int):
        """The heuristic's memo of goal ``goal`` (an id): per active mesh dim a table of
        :meth:`_entry` values, whether the goal has a Partial dim, its orders and codes."""
        goal_codes, goal_chains = self.states[goal]
        partial = any(type(c) is int and c > R for c in goal_codes)
        info = [(m, {}) for m in self.active], partial, goal_chains, goal_codes
        self._goal_info[goal] = info
        return info

    def _entry(self, m, a, b):
        """What mesh dim ``m`` going from ``a`` to the goal's ``b`` needs, for the heuristic:
        ``(kind, split, latency, local steps, bandwidth weight)``."""
        wt = self.weights[m]
        if b == ANY:
            # any placement but Partial will do: a Partial dim needs a reduction (an
            # all_reduce or a reduce_scatter), any other nothing
            if type(a) is int and a != R:
                return (1, self.sizes[m], self.reduce_alpha[m], 0, wt[1])
            return (4, 1, 0.0, 0, 0.0) if a == R else (0, self.sizes[m], 0.0, 0, 0.0)
        if type(b) is int and b <= SHARD_ANY:
            # any shard placement of tensor dim d, in any order position: a Partial dim
            # needs a reduction, a replicated one a slice (a local step), one sharding
            # another tensor dim a collective, one sharding d nothing
            n = self.sizes[m]
            if a == R:
                return (3, n, 0.0, 1, 0.0)
            if type(a) is int:
                return (1, n, self.reduce_alpha[m], 0, wt[1])
            if a[0] == SHARD_ANY - b:
                return (0, n, 0.0, 0, 0.0)
            return (2, n, self.alpha_log[m], 0, self._reshard_weight(m))
        n = self.sizes[m] if (type(a) is tuple or type(b) is tuple) else 1
        if a == b:
            if a == R:
                return (4, n, 0.0, 0, 0.0)
            if type(a) is tuple and not self.tiny[a[0]]:
                return (5, n, self.alpha_log[m], 0, self._reshard_weight(m))
            return (0, n, 0.0, 0, 0.0)
        if a == R:
            return (3, n, 0.0, 1, 0.0)
        if type(a) is int:
            if type(b) is int and b != R and a in _SUMAVG and b in _SUMAVG:
                return (3, n, 0.0, 1, 0.0)
            local = 1 if (type(b) is int and b != R) else 0
            w = wt[1] * self.sizes[m] if type(b) is tuple else wt[1]
            return (1, n, self.reduce_alpha[m], local, w)
        if b == R:
            return (1, n, self.gather_alpha[m], 0, wt[0])
        if type(b) is int:
            return (3, n, 0.0, 1, 0.0)
        if a[0] == b[0] and self.tiny[a[0]]:
            # another shard placement of the same tiny tensor dim: a local step that
            # moves nothing may do it (``_search._Context._relabels``), or a collective
            return (6, n, self.alpha_log[m], 0, self._reshard_weight(m))
        return (2, n, self.alpha_log[m], 0, self._reshard_weight(m))

    def _may_relabel(self, m: int, d: int, state, goal: int) -> bool:
        """Whether mesh dim ``m`` may reach its goal placement on tensor dim ``d`` by
        local steps that move nothing. Not when every link of both orders of ``d`` is a
        power of two dividing its length and ``m``'s coordinate reads other bits of an
        index in the goal (``_exact._bit_owners``): no step but a collective over ``m``
        changes which indices its coordinate picks. Otherwise, it may (an empty tensor's
        ranks hold nothing: always)."""
        if self.empty:
            return True
        codes, chains = state
        goal_codes, goal_chains = self.states[goal]
        chain, gchain = chains[d], goal_chains[d]
        key = (m, d, chain, tuple([codes[x] for x in chain]), gchain, goal)
        ok = self._relabel_memo.get(key)
        if ok is None:
            src = links(self.sizes, codes, chain)
            dst = links(self.sizes, goal_codes, gchain)
            base = even_base(src, dst)
            if self.shape[d] % base or base & (base - 1):
                ok = True
            else:
                bits = base.bit_length() - 1
                ok = _bit_owners(bits, src)[m] == _bit_owners(bits, dst).get(m)
            self._relabel_memo[key] = ok
        return ok

    def _reshard_weight(self, m: int) -> float:
        # a dim of an alias may re-shard by a merged gather and a slice: no copy counted
        wt = self.weights[m]
        return wt[2] - self.copy if m in self.merge_dims else wt[2]

    def _missing(self, state: int, goal: int, reduce: bool) -> int:
        """Elements the first rank (mesh coordinate 0) needs in ``goal`` and lacks in
        ``state`` (ids)."""
        a, b = self._pieces_of(state), self._pieces_of(goal)
        overlap = self._overlap
        need = have = 1
        for x, y in zip(a, b, strict=True):
            v = overlap.get((x, y))
            if v is None:
                ivs, goal_ivs = self._piece_list[x], self._piece_list[y]
                v = overlap[(x, y)] = (_length(goal_ivs), _common(ivs, goal_ivs))
            need *= v[0]
            have *= v[1]
        return need if reduce else need - have

    def _pieces_of(self, i: int) -> tuple:
        """Per tensor dim, the id of the first rank's piece (index intervals) in state
        ``i``: the same ids for the same shard order and placements along it."""
        ids = self._state_pieces.get(i)
        if ids is None:
            codes, chains = self.states[i]
            out = []
            for d, chain in enumerate(chains):
                if type(chain) is tuple:
                    key = (d, chain, tuple([codes[m] for m in chain]))
                elif chain is None:  # a pattern's dim of length 0 (``unreduced_goal``)
                    key = (d, (), ())
                else:
                    # a pattern's ways of one layout (``_search.class_goal``): each gives
                    # every rank the same piece, so any one says it
                    own, chain = min(chain)
                    by_dim = dict(zip(sorted(chain), own, strict=True))
                    key = (d, chain, tuple([by_dim[m] for m in chain]))
                pid = self._pieces.get(key)
                if pid is None:
                    pid = self._pieces[key] = len(self._piece_list)
                    self._piece_list.append(self._piece0_uncached(d, key[1], key[2]))
                out.append(pid)
            ids = self._state_pieces[i] = tuple(out)
        return ids

    def _piece0_uncached(self, d, chain, own):
        # (``own``: the codes of ``chain``'s mesh dims, in its order)
        links = tuple([(self.sizes[m], c[1]) for m, c in zip(chain, own, strict=True)])
        return piece(self.shape[d], links, (0,) * len(chain))


@functools.lru_cache(maxsize=65536)
def sequence_weights(gathers, scatters, more) -> tuple[float, float]:
    """The least bandwidth weight of the gather sequence (``gathers`` and the detour
    dims ``more``) and the reduce-scatter sequence (``scatters``, counted from the
    last), in any order and in one that keeps the shard orders (:func:`_orders`). A pure
    function of its items, so one memo serves every context (a mesh's tensor shapes)."""
    free = kept = 0.0
    if gathers is not None or more:
        f, k = _orders(gathers + more if gathers is not None else more)
        free += f
        kept += k
    if scatters is not None:
        f, k = _orders(scatters)
        free += f
        kept += k
    return free, kept


def _orders(items: tuple) -> tuple[float, float]:
    """The least bandwidth weight of a sequence of gathers (or reduce-scatters counted
    from the last) ``items`` = ``(weight, size, tensor dim, order position)``: in any
    order, and in an order that keeps each tensor dim's shard order (a higher position
    first; tensor dim -1: free). The k-th item's weight is multiplied by the sizes of
    the items before it."""
    # the cheapest order takes the slowest links first (by weight / (n-1), an exchange
    # argument)
    best = sorted(items, key=_by_link, reverse=True)
    free = _weight(best)
    if _keeps(best):
        return free, free
    return free, _kept_weight(items)


def _kept_weight(items: tuple) -> float:
    """The least weight (:func:`_weight`) of an order of ``items`` that keeps each tensor
    dim's shard order: over the sets of items taken first, as the product of their sizes
    multiplies the next one's weight whatever order they came in (each set keeps its
    least weight; rounding is monotone, so the result is an order's own weight)."""
    k = len(items)
    # the items each one must follow: its tensor dim's at higher order positions
    after = [
        sum(1 << j for j, y in enumerate(items) if y[2] == x[2] >= 0 and y[3] > x[3]) for x in items
    ]
    best: dict = {0: (0.0, 1)}  # a set (bit mask) -> (least weight, product of sizes)
    for mask in range(1 << k):  # (every set before the sets holding it)
        v = best.get(mask)
        if v is None:
            continue
        w, prefix = v
        for x in range(k):
            if mask >> x & 1 or after[x] & ~mask:
                continue
            nxt = mask | 1 << x
            nw = w + items[x][0] * prefix
            old = best.get(nxt)
            if old is None or nw < old[0]:
                best[nxt] = (nw, prefix * items[x][1])
    return best[(1 << k) - 1][0]


def _weight(order) -> float:
    """The weight of a sequence of ``_orders`` items taken in ``order``."""
    prefix = 1
    total = 0.0
    for dw, n, _, _ in order:
        total += dw * prefix
        prefix *= n
    return total


def _by_link(item) -> float:
    return item[0] / (item[1] - 1)


def _keeps(order) -> bool:
    """Whether ``order`` (``_Bounds._orders`` items) takes each tensor dim's items from
    the highest order position down."""
    last: dict = {}
    for _, _, d, pos in order:
        if d >= 0:
            if last.get(d, math.inf) < pos:
                return False
            last[d] = pos
    return True


def _length(ivs) -> int:
    return sum(b - a for a, b in ivs)


def _common(a, b) -> int:
    n = 0
    for x0, x1 in a:
        for y0, y1 in b:
            lo, hi = max(x0, y0), min(x1, y1)
            if lo < hi:
                n += hi - lo
    return n

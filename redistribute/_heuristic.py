"""The search's heuristic: a lower bound of what a plan from a state to a goal costs (no torch).

A mix-in of the search context (``_search._Context``), whose tables it reads: the
per-mesh-dim weights, latencies and launch prices set up there, and its memo tables.
"""

from __future__ import annotations

import itertools

from meshplan.placement import Shard, StridedShard, shard_intervals

R = 0  # the code of Replicate; Partial sum/avg/max/min are 1..4 (see ``_search``)
SUMAVG = (1, 2)  # the Partial codes that mix
_SUMAVG = SUMAVG


class _Bounds:
    def heuristic(self, state, goal) -> float:
        """A lower bound on the price of any plan from ``state`` to ``goal``.

        Launches: every mesh dim that must reduce, or go from a shard to Replicate, needs
        a collective; any other mesh dim in the wrong shard placement or order position
        needs at least one more collective between them; a step merged onto an alias
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
        order, slowest links first. Alias dims count less
        (``_search._Context._set_aliases``): a merged all_reduce moves (N-1)/N of its
        input, less than its dims' shares summed; a gather to undo a detour, or to
        re-shard by gather and slice, may ride in a merged step.
        """
        codes, chains = state = self.states[state]
        info = self._goal_info.get(goal)
        if info is None:
            info = self._goal_info[goal] = self._goal_table(self.states[goal])
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
        gathers = None  # (weight, size) of the dims to gather one by one (see below)
        for m, table in tables:
            a = codes[m]
            e = table.get(a)
            if e is None:
                e = table[a] = self._entry(m, a, goal_codes[m])
            kind, n_split, dlat, dlocal, dw = e
            split *= n_split
            if n_split == 1 and kind != 4:
                unsplit *= self.sizes[m]
                # the cheapest way to shard it for a while: R -> S -> P takes one more local
                # step; P -> S -> P' (P' not sum/avg of P) none; any other needs a collective
                b = goal_codes[m]
                if a == R:
                    extra = self.local_launch
                elif (kind == 1 and b != R) or m in self.merge_dims:
                    extra = 0.0
                else:
                    extra = self.launch + self.per_collective + self.alpha_log[m]
                loose = ((m, extra),) if loose is None else loose + ((m, extra),)
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
                    w_single += dw
                elif m in self.merge_dims:
                    w_single += dw
                else:
                    g = (dw, self.sizes[m])
                    gathers = (g,) if gathers is None else gathers + (g,)
            elif kind == 2:  # some collective
                other = True
                omask |= 1 << m
                lat += dlat
                if dw > w_other:
                    w_other = dw
            elif kind == 3:  # local
                local += 1
                lw += self.sizes[m] if type(goal_codes[m]) is int else 1
            elif kind == 4:  # replicated in both
                spare = (m,) if spare is None else spare + (m,)
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
                ):
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
        h = count * (self.launch + self.per_collective) + lat + local * self.local_launch
        if gathers is not None:
            # dims sharded here and replicated in the goal, gathered one at a time: when a
            # dim's last gather runs, every dim whose last gather ran before is replicated
            # (sharding it again would need another), so the k-th gather's input is at
            # least the sizes of the dims gathered before it times the smallest local
            # tensor; the cheapest order takes the slowest links first (by weight / (n-1),
            # an exchange argument)
            prefix = 1
            for dw, n in sorted(gathers, key=_by_link, reverse=True):
                w_single += dw * prefix
                prefix *= n
        w = w_single + w_other
        full = self.total_bytes / split
        n_spare = 1
        for x in spare or ():
            n_spare *= self.sizes[x]
        # each local step writes at least the smallest local tensor it can run on
        local_copy = lw * self.copy * full / (unsplit * n_spare)
        best = local_copy
        if w:
            bw = w * full
            if spare:
                detour = self.detour
                spare_all = tuple((x, detour[x]) for x in spare)
                if loose:
                    spare_all += loose
            else:
                spare_all = loose
            if spare_all and (bw > self.detour_floor or loose):
                sizes = self.sizes
                for k in range(1, len(spare_all) + 1):
                    for combo in itertools.combinations(spare_all, k):
                        n = 1
                        extra = 0.0
                        for x, e in combo:
                            n *= sizes[x]
                            extra += e
                        v = extra + w * full / n
                        if v < bw:
                            bw = v
            best += bw
        if not goal_partial:
            missing = (
                self._missing(state, self.states[goal], reduce) * self.itemsize * self.missing_rate
            )
            missing += local_copy
            if missing > best:
                best = missing
        return h + best

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

    def _goal_table(self, goal):
        goal_codes, goal_chains = goal
        partial = any(type(c) is int and c != R for c in goal_codes)
        return [(m, {}) for m in self.active], partial, goal_chains, goal_codes

    def _entry(self, m, a, b):
        """What mesh dim ``m`` going from ``a`` to the goal's ``b`` needs, for the heuristic:
        ``(kind, split, latency, local steps, bandwidth weight)``."""
        wt = self.weights[m]
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
            w = wt[1] * (self.sizes[m] if type(b) is tuple else self.reduce_share[m])
            return (1, n, self.alpha_log[m], local, w)
        if b == R:
            return (1, n, self.alpha_log[m], 0, wt[0])
        if type(b) is int:
            return (3, n, 0.0, 1, 0.0)
        return (2, n, self.alpha_log[m], 0, self._reshard_weight(m))

    def _reshard_weight(self, m: int) -> float:
        # a dim of an alias may re-shard by a merged gather and a slice: no copy counted
        wt = self.weights[m]
        return wt[2] - self.copy if m in self.merge_dims else wt[2]

    def _missing(self, state, goal, reduce: bool) -> int:
        """Elements the first rank (mesh coordinate 0) needs in ``goal`` and lacks in ``state``."""
        codes, chains = state
        goal_codes, goal_chains = goal
        need = have = 1
        for d in range(self.ndim):
            chain, goal_chain = chains[d], goal_chains[d]
            key = (
                d,
                chain,
                tuple([codes[m] for m in chain]),
                goal_chain,
                tuple([goal_codes[m] for m in goal_chain]),
            )
            v = self._overlap.get(key)
            if v is None:
                a = self._piece0(d, chains[d], codes)
                b = self._piece0(d, goal_chains[d], goal_codes)
                v = self._overlap[key] = (_length(b), _common(a, b))
            need *= v[0]
            have *= v[1]
        return need if reduce else need - have

    def _piece0(self, d, chain, codes):
        key = (d, chain, tuple(codes[m] for m in chain))
        ivs = self._pieces.get(key)
        if ivs is None:
            ivs = self._pieces[key] = self._piece0_uncached(d, chain, codes)
        return ivs

    def _piece0_uncached(self, d, chain, codes):
        length = self.shape[d]
        ivs = ((0, length),) if length else ()
        for m in chain:
            sf = codes[m][1]
            ivs = shard_intervals(
                ivs, Shard(d) if sf == 1 else StridedShard(d, sf), self.sizes[m], 0
            )
        return ivs


def _by_link(gather) -> float:
    dw, n = gather
    return dw / (n - 1)


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

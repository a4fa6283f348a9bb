"""Pieces of the per-mesh-dim bound (``_dim_bound``): what each mesh dim needs, how many
collectives those needs take at least, reductions' and re-shards' weights, and what the
first rank lacks (no torch). Each function reads a :class:`~._bounds.Bounds` ``b`` (its
constants and memo tables).
"""

from __future__ import annotations

import itertools
import math
from enum import IntEnum
from typing import NamedTuple

from ._encoding import ANY, SHARD_ANY, SUMAVG, R, is_partial
from ._exact import _bit_owners, even_base, links, piece

__all__ = [
    "Need",
    "DimNeed",
    "dim_need",
    "goal_table",
    "GoalInfo",
    "kept_dim_bound",
    "reduce_weight",
    "apart_count",
    "reshard_group",
    "collective_cover",
    "may_relabel",
    "first_rank_missing",
]


class Need(IntEnum):
    """What a mesh dim needs on the way to its goal placement."""

    NONE = 0  # nothing (at its goal, or any placement will do)
    OWN = 1  # a collective of its own: a gather (shard -> R) or a reduction (Partial)
    RESHARD = 2  # some collective: another shard placement (an all_to_all, a permute)
    LOCAL = 3  # a local step: a slice, a shard or R made Partial, a sum <-> avg change
    IDLE = 4  # nothing; Replicate in both (the plan may shard it for a while)
    ORDER = 5  # its shard placement already: a collective if its order position is wrong
    RELABEL = 6  # another shard placement of the same tiny tensor dim: a local step
    # that moves nothing may do it, else a collective


NONE, OWN, RESHARD, LOCAL, IDLE, ORDER, RELABEL = Need


class DimNeed(NamedTuple):
    """What a mesh dim needs (:func:`dim_need`), as the bound counts it."""

    kind: Need
    split: int  # how many pieces it cuts the smallest local tensor into on the way
    latency: float  # the latency of its collective (0.0: none)
    local: int  # local steps it takes
    weight: float  # the bandwidth weight of its collective (seconds per byte)


def kept_dim_bound(b, state, goal) -> float:
    """A lower bound on the price from any state an all_permute out of ``state`` leads
    to, to ``goal`` (ids): a permute keeps every mesh dim Partial, Replicate or
    sharding, so the collectives of the dims to gather or reduce and the local steps
    the heuristic counts stay due (its launch and latency terms for them)."""
    codes = b.states[state][0]
    tables, _, _, goal_codes = b.goal_info.get(goal) or goal_table(b, goal)
    single = local = 0
    lat = 0.0
    for m, table in tables:
        a = codes[m]
        e = table.get(a)
        if e is None:
            e = table[a] = dim_need(b, m, a, goal_codes[m])
        kind = e.kind
        if kind == OWN:
            single += 1
            lat += e.latency
            local += e.local
        elif kind == LOCAL:
            local += 1
    count = -(-single // b.widest)
    return count * (b.launch + b.per_collective) + lat + local * b.local_launch


def reduce_weight(b, red, mask: int) -> tuple[float, float]:
    """The least bandwidth weight of reducing the Partial dims ``red`` ((mesh dim,
    reduce-scatter weight) each) when the mesh dims of the bit ``mask`` may shard the
    tensor, and the latency it adds. A dim outside ``mask`` is never sharded, so it
    reduces by an all_reduce: twice the latency and the bytes of a reduce-scatter.
    (Where a reduce_scatter runs as an all_reduce, ``reduce_alpha`` holds both halves.)
    A reduction runs with its own dim unsharded; a merged one over an alias
    (``alias_shares``) moves ``r`` of its dims' share, but with all of them Partial,
    so on an input as many times bigger as they could otherwise split it."""
    key = (red, mask)
    v = b.red_memo.get(key)
    if v is None:
        sizes, shares, weights = b.sizes, b.alias_shares, b.weights
        w = lat = 0.0
        for m, dw in red:
            if mask >> m & 1:
                best = sizes[m]
            else:
                best = 1
                dw = weights[m].all_reduce
                if b.reduce_twice:
                    lat += b.alpha_log[m]
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
        v = b.red_memo[key] = (w, lat)
    return v


def apart_count(b, smask: int, adds: int, omask: int) -> int:
    """Collectives a plan needs at least when each dim of ``smask`` needs one (a
    gather or reduction), each of ``adds`` one more (a detour's gather, or a Partial
    dim's reduce-scatter) and the dims of ``omask`` one among them (a re-shard): the
    heaviest set of those needs no step can serve two of (dims no alias holds
    together; a permute serves re-shards only)."""
    key = (smask, adds, omask)
    v = b.apart_memo.get(key)
    if v is None:
        nodes = [
            (1 << m, (smask >> m & 1) + (adds >> m & 1), b.alias_reach[m] | 1 << m)
            for m in range(len(b.sizes))
            if (smask | adds) >> m & 1
        ]
        if omask:
            nodes.append((0, 1, omask | alias_reach_of(b, omask)))
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
        b.apart_memo[key] = v
    return v


def alias_reach_of(b, mask: int) -> int:
    """The mesh dims (a bit mask) some alias holds together with a dim of ``mask``."""
    reach = 0
    for m, r in enumerate(b.alias_reach):
        if mask >> m & 1:
            reach |= r
    return reach


def reshard_group(b, smask: int, omask: int) -> tuple[bool, int, float]:
    """For the dims to re-shard (bit mask ``omask``) and to gather or reduce
    (``smask``): whether no alias holds dims of both (so no collective serves both),
    then the collectives the plan needs at least (those covering ``smask``, and one
    more), and the bandwidth weight of one collective re-sharding every dim of
    ``omask`` (0.0 for a single dim: its own weight counts)."""
    key = (smask, omask)
    v = b.group_memo.get(key)
    if v is None:
        dims = [m for m in range(len(b.sizes)) if omask >> m & 1]
        reach = alias_reach_of(b, omask)
        alone = not reach & smask
        count = 1 + (collective_cover(b, smask, 0) if b.aliases else bin(smask).count("1"))
        w = 0.0
        if len(dims) > 1:
            k = math.prod(b.sizes[m] for m in dims)
            w = (k - 1) / k / min(b.dim_bw[m] for m in dims)
            if not reach:
                w += b.copy  # an all_to_all or all_permute: it copies its output
        v = b.group_memo[key] = (alone, count, w)
    return v


def collective_cover(b, smask: int, omask: int) -> int:
    """Collectives a plan needs at least for the dims of ``smask`` (each must gather
    or reduce: in a collective of its own or merged over an alias holding it) and
    ``omask`` (re-shard: some collective on one of them, which serves none of
    ``smask`` unless it is a merged step). The fewest aliases and single dims that
    cover ``smask``, plus one when no alias holds a dim of ``omask``."""
    masks = [sum(1 << m for m in dims) for _, dims in b.aliases]
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


class GoalInfo(NamedTuple):
    """What the per-dim bound reads of one goal (:func:`goal_table`)."""

    tables: list  # per active mesh dim ``(m, {code: DimNeed})``, filled as codes come
    partial: bool  # whether the goal has a Partial dim
    chains: tuple  # the goal's shard orders
    codes: tuple  # the goal's codes


def goal_table(b, goal: int) -> GoalInfo:
    """The heuristic's memo of goal ``goal`` (an id): a :class:`GoalInfo`."""
    goal_codes, goal_chains = b.states[goal]
    partial = any(is_partial(c) for c in goal_codes)
    info = GoalInfo([(m, {}) for m in b.active], partial, goal_chains, goal_codes)
    b.goal_info[goal] = info
    return info


def dim_need(b, m, a, bc):
    """What mesh dim ``m`` going from code ``a`` to the goal's ``bc`` needs (a
    :class:`DimNeed`)."""
    wt = b.weights[m]
    if bc == ANY:
        # any placement but Partial will do: a Partial dim needs a reduction (an
        # all_reduce or a reduce_scatter), any other nothing
        if type(a) is int and a != R:
            return DimNeed(OWN, b.sizes[m], b.reduce_alpha[m], 0, wt.reduce)
        return DimNeed(IDLE, 1, 0.0, 0, 0.0) if a == R else DimNeed(NONE, b.sizes[m], 0.0, 0, 0.0)
    if type(bc) is int and bc <= SHARD_ANY:
        # any shard placement of tensor dim d, in any order position: a Partial dim
        # needs a reduction, a replicated one a slice (a local step), one sharding
        # another tensor dim a collective, one sharding d nothing
        n = b.sizes[m]
        if a == R:
            return DimNeed(LOCAL, n, 0.0, 1, 0.0)
        if type(a) is int:
            return DimNeed(OWN, n, b.reduce_alpha[m], 0, wt.reduce)
        if a[0] == SHARD_ANY - bc:
            return DimNeed(NONE, n, 0.0, 0, 0.0)
        return DimNeed(RESHARD, n, b.alpha_log[m], 0, reshard_weight(b, m))
    n = b.sizes[m] if (type(a) is tuple or type(bc) is tuple) else 1
    if a == bc:
        if a == R:
            return DimNeed(IDLE, n, 0.0, 0, 0.0)
        if type(a) is tuple and not b.tiny[a[0]]:
            return DimNeed(ORDER, n, b.alpha_log[m], 0, reshard_weight(b, m))
        return DimNeed(NONE, n, 0.0, 0, 0.0)
    if a == R:
        return DimNeed(LOCAL, n, 0.0, 1, 0.0)
    if type(a) is int:
        if type(bc) is int and bc != R and a in SUMAVG and bc in SUMAVG:
            return DimNeed(LOCAL, n, 0.0, 1, 0.0)
        local = 1 if (type(bc) is int and bc != R) else 0
        w = wt.reduce * b.sizes[m] if type(bc) is tuple else wt.reduce
        return DimNeed(OWN, n, b.reduce_alpha[m], local, w)
    if bc == R:
        return DimNeed(OWN, n, b.gather_alpha[m], 0, wt.gather)
    if type(bc) is int:
        return DimNeed(LOCAL, n, 0.0, 1, 0.0)
    if a[0] == bc[0] and b.tiny[a[0]]:
        # another shard placement of the same tiny tensor dim: a local step that
        # moves nothing may do it (``_moves.relabels``), or a collective
        return DimNeed(RELABEL, n, b.alpha_log[m], 0, reshard_weight(b, m))
    return DimNeed(RESHARD, n, b.alpha_log[m], 0, reshard_weight(b, m))


def may_relabel(b, m: int, d: int, state, goal: int) -> bool:
    """Whether mesh dim ``m`` may reach its goal placement on tensor dim ``d`` by
    local steps that move nothing. Not when every link of both orders of ``d`` is a
    power of two dividing its length and ``m``'s coordinate reads other bits of an
    index in the goal (``_exact._bit_owners``): no step but a collective over ``m``
    changes which indices its coordinate picks. Otherwise, it may (an empty tensor's
    ranks hold nothing: always)."""
    if b.empty:
        return True
    codes, chains = state
    goal_codes, goal_chains = b.states[goal]
    chain, gchain = chains[d], goal_chains[d]
    key = (m, d, chain, tuple([codes[x] for x in chain]), gchain, goal)
    ok = b.relabel_memo.get(key)
    if ok is None:
        src = links(b.sizes, codes, chain)
        dst = links(b.sizes, goal_codes, gchain)
        base = even_base(src, dst)
        if b.shape[d] % base or base & (base - 1):
            ok = True
        else:
            bits = base.bit_length() - 1
            ok = _bit_owners(bits, src)[m] == _bit_owners(bits, dst).get(m)
        b.relabel_memo[key] = ok
    return ok


def reshard_weight(b, m: int) -> float:
    # a dim of an alias may re-shard by a merged gather and a slice: no copy counted
    wt = b.weights[m]
    return wt.reshard - b.copy if m in b.merge_dims else wt.reshard


def first_rank_missing(b, state: int, goal: int, reduce: bool) -> int:
    """Elements the first rank (mesh coordinate 0) needs in ``goal`` and lacks in
    ``state`` (ids)."""
    a, g = _pieces_of(b, state), _pieces_of(b, goal)
    overlap = b.overlap
    need = have = 1
    for x, y in zip(a, g, strict=True):
        v = overlap.get((x, y))
        if v is None:
            ivs, goal_ivs = b.piece_list[x], b.piece_list[y]
            v = overlap[(x, y)] = (interval_length(goal_ivs), interval_overlap(ivs, goal_ivs))
        need *= v[0]
        have *= v[1]
    return need if reduce else need - have


def _pieces_of(b, i: int) -> tuple:
    """Per tensor dim, the id of the first rank's piece (index intervals) in state
    ``i``: the same ids for the same shard order and placements along it."""
    ids = b.state_pieces.get(i)
    if ids is None:
        codes, chains = b.states[i]
        out = []
        for d, chain in enumerate(chains):
            if type(chain) is tuple:
                key = (d, chain, tuple([codes[m] for m in chain]))
            elif chain is None:  # a pattern's dim of length 0 (``unreduced_goal``)
                key = (d, (), ())
            else:
                # a pattern's ways of one layout (``_goals.class_goal``): each gives
                # every rank the same piece, so any one says it
                own, chain = min(chain)
                by_dim = dict(zip(sorted(chain), own, strict=True))
                key = (d, chain, tuple([by_dim[m] for m in chain]))
            pid = b.pieces.get(key)
            if pid is None:
                pid = b.pieces[key] = len(b.piece_list)
                b.piece_list.append(_piece0(b, d, key[1], key[2]))
            out.append(pid)
        ids = b.state_pieces[i] = tuple(out)
    return ids


def _piece0(b, d, chain, own):
    # (``own``: the codes of ``chain``'s mesh dims, in its order)
    links = tuple([(b.sizes[m], c[1]) for m, c in zip(chain, own, strict=True)])
    return piece(b.shape[d], links, (0,) * len(chain))


def interval_length(ivs) -> int:
    """Indices covered by disjoint half-open intervals ``ivs``."""
    return sum(b - a for a, b in ivs)


def interval_overlap(a, b) -> int:
    """Indices two sets of disjoint half-open intervals share."""
    n = 0
    for x0, x1 in a:
        for y0, y1 in b:
            lo, hi = max(x0, y0), min(x1, y1)
            if lo < hi:
                n += hi - lo
    return n

"""The plan search: A* over encoded specs with an admissible heuristic (no torch).

States are ``(codes, chains)``: one code per mesh dim (``0`` Replicate, ``1..4``
Partial sum/avg/max/min, ``(tensor_dim, split_factor)`` for Shard (split factor 1) and
StridedShard) and, per tensor dim, the mesh dims sharding it in application order.
A :class:`_Context` holds, per (mesh, shape, dtype, cost model, placement universe,
memory bound), the tables every search on it shares: interned states (ids), their
padded local bytes, their transitions and prices, heuristic values per goal.

Transitions (see ``meshplan.redistribute._planner`` for the rules) are generated per
state, goal-free and memoized: single-dim steps, validity checked structurally (a mesh
dim leaves an order from its end and joins one at its end) or, for tiny dims and
StridedShards, exactly on index intervals; and every valid all_permute. Each price
carries the tie-breaking factor of :func:`_tie`. The heuristic is a lower bound of the
remaining price: launches and latency of the collectives each mesh dim still needs,
local launches, and a bandwidth floor. The search prunes commuting steps taken in the
costlier order, never reduces into a Partial the goal does not hold, and evaluates the
heuristic lazily.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import threading

from meshplan.placement import Shard, StridedShard, dtype_itemsize, shard_intervals

from ._cost import chain_extent, coefficients, group_link

__all__ = ["R", "SUMAVG", "search", "context", "mixable", "exact_covers"]

R = 0
SUMAVG = (1, 2)
_SUMAVG = SUMAVG


# -- the search context ---------------------------------------------------------------------

# A transition: (price, next_state, mesh_dims, collective, n_send, scaled, touch). ``touch``
# lists the tensor dims whose shard orders a structural single-dim step changes (its mesh
# dim leaves the end of one order and joins the end of another); None for other steps.


class _Context:
    """Everything a search needs that depends on the mesh/tensor/model, not on the pair."""

    def __init__(self, mesh, shape, dtype, model, shards, ptargets, bound):
        self.mesh = mesh
        self.sizes = mesh.shape
        self.active = tuple(m for m, n in enumerate(mesh.shape) if n > 1)
        self.shape = shape
        self.ndim = len(shape)
        self.itemsize = dtype_itemsize(dtype)
        self.model = model
        self.shards = shards
        self.ptargets = ptargets
        self.bound = bound
        self.strided = any(c[1] > 1 for c in shards)
        active_sizes = tuple(sorted(mesh.shape[m] for m in self.active))
        # tensor dims where a mesh dim may leave or join the middle of an order: tiny
        # dims (some order of mesh dims leaves a piece empty) and dims with StridedShards
        # (an SS may encode an order); such moves are checked exactly, and the heuristic
        # ignores order positions there
        self.tiny = tuple(
            any(c[0] == d and c[1] > 1 for c in shards) or _may_empty(length, active_sizes)
            for d, length in enumerate(shape)
        )
        # the memo tables below are shared by every search on this context: one at a time
        self.lock = threading.Lock()
        self.tabled = None  # whether a plan table fits (``_table``), once known
        self.planned = 0  # pairs planned by search, towards building the table
        self._ids: dict = {}  # state -> id (states are hashed once, then ids are used)
        self.states: list = []
        self._nbytes: list = []
        self._ext: dict = {}
        self._succ: dict = {}  # state -> its single-dim transitions
        self._perms: dict = {}  # state -> its all_permute transitions
        self._floor: dict = {}  # state -> lower bound of their prices
        self._coef: dict = {}
        self._overlap: dict = {}
        self._pieces: dict = {}
        self._goal_info: dict = {}
        self._h: dict = {}
        self._kept: dict = {}  # (prev, step into state, state) -> successors kept by the
        # commuting-steps reduction (independent of the goal)
        hw = model.profile
        self.launch = hw.launch_s
        self.local_launch = hw.local_launch_s
        self.copy = 1.0 / hw.copy_bytes_per_s
        self.alpha_log = tuple(
            group_link(model, mesh, (m,)).latency_s * math.log2(n) if n > 1 else 0.0
            for m, n in enumerate(mesh.shape)
        )
        self.fastest = max(
            [group_link(model, mesh, (m,)).bytes_per_s for m in self.active] or [1.0]
        )
        self.total_bytes = self.itemsize * math.prod(shape)
        # per mesh dim, seconds per byte of the smallest local tensor a collective on it
        # can run on: (gather: (n-1) x its input; reduce: (n-1)/n x its input, plus the
        # reduction; other shard change: (n-1)/n x, plus a copy)
        self.weights = []
        for m, n in enumerate(mesh.shape):
            link = group_link(model, mesh, (m,))
            bw = link.bytes_per_s
            f = (n - 1) / n if n > 1 else 0.0
            self.weights.append(
                ((n - 1) / bw, f / bw + f / hw.reduce_bytes_per_s, f / bw + self.copy)
            )
        # temporarily sharding a dim replicated in source and target: a slice and a gather
        self.detour = [
            hw.local_launch_s + hw.launch_s + self.alpha_log[m] for m in range(mesh.ndim)
        ]
        self.detour_floor = min(self.detour) if self.detour else 0.0

    def _trim(self) -> None:
        # bound the memo tables (a long-lived process plans many pairs on one context);
        # only between searches, as ids must stay stable during one
        if len(self.states) > 200000:
            self._ids.clear()
            self.states.clear()
            self._nbytes.clear()
            self._succ.clear()
            self._perms.clear()
            self._floor.clear()
            self._overlap.clear()
            self._pieces.clear()
            self._goal_info.clear()
            self._h.clear()
            self._kept.clear()

    def intern(self, state) -> int:
        i = self._ids.get(state)
        if i is None:
            i = self._ids[state] = len(self.states)
            self.states.append(state)
            codes, chains = state
            b = self.itemsize
            for d, chain in enumerate(chains):
                b *= self.extent(d, chain, codes) if chain else self.shape[d]
            self._nbytes.append(b)
        return i

    # sizes
    def extent(self, d: int, chain: tuple, codes: tuple) -> int:
        key = (d, chain, tuple(codes[m][1] for m in chain)) if self.strided else (d, chain)
        e = self._ext.get(key)
        if e is None:
            sizes = self.sizes
            kinds = tuple((sizes[m], codes[m][1]) for m in chain)
            e = self._ext[key] = chain_extent(self.shape[d], kinds)
        return e

    def nbytes(self, i: int) -> int:
        return self._nbytes[i]

    def price(self, dims, collective, n_send, b_in, b_out, scaled=False) -> float:
        key = (dims, collective, n_send)
        c = self._coef.get(key)
        if c is None:
            c = coefficients(self.model, self.mesh, dims, collective, n_send)
            c = self._coef[key] = (c[0] + c[3], c[1] + c[4], c[2] + c[5])
        total = c[0] + c[1] * b_in + c[2] * b_out
        if scaled:
            total += b_out * self.copy
        return total

    # transitions
    def successors(self, i: int, goal: int | None = None):
        """Every transition from state ``i`` (see the tuple layout above); goal-free."""
        return self.singles(i) + self.permutes(i)

    def singles(self, i: int):
        """The single-dim transitions from state ``i``."""
        out = self._succ.get(i)
        if out is None:
            out = self._succ[i] = self._successors(self.states[i])
        return out

    def permutes(self, i: int):
        """The all_permute transitions from state ``i``."""
        out = self._perms.get(i)
        if out is None:
            out = self._perms[i] = self._permutes(i, self.states[i])
        return out

    def permute_floor(self, i: int) -> float:
        """A lower bound on the price of every all_permute from state ``i`` (inf: none)."""
        f = self._floor.get(i)
        if f is None:
            codes = self.states[i][0]
            sharded = [m for m in self.active if type(codes[m]) is tuple]
            b_in = self._nbytes[i]
            f = min(
                (
                    self.price(g, "all_permute", self.sizes[g[0]] * self.sizes[g[1]], b_in, 0)
                    for g in itertools.combinations(sharded, 2)
                ),
                default=math.inf,
            )
            self._floor[i] = f
        return f

    def _permutes(self, i: int, state) -> tuple:
        """Every valid all_permute out of ``state``: the sharding mesh dims take other
        shard placements and orders, keeping per tensor dim a common prefix, and the
        dims after it (at least two) exchange pieces."""
        codes, chains = state
        sharded = [m for m in self.active if type(codes[m]) is tuple]
        if len(sharded) < 2:
            return ()
        out = []
        b_in = self._nbytes[i]
        bound, sizes, ndim = self.bound, self.sizes, self.ndim
        intern, nbytes, price = self.intern, self._nbytes, self.price
        for assign in itertools.product(self.shards, repeat=len(sharded)):
            new_codes = list(codes)
            for m, c in zip(sharded, assign, strict=True):
                new_codes[m] = c
            new_codes = tuple(new_codes)
            members = [[m for m in sharded if new_codes[m][0] == d] for d in range(ndim)]
            for new_chains in itertools.product(*(itertools.permutations(x) for x in members)):
                # the dims after the longest common prefix of each order: the step's group
                g: set[int] = set()
                for chain, tchain in zip(chains, new_chains, strict=True):
                    k = 0
                    n = min(len(chain), len(tchain))
                    while (
                        k < n and chain[k] == tchain[k] and codes[chain[k]] == new_codes[chain[k]]
                    ):
                        k += 1
                    g.update(chain[k:])
                    g.update(tchain[k:])
                if len(g) < 2:
                    continue  # the state itself, or a single-dim step
                t = (new_codes, new_chains)
                j = intern(t)
                b_out = nbytes[j]
                if bound is None or b_in + b_out <= bound:
                    dims = tuple(sorted(g))
                    n = math.prod(sizes[m] for m in dims)
                    c = price(dims, "all_permute", n, b_in, b_out) * _tie(state, t)
                    out.append((c, j, dims, "all_permute", n, False, None))
        return tuple(out)

    def _successors(self, state):
        codes, chains = state
        out: list = []
        b_in = self._nbytes[self._ids[state]]
        sizes = self.sizes
        bound = self.bound
        intern = self.intern
        nbytes = self._nbytes
        price = self.price

        def add(dims, collective, t, touch, n_send=1, scaled=False):
            j = intern(t)
            b_out = nbytes[j]
            if bound is not None and b_in + b_out > bound:
                return
            c = price(dims, collective, n_send, b_in, b_out, scaled) * _tie(state, t)
            out.append((c, j, dims, collective, n_send, scaled, touch))

        for m in self.active:
            a = codes[m]
            dims = (m,)
            if a == R:
                for code in self.shards:
                    for t, touch in self._inserted(state, codes, chains, m, code):
                        add(dims, None, t, touch)
                for op in self.ptargets:
                    if mixable(codes, op):
                        add(dims, None, (_put(codes, m, op), chains), ())
            elif type(a) is int:
                scaled = a == 2
                add(dims, "all_reduce", (_put(codes, m, R), chains), (), 1, scaled)
                for code in self.shards:
                    for t, touch in self._inserted(state, codes, chains, m, code):
                        add(dims, "reduce_scatter", t, touch, 1, scaled)
                if a in _SUMAVG:
                    for op in self.ptargets:
                        if op in _SUMAVG and op != a:
                            add(dims, None, (_put(codes, m, op), chains), ())
            else:
                d = a[0]
                chain = chains[d]
                last = chain[-1] == m
                rest = chain[:-1] if last else tuple(x for x in chain if x != m)
                n = sizes[m]
                removed = _put(chains, d, rest)
                gone = (_put(codes, m, R), removed)
                if last or self._exact(state, d, gone, rest, m):
                    touch = (d,) if last else None
                    add(dims, "all_gather", gone, touch, n)
                    for op in self.ptargets:
                        if mixable(codes, op):
                            add(dims, None, (_put(codes, m, op), removed), touch)
                    others_ok = True
                else:
                    others_ok = False
                for code in self.shards:
                    if code == a or (code[0] != d and not others_ok):
                        continue
                    for t, touch in self._inserted(state, codes, removed, m, code, last):
                        if touch is not None and code[0] != d:
                            touch = (d, code[0]) if last else None
                        add(dims, "all_to_all", t, touch, n)
        return tuple(out)

    def _inserted(self, state, codes, chains, m, code, last=True):
        """``(state, touch)`` where mesh dim ``m`` takes shard ``code``, joining its tensor
        dim's order last (valid when ``m`` left its old order from the end), or, for tiny
        dims, anywhere the exact check allows."""
        d = code[0]
        base = chains[d]
        new_codes = _put(codes, m, code)
        t = (new_codes, _put(chains, d, base + (m,)))
        old = codes[m]
        same_dim = type(old) is tuple and old[0] == d
        if last or not same_dim:
            yield t, (d,)
        elif self._exact(state, d, t, base + (m,), m):
            yield t, None
        if self.tiny[d]:
            for i in range(len(base)):
                new_chain = base[:i] + (m,) + base[i:]
                t = (new_codes, _put(chains, d, new_chain))
                if self._exact(state, d, t, new_chain, m):
                    yield t, None

    def _exact(self, state, d, new_state, new_chain, m) -> bool:
        if not self.tiny[d]:
            return False
        codes, chains = state
        new_codes = new_state[0]
        src = tuple((x, self.sizes[x], codes[x][1]) for x in chains[d])
        dst = tuple((x, self.sizes[x], new_codes[x][1]) for x in new_chain)
        length = self.shape[d]
        if all(sf == 1 for _, _, sf in src + dst) and (
            _smallest_piece(length, tuple(n for _, n, _ in src)) > 0
            and _smallest_piece(length, tuple(n for _, n, _ in dst)) > 0
        ):
            # plain shards, no empty piece: each rank's pieces are disjoint runs that only
            # the structural moves keep inside its group's holdings
            return False
        return exact_covers(length, src, dst, m)

    # the heuristic
    def heuristic(self, state, goal) -> float:
        """A lower bound on the price of any plan from ``state`` to ``goal``.

        Launches: every mesh dim that must reduce, or go from a shard to Replicate, needs
        a single-dim collective of its own (the search merges nothing); any other mesh
        dim in the wrong shard placement or order position needs at least one more
        collective between them; alpha * log2(size) per such dim; one local launch per
        dim that must become a shard or Partial from Replicate, or change Partial kind.
        Bandwidth: each of those collectives moves at least its share of the smallest
        local tensor it can run on (the tensor split over every mesh dim sharded in
        ``state`` or ``goal``, and over dims replicated in both that the plan might shard
        for a while, paying a slice and a gather for each), on its own dim's link; and
        the first rank must receive what it lacks, at the fastest link.
        """
        codes, chains = state = self.states[state]
        info = self._goal_info.get(goal)
        if info is None:
            info = self._goal_info[goal] = self._goal_table(self.states[goal])
        tables, goal_partial, goal_chains, goal_codes = info
        single = 0
        other = False
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
                elif kind == 1 and b != R:
                    extra = 0.0
                else:
                    extra = self.launch + self.alpha_log[m]
                loose = ((m, extra),) if loose is None else loose + ((m, extra),)
            if kind == 0:
                continue
            if kind == 1:  # a collective of its own
                single += 1
                lat += dlat
                if dlocal:
                    local += 1
                    lw += self.sizes[m]  # its local step writes a tensor unsplit on m
                w_single += dw
                if type(a) is int:
                    reduce = True
            elif kind == 2:  # some collective
                other = True
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
                    lat += dlat
                    if dw > w_other:
                        w_other = dw
        h = (single + (1 if other else 0)) * self.launch + lat + local * self.local_launch
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
            missing = self._missing(state, self.states[goal], reduce) * self.itemsize / self.fastest
            missing += local_copy
            if missing > best:
                best = missing
        return h + best

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
                return (5, n, self.alpha_log[m], 0, wt[2])
            return (0, n, 0.0, 0, 0.0)
        if a == R:
            return (3, n, 0.0, 1, 0.0)
        if type(a) is int:
            if type(b) is int and b != R and a in _SUMAVG and b in _SUMAVG:
                return (3, n, 0.0, 1, 0.0)
            local = 1 if (type(b) is int and b != R) else 0
            w = wt[1] * (self.sizes[m] if type(b) is tuple else 1)
            return (1, n, self.alpha_log[m], local, w)
        if b == R:
            return (1, n, self.alpha_log[m], 0, wt[0])
        if type(b) is int:
            return (3, n, 0.0, 1, 0.0)
        return (2, n, self.alpha_log[m], 0, wt[2])

    def _missing(self, state, goal, reduce: bool) -> int:
        """Elements the first rank (mesh coordinate 0) needs in ``goal`` and lacks in ``state``."""
        codes, chains = state
        goal_codes, goal_chains = goal
        need = have = 1
        for d in range(self.ndim):
            key = (d, chains[d], tuple(codes[m] for m in chains[d]), goal_chains[d])
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


def _put(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1 :]


def mixable(codes, op) -> bool:
    for c in codes:
        if type(c) is int and c != R and c != op and not (c in _SUMAVG and op in _SUMAVG):
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _may_empty(length: int, sizes: tuple[int, ...]) -> bool:
    """Whether some order of some of the mesh dims of ``sizes`` leaves a piece empty."""
    return any(_smallest_piece(length, order) == 0 for order in set(itertools.permutations(sizes)))


@functools.lru_cache(maxsize=65536)
def _smallest_piece(length: int, sizes: tuple[int, ...]) -> int:
    """The shortest piece any rank holds when plain shards of ``sizes`` chunk ``length``."""
    lengths = {length}
    for n in sizes:
        nxt = set()
        for L in lengths:
            size = -(-L // n) if n else 0
            for c in range(n):
                start = min(size * c, L)
                nxt.add(min(start + size, L) - start)
        lengths = nxt
    return min(lengths)


@functools.lru_cache(maxsize=65536)
def exact_covers(length: int, src: tuple, dst: tuple, m: int) -> bool:
    """Exact check along one tensor dim of a step on mesh dim ``m``: every rank's piece under
    ``dst`` lies in what the ranks it reads from hold under ``src`` (those differing only
    in ``m`` when ``m`` shards in ``src``, else the rank itself).

    ``src``/``dst``: the orders as ``((mesh_dim, size, split_factor), ...)``.
    """
    dims = sorted({x for x, _, _ in src} | {x for x, _, _ in dst})
    size = {x: n for x, n, _ in src + dst}
    others = [x for x in dims if x != m]

    def piece(chain, coord):
        ivs = ((0, length),) if length else ()
        for x, n, sf in chain:
            p = Shard(0) if sf == 1 else StridedShard(0, sf)
            ivs = shard_intervals(ivs, p, n, coord[x])
        out: set[int] = set()
        for a, b in ivs:
            out.update(range(a, b))
        return out

    in_src = any(x == m for x, _, _ in src)
    in_dst = any(x == m for x, _, _ in dst)
    for combo in itertools.product(*(range(size[x]) for x in others)):
        coord = dict(zip(others, combo, strict=True))
        have: set[int] = set()
        for c in range(size[m] if in_src else 1):
            coord[m] = c
            have |= piece(src, coord)
        for c in range(size[m] if in_dst else 1):
            coord[m] = c
            if not piece(dst, coord) <= have:
                return False
    return True


@functools.lru_cache(maxsize=256)
def context(mesh, shape, dtype, model, shards, ptargets, bound) -> _Context:
    return _Context(mesh, shape, dtype, model, shards, ptargets, bound)


def search(ctx: _Context, start: int, goal: int):
    """A* from state ``start`` to ``goal`` (ids); ``(cost, [(state, transition, next)])``.

    Prices carry the tie-breaking factor of :func:`_tie`, so the minimum is unique: the
    search and a plan table (``_table``) find the same plan. Partial-order reduction:
    when two structural single-dim steps on different mesh dims and different shard
    orders commute, only the cheaper order is kept, so independent steps are not tried
    in every order.
    """
    heuristic = ctx.heuristic
    hmemo = ctx._h
    singles = ctx.singles
    states = ctx.states

    goal_codes = states[goal][0]
    kept_memo = ctx._kept

    def h_of(i):
        key = (i, goal)
        h = hmemo.get(key)
        if h is None:
            h = hmemo[key] = heuristic(i, goal)
        return h

    memo: dict = {start: h_of(start)}
    best = {start: 0.0}
    parent: dict = {start: None}
    counter = itertools.count()
    heap = [(memo[start], 0.0, 0, start)]
    closed = set()
    push = heapq.heappush

    def relax(i, g, h, succ):
        for trans in succ:
            c, t = trans[0], trans[1]
            if trans[3] is None and trans[6] == () and len(trans[2]) == 1:
                # Replicate -> Partial, or sum <-> avg, on a mesh dim the goal keeps
                # un-Partial: whatever reduces it later could have run without it
                b = goal_codes[trans[2][0]]
                if type(b) is not int or b == R:
                    continue
            ng = g + c
            old = best.get(t)
            if old is None or ng < old:
                best[t] = ng
                parent[t] = (i, trans)
                ht = memo.get(t)
                if ht is None:
                    ht = h - c if h > c else 0.0
                push(heap, (ng + ht, -ng, next(counter), t))
                closed.discard(t)

    while heap:
        key, neg_g, _, i = heapq.heappop(heap)
        g = -neg_g
        if i < 0:
            # the all_permutes of state ~i, queued when it was expanded (at a lower bound
            # of their successors' rank), generated only now
            i = ~i
            if g <= best[i]:
                relax(i, g, memo[i], ctx.permutes(i))
            continue
        if i in closed or g > best[i]:
            continue
        # lazy heuristic: a state was queued under h(parent) - step price (a lower bound
        # of its own, by consistency); evaluate it only now, re-queue if it ranks later
        h = memo.get(i)
        if h is None:
            h = memo[i] = h_of(i)
            if g + h > key:
                push(heap, (g + h, neg_g, next(counter), i))
                continue
        if i == goal:
            moves = []
            while parent[i] is not None:
                prev, trans = parent[i]
                moves.append((prev, trans, i))
                i = prev
            moves.reverse()
            return g, moves
        closed.add(i)
        via = parent[i]
        succ = singles(i)
        if via is not None and via[1][6] is not None and len(via[1][2]) == 1:
            # the single-dim steps the commuting-steps reduction keeps
            kkey = (via[0], via[1][1], via[1][2], via[1][3], i)
            succ = kept_memo.get(kkey)
            if succ is None:
                succ = kept_memo[kkey] = _commute_filter(ctx, via[0], via[1], singles(i))
        relax(i, g, h, succ)
        floor = ctx.permute_floor(i)
        if floor < math.inf:
            # every permute leads to a state ranked at least this
            push(heap, (g + (floor if floor > h else h), neg_g, next(counter), ~i))
    return None


def _tie(a, b) -> float:
    """A deterministic factor in [1, 1 + 2**-31) for the transition ``a -> b`` (states).

    Every price carries it, so plans that would tie exactly differ, and each pair of specs
    has one cheapest plan, whichever way it is found (search or table, in any process of
    one Python build: states hold only ints, whose hashes are fixed). A plan's price moves
    by under 5e-10 of itself.
    """
    return 1.0 + (hash((a, b)) & 0xFFFFFFFF) * 2.0**-63


def _commute_filter(ctx: _Context, prev: int, x: tuple, succ: tuple) -> tuple:
    """The transitions of ``succ`` (from the state ``x`` led to out of ``prev``) that the
    partial-order reduction keeps: a structural single-dim step ``y`` after ``x`` on another
    mesh dim and other shard orders is dropped when ``y`` then ``x`` is cheaper (on a tie,
    when ``y`` moves the lower mesh dim)."""
    states, nbytes, price, intern, bound = ctx.states, ctx._nbytes, ctx.price, ctx.intern, ctx.bound
    mx = x[2][0]
    touch_x = x[6]
    pc, pch = states[prev]
    out = []
    for trans in succ:
        if trans[6] is not None and len(trans[2]) == 1:
            my = trans[2][0]
            touch_y = trans[6]
            if my != mx and not any(d in touch_x for d in touch_y):
                # the same two steps the other way round: y from prev, then x
                t = trans[1]
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
                        alt = price(trans[2], trans[3], trans[4], bp, bq, trans[5]) * _tie(
                            states[prev], q_state
                        ) + price(x[2], x[3], x[4], bq, bt, x[5]) * _tie(q_state, states[t])
                        here = x[0] + trans[0]
                        if alt < here or (alt == here and my < mx):
                            continue
        out.append(trans)
    return tuple(out)

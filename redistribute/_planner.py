"""``plan(src, dst)``: the minimum-cost sequence of steps, by A* search over specs.

States are specs, encoded compactly as ``(codes, chains)``: one code per mesh dim
(``0`` Replicate, ``1..4`` Partial sum/avg/max/min, ``(tensor_dim, split_factor)`` for
Shard (split factor 1) and StridedShard) and, per tensor dim, the mesh dims sharding it
in application order. Transitions (each a valid :class:`Step`):

* per mesh dim ``m``: ``R -> S`` (local slice; ``m`` chunks the current piece, so it is
  appended last to its tensor dim's order), ``R -> P`` and ``S -> P`` (local), ``P(sum)
  <-> P(avg)`` (local scale), ``S -> R`` (all_gather), ``S(d) -> S(d')`` (all_to_all;
  ``m`` moves to the end of ``d'``'s order), ``P -> R`` (all_reduce), ``P -> S``
  (reduce_scatter). Taking ``m`` out of an order is valid when ``m`` is last in it (the
  group then holds the parent piece); elsewhere only for degenerate (tiny) dims, checked
  exactly;
* ``all_permute`` over several mesh dims that shard in both specs: a change of shard
  order or of which dims shard which tensor dims, valid when, per tensor dim, the old and
  new orders share a prefix and differ only in the step's dims.

The shard placements searched are ``Shard(d)`` for every tensor dim plus the
StridedShards of ``src``/``dst``; Partial targets are the ops of ``src`` and ``dst``. The heuristic is a
lower bound (latency and launches every mismatched mesh dim still needs), so the search
returns an optimal plan; plans are cached on the frozen arguments.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math

from meshplan.errors import PlanError
from meshplan.layout import FrozenMap, Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    dtype_itemsize,
    shard_intervals,
)

from ._cost import CostModel, chain_extent, coefficients, group_link
from ._step import Plan, Step, _avg_scale

__all__ = ["plan", "check_plannable", "clear_plan_cache"]

R = 0
_OPS = ("sum", "avg", "max", "min")
_OP_CODE = {op: i + 1 for i, op in enumerate(_OPS)}
_SUMAVG = (1, 2)


# -- encoding -------------------------------------------------------------------------------


def _code(p) -> object:
    match p:
        case Replicate():
            return R
        case Partial(op=op):
            return _OP_CODE[op]
        case StridedShard(dim=d, split_factor=sf):
            return (d, sf)
        case Shard(dim=d):
            return (d, 1)
    raise PlanError(f"unknown placement {p!r}", value=p)


@functools.lru_cache(maxsize=None)
def _placement(code) -> object:
    if code == R:
        return Replicate()
    if type(code) is int:
        return Partial(_OPS[code - 1])
    d, sf = code
    return Shard(d) if sf == 1 else StridedShard(d, sf)


def _state(spec: Spec) -> tuple:
    codes = tuple(_code(p) for p in spec.placements)
    chains = tuple(spec.order(d) for d in range(spec.ndim))
    return codes, chains


def _spec(template: Spec, state: tuple) -> Spec:
    """A canonical Spec for an encoded state, built without re-validating (states are canonical)."""
    codes, chains = state
    order = object.__new__(FrozenMap)
    object.__setattr__(order, "_data", {d: c for d, c in enumerate(chains) if c})
    object.__setattr__(order, "_hash", None)
    spec = object.__new__(Spec)
    object.__setattr__(spec, "mesh", template.mesh)
    object.__setattr__(spec, "placements", tuple(_placement(c) for c in codes))
    object.__setattr__(spec, "shape", template.shape)
    object.__setattr__(spec, "dtype", template.dtype)
    object.__setattr__(spec, "shard_order", order)
    object.__setattr__(spec, "_attrs_cached_hash", None)
    return spec


def _step(dims: tuple[int, ...], src: Spec, dst: Spec, collective, alias=None) -> Step:
    step = object.__new__(Step)
    object.__setattr__(step, "mesh_dims", dims)
    object.__setattr__(step, "src", src)
    object.__setattr__(step, "dst", dst)
    object.__setattr__(step, "collective", collective)
    object.__setattr__(step, "alias", alias)
    object.__setattr__(step, "avg_scale", 1)
    object.__setattr__(step, "_attrs_cached_hash", None)
    object.__setattr__(step, "avg_scale", _avg_scale(step))
    return step


def _plan_value(src: Spec, dst: Spec, steps: tuple[Step, ...]) -> Plan:
    p = object.__new__(Plan)
    object.__setattr__(p, "src", src)
    object.__setattr__(p, "dst", dst)
    object.__setattr__(p, "steps", steps)
    object.__setattr__(p, "_attrs_cached_hash", None)
    return p


# -- input checks ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def alias_dims(mesh: Mesh) -> FrozenMap:
    """Each alias of ``mesh`` as the mesh dims it flattens (in flattening order).

    Raises :class:`PlanError` for an alias that is not a flattening of mesh dims.

    >>> m = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
    >>> dict(alias_dims(m))
    {'ac': (0, 2)}
    """
    found: dict[str, tuple[int, ...]] = {}
    dims = range(mesh.ndim)
    for k in range(1, mesh.ndim + 1):
        for combo in itertools.permutations(dims, k):
            name = mesh.alias_for(combo)
            if name is not None and name not in found:
                found[name] = combo
    for name in mesh.aliases:
        if name not in found:
            raise PlanError(
                f"alias {name!r} of {mesh} ({mesh.aliases[name]}) does not flatten any of its "
                f"mesh dims {mesh.names!r}; register aliases with mesh.flatten(dims, name)",
                value=name,
            )
    return FrozenMap(found)


def check_plannable(src: Spec, dst: Spec) -> None:
    """Raise :class:`PlanError` naming what differs when ``src`` and ``dst`` cannot be planned.

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
    if src.mesh != dst.mesh:
        a, b = src.mesh, dst.mesh
        if a.shape != b.shape:
            what = f"mesh shape {a.shape} vs {b.shape}"
        elif a.names != b.names:
            what = f"mesh dim names {a.names!r} vs {b.names!r}"
        elif tuple(a.ranks) != tuple(b.ranks):
            what = "rank maps"
        elif a.aliases != b.aliases:
            what = f"aliases {tuple(a.aliases)!r} vs {tuple(b.aliases)!r}"
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


# -- the search context ---------------------------------------------------------------------


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
        self.has_alias = bool(mesh.aliases)
        world = math.prod(mesh.shape)
        sf = math.prod(c[1] for c in shards)
        # tensor dims where a mesh dim may leave or join the middle of an order: tiny
        # dims (pieces may be empty) and dims with StridedShards (an SS may encode an
        # order); such moves are checked exactly and the heuristic ignores orders there
        self.empty = 0 in shape  # no data at all: every step is valid
        self.tiny = tuple(
            self.empty or length < world * sf or any(c[0] == d and c[1] > 1 for c in shards)
            for d, length in enumerate(shape)
        )
        self._bytes: dict = {}
        self._succ: dict = {}
        self._perm: dict = {}
        self._coef: dict = {}
        hw = model.profile
        self.launch = hw.launch_s
        self.local_launch = hw.local_launch_s
        self.alpha_log = tuple(
            group_link(model, mesh, (m,)).latency_s * math.log2(n) if n > 1 else 0.0
            for m, n in enumerate(mesh.shape)
        )

    # sizes
    def nbytes(self, state) -> int:
        b = self._bytes.get(state)
        if b is None:
            codes, chains = state
            sizes = self.sizes
            b = self.itemsize
            for d, chain in enumerate(chains):
                if chain:
                    kinds = tuple((sizes[m], codes[m][1]) for m in chain)
                    b *= chain_extent(self.shape[d], kinds)
                else:
                    b *= self.shape[d]
            self._bytes[state] = b
        return b

    def price(self, dims, collective, n_send, b_in, b_out, scaled=False) -> float:
        key = (dims, collective, n_send)
        c = self._coef.get(key)
        if c is None:
            c = coefficients(self.model, self.mesh, dims, collective, n_send)
            self._coef[key] = c
        total = c[0] + c[3] + (c[1] + c[4]) * b_in + (c[2] + c[5]) * b_out
        if scaled:
            total += b_out / self.model.profile.copy_bytes_per_s
        return total

    # transitions
    def successors(self, state, goal):
        """Every transition from ``state``: ``(price, next_state, mesh_dims, collective)``."""
        out = self._succ.get(state)
        if out is None:
            out = self._successors(state)
            self._succ[state] = out
        key = (state, goal)
        perm = self._perm.get(key)
        if perm is None:
            perm = self._permutes(state, goal)
            self._perm[key] = perm
        return out + perm if perm else out

    def _add(self, out, state, b_in, dims, collective, t, n_send=1, scaled=False):
        b_out = self.nbytes(t)
        if self.bound is not None and b_in + b_out > self.bound:
            return
        out.append((self.price(dims, collective, n_send, b_in, b_out, scaled), t, dims, collective))

    def _permutes(self, state, goal):
        out = []
        b_in = self.nbytes(state)
        for t in self._permute_targets(state, goal):
            g = _permute_dims(state, t)
            if g is not None and len(g) > 1:
                n = math.prod(self.sizes[m] for m in g)
                self._add(out, state, b_in, g, "all_permute", t, n)
        return tuple(out)

    def _successors(self, state):
        codes, chains = state
        out: list = []
        b_in = self.nbytes(state)
        sizes = self.sizes

        def add(dims, collective, t, n_send=1, scaled=False):
            self._add(out, state, b_in, dims, collective, t, n_send, scaled)

        for m in self.active:
            a = codes[m]
            dims = (m,)
            if a == R:
                for code in self.shards:
                    for t in self._inserted(state, codes, chains, m, code):
                        add(dims, None, t)
                for op in self.ptargets:
                    if _mixable(codes, op):
                        add(dims, None, (_put(codes, m, op), chains))
            elif type(a) is int:
                add(dims, "all_reduce", (_put(codes, m, R), chains), scaled=a == 2)
                for code in self.shards:
                    for t in self._inserted(state, codes, chains, m, code):
                        add(dims, "reduce_scatter", t, scaled=a == 2)
                if a in _SUMAVG:
                    for op in self.ptargets:
                        if op in _SUMAVG and op != a:
                            add(dims, None, (_put(codes, m, op), chains))
            else:
                d = a[0]
                chain = chains[d]
                last = chain[-1] == m
                rest = chain[:-1] if last else tuple(x for x in chain if x != m)
                n = sizes[m]
                removed = _put(chains, d, rest)
                if last or self._exact(state, d, (_put(codes, m, R), removed), rest, m):
                    add(dims, "all_gather", (_put(codes, m, R), removed), n)
                    for op in self.ptargets:
                        if _mixable(codes, op):
                            add(dims, None, (_put(codes, m, op), removed))
                    others_ok = True
                else:
                    others_ok = False
                for code in self.shards:
                    if code == a:
                        continue
                    if code[0] != d and not others_ok:
                        continue
                    for t in self._inserted(state, codes, removed, m, code, last):
                        add(dims, "all_to_all", t, n)
        return tuple(out)

    def _inserted(self, state, codes, chains, m, code, last=True):
        """States where mesh dim ``m`` takes shard ``code``, joining its tensor dim's order:
        last (always valid when ``m`` left its old order from the end), or, for tiny dims,
        anywhere the exact check allows."""
        d = code[0]
        base = chains[d]
        new_codes = _put(codes, m, code)
        t = (new_codes, _put(chains, d, base + (m,)))
        old = codes[m]
        same_dim = type(old) is tuple and old[0] == d
        if (last or not same_dim) or self._exact(state, d, t, base + (m,), m):
            yield t
        if self.tiny[d]:
            for i in range(len(base)):
                new_chain = base[:i] + (m,) + base[i:]
                t = (new_codes, _put(chains, d, new_chain))
                if self._exact(state, d, t, new_chain, m):
                    yield t

    def _exact(self, state, d, new_state, new_chain, m) -> bool:
        if not self.tiny[d]:
            return False
        if self.empty:
            return True
        codes, chains = state
        new_codes = new_state[0]
        src = tuple((x, self.sizes[x], codes[x][1]) for x in chains[d])
        dst = tuple((x, self.sizes[x], new_codes[x][1]) for x in new_chain)
        return _exact_covers(self.shape[d], src, dst, m)

    def _permute_targets(self, state, goal):
        """Candidate all_permute targets: re-order one tensor dim, or jump towards the goal."""
        codes, chains = state
        goal_codes, goal_chains = goal
        seen = []
        for d, chain in enumerate(chains):
            if len(chain) < 2:
                continue
            gchain = goal_chains[d]
            if set(gchain) == set(chain) and any(
                x != y or codes[x] != goal_codes[y] for x, y in zip(chain, gchain, strict=True)
            ):
                new_codes = list(codes)
                for x in gchain:
                    new_codes[x] = goal_codes[x]
                seen.append((tuple(new_codes), _put(chains, d, gchain)))
            for i, m in enumerate(chain[:-1]):
                new_chain = chain[:i] + chain[i + 1 :] + (m,)
                seen.append((codes, _put(chains, d, new_chain)))
        # jump: dims sharding in both take the goal's placement, in the goal's order
        both = [m for m in self.active if type(codes[m]) is tuple and type(goal_codes[m]) is tuple]
        if len(both) > 1:
            new_codes = list(codes)
            for m in both:
                new_codes[m] = goal_codes[m]
            new_chains = []
            for d in range(self.ndim):
                mine = [m for m in self.active if type(new_codes[m]) is tuple and new_codes[m][0] == d]
                first = [m for m in goal_chains[d] if m in mine]
                tail = [m for m in chains[d] if m in mine and m not in first]
                tail += [m for m in mine if m not in first and m not in tail]
                new_chains.append(tuple(first + tail))
            seen.append((tuple(new_codes), tuple(new_chains)))
        out = []
        for t in seen:
            if t != state and t not in out:
                out.append(t)
        return out

    # the heuristic
    def heuristic(self, state, goal) -> float:
        """A lower bound on the price of any plan from ``state`` to ``goal``."""
        codes, chains = state
        goal_codes, goal_chains = goal
        single = 0  # mesh dims needing a reduction or gather of their own
        other = False
        lat = 0.0
        local = 0
        for m in self.active:
            a = codes[m]
            b = goal_codes[m]
            if a == b:
                if type(a) is tuple:
                    d = a[0]
                    if not self.tiny[d] and _prefix(chains[d], m, codes) != _prefix(
                        goal_chains[d], m, goal_codes
                    ):
                        other = True
                        lat += self.alpha_log[m]
                continue
            if a == R:
                local += 1
            elif type(a) is int:
                if type(b) is int and b != R and a in _SUMAVG and b in _SUMAVG:
                    local += 1
                else:
                    single += 1
                    lat += self.alpha_log[m]
                    if type(b) is int and b != R:
                        local += 1
            elif b == R:
                single += 1
                lat += self.alpha_log[m]
            elif type(b) is int:
                local += 1
            else:
                other = True
                lat += self.alpha_log[m]
        if self.has_alias:
            launches = 1 if (single or other) else 0
        else:
            launches = single + (1 if other and not single else 0)
        return launches * self.launch + lat + local * self.local_launch


def _prefix(chain, m, codes):
    i = chain.index(m)
    return tuple((x, codes[x]) for x in chain[: i + 1])


def _put(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1 :]


def _mixable(codes, op) -> bool:
    for c in codes:
        if type(c) is int and c != R and c != op and not (c in _SUMAVG and op in _SUMAVG):
            return False
    return True


def _permute_dims(state, target):
    """The mesh dims an all_permute from ``state`` to ``target`` runs over, or None if invalid."""
    codes, chains = state
    tcodes, tchains = target
    g: set[int] = set()
    for chain, tchain in zip(chains, tchains, strict=True):
        k = 0
        while (
            k < len(chain)
            and k < len(tchain)
            and chain[k] == tchain[k]
            and codes[chain[k]] == tcodes[tchain[k]]
        ):
            k += 1
        g.update(chain[k:])
        g.update(tchain[k:])
    for m, (a, b) in enumerate(zip(codes, tcodes, strict=True)):
        if m in g:
            if type(a) is not tuple or type(b) is not tuple:
                return None
        elif a != b:
            return None
    return tuple(sorted(g))


@functools.lru_cache(maxsize=65536)
def _exact_covers(length: int, src: tuple, dst: tuple, m: int) -> bool:
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
def _context(mesh, shape, dtype, model, shards, ptargets, bound) -> _Context:
    return _Context(mesh, shape, dtype, model, shards, ptargets, bound)


def _universe(src: Spec, dst: Spec, ndim: int) -> tuple[tuple, tuple]:
    shards = [(d, 1) for d in range(ndim)]
    for spec in (src, dst):
        for p in spec.placements:
            if isinstance(p, StridedShard) and (p.dim, p.split_factor) not in shards:
                shards.append((p.dim, p.split_factor))
    ops = sorted(
        {_OP_CODE[p.op] for spec in (src, dst) for p in spec.placements if isinstance(p, Partial)}
    )
    return tuple(shards), tuple(ops)


# -- search ---------------------------------------------------------------------------------


def _search(ctx: _Context, start, goal):
    memo: dict = {}

    def h(state):
        v = memo.get(state)
        if v is None:
            v = memo[state] = ctx.heuristic(state, goal)
        return v

    best = {start: 0.0}
    parent: dict = {start: None}
    counter = itertools.count()
    heap = [(h(start), 0.0, next(counter), start)]
    closed = set()
    while heap:
        f, neg_g, _, state = heapq.heappop(heap)
        g = -neg_g
        if state == goal:
            moves = []
            while parent[state] is not None:
                prev, dims, collective = parent[state]
                moves.append((prev, dims, collective, state))
                state = prev
            moves.reverse()
            return g, moves
        if state in closed:
            continue
        closed.add(state)
        for c, t, dims, collective in ctx.successors(state, goal):
            ng = g + c
            old = best.get(t)
            if old is None or ng < old:
                best[t] = ng
                parent[t] = (state, dims, collective)
                heapq.heappush(heap, (ng + h(t), -ng, next(counter), t))
                closed.discard(t)
    return None


def _min_cost_plan(src: Spec, dst: Spec, model: CostModel, bound) -> Plan:
    start, goal = _state(src), _state(dst)
    if start == goal:
        return _plan_value(src, dst, ())
    shards, ptargets = _universe(src, dst, src.ndim)
    ctx = _context(src.mesh, src.shape, src.dtype, model, shards, ptargets, bound)
    found = _search(ctx, start, goal)
    if found is None:
        raise PlanError(
            f"no plan from {src} to {dst} keeps peak local memory within max_local_bytes="
            f"{bound} (source holds {ctx.nbytes(start)} and target {ctx.nbytes(goal)} bytes "
            "per rank, and every step holds its input and output); raise the bound",
            value=bound,
        )
    _, moves = found
    specs = {start: src, goal: dst}
    steps = []
    for prev, dims, collective, state in moves:
        a = specs.get(prev) or specs.setdefault(prev, _spec(src, prev))
        b = specs.get(state) or specs.setdefault(state, _spec(src, state))
        steps.append(_step(dims, a, b, collective))
    return _plan_value(src, dst, tuple(steps))


@functools.lru_cache(maxsize=4096)
def _plan_cached(src: Spec, dst: Spec, model: CostModel, merge: bool, bound):
    check_plannable(src, dst)
    p = _min_cost_plan(src, dst, model, bound)
    missed: tuple = ()
    if merge and len(p.steps) > 1:
        from ._merge import merge_plan

        p, missed = merge_plan(p, model)
    return p, missed


def plan(
    src: Spec,
    dst: Spec,
    *,
    cost_model: CostModel | None = None,
    merge: bool = True,
    max_local_bytes: int | None = None,
) -> Plan:
    """The minimum-cost plan turning ``src`` into ``dst`` (same mesh, shape and dtype).

    ``merge`` folds adjacent like-kind collectives onto flattened aliases of the mesh
    (see :func:`merge`); ``max_local_bytes`` bounds every step's input plus output bytes
    per rank (raising :class:`PlanError` when no plan fits). Cached on the arguments.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard, Replicate
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> a = Spec(mesh, [Shard(0), Shard(0)], (8, 8))
    >>> b = Spec(mesh, [Shard(0), Shard(0)], (8, 8), shard_order={0: (1, 0)})
    >>> print(plan(a, b))
    Plan f32[8,8](S(0) S(0)) -> f32[8,8](S(0)[1,0] S(0))
      0. all_permute[dp,tp]: S(0) S(0) -> S(0)[1,0] S(0)
    """
    if cost_model is None:
        cost_model = CostModel.default()
    if max_local_bytes is not None and (
        isinstance(max_local_bytes, bool) or not isinstance(max_local_bytes, int)
    ):
        raise PlanError(
            f"max_local_bytes must be an int or None, got {max_local_bytes!r}",
            value=max_local_bytes,
        )
    try:
        p, missed = _plan_cached(src, dst, cost_model, bool(merge), max_local_bytes)
    except TypeError:  # unhashable input: validate to raise a clear error
        check_plannable(src, dst)
        raise
    if missed:
        from ._merge import warn_missed

        warn_missed(p, missed)
    return p


def clear_plan_cache() -> None:
    """Forget cached plans and search tables (for benchmarks measuring uncached planning)."""
    _plan_cached.cache_clear()
    _context.cache_clear()
    _exact_covers.cache_clear()

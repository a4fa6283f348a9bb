"""``merge(plan)``: run like-kind collectives over several mesh dims as one, on a flattened alias.

Rules (torch 2.13's flattened-mesh optimization, then bettered):

* Adjacent steps of one kind — ``all_reduce``, ``all_gather``, ``reduce_scatter`` and,
  beyond torch, ``all_to_all`` — over disjoint mesh dims merge into one step over their
  union when the mesh has an alias flattening exactly those dims (``mesh.alias_for``).
  Partial sum and avg merge (a sum-reduction then a divide by the avg dims' sizes:
  ``Step.avg_scale``); no other mix of ops exists in a valid spec.
* A merge happens only when the merged step is a valid transform of its source into its
  target (every rank's target data lies in its group; the data each rank moves is derived
  from the specs, so uneven shards and any shard order are exact, unlike torch's merged
  all_gather) and when it is not more expensive under the cost model than the steps it
  replaces (a merged step runs on the slowest link of its dims).
* Beyond torch: single-dim steps commute past steps on other mesh dims when both orders
  are valid transforms, so like-kind collectives separated by other steps can meet and
  merge — kept only when the whole plan gets cheaper.
* A merge that would help but has no alias is reported once per mesh shape with a
  :class:`MergeWarning` naming the ``mesh.flatten(...)`` call that enables it.

Which mesh shapes have warned is a planner's memory (``Planner.warned``; the default
planner's for :func:`merge`); :func:`reset_merge_warnings` clears the default planner's.
"""

from __future__ import annotations

import itertools
import warnings

from meshplan.errors import MergeWarning, PlanError
from meshplan.layout._mesh import first_instance
from meshplan.placement import Partial, Replicate, is_shard_like

from ._aliases import alias_dims
from ._collectives import MERGEABLE
from ._engine._encoding import decode, encode, universe
from ._plan import Plan, as_plan
from ._profile import CostModel, as_model
from ._sizes import padded_local_bytes
from ._step_cost import step_cost
from ._steps import Step

__all__ = ["merge", "merge_plan", "MergeWarning", "reset_merge_warnings", "MERGEABLE"]


def reset_merge_warnings() -> None:
    """Forget which mesh shapes were warned about (so the next missed merge warns again)."""
    from ._store import default_planner

    default_planner().forget_warnings()


def merge(plan: Plan, cost_model: CostModel | None = None) -> Plan:
    """Merge like-kind collectives of ``plan`` onto the mesh's flattened aliases.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Partial, Replicate, Spec
    >>> from meshplan.redistribute import plan as make_plan
    >>> mesh = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
    >>> src = Spec(mesh, [Partial(), Replicate(), Partial()], (8, 8))
    >>> dst = Spec(mesh, [Replicate()] * 3, (8, 8))
    >>> unmerged = make_plan(src, dst, merge=False)
    >>> len(unmerged), len(merge(unmerged))
    (2, 1)
    >>> print(merge(unmerged).steps[0])
    all_reduce[ac=a,c]: P(sum) P(sum) -> R R
    """
    from ._store import default_planner

    planner = default_planner()
    merged, missed = merge_plan(as_plan(plan, "merge"), as_model(cost_model), planner=planner)
    if missed:
        warn_missed(merged, missed, planner.warned)
    return merged


def merge_plan(
    plan: Plan,
    model: CostModel,
    prices=None,
    per_collective: float = 0.0,
    reorder: bool = True,
    bound: int | None = None,
    planner=None,
) -> tuple[Plan, tuple]:
    """``merge`` without the warning: the merged plan and the merges an alias would enable.

    ``prices``: the steps' prices when known (the planner's own); ``per_collective``: the
    price each collective adds on top of its time (the ``"collectives"`` objective);
    ``reorder``: also try commuting steps so like-kind ones meet (the planner's search
    has tried every merge already, so it only asks for the adjacent ones); ``bound``: the
    plan's ``max_local_bytes`` (a merged step must keep to it too: its input and output
    are the whole run's); ``planner``: whose contexts check reordered steps (the default
    planner's when None)."""
    kinds = [s.collective for s in plan.steps if s.collective in MERGEABLE]
    if len(kinds) == len(set(kinds)):
        return plan, ()  # no two collectives of one kind: nothing to merge
    price = _Prices(model, per_collective)
    if prices is not None:
        price.know(plan.steps, prices)
    best = plan
    best_cost = price.total(plan)
    missed: list = []
    # beyond torch: let like-kind steps meet by commuting, keep what gets cheaper (with an
    # alias to merge onto; without, only adjacent like-kind steps are reported)
    reordered = _reorderings(plan, planner) if reorder and plan.src.mesh.aliases else ()
    for candidate in reordered:
        merged, miss = _merge_adjacent(candidate, price, bound)
        c = price.total(merged)
        if c < best_cost * (1 - 1e-12):
            best, best_cost = merged, c
    merged, miss = _merge_adjacent(best, price, bound)
    missed.extend(miss)
    if price.total(merged) <= best_cost:
        best = merged
    return best, tuple(dict.fromkeys(missed))


def _total(plan: Plan, model: CostModel) -> float:
    return sum(step_cost(s, model).total for s in plan.steps)


class _Prices:
    """Step prices under one model, each step priced once (by identity: the steps priced
    live as long as this)."""

    def __init__(self, model: CostModel, per_collective: float = 0.0):
        self.model = model
        self.per_collective = per_collective  # the "collectives" objective's weight
        self._memo: dict = {}

    def __call__(self, step: Step) -> float:
        hit = self._memo.get(id(step))
        if hit is None:
            c = step_cost(step, self.model).total
            if step.collective is not None:
                c += self.per_collective
            hit = self._memo[id(step)] = (step, c)
        return hit[1]

    def know(self, steps, prices) -> None:
        for step, c in zip(steps, prices, strict=True):
            self._memo[id(step)] = (step, c)

    def total(self, plan: Plan) -> float:
        return sum(self(s) for s in plan.steps)


# -- adjacent merging -----------------------------------------------------------------------


def _merge_adjacent(plan: Plan, price: _Prices, bound=None) -> tuple[Plan, list]:
    steps = list(plan.steps)
    out: list[Step] = []
    missed: list = []
    i = 0
    while i < len(steps):
        kind = steps[i].collective
        j = i + 1
        if kind in MERGEABLE:
            used = set(steps[i].mesh_dims)
            while (
                j < len(steps)
                and steps[j].collective == kind
                and not used & set(steps[j].mesh_dims)
            ):
                used |= set(steps[j].mesh_dims)
                j += 1
        run = steps[i:j]
        if len(run) > 1:
            best, miss = _best_split(run, price, bound)
            out.extend(best)
            missed.extend(miss)
        else:
            out.extend(run)
        i = j
    if len(out) == len(steps):
        return plan, missed
    return Plan(plan.src, plan.dst, tuple(out)), missed


def _best_split(run: list[Step], price: _Prices, bound=None) -> tuple[list[Step], list]:
    """Partition a run of like-kind steps into merged segments of least total cost."""
    n = len(run)
    costs = [price(s) for s in run]
    if not run[0].src.mesh.aliases:
        # nothing can merge: only note what an alias would enable (the whole run, or else
        # its first mergeable pair)
        for start, end in [(0, n)] + [(k, k + 2) for k in range(n - 1)]:
            _, missed = _merged_step(run[start:end], sum(costs[start:end]), price, bound)
            if missed is not None:
                return run, [missed]
        return run, []
    # best[i] = (cost, steps, missed) for run[:i]
    best: list = [(0.0, [], [])] + [None] * n
    for end in range(1, n + 1):
        for start in range(end):
            prev = best[start]
            seg = run[start:end]
            if len(seg) == 1:
                option = (prev[0] + costs[start], prev[1] + seg, prev[2])
            else:
                separate = sum(costs[start:end])
                step, missed = _merged_step(seg, separate, price, bound)
                if step is None:
                    if missed is None:
                        continue
                    option = (prev[0] + separate, prev[1] + seg, prev[2] + [missed])
                else:
                    c = price(step)
                    if c > separate:
                        continue
                    option = (prev[0] + c, prev[1] + [step], prev[2])
            if best[end] is None or option[0] < best[end][0] - 1e-18:
                best[end] = option
    _, steps, missed = best[n]
    # report a missed merge only if no merge covers those steps
    return steps, missed


def _merged_step(seg: list[Step], separate: float, price: _Prices, bound=None):
    """The merged step for ``seg`` (or None) and, if only an alias is lacking, a missed-merge
    note; ``separate`` is what the steps of ``seg`` cost one by one. A merged step whose
    input plus output exceeds ``bound`` is none."""
    src, dst = seg[0].src, seg[-1].dst
    if bound is not None and padded_local_bytes(src) + padded_local_bytes(dst) > bound:
        return None, None
    mesh = src.mesh
    dims = tuple(sorted(m for s in seg for m in s.mesh_dims))
    kind = seg[0].collective
    if not _valid_merge(src, dst, dims, kind):
        return None, None

    names = alias_dims(mesh)
    alias = None
    order = dims
    for name, adims in names.items():
        if sorted(adims) == list(dims) and (alias is None or adims == dims):
            alias, order = name, adims
    if alias is None:
        hypothetical = Step(dims, src, dst, kind)  # valid: checked above
        if price(hypothetical) <= separate:
            return None, (mesh.shape, tuple(mesh.names[m] for m in dims), kind, len(seg))
        return None, None
    return Step(order, src, dst, kind, alias), None


def _valid_merge(src, dst, dims, kind) -> bool:
    """Whether one ``kind`` step over ``dims`` turns ``src`` into ``dst`` (structural rule,
    exact check through the exchange bookkeeping when shards are tiny)."""
    sp, dp = src.placements, dst.placements
    for m in dims:
        a, b = sp[m], dp[m]
        if kind == "all_reduce":
            ok = isinstance(a, Partial) and isinstance(b, Replicate)
        elif kind == "reduce_scatter":
            ok = isinstance(a, Partial) and is_shard_like(b)
        elif kind == "all_gather":
            ok = is_shard_like(a) and isinstance(b, Replicate)
        else:
            ok = is_shard_like(a) and is_shard_like(b)
        if not ok:
            return False
    if kind == "all_reduce":
        return True
    dimset = set(dims)
    for d in range(src.ndim):
        a, b = src.order(d), dst.order(d)
        k = 0
        while k < len(a) and k < len(b) and a[k] == b[k] and sp[a[k]] == dp[b[k]]:
            k += 1
        if not set(a[k:]) <= dimset or not set(b[k:]) <= dimset:
            return _exact_valid(src, dst, dims, kind)
    return True


def _exact_valid(src, dst, dims, kind) -> bool:
    from .exchange import reduce_blocks, transfers_to

    step = Step(dims, src, dst, kind)
    try:
        for r in first_instance(src.mesh):
            if kind == "reduce_scatter":
                reduce_blocks(step, r)
            else:
                transfers_to(step, r)
    except PlanError:
        return False
    return True


# -- commuting steps so that like-kind ones meet --------------------------------------------


def _reorderings(plan: Plan, planner):
    """Plans equal to ``plan`` with one step moved next to a like-kind step it commutes to."""
    steps = plan.steps
    n = len(steps)
    for i, j in itertools.combinations(range(n), 2):
        if j == i + 1 or steps[i].collective != steps[j].collective:
            continue
        if steps[i].collective not in MERGEABLE:
            continue
        if set(steps[i].mesh_dims) & set(steps[j].mesh_dims):
            continue
        for moved in (_move(steps, j, i + 1, planner), _move(steps, i, j - 1, planner)):
            if moved is not None:
                yield Plan(plan.src, plan.dst, moved)


def _move(steps, frm: int, to: int, planner):
    """``steps`` with step ``frm`` commuted to position ``to`` (None if some swap is invalid)."""
    steps = list(steps)
    k = frm
    while k != to:
        a, b = (k - 1, k) if to < k else (k, k + 1)
        swapped = _swap(steps[a], steps[b], planner)
        if swapped is None:
            return None
        steps[a], steps[b] = swapped
        k += -1 if to < k else 1
    return tuple(steps)


def _swap(x: Step, y: Step, planner):
    """Run ``y`` before ``x`` (disjoint single mesh dims): the two new steps, or None."""
    if len(x.mesh_dims) != 1 or len(y.mesh_dims) != 1 or x.mesh_dims == y.mesh_dims:
        return None

    s0 = encode(x.src)
    s2 = encode(y.dst)
    my = y.mesh_dims[0]
    mid = _apply(s0, my, s2[0][my])
    if mid is None:
        return None
    mx = x.mesh_dims[0]
    end = _apply(mid, mx, encode(x.dst)[0][mx])
    if end != s2:
        return None
    mid_spec = decode(x.src, mid)
    try:
        y2 = Step(y.mesh_dims, x.src, mid_spec, y.collective)
        x2 = Step(x.mesh_dims, mid_spec, y.dst, x.collective)
    except PlanError:
        return None
    for s in (y2, x2):
        if not _valid_single(s, planner):
            return None
    return y2, x2


def _apply(state, m, code):
    """The state after mesh dim ``m`` takes placement ``code`` (taken out of its order, and
    appended last to the new one); None if ``m`` is not last in its old order."""
    codes, chains = state
    old = codes[m]
    chains = list(chains)
    if type(old) is tuple:
        chain = chains[old[0]]
        if chain[-1] != m:
            return None
        chains[old[0]] = chain[:-1]
    if type(code) is tuple:
        chains[code[0]] = chains[code[0]] + (m,)
    codes = codes[:m] + (code,) + codes[m + 1 :]
    return codes, tuple(chains)


def _valid_single(step: Step, planner) -> bool:
    """Whether ``step`` is one of the search's single-dim moves (on a context of
    ``planner``'s, the default planner's when None)."""
    from ._engine._edges import singles
    from ._engine._problem import Problem
    from ._store import default_planner

    src, dst = step.src, step.dst
    shards, ptargets = universe(src, dst)
    problem = Problem(src.mesh, src.shape, src.dtype, CostModel.default(), shards, ptargets, None)
    ctx = (planner or default_planner()).context(problem)
    with ctx.lock:
        ids = ctx.intern(encode(src)), ctx.intern(encode(dst))
        for edge in singles(ctx, ids[0]):
            if (
                edge.target == ids[1]
                and edge.dims == step.mesh_dims
                and edge.collective == step.collective
            ):
                return True
    return False


# -- the warning ----------------------------------------------------------------------------


def warn_missed(plan: Plan, missed, warned: set) -> None:
    """Warn about merges a flattened alias would enable, once per mesh shape (``warned``:
    the shapes warned about already, a planner's)."""
    for shape, names, kind, count in missed:
        if shape in warned:
            continue
        warned.add(shape)
        quoted = ", ".join(repr(n) for n in names)
        alias = "_".join(names)
        warnings.warn(
            f"plan {plan.src} -> {plan.dst} runs {count} {kind} steps over mesh dims "
            f"({quoted}) one after another; flatten them so they run as one collective: "
            f'mesh = mesh.flatten(({quoted}), "{alias}")',
            MergeWarning,
            stacklevel=3,
        )

"""Prices for strategy selection: the planner's redistribution cost and its lower bounds.

``redistribute_cost(src, dst, model)`` is the exact price the selection minimizes: the
cost of the minimum-cost plan from ``src`` to ``dst``, as ``meshplan.redistribute``
computes it. ``transition_bound(src, m, q, model)`` is a cheap lower bound of the part
of that price caused by changing mesh dim ``m`` of ``src`` to placement ``q``; bounds of
different mesh dims add up to a lower bound of the whole price, which is what lets the
search stop early with a proven minimum.

Why the bound holds: a plan can only change a mesh dim's placement with a step over
that dim, and some changes need a collective (leaving a shard, reducing a Partial,
arriving at Replicate), others at least a local step. Every step costs at least its
price at the smallest local size the tensor can have on the mesh (all steps' prices
grow with bytes), and a step over several mesh dims (a merged one) is shared among
the dims it changes.
"""

from __future__ import annotations

import functools
import itertools
import math

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    dtype_itemsize,
)

__all__ = [
    "redistribute_cost",
    "redistribute_bound",
    "transition_bound",
    "input_bound",
    "default_model",
    "check_model",
    "check_planner",
    "min_local_bytes",
]


def default_model():
    """The cost model used when none is given (the planner's default)."""
    from meshplan.redistribute._profile import CostModel

    return CostModel.default()


def check_model(value):
    """``value`` as a cost model: None is the default; anything but a CostModel raises."""
    from meshplan.redistribute._profile import CostModel, HardwareProfile

    if value is None:
        return default_model()
    if isinstance(value, CostModel):
        return value
    hint = "wrap it: CostModel(profile)" if isinstance(value, HardwareProfile) else "see CostModel"
    raise StrategyError(
        f"cost_model must be a meshplan.redistribute.CostModel (or None for the default), got "
        f"{value!r}; {hint}",
        value=value,
    )


def redistribute_cost(src: Spec, dst: Spec, model, planner=None) -> float:
    """Total price (seconds) of the planner's minimum-cost plan from ``src`` to ``dst``
    (``meshplan.redistribute.plan_cost``: remembered by ``planner``, the default
    :class:`~meshplan.redistribute.Planner` when None)."""
    if src == dst:
        return 0.0
    from meshplan.redistribute._planner import plan_cost

    return plan_cost(src, dst, cost_model=model, planner=planner)


def redistribute_bound(src: Spec, dst: Spec, model, planner=None) -> tuple[float, float]:
    """``(price, lower)``: :func:`redistribute_cost` and a price every plan from ``src`` to
    ``dst`` costs at least, below it only where the planner's budget cut the plan's search
    (``meshplan.redistribute._planner.price_bound``)."""
    if src == dst:
        return 0.0, 0.0
    from meshplan.redistribute._planner import price_bound

    return price_bound(src, dst, cost_model=model, planner=planner)


def _plan(src: Spec, dst: Spec, model, planner=None):
    # the plan ``plan()`` returns, without its "flatten to merge" warning: selection
    # prices many candidate redistributions that never run
    from meshplan.redistribute._planner import _plan_cached

    return _plan_cached(src, dst, model, True, None, "time", planner)[0]


def check_planner(value):
    """``value`` as a planner: None (the default planner) or a Planner; anything else raises."""
    from meshplan.redistribute._store import Planner

    if value is None or isinstance(value, Planner):
        return value
    raise StrategyError(
        f"planner must be a meshplan.redistribute.Planner (or None for the default), got {value!r}",
        value=value,
    )


@functools.lru_cache(maxsize=16384)
def min_local_bytes(spec: Spec) -> float:
    """A lower bound of any layout's largest local size of ``spec``'s tensor on its mesh."""
    n = math.prod(spec.shape)
    return dtype_itemsize(spec.dtype) * n / math.prod(spec.mesh.shape)


@functools.lru_cache(maxsize=16384)
def _step_bound(model, mesh: Mesh, m: int, collective: str | None, nbytes: float) -> float:
    """The least a ``collective`` step over a group holding mesh dim ``m`` can cost.

    ``nbytes`` bounds every local size from below; a side of the step where ``m``
    does not shard (Partial or Replicate) holds ``mesh.shape[m]`` times as much.
    """
    from meshplan.redistribute._collectives import REDUCING
    from meshplan.redistribute._step_cost import coefficients

    size = mesh.shape[m]
    c = coefficients(model, mesh, (m,), collective, size)
    b_in = nbytes * size if collective in REDUCING else nbytes
    b_out = nbytes * size if collective == "all_gather" else nbytes
    return c[0] + c[3] + (c[1] + c[4]) * b_in + (c[2] + c[5]) * b_out


@functools.lru_cache(maxsize=1024)
def _share(mesh: Mesh, m: int) -> int:
    """How many placement changes one step touching mesh dim ``m`` may make at most."""
    return _max_step_dims(mesh, m)


def _max_step_dims(mesh: Mesh, m: int) -> int:
    # steps over several mesh dims run on a flattened alias holding them
    best = 1
    for axis in mesh.aliases.values():
        dims = _alias_dims(mesh, axis)
        if m in dims:
            best = max(best, len(dims))
    return best


def _alias_dims(mesh: Mesh, axis) -> tuple[int, ...]:
    covered = set(axis.offsets())
    return tuple(i for i in range(mesh.ndim) if set(mesh.axis(i).offsets()) <= covered)


def _kind(p: Placement) -> str:
    kind = _KINDS.get(type(p))
    if kind is not None:
        return kind
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P"
    return "S"


_KINDS = {Replicate: "R", Partial: "P", Shard: "S", StridedShard: "S"}



@functools.lru_cache(maxsize=16384)
def _dim_steps(model, mesh: Mesh, m: int, nbytes: float) -> tuple[float, ...]:
    """:func:`_step_bound` of every step kind: a local step, then each of
    ``COLLECTIVES`` in order."""
    from meshplan.redistribute._collectives import COLLECTIVES

    return tuple(_step_bound(model, mesh, m, c, nbytes) for c in (None, *COLLECTIVES))


@functools.lru_cache(maxsize=65536)
def _dim_bound(src: Spec, m: int, q: Placement, model) -> tuple[float, bool]:
    """(least price of the steps changing mesh dim ``m`` to ``q``, whether it is shard -> shard)."""
    p = src.placements[m]
    if p == q or src.mesh.shape[m] == 1:
        return 0.0, False
    kp, kq = _kind(p), _kind(q)
    if "P" not in (kp, kq) and (0 in src.shape or (kp == kq == "S" and p.dim == q.dim)):
        # the target may hold the source's layout already (``same_layout``: a
        # StridedShard written as a shard order, any unreduced placements of an empty
        # tensor), and then the plan has no step
        return 0.0, False
    local, gather, allreduce, scatter, a2a, permute = _dim_steps(
        model, src.mesh, m, min_local_bytes(src)
    )
    reduce = min(allreduce, scatter)
    leave_shard = min(gather, a2a, permute, reduce)
    bound = min(local, leave_shard)  # every change takes at least one step over m
    if kp == "P" and (kq != "P" or {p.op, q.op} != {"sum", "avg"}):
        bound = max(bound, reduce)  # a Partial only leaves by reducing
    if kp == "S" and kq in ("S", "R"):
        bound = max(bound, leave_shard)  # a shard leaves by moving data (or reducing later)
    if kq == "R":
        arrive = min(gather, allreduce)
        if kp == "S":  # a general all_permute may hand the piece over to another mesh dim
            arrive = min(arrive, permute)
        bound = max(bound, arrive)  # arriving at R
    # shard -> shard, shard -> R and R -> shard changes may all be one all_permute
    # (ranks holding the same pieces under other mesh dims): they share its price
    permuting = (kp == "S" and kq in ("S", "R")) or (kp == "R" and kq == "S")
    return bound * (1 - 1e-9), permuting


def transition_bound(src: Spec, m: int, q: Placement, model) -> float:
    """A lower bound of the price of turning mesh dim ``m`` of ``src`` into ``q``.

    Zero when nothing changes; the bounds of the mesh dims of one redistribution add up
    to a lower bound of its planned price (a step changing several mesh dims at once
    is shared among them: a merged one over an alias, or an all_permute re-sharding
    several of the dims that shard in ``src``).
    """
    if src.placements[m] == q:
        return 0.0
    bound, ss = _dim_bound(src, m, q, model)
    if not bound:
        return 0.0
    share = _share(src.mesh, m)
    if ss:  # one all_permute may change every mesh dim at once
        share = max(share, src.mesh.ndim)
    return bound / share


@functools.lru_cache(maxsize=16384)
def _n_sharding(src: Spec) -> int:
    return sum(1 for m, p in enumerate(src.placements) if _kind(p) == "S" and src.mesh.shape[m] > 1)


@functools.lru_cache(maxsize=65536)
def input_bound(src: Spec, placements: tuple[Placement, ...], model) -> float:
    """A lower bound of the planned price from ``src`` to any spec with ``placements``.

    At least the sum of :func:`transition_bound`, and tighter when several mesh dims
    change shard -> shard: one all_permute may do them all, so they count as the most
    expensive of them (or as their shares, when merged steps witness some).
    """
    fixed = 0.0
    ss: list[tuple[float, int]] = []
    for m, q in enumerate(placements):
        bound, is_ss = _dim_bound(src, m, q, model)
        if not bound:
            continue
        share = _share(src.mesh, m)
        if is_ss:
            ss.append((bound, share))
        else:
            fixed += bound / share
    if not ss:
        return fixed
    best = sum(b / s for b, s in ss)  # every shard -> shard change witnessed by a merged step
    for k in range(1, len(ss) + 1):
        for chosen in itertools.combinations(range(len(ss)), k):
            rest = sum(b / s for j, (b, s) in enumerate(ss) if j not in chosen)
            best = min(best, rest + max(ss[j][0] for j in chosen))
    return fixed + best

"""The price of one step: alpha-beta prices for collectives per mesh dim, plus local compute.

One pricing function (:func:`_price`, through :func:`coefficients`) serves the planner,
:func:`step_cost`, ``cost(plan)``, ``explain()`` and strategy selection, so estimates
agree everywhere.

Model (per step over the mesh dims ``G``; ``n`` ranks in the group, ``b_in``/``b_out``
the padded local bytes before/after — the largest rank's, as collectives pad to it):

===============  ==========================================  ===========================
collective       bytes received per rank                     time
===============  ==========================================  ===========================
local (None)     0                                           launch_local + b_out/copy
all_gather       (n-1) * b_in                                launch + a*L + recv/bw
reduce_scatter   (n-1) * b_out                               ... + recv/reduce
all_reduce       2 (n-1)/n * b_in                            launch + 2a*L + recv/bw + ...
all_to_all,      (k-1)/k * b_out (k: ranks that send, i.e.   launch + a*ceil(log2 k)
all_permute      the dims sharded in the source)             + recv/bw + b_out/copy
===============  ==========================================  ===========================

``L = ceil(log2 n)`` (latency of a tree / recursive-doubling schedule; bandwidth terms of
a ring). ``a``/``bw`` are the latency and bandwidth of the group's link: the slowest of
its mesh dims (a dim spanning nodes is inter-node), on the collective's own links when
the profile has them (``HardwareProfile.per_collective``, what ``calibrate`` fits). On a
profile with ``reduce_scatter_via_all_reduce`` (gloo) a reduce_scatter is priced as the
all_reduce of its input plus a copy of its output. No torch here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import attrs

from meshplan.errors import PlanError
from meshplan.layout import Mesh
from meshplan.placement import Spec, is_shard_like

from ._collectives import EXCHANGING, REDUCING
from ._links import group_link
from ._profile import CostModel, HardwareProfile, as_model
from ._sizes import padded_local_bytes
from ._steps import Step

__all__ = ["Cost", "coefficients", "link_terms", "step_cost", "transition_cost"]


def _number_named(name: str):
    """A converter checking that a Cost field holds a number (any int or float)."""

    def convert(value):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PlanError(
                f"Cost {name}={value!r:.80} is no number; a cost holds seconds and bytes",
                value=value,
            )
        return value

    return convert


@attrs.frozen
class Cost:
    """A price: seconds of communication and of local compute, their sum, and bytes received.

    ``bytes`` counts what the busiest rank receives (padded), summed over steps; ``total``
    is ``comm + compute``.

    >>> c = Cost(1.0, 0.5, 10) + Cost(2.0, 0.0, 5)
    >>> c, c.total
    (Cost(comm=3.0, compute=0.5, bytes=15), 3.5)
    """

    comm: float = attrs.field(default=0.0, converter=_number_named("comm"))
    compute: float = attrs.field(default=0.0, converter=_number_named("compute"))
    bytes: int = attrs.field(default=0, converter=_number_named("bytes"))
    total: float = attrs.field(init=False, repr=False)

    @total.default
    def _total(self) -> float:
        return self.comm + self.compute

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.comm + other.comm, self.compute + other.compute, self.bytes + other.bytes)


@functools.lru_cache(maxsize=16384)
def coefficients(
    model: CostModel, mesh: Mesh, dims: tuple[int, ...], collective: str | None, n_send: int
) -> tuple[float, float, float, float, float, float, float]:
    """Linear coefficients of a step's price in its padded local bytes ``b_in``, ``b_out``.

    Returns ``(comm0, comm_in, comm_out, comp0, comp_in, comp_out, recv)``: comm =
    comm0 + comm_in*b_in + comm_out*b_out, compute likewise, and bytes received =
    recv * b_in for all_gather/all_reduce, recv * b_out otherwise.

    >>> coefficients(CostModel(), Mesh.create(2), (0,), None, 1)[:3]
    (0.0, 0.0, 0.0)
    """
    hw = model.profile
    if collective is None:
        return (0.0, 0.0, 0.0, hw.local_launch_s, 0.0, 1.0 / hw.copy_bytes_per_s, 0.0)
    link = group_link(model, mesh, dims, collective)
    n = math.prod(mesh.shape[m] for m in dims)
    hops, y_in, y_out, comp_in, comp_out, recv = link_terms(hw, collective, n, n_send)
    bw = link.bytes_per_s
    comm0 = hw.launch_s + link.latency_s * hops
    return (comm0, y_in / bw, y_out / bw, 0.0, comp_in, comp_out, recv)


def link_terms(
    hw: HardwareProfile, collective: str, n: int, n_send: int
) -> tuple[int, float, float, float, float, float]:
    """The shape of a collective's price over a group of ``n`` ranks (``n_send`` of them
    sending), whatever its link: ``(hops, y_in, y_out, comp_in, comp_out, recv)``. It
    costs ``launch_s + latency * hops + (y_in * b_in + y_out * b_out) / bandwidth`` of
    communication and ``comp_in * b_in + comp_out * b_out`` of compute, and the busiest
    rank receives ``recv`` times its ``b_in`` (all_gather, all_reduce) or ``b_out``.
    ``calibrate`` fits each collective's link to its timings through this shape.

    >>> link_terms(HardwareProfile(), "all_gather", 4, 4)
    (2, 3.0, 0.0, 0.0, 0.0, 3.0)
    """
    steps = math.ceil(math.log2(n)) if n > 1 else 0
    if collective == "all_gather":
        k = n_send
        return (steps, float(k - 1), 0.0, 0.0, 0.0, float(k - 1))
    if collective == "reduce_scatter" and hw.reduce_scatter_via_all_reduce:
        # an all_reduce of the input (n times the output), then a copy of the own chunk
        f = (n - 1) / n
        copy = 1.0 / hw.copy_bytes_per_s
        return (2 * steps, 2 * f, 0.0, f / hw.reduce_bytes_per_s, copy, 2.0 * (n - 1))
    if collective == "reduce_scatter":
        red = (n - 1) / hw.reduce_bytes_per_s
        return (steps, 0.0, float(n - 1), 0.0, red, float(n - 1))
    if collective == "all_reduce":
        f = (n - 1) / n
        return (2 * steps, 2 * f, 0.0, f / hw.reduce_bytes_per_s, 0.0, 2 * f)
    if collective in EXCHANGING:
        k = n_send
        f = (k - 1) / k
        ksteps = math.ceil(math.log2(k)) if k > 1 else 0
        return (ksteps, 0.0, f, 0.0, 1.0 / hw.copy_bytes_per_s, f)
    raise PlanError(f"cannot price collective {collective!r}", value=collective)


def _price(
    model: CostModel,
    mesh: Mesh,
    dims: tuple[int, ...],
    collective: str | None,
    b_in: int,
    b_out: int,
    n_send: int,
    scaled: bool = False,
) -> Cost:
    """The price of a step from its padded local bytes (``scaled``: divides by avg_scale)."""
    c = coefficients(model, mesh, dims, collective, n_send)
    comm = c[0] + c[1] * b_in + c[2] * b_out
    compute = c[3] + c[4] * b_in + c[5] * b_out
    if scaled:
        compute += b_out / model.profile.copy_bytes_per_s
    recv = c[6] * (b_in if collective in ("all_gather", "all_reduce") else b_out)
    return Cost(comm, compute, int(round(recv)))


def _n_send(src: Spec, dims: tuple[int, ...]) -> int:
    sizes = src.mesh.shape
    return math.prod(sizes[m] for m in dims if is_shard_like(src.placements[m])) or 1


def transition_cost(
    src: Spec,
    dst: Spec,
    mesh_dims: Sequence[int] | int,
    collective: str | None,
    model: CostModel | None = None,
) -> Cost:
    """The price of one step from ``src`` to ``dst`` over ``mesh_dims`` (no Step needed).

    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create(4)
    >>> a = Spec(mesh, [Shard(0)], (1024, 1024))
    >>> b = Spec(mesh, [Replicate()], (1024, 1024))
    >>> c = transition_cost(a, b, 0, "all_gather")
    >>> c.bytes, c.comm > 0, c.compute
    (3145728, True, 0.0)
    """
    step = Step(mesh_dims, src, dst, collective)  # checks the arguments
    return _step_price(step.src, step.dst, step.mesh_dims, step.collective, as_model(model))


def _step_price(src: Spec, dst: Spec, dims: tuple[int, ...], collective, model) -> Cost:
    scaled = collective in REDUCING and any(
        getattr(src.placements[m], "op", None) == "avg" for m in dims
    )
    return _price(
        model,
        src.mesh,
        dims,
        collective,
        padded_local_bytes(src),
        padded_local_bytes(dst),
        _n_send(src, dims),
        scaled,
    )


def step_cost(step, model: CostModel | None = None) -> Cost:
    """The price of one :class:`~meshplan.redistribute.Step`.

    >>> from meshplan.placement import Partial, Replicate
    >>> from meshplan.redistribute import Step
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Replicate()], (4,)), Spec(mesh, [Partial()], (4,))
    >>> step_cost(Step(0, a, b, None)).compute > 0   # Replicate -> Partial is not free
    True
    """
    if not isinstance(step, Step):
        raise PlanError(f"step_cost needs a Step, got {step!r}", value=step)
    return _step_price(step.src, step.dst, step.mesh_dims, step.collective, as_model(model))

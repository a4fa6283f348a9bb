"""The price of a plan (the sum of its steps'), and what ``plan()`` minimizes."""

from __future__ import annotations

import functools
import math

from meshplan.layout import Mesh

from ._collectives import COLLECTIVES
from ._plan import as_plan
from ._profile import CostModel, as_model
from ._step_cost import Cost, _step_price, coefficients

__all__ = ["cost", "OBJECTIVES", "collective_weight"]


OBJECTIVES = ("time", "collectives")
"""What ``plan()`` minimizes: modeled time, or the number of collectives first (then time)."""


@functools.lru_cache(maxsize=1024)
def collective_weight(model: CostModel, mesh: Mesh, nbytes: int) -> float:
    """The price the ``"collectives"`` objective adds per collective, for a tensor of
    ``nbytes`` on ``mesh``: more than a plan of a few times as many steps as the mesh has
    dims, each as dear as the dearest step there is, can take, so a plan with fewer
    collectives always ranks first and time only breaks ties between equal counts.

    >>> m = Mesh.create((2, 4))
    >>> collective_weight(CostModel(), m, 1 << 20) > 0.001  # s; one step costs ~20 us
    True
    """
    n = math.prod(mesh.shape)
    dims = tuple(range(mesh.ndim))
    worst = 0.0
    for kind in (None, *COLLECTIVES):  # (each on its own links, when the profile has them)
        c = coefficients(model, mesh, dims, kind, n)
        worst = max(worst, c[0] + c[3] + (c[1] + c[4] + c[2] + c[5]) * nbytes)
    return 8.0 * (mesh.ndim + 2) * worst


def cost(plan, model: CostModel | None = None) -> Cost:
    """The price of a plan: the sum of its steps' prices.

    >>> from meshplan.placement import Replicate, Shard, Spec
    >>> from meshplan.redistribute import plan as make_plan
    >>> mesh = Mesh.create(2)
    >>> p = make_plan(Spec(mesh, [Shard(0)], (8,)), Spec(mesh, [Replicate()], (8,)))
    >>> cost(p).bytes
    16
    """
    return _plan_cost(as_plan(plan, "cost"), as_model(model))


@functools.lru_cache(maxsize=4096)
def _plan_cost(plan, model: CostModel) -> Cost:
    # (plans and models are frozen values: a plan's price is kept as long as the plan
    # cache keeps plans, so the memo holds no more plans than that cache does)
    total = Cost()
    for step in plan.steps:
        total = total + _step_price(step.src, step.dst, step.mesh_dims, step.collective, model)
    return total

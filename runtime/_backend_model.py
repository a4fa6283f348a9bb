"""How the shell plans when its caller names no cost model: by the backend that runs the mesh.

``plan()`` on its own prices steps for GPUs (:meth:`HardwareProfile.nvlink_ib`): a
program written for a GPU cluster plans alike wherever it is planned. The shell knows
more: the backend of the process groups that will run the plan. When the caller of
``run``-side planning (:func:`~meshplan.runtime.redistribute`,
:func:`~meshplan.runtime.redistribute_dtensor`) gives no ``cost_model``, it plans with
the options of that backend (:func:`backend_plan_options`), which the caller can see and
override on :class:`~meshplan.runtime.ProcessGroups` (``cost_model=``, ``objective=``):

* NCCL (or any backend other than gloo): the GPU preset, least modeled time.
* gloo: :meth:`HardwareProfile.gloo_cpu` and the ``"collectives"`` objective (fewest
  collectives, then least modeled time). gloo runs on host processes that share the
  host's cores and talk over loopback TCP: every collective is a rendezvous of processes
  taking turns on those cores, which costs more than any alpha-beta price of its bytes,
  and gloo runs a reduce_scatter as an all_reduce of its whole input. Measured with
  ``benchmarks/redistribute_speed.py`` (8 gloo ranks on 2 shared cores, 4 MiB,
  ``P R P -> S(0) R R``): the GPU preset's plan, a reduce_scatter on the flattened
  alias then an all_gather, took 1.6x torch's time; this choice, one all_reduce on the
  alias then a local slice, 0.55-0.6x of it. On the benchmark's other cases the two
  choices agree but for one (an uneven ``S(0) S(0) -> S(1) R``: one all_gather on the
  alias and a slice, instead of a permute and a gather).

Pure: a function of the backend's name and the mesh's device type.
"""

from __future__ import annotations

import functools
from typing import Any

from meshplan.errors import RuntimeShellError
from meshplan.redistribute import CostModel, HardwareProfile

__all__ = ["OBJECTIVES", "backend_plan_options", "check_plan_options", "runs_on_gloo"]

OBJECTIVES = ("time", "collectives")


def runs_on_gloo(backend: str, device_type: str) -> bool:
    """Whether collectives on ``device_type`` tensors run on gloo under ``backend``
    (torch's name for a group's backend: ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``).

    >>> runs_on_gloo("gloo", "cpu"), runs_on_gloo("nccl", "cuda")
    (True, False)
    >>> runs_on_gloo("cpu:gloo,cuda:nccl", "cpu"), runs_on_gloo("cpu:gloo,cuda:nccl", "cuda")
    (True, False)
    """
    backend = str(backend).lower()
    if ":" not in backend:
        return backend == "gloo"
    return any(part.strip() == f"{device_type}:gloo" for part in backend.split(","))


@functools.lru_cache(maxsize=16)
def backend_plan_options(backend: str, device_type: str) -> tuple[CostModel, str]:
    """The cost model and objective the shell plans with on ``backend`` by default.

    >>> model, objective = backend_plan_options("gloo", "cpu")
    >>> model.profile == HardwareProfile.gloo_cpu(), objective
    (True, 'collectives')
    >>> backend_plan_options("nccl", "cuda") == (CostModel.default(), "time")
    True
    """
    if runs_on_gloo(backend, device_type):
        return CostModel(HardwareProfile.gloo_cpu()), "collectives"
    return CostModel.default(), "time"


def check_plan_options(cost_model: Any, objective: Any) -> None:
    """Raise unless ``cost_model`` is None or a CostModel and ``objective`` None or one of
    :data:`OBJECTIVES`.

    >>> check_plan_options(HardwareProfile.gloo_cpu(), None)
    Traceback (most recent call last):
    ...
    meshplan.errors.RuntimeShellError: cost_model must be a CostModel or None, got HardwareProfile(...); wrap a profile: CostModel(profile)
    """
    if cost_model is not None and not isinstance(cost_model, CostModel):
        shown = (
            "HardwareProfile(...)" if isinstance(cost_model, HardwareProfile) else repr(cost_model)
        )
        raise RuntimeShellError(
            f"cost_model must be a CostModel or None, got {shown:.80}; wrap a profile: "
            "CostModel(profile)",
            value=cost_model,
        )
    if objective is not None and objective not in OBJECTIVES:
        raise RuntimeShellError(
            f"objective must be one of {OBJECTIVES!r} or None (the backend's), got "
            f"{objective!r:.80}",
            value=objective,
        )

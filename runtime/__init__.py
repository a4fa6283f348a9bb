"""meshplan.runtime — the shell: runs plans and programs on torch.distributed process groups.

It owns process groups (:class:`ProcessGroups`, one group per distinct rank set, created
once), issues collectives in mesh-coordinate order, runs a :class:`~meshplan.redistribute.Plan`
on this rank's local tensor (:func:`run`), makes that differentiable (:func:`redistribute`,
whose backward plans from the gradient's derived layout), measures a hardware profile
(:func:`calibrate`) and starts a world of local worker processes (:class:`WorkerPool`, what
the examples and the test suite use to run on several ranks without a launcher). It never
decides anything: every step it takes is described by a pure plan that the in-process
simulator (:func:`meshplan.redistribute.simulate`) runs alike.

torch interop lets a torch program adopt it piece by piece: ``Mesh.from_device_mesh`` and
:func:`to_device_mesh`, :meth:`ProcessGroups.from_device_mesh` (the DeviceMesh's own
groups), :func:`from_dtensor` / :func:`to_dtensor`, and :func:`redistribute_dtensor`
(``DTensor.redistribute`` planned by meshplan).

:func:`parallelize` turns a model into a :class:`ParallelModule` of this rank's shards,
planned whole, that a stock torch optimizer steps (see :mod:`meshplan.runtime._parallelize`).

Attributes are imported on first use, so ``import meshplan.runtime`` is cheap until a
name that needs torch is touched.
"""

from meshplan.errors import RuntimeShellError, WorkerError
from meshplan.layout._lazy import lazy_attributes

_LAZY = {
    "Group": "_group",
    "ProcessGroups": "_groups",
    "WorkerPool": "_pool",
    "calibrate": "_calibrate",
    "run": "_run",
    "run_step": "_run",
    "prepare_groups": "_run",
    "redistribute": "_autograd",
    "grad_spec": "_autograd",
    "derived_grad_spec": "_autograd",
    "from_dtensor": "_interop",
    "to_dtensor": "_interop",
    "to_device_mesh": "_interop",
    "redistribute_dtensor": "_interop",
    "run_program": "_program",
    "parallelize": "_parallelize",
    "ParallelModule": "_parallel_module",
    "run_unsharded": "_program",
    "simulate_program": "_program",
}

__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = [
    "Group",
    "ParallelModule",
    "ProcessGroups",
    "RuntimeShellError",
    "WorkerError",
    "WorkerPool",
    "calibrate",
    "derived_grad_spec",
    "from_dtensor",
    "grad_spec",
    "parallelize",
    "prepare_groups",
    "redistribute",
    "redistribute_dtensor",
    "run",
    "run_program",
    "run_step",
    "run_unsharded",
    "simulate_program",
    "to_device_mesh",
    "to_dtensor",
]

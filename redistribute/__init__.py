"""meshplan.redistribute — plans that move a tensor from one layout to another.

Decides the steps (collectives and local transforms), prices them, merges them onto
flattened meshes, and simulates them on all ranks at once; a thin shell runs them on
torch.distributed process groups. The planning part never imports torch.
"""

from meshplan.errors import PlanError
from meshplan.layout._lazy import lazy_attributes

from . import exchange
from ._cost import Cost, CostModel, HardwareProfile, Link, cost, step_cost, transition_cost
from ._explain import explain
from ._merge import MergeWarning, merge, reset_merge_warnings
from ._planner import check_plannable, clear_plan_cache, plan
from ._step import COLLECTIVES, Plan, Step, reduce_op

# simulate touches tensor values, and the runtime shell imports torch.distributed:
# imported only when they are used.
_LAZY = {
    "simulate": "_simulate",
    "simulate_step": "_simulate",
    "Group": "_groups",
    "ProcessGroups": "_groups",
    "WorkerError": "_pool",
    "WorkerPool": "_pool",
    "calibrate": "_calibrate",
    "run": "_run",
    "run_step": "_run",
    "prepare_groups": "_run",
    "redistribute": "_run",
    "grad_spec": "_run",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "COLLECTIVES",
    "Cost",
    "CostModel",
    "HardwareProfile",
    "Link",
    "MergeWarning",
    "Plan",
    "PlanError",
    "Step",
    "check_plannable",
    "clear_plan_cache",
    "cost",
    "exchange",
    "explain",
    "merge",
    "plan",
    "reduce_op",
    "reset_merge_warnings",
    "step_cost",
    "transition_cost",
    "simulate",
    "simulate_step",
    "Group",
    "ProcessGroups",
    "WorkerError",
    "WorkerPool",
    "calibrate",
    "run",
    "run_step",
    "prepare_groups",
    "redistribute",
    "grad_spec",
]

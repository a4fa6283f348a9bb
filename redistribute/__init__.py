"""meshplan.redistribute — plans that move a tensor from one layout to another.

Decides the steps (collectives and local transforms), prices them, merges them onto
flattened meshes, and simulates them on all ranks at once. It never talks to other
processes: the shell that runs plans on torch.distributed process groups is
:mod:`meshplan.runtime`. Importing it loads neither torch nor numpy (only ``simulate``,
which touches tensor values, imports torch, when it is first used); the planner's
engine loads when ``plan``, ``plan_cost`` or ``Planner`` is first asked for.
"""

from meshplan.errors import BudgetWarning, MergeWarning, PlanError
from meshplan.layout._lazy import lazy_attributes

from . import exchange
from ._cost import cost
from ._plan import Plan, explain
from ._profile import CostModel, HardwareProfile, Link
from ._step_cost import Cost, step_cost, transition_cost
from ._steps import COLLECTIVES, Step, reduce_op

_LAZY = {
    # the planner's engine loads when it is first asked for
    "Planner": "_planner",
    "check_plannable": "_planner",
    "clear_plan_cache": "_planner",
    "plan": "_planner",
    "plan_cost": "_planner",
    "merge": "_merge",
    "reset_merge_warnings": "_merge",
    # simulate touches tensor values: imported only when it is used.
    "simulate": "_simulate",
    "simulate_step": "_simulate",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "BudgetWarning",
    "COLLECTIVES",
    "Cost",
    "CostModel",
    "HardwareProfile",
    "Link",
    "MergeWarning",
    "Plan",
    "PlanError",
    "Planner",
    "Step",
    "check_plannable",
    "clear_plan_cache",
    "cost",
    "exchange",
    "explain",
    "merge",
    "plan",
    "plan_cost",
    "reduce_op",
    "reset_merge_warnings",
    "step_cost",
    "transition_cost",
    "simulate",
    "simulate_step",
]

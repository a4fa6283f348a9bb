"""meshplan.redistribute — plans that move a tensor from one layout to another.

Decides the steps (collectives and local transforms), prices them, merges them onto
flattened meshes, and simulates them on all ranks at once. It never talks to other
processes: the shell that runs plans on torch.distributed process groups is
:mod:`meshplan.runtime`. Importing it loads neither torch nor numpy (only ``simulate``,
which touches tensor values, imports torch, when it is first used).
"""

from meshplan.errors import BudgetWarning, PlanError
from meshplan.layout._lazy import lazy_attributes

from . import exchange
from ._cost import cost
from ._merge import MergeWarning, merge, reset_merge_warnings
from ._plan import Plan, explain
from ._planner import Planner, check_plannable, clear_plan_cache, plan, plan_cost
from ._profile import CostModel, HardwareProfile, Link
from ._step_cost import Cost, step_cost, transition_cost
from ._steps import COLLECTIVES, Step, reduce_op

# simulate touches tensor values: imported only when it is used.
_LAZY = {
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

"""meshplan.redistribute — plans that move a tensor from one layout to another.

Decides the steps (collectives and local transforms), prices them, merges them onto
flattened meshes, and simulates them on all ranks at once. It never talks to other
processes: the shell that runs plans on torch.distributed process groups is
:mod:`meshplan.runtime`. Importing it loads neither torch nor numpy (only ``simulate``,
which touches tensor values, imports torch, when it is first used). Each public name loads
its module when it is first asked for: the planner's engine (``_engine``) when ``plan``,
``plan_cost`` or ``Planner`` is.
"""

import importlib

from meshplan.errors import BudgetWarning, MergeWarning, PlanError
from meshplan.layout._lazy import lazy_attributes

_LAZY = {
    # each public name loads its module when it is first asked for, so importing the
    # package costs little (``strategy`` imports it; most programs use a few names)
    "COLLECTIVES": "_collectives",
    "Cost": "_step_cost",
    "step_cost": "_step_cost",
    "transition_cost": "_step_cost",
    "CostModel": "_profile",
    "HardwareProfile": "_profile",
    "Link": "_profile",
    "Plan": "_plan",
    "explain": "_plan",
    "Step": "_steps",
    "reduce_op": "_steps",
    "cost": "_cost",
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

_attribute = lazy_attributes(__name__, _LAZY)


def __getattr__(name: str) -> object:
    if name == "exchange":  # a public submodule
        return importlib.import_module(f"{__name__}.exchange")
    return _attribute(name)


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

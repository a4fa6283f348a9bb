"""Plain re-imports of the plan values, kept for modules that still import them from here
(the search engine's _encoding, _merge and _planner; runtime/_run): Step, reduce_op and
_avg_scale (home: ``_steps``), Plan and as_plan (home: ``_plan``). Nothing is defined
here."""

from ._plan import Plan, as_plan
from ._steps import Step, _avg_scale, reduce_op

__all__ = ["Plan", "Step", "as_plan", "reduce_op", "_avg_scale"]

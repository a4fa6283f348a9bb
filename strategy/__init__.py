"""meshplan.strategy — sharding strategies for ops.

Decides, for an op and the current layouts of its inputs, which layouts the inputs
should be redistributed to and what layout the output gets: rules are written for
ONE mesh dim with shard :class:`Placeholder` s, filled with the shard kinds the
inputs use, combined over the mesh (:func:`expand`), and the cheapest combination
under the planner's cost model is found by a best-first search (:func:`select`).
Output dtypes follow torch 2.13's type promotion, and dtypes torch refuses for an op
are refused here too.
Never communicates; the planning part never imports torch (the rule checker
:func:`check_rule` and :func:`propagate` run tensors and import it lazily).
"""

from meshplan.errors import StrategyError
from meshplan.layout._lazy import lazy_attributes

from ._aten import Call, TensorArg
from ._constraints import check_constraint
from ._expand import Strategy, expand
from ._progress import PROGRESS_STAGES
from ._rule import DimStrategy, Meta, Placeholder, fill, meta_of, replicate_strategy, shard_kinds
from ._ruleset import OpRule, RuleSet
from ._select import METHODS, Choice, clear_strategy_cache, select

_LAZY = {
    "check_rule": "_check",
    "RuleReport": "_check",
    "Failure": "_check",
    "Gap": "_check",
    "random_locals": "_check",
    "propagate": "_propagate",
    "propagate_simulated": "_propagate",
    "OPS": "_reference",
    "run_local": "_reference",
    "plan_program": "_program",
    "plan_graph": "_program",
    "plan_module": "_module",
    "ModuleProgram": "_module",
    "Program": "_program",
    "ProgramOp": "_program",
    "ProgramCost": "_program",
    "ProgramWarning": "_program",
    "ComputeModel": "_program",
    "grad_spec": "_program",
    "ProgramMemory": "_memory",
    "state_bytes": "_memory",
}

# the checker and propagate touch tensors: import torch only when they are used
__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "METHODS",
    "PROGRESS_STAGES",
    "ComputeModel",
    "Program",
    "ProgramCost",
    "ProgramOp",
    "ProgramWarning",
    "ProgramMemory",
    "state_bytes",
    "plan_graph",
    "plan_module",
    "ModuleProgram",
    "plan_program",
    "grad_spec",
    "OPS",
    "Call",
    "TensorArg",
    "Choice",
    "DimStrategy",
    "Failure",
    "Gap",
    "Meta",
    "OpRule",
    "Placeholder",
    "RuleReport",
    "RuleSet",
    "Strategy",
    "StrategyError",
    "check_constraint",
    "check_rule",
    "clear_strategy_cache",
    "expand",
    "fill",
    "meta_of",
    "propagate",
    "propagate_simulated",
    "random_locals",
    "replicate_strategy",
    "run_local",
    "select",
    "shard_kinds",
]

"""meshplan.strategy — sharding strategies for ops and whole programs.

Decides, for an op and the current layouts of its inputs, which layouts the inputs
should be redistributed to and what layout the output gets: rules are written for
ONE mesh dim with shard :class:`Placeholder` s, filled with the shard kinds the
inputs use, combined over the mesh (:func:`expand`), and the cheapest combination
under the planner's cost model is found by a best-first search (:func:`select`).
Output dtypes follow torch 2.13's type promotion, and dtypes torch refuses for an op
are refused here too. For a whole function, :func:`plan_program` (and
:func:`plan_module`) traces it, prices every op's candidates and the moves between
them, and hands the whole choice to the discrete solver.

Four subpackages, each importing only those listed before it:
:mod:`meshplan.strategy.solver` (the discrete optimizer: a typed ``Problem`` in, a
``Solution`` with a proven bound out; knows nothing of torch, meshes or specs),
:mod:`meshplan.strategy.rules` (the ``RuleSet``, op and aten rules, constraints, dtypes),
:mod:`meshplan.strategy.selection` (one op: expand, price, select, propagate, check) and
:mod:`meshplan.strategy.programs` (trace, candidates, prices, solve, assemble a
``Program``).
Never communicates; the planning part never imports torch (the rule checker
:func:`check_rule` and :func:`propagate` run tensors and import it lazily).
"""

from meshplan.errors import StrategyError
from meshplan.layout._lazy import lazy_attributes

from .programs._progress import PROGRESS_STAGES
from .rules._aten import Call, TensorArg
from .rules._constraints import check_constraint
from .rules._rule import (
    DimStrategy,
    Meta,
    Placeholder,
    fill,
    meta_of,
    replicate_strategy,
    shard_kinds,
)
from .rules._ruleset import OpRule, RuleSet
from .selection._expand import Strategy, expand
from .selection._select import METHODS, Choice, clear_strategy_cache, select

_LAZY = {
    "check_rule": "selection._check",
    "RuleReport": "selection._check",
    "Failure": "selection._check",
    "Gap": "selection._check",
    "random_locals": "selection._check",
    "propagate": "selection._propagate",
    "propagate_simulated": "selection._propagate",
    "OPS": "selection._reference",
    "run_local": "selection._reference",
    "plan_program": "programs._program",
    "plan_graph": "programs._program",
    "plan_module": "programs._module",
    "ModuleProgram": "programs._module",
    "Program": "programs._program",
    "ProgramOp": "programs._program",
    "ProgramCost": "programs._program",
    "ProgramWarning": "programs._program",
    "ComputeModel": "programs._program",
    "grad_spec": "programs._program",
    "ProgramMemory": "programs._memory",
    "state_bytes": "programs._memory",
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

"""meshplan.strategy — sharding strategies for ops.

Decides, for an op and the current layouts of its inputs, which layouts the inputs
should be redistributed to and what layout the output gets: rules are written for
ONE mesh dim with shard :class:`Placeholder` s, filled with the shard kinds the
inputs use, combined over the mesh, and the cheapest combination is found by a
best-first search. Never communicates; the planning part never imports torch (the
rule checker and ``propagate`` run tensors and import it lazily).
"""

from meshplan.errors import StrategyError

from ._expand import Strategy, check_constraint, expand
from ._rule import DimStrategy, Meta, Placeholder, fill, meta_of, replicate_strategy, shard_kinds
from ._ruleset import OpRule, RuleSet
from ._select import Choice, select

__all__ = [
    "Choice",
    "DimStrategy",
    "Meta",
    "OpRule",
    "Placeholder",
    "RuleSet",
    "Strategy",
    "StrategyError",
    "check_constraint",
    "expand",
    "fill",
    "meta_of",
    "replicate_strategy",
    "select",
    "shard_kinds",
]

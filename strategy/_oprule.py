"""An op's rule: its single-mesh-dim strategies and its output metadata (the entries of a
:class:`~meshplan.strategy.RuleSet`, which the rule modules build)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from meshplan.errors import StrategyError

from ._rule import DimStrategy, Meta

__all__ = ["OpRule", "Rule", "OutputsFn"]

Rule = Callable[..., Sequence[DimStrategy]]
"""``rule(inputs: tuple[Meta, ...], **args) -> [DimStrategy, ...]`` for one mesh dim."""
OutputsFn = Callable[..., Sequence[Meta]]
"""``outputs(inputs: tuple[Meta, ...], **args) -> (Meta, ...)``: the op's output metadata."""


def _callable(instance, attribute, value) -> None:
    if not callable(value):
        what = "rule(inputs, **args) -> [DimStrategy, ...]"
        if attribute.name == "outputs":
            what = "outputs(inputs, **args) -> (Meta, ...)"
        raise StrategyError(
            f"OpRule {attribute.name} must be a function {what}, got {value!r}", value=value
        )


@attrs.frozen
class OpRule:
    """An op's single-mesh-dim rule and its output metadata function.

    >>> from meshplan.strategy import RuleSet
    >>> relu = RuleSet.default()["relu"]
    >>> OpRule(relu.strategies, relu.outputs) == relu
    True
    """

    strategies: Rule = attrs.field(validator=_callable)
    outputs: OutputsFn = attrs.field(validator=_callable)

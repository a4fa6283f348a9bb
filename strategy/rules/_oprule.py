"""An op's rule: its single-mesh-dim strategies and its output metadata (the entries of a
:class:`~meshplan.strategy.RuleSet`, which the rule modules build), and how it reads a
traced aten call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from meshplan.errors import StrategyError

from ._rule import DimStrategy, Meta

__all__ = ["OpRule", "Rule", "OutputsFn", "AtenRule"]

Rule = Callable[..., Sequence[DimStrategy]]
"""``rule(inputs: tuple[Meta, ...], **args) -> [DimStrategy, ...]`` for one mesh dim."""
OutputsFn = Callable[..., Sequence[Meta]]
"""``outputs(inputs: tuple[Meta, ...], **args) -> (Meta, ...)``: the op's output metadata."""
AtenRule = Callable[..., Sequence[DimStrategy]]
"""``aten(call: Call) -> [DimStrategy, ...]``: the strategies of one traced aten call, read
from its inputs' and outputs' metadata, its arguments and its tags."""


def _callable(instance, attribute, value) -> None:
    if value is None and attribute.name != "aten" and getattr(instance, "aten", None) is not None:
        return  # a rule for traced programs only
    if value is None and attribute.name == "aten":
        if instance.strategies is None or instance.outputs is None:
            raise StrategyError(
                "an OpRule needs rule(inputs, **args) and outputs(inputs, **args), or aten(call) "
                "for a rule that reads traced aten calls only",
                value=instance,
            )
        return
    if not callable(value):
        what = "rule(inputs, **args) -> [DimStrategy, ...]"
        if attribute.name == "outputs":
            what = "outputs(inputs, **args) -> (Meta, ...)"
        elif attribute.name == "aten":
            what = "aten(call) -> [DimStrategy, ...]"
        raise StrategyError(
            f"OpRule {attribute.name} must be a function {what}, got {value!r}", value=value
        )


@attrs.frozen
class OpRule:
    """An op's single-mesh-dim rule, its output metadata function, and its aten reading.

    ``strategies(inputs, **args)`` and ``outputs(inputs, **args)`` serve
    :func:`~meshplan.strategy.select` and :func:`~meshplan.strategy.expand`, and programs
    too: a traced aten call of the op is passed its tensor inputs' metadata and its other
    arguments by schema name. ``aten(call)``, where given, reads a traced call directly
    (its outputs' metadata, its tags), for ops whose aten arguments differ from the
    op-name rule's; an entry with ``aten`` only serves programs.

    >>> from meshplan.strategy import RuleSet
    >>> relu = RuleSet.default()["relu"]
    >>> OpRule(relu.strategies, relu.outputs) == relu
    False
    >>> OpRule(relu.strategies, relu.outputs, aten=relu.aten) == relu
    True
    """

    strategies: Rule | None = attrs.field(validator=_callable)
    outputs: OutputsFn | None = attrs.field(validator=_callable)
    aten: AtenRule | None = attrs.field(default=None, validator=_callable, kw_only=True)

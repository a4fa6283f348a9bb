"""The :class:`RuleSet` value: an immutable map from op names to their rules."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.layout import FrozenMap

from ._oprule import OpRule, OutputsFn, Rule

__all__ = ["OpRule", "RuleSet", "Rule", "OutputsFn", "freeze_args"]


def freeze_args(args: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Keyword arguments as a sorted, hashable tuple (lists become tuples).

    >>> freeze_args({"dim": [1, 0], "keepdim": True})
    (('dim', (1, 0)), ('keepdim', True))
    """

    def freeze(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return tuple(freeze(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, freeze(x)) for k, x in v.items()))
        try:
            hash(v)
        except TypeError:
            raise StrategyError(
                f"op argument {v!r} is not hashable; pass ints, floats, strings or tuples",
                value=v,
            ) from None
        return v

    return tuple(sorted((k, freeze(v)) for k, v in args.items()))


def _check_hashable(op: str, entry: OpRule) -> None:
    """Raise a StrategyError naming ``op`` when its rule or outputs function is unhashable."""
    for what, fn in (("rule", entry.strategies), ("outputs=", entry.outputs)):
        try:
            hash(fn)
        except TypeError:
            raise StrategyError(
                f"{what} for {op!r} must be hashable (a RuleSet is a frozen value, and "
                f"strategies are cached on it), got {fn!r}; pass a function, a "
                "functools.partial, or an object that defines __hash__",
                value=fn,
            ) from None


def _rules(value: Mapping[str, OpRule]) -> FrozenMap[str, OpRule]:
    if not isinstance(value, Mapping):
        raise StrategyError(
            f"RuleSet takes a mapping of op names to OpRule values, got {value!r}", value=value
        )
    for op, rule in value.items():
        if not isinstance(op, str) or not op:
            raise StrategyError(f"op names are non-empty strings, got {op!r}", value=op)
        if not isinstance(rule, OpRule):
            raise StrategyError(
                f"the rule for {op!r} is {rule!r}, not an OpRule; build it with "
                "OpRule(rule, outputs) or add it with ruleset.with_rule(op, rule, outputs=...)",
                value=rule,
            )
        _check_hashable(op, rule)
    return value if isinstance(value, FrozenMap) else FrozenMap(value)


@attrs.frozen(repr=False)
class RuleSet:
    """An immutable map: op name -> :class:`OpRule`. Change it with :meth:`with_rule`.

    >>> rs = RuleSet.default()
    >>> "mm" in rs, "my_op" in rs
    (True, False)
    >>> from meshplan.strategy import Placeholder
    >>> def my_rule(inputs):
    ...     return [DimStrategy([Placeholder(0)], [Placeholder(0)])]
    >>> rs2 = rs.with_rule("my_op", my_rule, outputs=lambda inputs: inputs[:1])
    >>> "my_op" in rs2, "my_op" in rs
    (True, False)
    """

    rules: FrozenMap[str, OpRule] = attrs.field(converter=_rules, factory=FrozenMap)

    @classmethod
    def default(cls) -> RuleSet:
        """The built-in rules (matrix products, pointwise, reductions, shape ops, embedding)."""
        return _default()

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self.rules)

    def __contains__(self, op: object) -> bool:
        return isinstance(op, str) and op in self.rules

    def __getitem__(self, op: str) -> OpRule:
        if not isinstance(op, str):
            raise StrategyError(f"op names are strings, got {op!r}", value=op)
        try:
            return self.rules[op]
        except KeyError:
            raise StrategyError(
                f"no rule for op {op!r}; known ops: {', '.join(self.rules)}; add one with "
                "ruleset.with_rule(op, rule, outputs=...)",
                value=op,
            ) from None

    def with_rule(
        self, op: str, rule: Rule | OpRule, *, outputs: OutputsFn | None = None
    ) -> RuleSet:
        """A copy where ``op`` uses ``rule`` (and ``outputs``, kept from the old rule if None)."""
        if not isinstance(op, str) or not op:
            raise StrategyError(f"op names are non-empty strings, got {op!r}", value=op)
        if outputs is not None and not callable(outputs):
            raise StrategyError(
                f"outputs= for {op!r} must be a function from the input metadata (and op "
                f"arguments) to the output metadata, got {outputs!r}",
                value=outputs,
            )
        if isinstance(rule, OpRule):
            entry = rule if outputs is None else OpRule(rule.strategies, outputs)
        else:
            if not callable(rule):
                raise StrategyError(f"rule for {op!r} must be callable, got {rule!r}", value=rule)
            if outputs is None:
                if op not in self.rules:
                    raise StrategyError(
                        f"op {op!r} is new: give outputs=, a function from the input metadata "
                        "(and op arguments) to the output metadata",
                        value=op,
                    )
                outputs = self.rules[op].outputs
            entry = OpRule(rule, outputs)
        _check_hashable(op, entry)
        return RuleSet(self.rules.set(op, entry))

    def __repr__(self) -> str:
        return f"RuleSet(<{len(self.rules)} ops>)"


@functools.cache
def _default() -> RuleSet:
    from . import _rules_matrix, _rules_pointwise, _rules_shape

    table: dict[str, OpRule] = {}
    for module in (_rules_matrix, _rules_pointwise, _rules_shape):
        table.update(module.RULES)
    return RuleSet(table)

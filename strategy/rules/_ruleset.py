"""The :class:`RuleSet` value: an immutable map from op names to their rules."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.layout import FrozenMap

from ._oprule import AtenRule, OpRule, OutputsFn, Rule
from ._rule import DimStrategy, Meta, check_strategies

__all__ = ["OpRule", "RuleSet", "Rule", "OutputsFn", "AtenRule", "freeze_args"]


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
    for what, fn in (
        ("rule", entry.strategies),
        ("outputs=", entry.outputs),
        ("aten=", entry.aten),
    ):
        try:
            hash(fn)
        except TypeError:
            raise StrategyError(
                f"{what} for {op!r} must be hashable (a RuleSet is a frozen value, and "
                f"strategies are cached on it), got {fn!r}; pass a function, a "
                "functools.partial, or an object that defines __hash__",
                value=fn,
            ) from None


_SAMPLES = tuple((Meta((8, 8)),) * n for n in (1, 2, 3))
"""Inputs a rule is tried on when registered: one to three 8x8 float32 tensors."""


def _check_on_samples(op: str, entry: OpRule) -> None:
    """Call ``entry``'s rule on sample inputs (:data:`_SAMPLES`, no op arguments) and
    refuse it, naming what it returned, where it returns no sequence of DimStrategy
    values. A rule that needs arguments or other shapes (it raises on these) is checked
    when it is used; the counts of its strategies' placements, there too (they depend on
    the op's inputs)."""
    if entry.strategies is None or entry.outputs is None:
        return
    for metas in _SAMPLES:
        try:
            outputs = entry.outputs(metas)
            value = entry.strategies(metas)
            outputs = tuple(outputs)
        except Exception:  # (other shapes, or arguments, needed: checked when used)
            continue
        if isinstance(value, str | bytes | DimStrategy) or not isinstance(value, Iterable):
            check_strategies(op, value, (), ())
        for s in value:
            if not isinstance(s, DimStrategy):
                check_strategies(op, value, (), ())
        return


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

    The one rule table: :func:`~meshplan.strategy.select` and
    :func:`~meshplan.strategy.expand` look an op up by name, and
    :func:`~meshplan.strategy.plan_program` looks up each traced aten call by its op
    name (``"roll"`` for ``aten.roll.default``), passing the call's tensor inputs'
    metadata and its other arguments by their schema names. A rule registered once
    serves both:

    >>> rs = RuleSet.default()
    >>> "mm" in rs, "roll" in rs
    (True, False)
    >>> from meshplan.strategy import DimStrategy, Placeholder
    >>> def roll_rule(inputs, shifts, dims):  # rolling dims (d,) keeps the others' shards
    ...     rolled = {d % inputs[0].ndim for d in dims}
    ...     return [DimStrategy([Placeholder(d)], [Placeholder(d)])
    ...             for d in range(inputs[0].ndim) if d not in rolled]
    >>> rs2 = rs.with_rule("roll", roll_rule, outputs=lambda inputs, **args: inputs[:1])
    >>> "roll" in rs2, "roll" in rs
    (True, False)
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard, Spec
    >>> from meshplan.strategy import select
    >>> x = Spec(Mesh.create((2,)), [Shard(1)], (4, 6))
    >>> str(select("roll", [x], ruleset=rs2, shifts=(1,), dims=(0,)).output_spec)
    'f32[4,6](S(1))'

    ``plan_program(fn, x, ruleset=rs2)`` plans ``torch.roll(x, 1, 0)`` in ``fn`` with
    the same rule (without it, the op runs replicated).
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
        self,
        op: str,
        rule: Rule | OpRule,
        *,
        outputs: OutputsFn | None = None,
        aten: AtenRule | None = None,
    ) -> RuleSet:
        """A copy where ``op`` uses ``rule`` (and ``outputs``, kept from the old rule if None).

        ``aten``, a function of a traced :class:`~meshplan.strategy.rules._aten.Call`, reads
        the op's aten calls in programs where its arguments differ from ``rule``'s;
        without it a program calls ``rule`` with the call's arguments by schema name.
        """
        if aten is not None and not callable(aten):
            raise StrategyError(
                f"aten= for {op!r} must be a function of a traced call, got {aten!r}",
                value=aten,
            )
        if not isinstance(op, str) or not op:
            raise StrategyError(f"op names are non-empty strings, got {op!r}", value=op)
        if outputs is not None and not callable(outputs):
            raise StrategyError(
                f"outputs= for {op!r} must be a function from the input metadata (and op "
                f"arguments) to the output metadata, got {outputs!r}",
                value=outputs,
            )
        if isinstance(rule, OpRule):
            entry = rule
            if outputs is not None or aten is not None:
                entry = OpRule(
                    rule.strategies,
                    rule.outputs if outputs is None else outputs,
                    aten=rule.aten if aten is None else aten,
                )
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
                if outputs is None:
                    raise StrategyError(
                        f"the built-in rule for {op!r} reads traced calls only: give outputs=, "
                        "a function from the input metadata (and op arguments) to the output "
                        "metadata",
                        value=op,
                    )
            entry = OpRule(rule, outputs, aten=aten)
        _check_hashable(op, entry)
        _check_on_samples(op, entry)
        return RuleSet(self.rules.set(op, entry))

    def __repr__(self) -> str:
        return f"RuleSet(<{len(self.rules)} ops>)"


@functools.cache
def _default() -> RuleSet:
    from . import (
        _aten,
        _aten_nets,
        _aten_pieces,
        _aten_writes,
        _rules_matrix,
        _rules_pointwise,
        _rules_shape,
    )

    table: dict[str, OpRule] = {}
    for module in (_rules_matrix, _rules_pointwise, _rules_shape):
        table.update(module.RULES)
    # how each rule reads a traced aten call: the aten rules where aten arguments differ
    # from the op-name rule's, the pointwise rule for the pointwise ops
    aten = {op: _aten.POINTWISE for op in _rules_pointwise.RULES}
    aten |= _aten.ATEN_RULES | _aten_pieces.RULES
    aten |= _aten_writes.RULES  # writes made values (copy, scatters) and random draws
    aten |= _aten_nets.RULES  # convolutions, pooling, batch norm, baddbmm, repeat, topk
    for op, fn in aten.items():
        old = table.get(op)
        table[op] = OpRule(old.strategies if old else None, old.outputs if old else None, aten=fn)
    return RuleSet(table)

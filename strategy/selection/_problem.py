"""One op call made ready to expand: its inputs checked, its rule run, its candidates.

:func:`prepare` checks the op name and the input specs, runs the op's rule on the
inputs' metadata (refusing keyword arguments the rule does not take) and fills the
rule's placeholders per mesh dim: a :class:`OpProblem`, cached per op, inputs, rule set
and arguments.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.placement import Spec, is_shard_like

from ..rules._rule import DimStrategy, Meta, call_rule, check_strategies, fill, meta_of, shard_kinds
from ..rules._ruleset import OpRule, RuleSet, freeze_args

__all__ = ["OpProblem", "build_problem", "check_inputs", "check_op", "prepare"]


@attrs.frozen(repr=False, cache_hash=True)
class OpProblem:
    """One op call, ready to combine: its inputs, outputs and each mesh dim's candidates."""

    op: str
    args: tuple[tuple[str, Any], ...]
    sources: tuple[Spec, ...]
    outputs: tuple[Meta, ...]
    dim_rules: tuple[tuple[DimStrategy, ...], ...]

    @property
    def mesh(self):
        return self.sources[0].mesh

    def n_states(self) -> int:
        """How many rule combinations (N-D strategies before checks) there are."""
        n = 1
        for rules in self.dim_rules:
            n *= len(rules)
        return n


def check_op(op: object) -> str:
    """``op`` if it is an op name (a non-empty string); raise otherwise."""
    if not isinstance(op, str) or not op:
        raise StrategyError(
            f"op must be an op name (a non-empty string such as 'mm'), got {op!r}", value=op
        )
    return op


def check_inputs(op: str, input_specs: Sequence[Spec]) -> tuple[Spec, ...]:
    """The input specs as a tuple: at least one, all :class:`Spec` s on one mesh."""
    if isinstance(input_specs, Spec):
        return (input_specs,)
    if isinstance(input_specs, str | bytes | Mapping) or not isinstance(input_specs, Iterable):
        raise StrategyError(
            f"{op}: input_specs must be a sequence of Spec values (one per tensor input), got "
            f"{input_specs!r}",
            value=input_specs,
        )
    specs = tuple(input_specs)
    if not specs:
        raise StrategyError(f"{op}: give at least one input spec", value=input_specs)
    for s in specs:
        if not isinstance(s, Spec):
            raise StrategyError(f"{op}: input {s!r} is not a Spec", value=s)
    mesh = specs[0].mesh
    for s in specs[1:]:
        if s.mesh != mesh:
            raise StrategyError(
                f"{op}: inputs lie on different meshes ({mesh} and {s.mesh}); redistribute them "
                "onto one mesh first",
                value=s,
            )
    return specs


def prepare(
    op: str,
    input_specs: Sequence[Spec],
    ruleset: RuleSet | None = None,
    args: Mapping[str, Any] | None = None,
) -> OpProblem:
    """Run the op's rule on the inputs' metadata and fill its placeholders."""
    op = check_op(op)
    specs = check_inputs(op, input_specs)
    if ruleset is not None and not isinstance(ruleset, RuleSet):
        raise StrategyError(
            f"{op}: ruleset must be a RuleSet (or None for the built-in rules), got {ruleset!r}",
            value=ruleset,
        )
    if args is not None and not isinstance(args, Mapping):
        raise StrategyError(f"{op}: args must be a mapping of keyword arguments", value=args)
    frozen = freeze_args(args or {})
    return _prepare(op, specs, ruleset or RuleSet.default(), frozen, _types(frozen))


def _types(value: Any) -> Any:
    """The types inside frozen op arguments, for ``_prepare``'s cache key: ``48``,
    ``48.0`` and ``np.int64(48)`` (or ``1`` and ``True``) compare and hash alike, but the
    rules take some of them and refuse others."""
    if isinstance(value, tuple):
        return tuple(_types(v) for v in value)
    return type(value)


@functools.lru_cache(maxsize=4096)
def _prepare(
    op: str, specs: tuple[Spec, ...], ruleset: RuleSet, args: tuple, types: tuple
) -> OpProblem:
    # ``types`` is only part of the cache key (see ``_types``)
    return build_problem(op, ruleset[op], specs, args, shard_kinds(specs))


def _check_keywords(op: str, fn, kwargs: dict) -> None:
    """Raise :class:`StrategyError` when ``fn`` cannot take ``kwargs`` (a misspelt or
    unsupported argument of the op), before calling it."""
    try:
        problem = _keyword_problem(fn, tuple(kwargs))
    except TypeError:  # an unhashable callable: read its signature each time
        problem = _keyword_problem.__wrapped__(fn, tuple(kwargs))
    if problem is not None:
        raise StrategyError(
            f"{op} does not take the arguments {sorted(kwargs)!r} {problem}", value=kwargs
        )


@functools.lru_cache(maxsize=1024)
def _keyword_problem(fn, names: tuple) -> str | None:
    """Why ``fn`` cannot be called with the metas and keyword arguments ``names`` (None:
    it can, or it has no signature to read and the call decides). A property of the
    function alone, read once."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(None, **dict.fromkeys(names))
    except TypeError as e:
        takes = [
            p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
        ]
        return f"({e}); it takes {takes or 'no keyword arguments'}"
    return None


def build_problem(
    op: str, rule: OpRule, specs: tuple[Spec, ...], args: tuple, kinds: Sequence[int]
) -> OpProblem:
    """A :class:`OpProblem` from an explicit rule and shard kinds (what ``prepare`` runs)."""
    metas = tuple(meta_of(s) for s in specs)
    kwargs = dict(args)
    if rule.strategies is None or rule.outputs is None:
        raise StrategyError(
            f"the rule for {op!r} reads traced aten calls only (OpRule.aten); to select "
            f"strategies for {op!r} by name, add rule(inputs, **args) and outputs= with "
            "ruleset.with_rule(op, rule, outputs=...)",
            value=op,
        )
    for fn in (rule.strategies, rule.outputs):
        _check_keywords(op, fn, kwargs)
    # outputs first: it computes the result's dtype, refusing dtypes torch refuses
    outputs = _sequence(
        op, "outputs function", call_rule(op, "outputs function", rule.outputs, metas, **kwargs)
    )
    if not outputs:
        raise StrategyError(f"{op}: the outputs function returned no outputs", value=outputs)
    for m in outputs:
        if not isinstance(m, Meta):
            raise StrategyError(f"{op}: the outputs function returned {m!r}, not a Meta", value=m)
    raw = call_rule(op, "rule", rule.strategies, metas, **kwargs)
    raw = check_strategies(op, raw, [m.ndim for m in outputs], [m.ndim for m in metas])
    filled = fill(raw, kinds, len(outputs), len(specs))
    tensors = (*outputs, *metas)
    for s in filled:
        for pos, p in enumerate(s.entries):
            if is_shard_like(p) and not p.dim < tensors[pos].ndim:
                raise StrategyError(
                    f"{op}: strategy {s} shards dim {p.dim} of a {tensors[pos].ndim}-D tensor; "
                    "the rule is wrong",
                    value=s,
                )
    mesh = specs[0].mesh
    dim_rules = tuple(filled if size > 1 else filled[:1] for size in mesh.shape)
    return OpProblem(op, args, specs, outputs, dim_rules)


def _sequence(op: str, what: str, value: object) -> tuple:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise StrategyError(f"{op}: the {what} returned {value!r}, not a sequence", value=value)
    return tuple(value)

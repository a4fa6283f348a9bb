"""Single-mesh-dim rules: tensor metadata, :class:`Placeholder`, :class:`DimStrategy`, filling.

A rule describes an op on ONE mesh dim: which combinations of input placements give
which output placements when every rank runs the op on its local tensors. Shard-like
placements are written as :class:`Placeholder` s and filled later with every
shard-like kind the inputs use (``Shard`` and each ``StridedShard`` split factor).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from meshplan.errors import MeshplanError, StrategyError
from meshplan.layout._ints import as_int, brief
from meshplan.placement import Partial, Placement, Replicate, Shard, Spec, StridedShard
from meshplan.placement._types import dtype_name

__all__ = [
    "Meta",
    "Placeholder",
    "DimStrategy",
    "DimPlacement",
    "meta_of",
    "fill",
    "shard_kinds",
    "replicate_strategy",
    "CONSTRAINTS",
    "MAX_TENSORS",
    "RULE_HINT",
    "call_rule",
    "check_strategies",
]

CONSTRAINTS = ("even", "nonempty", "aligned")
MAX_TENSORS = 1 << 16  # outputs or inputs of one op: a bound that keeps bad counts from hanging


def _shape(value: Iterable[int]) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise StrategyError(
            f"tensor shape {brief(value)} is not a sequence of sizes; pass a tuple such as (4, 3)",
            value=value,
        )
    try:
        shape = tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise StrategyError(
            f"tensor shape {brief(value)} is not a sequence of sizes; pass a tuple such as (4, 3)",
            value=value,
        ) from None
    out = []
    for s in shape:
        size = as_int(s)
        if size is None or size < 0:
            raise StrategyError(
                f"tensor shape {shape!r} holds {s!r}; sizes are ints >= 0", value=shape
            )
        out.append(size)
    return tuple(out)


@attrs.frozen(repr=False)
class Meta:
    """What a rule may look at of a tensor: its global shape and dtype name.

    >>> Meta((4, 3)), Meta((2,), "int64").ndim
    (Meta((4, 3), 'float32'), 1)
    """

    shape: tuple[int, ...] = attrs.field(converter=_shape)
    dtype: str = attrs.field(default="float32", converter=dtype_name)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Meta({self.shape!r}, {self.dtype!r})"


def meta_of(spec: Spec) -> Meta:
    """The metadata of a spec's tensor."""
    if not isinstance(spec, Spec):
        raise StrategyError(
            f"meta_of takes a Spec, got {spec!r}; build one with Spec(mesh, placements, shape)",
            value=spec,
        )
    return Meta(spec.shape, spec.dtype)


def _to_int(value):
    """Integers (numpy ones too) as Python ints; anything else unchanged for the validator."""
    i = as_int(value)
    return value if i is None else i


def _dim(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StrategyError(
            f"Placeholder dim must be an int >= 0 (normalize negative dims in the rule), got "
            f"{value!r}",
            value=value,
        )


def _split(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StrategyError(f"Placeholder split must be an int >= 1, got {value!r}", value=value)


def _flag(instance, attribute, value) -> None:
    if not isinstance(value, bool):
        raise StrategyError(
            f"Placeholder {attribute.name}= must be True or False, got {value!r}", value=value
        )


def _split_factor(value: object) -> int:
    sf = as_int(value)
    if sf is None or sf < 1:
        raise StrategyError(
            f"split factor {value!r} must be an int >= 1 (1 fills placeholders with Shard)",
            value=value,
        )
    return sf


@attrs.frozen(repr=False)
class Placeholder:
    """A shard-like placement on tensor dim ``dim``, filled with each kind the inputs use.

    Filled with split factor ``sf`` (1 for ``Shard``) it becomes
    ``StridedShard(dim, sf * split)`` (``Shard(dim)`` when that is 1): ``split`` lets a
    view rule say "a shard of an inner dim becomes a strided shard of the flattened
    dim". All placeholders of one strategy take the same kind. Constraints are checked
    on the N-D spec: ``even`` (every chunking along ``dim`` divides exactly, so all
    ranks hold equally many), ``nonempty`` (every rank holds at least one index),
    ``aligned`` (every ``StridedShard`` step splits its piece into equal parts).

    >>> Placeholder(0), str(Placeholder(1, even=True)), str(Placeholder(0, split=3))
    (Placeholder(0), 'S?(1,even)', 'S?(0)*3')
    """

    dim: int = attrs.field(converter=_to_int, validator=_dim)
    split: int = attrs.field(default=1, converter=_to_int, validator=_split, kw_only=True)
    even: bool = attrs.field(default=False, validator=_flag, kw_only=True)
    nonempty: bool = attrs.field(default=False, validator=_flag, kw_only=True)
    aligned: bool = attrs.field(default=False, validator=_flag, kw_only=True)

    def fill(self, split_factor: int) -> Shard | StridedShard:
        """The concrete placement for a kind with ``split_factor`` (1 = ``Shard``)."""
        sf = _split_factor(split_factor) * self.split
        return Shard(self.dim) if sf == 1 else StridedShard(self.dim, sf)

    @property
    def constraints(self) -> tuple[str, ...]:
        flags = (("even", self.even), ("nonempty", self.nonempty), ("aligned", self.aligned))
        return tuple(name for name, on in flags if on)

    def __str__(self) -> str:
        extra = "".join("," + c for c in self.constraints)
        mult = f"*{self.split}" if self.split != 1 else ""
        return f"S?({self.dim}{extra}){mult}"

    def __repr__(self) -> str:
        args = [str(self.dim)]
        if self.split != 1:
            args.append(f"split={self.split}")
        args += [f"{c}=True" for c in self.constraints]
        return f"Placeholder({', '.join(args)})"


DimPlacement = Placement | Placeholder
_PLACEMENT_TYPES = (Shard, StridedShard, Replicate, Partial, Placeholder)


_EXACT_TYPES = frozenset(_PLACEMENT_TYPES)


def _entries(value: Iterable[DimPlacement]) -> tuple[DimPlacement, ...]:
    if type(value) in (tuple, list) and all(type(p) in _EXACT_TYPES for p in value):
        return tuple(value)  # (the common case, checked by exact types)
    if isinstance(value, _PLACEMENT_TYPES):
        value = (value,)
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise StrategyError(
            f"{brief(value)} is not a sequence of placements; a single-dim strategy lists one "
            "placement (or Placeholder) per output and input, e.g. DimStrategy([Shard(0)], "
            "[Shard(0), Replicate()])",
            value=value,
        )
    try:
        out = tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise StrategyError(
            f"{brief(value)} is not a sequence of placements; a single-dim strategy lists one "
            "placement (or Placeholder) per output and input",
            value=value,
        ) from None
    for p in out:
        if not isinstance(p, _PLACEMENT_TYPES):
            raise StrategyError(
                f"{brief(p)} is not a placement or Placeholder; a single-dim strategy lists one "
                "placement per output and input",
                value=p,
            )
    return out


Constraint = tuple[int, int, str]  # (position among outputs+inputs, tensor dim, name)


def _constraints(value: Iterable[Constraint]) -> tuple[Constraint, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise StrategyError(
            f"constraints {value!r} must be a sequence of (position, tensor dim, name) triples",
            value=value,
        )
    out = []
    for c in value:
        pos, dim, name = c if isinstance(c, tuple) and len(c) == 3 else (None, None, None)
        p, d = as_int(pos), as_int(dim)
        if p is None or d is None or p < 0 or d < 0 or name not in CONSTRAINTS:
            raise StrategyError(
                f"constraint {c!r} is not a (position >= 0, tensor dim >= 0, name) triple with a "
                f"name in {CONSTRAINTS!r}",
                value=c,
            )
        out.append((p, d, name))
    return tuple(out)


@attrs.frozen(repr=False, cache_hash=True)
class DimStrategy:
    """One mesh dim's strategy: input placements -> output placements.

    ``outputs`` and ``inputs`` hold one placement (or :class:`Placeholder`) per output
    and per tensor input. Filled strategies carry their placeholders' constraints in
    ``constraints`` as ``(position, tensor dim, name)`` with positions counting
    outputs first, then inputs.

    >>> s = DimStrategy([Placeholder(0)], [Placeholder(0), Replicate()])
    >>> print(s)
    S?(0), R -> S?(0)
    >>> print(s.fill(2))
    SS(0,2), R -> SS(0,2)
    """

    outputs: tuple[DimPlacement, ...] = attrs.field(converter=_entries)
    inputs: tuple[DimPlacement, ...] = attrs.field(converter=_entries)
    constraints: tuple[Constraint, ...] = attrs.field(
        default=(), converter=_constraints, kw_only=True
    )

    @property
    def entries(self) -> tuple[DimPlacement, ...]:
        """Outputs then inputs."""
        return self.outputs + self.inputs

    @property
    def has_placeholder(self) -> bool:
        return any(isinstance(p, Placeholder) for p in self.entries)

    @property
    def is_replicate(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.entries)

    def fill(self, split_factor: int) -> DimStrategy:
        """Every placeholder filled with the kind of ``split_factor`` (1 = ``Shard``)."""
        split_factor = _split_factor(split_factor)
        filled: list[Placement] = []
        cons: list[Constraint] = list(self.constraints)
        for pos, p in enumerate(self.entries):
            if isinstance(p, Placeholder):
                filled.append(p.fill(split_factor))
                cons.extend((pos, p.dim, c) for c in p.constraints)
            else:
                filled.append(p)
        n = len(self.outputs)
        return DimStrategy(filled[:n], filled[n:], constraints=tuple(cons))

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"{ins} -> {outs}"

    def __repr__(self) -> str:
        extra = f", constraints={self.constraints!r}" if self.constraints else ""
        return f"DimStrategy({list(self.outputs)!r}, {list(self.inputs)!r}{extra})"


def _count(name: str, value: object) -> int:
    n = as_int(value)
    if n is None or not 1 <= n <= MAX_TENSORS:
        raise StrategyError(
            f"{name}={value!r} must be an int in [1, {MAX_TENSORS}]: an op has at least one "
            "output and one tensor input",
            value=value,
        )
    return n


def replicate_strategy(n_outputs: int, n_inputs: int) -> DimStrategy:
    """The all-``Replicate`` strategy every op has (every rank computes everything).

    >>> print(replicate_strategy(1, 2))
    R, R -> R
    """
    n_out, n_in = _count("n_outputs", n_outputs), _count("n_inputs", n_inputs)
    return DimStrategy((Replicate(),) * n_out, (Replicate(),) * n_in)


def shard_kinds(specs: Sequence[Spec]) -> tuple[int, ...]:
    """The shard-like kinds to fill placeholders with, as split factors (1 = ``Shard``).

    ``Shard`` is always offered (a replicated input can be sliced locally); each
    ``StridedShard`` split factor found in the inputs is added, ascending.

    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2, 2))
    >>> shard_kinds([Spec(mesh, (StridedShard(0, 4), Replicate()), (8, 2))])
    (1, 4)
    """
    if isinstance(specs, Spec | str | bytes) or not isinstance(specs, Iterable):
        raise StrategyError(
            f"shard_kinds takes a sequence of Spec values (one per input), got {brief(specs)}",
            value=specs,
        )
    found = {1}
    try:
        specs = tuple(specs)
    except TypeError:  # a 0-d tensor or array
        raise StrategyError(
            f"shard_kinds takes a sequence of Spec values, got {brief(specs)}", value=specs
        ) from None
    for spec in specs:
        if not isinstance(spec, Spec):
            raise StrategyError(f"shard_kinds: {brief(spec)} is not a Spec", value=spec)
        for p in spec.placements:
            if isinstance(p, StridedShard):
                found.add(p.split_factor)
    return tuple(sorted(found))


def fill(
    strategies: Sequence[DimStrategy], kinds: Sequence[int], n_outputs: int, n_inputs: int
) -> tuple[DimStrategy, ...]:
    """Placeholders filled with every kind, plus the all-``Replicate`` strategy first.

    Duplicates are dropped (first occurrence kept), so the result is deterministic.

    >>> rules = [DimStrategy([Placeholder(0)], [Placeholder(0), Replicate()])]
    >>> [str(s) for s in fill(rules, (1, 2), 1, 2)]
    ['R, R -> R', 'S(0), R -> S(0)', 'SS(0,2), R -> SS(0,2)']
    """
    out: list[DimStrategy] = [replicate_strategy(n_outputs, n_inputs)]
    n_outputs, n_inputs = len(out[0].outputs), len(out[0].inputs)
    if isinstance(kinds, str | bytes) or not isinstance(kinds, Iterable):
        raise StrategyError(f"kinds {kinds!r} must be a sequence of split factors", value=kinds)
    kinds = tuple(_split_factor(k) for k in kinds)
    if isinstance(strategies, DimStrategy) or not isinstance(strategies, Iterable):
        raise StrategyError(
            f"strategies {strategies!r} must be a sequence of DimStrategy values",
            value=strategies,
        )
    seen = {out[0]}
    for s in strategies:
        if not isinstance(s, DimStrategy):
            raise StrategyError(f"a rule returned {s!r}; rules return DimStrategy values", value=s)
        if len(s.outputs) != n_outputs or len(s.inputs) != n_inputs:
            raise StrategyError(
                f"strategy {s} has {len(s.outputs)} outputs and {len(s.inputs)} inputs; the op "
                f"has {n_outputs} outputs and {n_inputs} tensor inputs",
                value=s,
            )
        for filled in (s.fill(k) for k in kinds) if s.has_placeholder else (s.fill(1),):
            if filled not in seen:
                seen.add(filled)
                out.append(filled)
    return tuple(out)


RULE_HINT = (
    "a rule returns [DimStrategy(outputs, inputs), ...], outputs first, one placement per "
    "output and per tensor input; check a rule's math with check_rule(op, rule, inputs, "
    "outputs=..., impl=...)"
)


def call_rule(op: str, what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a rule, or its outputs function, of ``op``); any exception
    but a meshplan error as a StrategyError naming the op, chained to it."""
    try:
        return fn(*args, **kwargs)
    except MeshplanError:
        raise
    except Exception as e:
        raise StrategyError(
            f"{op}: its {what} raised {type(e).__name__}: {brief(str(e))[1:-1]}; fix the "
            f"{what} ({RULE_HINT})",
            value=fn,
        ) from e


def check_strategies(
    op: str, value, outputs: Sequence[int | None], inputs: Sequence[int]
) -> tuple[DimStrategy, ...]:
    """``value``, what the rule of ``op`` returned, as a tuple of DimStrategy values, each
    with one placement per output (``outputs``: their ranks, None for a non-tensor one)
    and per tensor input (``inputs``: their ranks), sharding only dims those have; a
    StrategyError naming the op and what the rule returned otherwise.

    >>> check_strategies("neg", None, (2,), (2,))
    Traceback (most recent call last):
    ...
    meshplan.errors.StrategyError: neg: its rule returned None, not a sequence of DimStrategy values; ...
    """
    if isinstance(value, str | bytes | DimStrategy) or not isinstance(value, Iterable):
        raise StrategyError(
            f"{op}: its rule returned {brief(value)}, not a sequence of DimStrategy values; "
            f"{RULE_HINT}",
            value=value,
        )
    out = tuple(value)
    ranks = (*outputs, *inputs)
    for s in out:
        if not isinstance(s, DimStrategy):
            raise StrategyError(
                f"{op}: its rule returned {brief(out)}, holding {brief(s)}, not a "
                f"DimStrategy; {RULE_HINT}",
                value=s,
            )
        if len(s.outputs) != len(outputs) or len(s.inputs) != len(inputs):
            raise StrategyError(
                f"{op}: its rule returned the strategy {s} with {len(s.outputs)} outputs and "
                f"{len(s.inputs)} inputs; the op has {len(outputs)} outputs and {len(inputs)} "
                f"tensor inputs ({RULE_HINT})",
                value=s,
            )
        for pos, p in enumerate(s.entries):
            dim = getattr(p, "dim", None)
            n = ranks[pos]
            if dim is not None and n is not None and not dim < n:
                which = f"output {pos}" if pos < len(outputs) else f"input {pos - len(outputs)}"
                raise StrategyError(
                    f"{op}: its rule returned the strategy {s}, which shards dim {dim} of a "
                    f"{n}-D tensor ({which}); {RULE_HINT}",
                    value=s,
                )
    return out

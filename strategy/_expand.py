"""From single-dim rules to N-D strategies: :class:`Strategy`, :func:`expand`.

An N-D strategy picks one filled single-dim strategy per mesh dim. Its input and
output specs follow by reading the picks column-wise, plus shard orders where a
tensor dim is sharded by several mesh dims:

* inputs whose dims are linked by the rules (e.g. the contracted dims of ``mm``, or
  the operands of ``add``) must share one order; the candidates are each input's
  current order (kept mesh dims first, new ones ascending) and the ascending order;
* an output dim takes the order of the input dim it comes from; when a view merges
  several input dims into one, the mesh dims of inner input dims come first (they
  cut every row of the outer dims, see ``_rules_shape``).

Placeholder constraints (``even``, ``nonempty``, ``aligned``) are checked on the
specs; strategies breaking them, or mixing ``Partial`` ops a spec cannot hold, are
left out.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError, StrategyError
from meshplan.placement import (
    Partial,
    Placement,
    Shard,
    Spec,
    StridedShard,
    chunk_bounds,
    format_placements,
    is_shard_like,
)
from meshplan.placement._local import chunk_lengths

from ._args import as_int
from ._rule import CONSTRAINTS, DimStrategy, Meta, fill, meta_of, shard_kinds
from ._ruleset import OpRule, RuleSet, freeze_args

__all__ = [
    "Candidate",
    "candidates",
    "realize",
    "Strategy",
    "Problem",
    "prepare",
    "build_problem",
    "assemble",
    "expand",
    "check_constraint",
    "check_op",
    "check_inputs",
]


@attrs.frozen(repr=False, cache_hash=True)
class Strategy:
    """An N-D sharding strategy: the specs the inputs must have and the outputs' specs.

    ``dims`` holds the filled single-dim strategy picked on each mesh dim.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2))
    >>> a, b = Spec(mesh, (Shard(0), Replicate()), (4, 6)), Spec(mesh, (Replicate(),) * 2, (6, 2))
    >>> s = expand("mm", (a, b))[0]
    >>> print(s)
    R R, R R -> R R
    """

    input_specs: tuple[Spec, ...] = attrs.field(converter=lambda v: _specs(v, "input_specs"))
    output_specs: tuple[Spec, ...] = attrs.field(converter=lambda v: _specs(v, "output_specs"))
    dims: tuple[DimStrategy, ...] = attrs.field(converter=lambda v: _items(v, "dims"), eq=False)

    @property
    def output_spec(self) -> Spec:
        """The (first) output's spec."""
        return self.output_specs[0]

    def __str__(self) -> str:
        def text(spec: Spec) -> str:
            return format_placements(spec.placements, spec.shard_order)

        ins = ", ".join(map(text, self.input_specs))
        outs = ", ".join(map(text, self.output_specs))
        return f"{ins} -> {outs}"

    def __repr__(self) -> str:
        return f"Strategy(input_specs={self.input_specs!r}, output_specs={self.output_specs!r})"


def _items(value: Any, what: str) -> tuple:
    try:
        if not isinstance(value, str | bytes):
            return tuple(value)
    except (TypeError, RecursionError):
        pass
    raise StrategyError(f"Strategy {what} must be a sequence, got {value!r:.80}", value=value)


def _specs(value: Any, what: str) -> tuple[Spec, ...]:
    items = _items(value, what)
    for x in items:
        if not isinstance(x, Spec):
            raise StrategyError(f"Strategy {what} holds {x!r:.80}, not a Spec", value=x)
    return items


@attrs.frozen(repr=False, cache_hash=True)
class Problem:
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
) -> Problem:
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
) -> Problem:
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
) -> Problem:
    """A :class:`Problem` from an explicit rule and shard kinds (what ``prepare`` runs)."""
    metas = tuple(meta_of(s) for s in specs)
    kwargs = dict(args)
    for fn in (rule.strategies, rule.outputs):
        _check_keywords(op, fn, kwargs)
    # outputs first: it computes the result's dtype, refusing dtypes torch refuses
    outputs = _sequence(op, "outputs function", rule.outputs(metas, **kwargs))
    if not outputs:
        raise StrategyError(f"{op}: the outputs function returned no outputs", value=outputs)
    for m in outputs:
        if not isinstance(m, Meta):
            raise StrategyError(f"{op}: the outputs function returned {m!r}, not a Meta", value=m)
    raw = _sequence(op, "rule", rule.strategies(metas, **kwargs))
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
    return Problem(op, args, specs, outputs, dim_rules)


def _sequence(op: str, what: str, value: object) -> tuple:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise StrategyError(f"{op}: the {what} returned {value!r}, not a sequence", value=value)
    return tuple(value)


# -- constraints -------------------------------------------------------------------


def _stage(length: int, p: Placement, parts: int) -> list[int]:
    """Lengths each coordinate keeps when ``p`` cuts a piece of ``length`` over ``parts``."""
    if not isinstance(p, StridedShard):
        return [b - a for a, b in (chunk_bounds(length, parts, c) for c in range(parts))]
    pieces = chunk_lengths(length, p.split_factor)  # (length, count): O(1) in split_factor
    return [sum(k * _part(n, parts, c) for n, k in pieces) for c in range(parts)]


def _part(n: int, parts: int, c: int) -> int:
    a, b = chunk_bounds(n, parts, c)
    return b - a


def check_constraint(spec: Spec, dim: int, name: str) -> bool:
    """Whether ``spec`` meets a placeholder constraint on tensor ``dim``.

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(4), (Shard(0),), (7,))   # chunks of 2, 2, 2, 1
    >>> check_constraint(spec, 0, "even"), check_constraint(spec, 0, "nonempty")
    (False, True)
    >>> check_constraint(Spec(Mesh.create(4), (Shard(0),), (6,)), 0, "nonempty")  # 2, 2, 2, 0
    False
    """
    if not isinstance(spec, Spec):
        raise StrategyError(f"check_constraint needs a Spec, got {spec!r}", value=spec)
    d = as_int(dim)
    nd = len(spec.shape)
    if d is None or not -nd <= d < nd:
        raise StrategyError(
            f"dim {dim!r} is not a tensor dim of {spec} (shape {spec.shape!r}); use an int in "
            f"[{-nd}, {nd})",
            value=dim,
        )
    if name not in CONSTRAINTS:
        raise StrategyError(f"unknown constraint {name!r}; use one of {CONSTRAINTS!r}", value=name)
    dim = d % nd
    sizes = spec.mesh.shape
    stages = [(spec.placements[m], sizes[m]) for m in spec.order(dim)]
    return _chain_ok(spec.shape[dim], stages, name)


# -- assembling one combination ----------------------------------------------------


def _find(parent: dict, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def _derived_order(
    src: Spec, dim: int, mesh_dims: tuple[int, ...], target: tuple[Placement, ...]
) -> tuple[int, ...]:
    kept = [m for m in src.order(dim) if m in mesh_dims and src.placements[m] == target[m]]
    return tuple(kept) + tuple(sorted(set(mesh_dims) - set(kept)))


def _partial_ok(placements: tuple[Placement, ...]) -> bool:
    ops = {p.op for p in placements if isinstance(p, Partial)}
    return len(ops) <= 1 or ops == {"sum", "avg"}


@attrs.frozen
class Candidate:
    """An assembled combination before its output specs are built (cheap to price)."""

    input_specs: tuple[Spec, ...]
    output_placements: tuple[tuple[Placement, ...], ...]
    output_orders: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
    rules: tuple[DimStrategy, ...]


def realize(problem: Problem, cand: Candidate) -> Strategy:
    """The :class:`Strategy` of a candidate (builds its output specs)."""
    mesh = problem.mesh
    try:
        outs = tuple(
            Spec(mesh, pl, meta.shape, meta.dtype, dict(order))
            for pl, order, meta in zip(
                cand.output_placements, cand.output_orders, problem.outputs, strict=True
            )
        )
    except PlacementError as e:
        raise StrategyError(
            f"{problem.op}: strategy {' | '.join(map(str, cand.rules))} gives an invalid output "
            f"spec: {e}",
            value=cand.rules,
        ) from None
    return Strategy(cand.input_specs, outs, cand.rules)


def assemble(problem: Problem, combo: Sequence[int]) -> tuple[Strategy, ...]:
    """The N-D strategies (one per shard-order choice) of picking ``combo[m]`` on mesh dim m.

    Empty when the combination breaks a constraint or mixes Partial ops.
    """
    return tuple(realize(problem, c) for c in candidates(problem, tuple(combo)))


@functools.lru_cache(maxsize=65536)
def candidates(problem: Problem, combo: tuple[int, ...]) -> tuple[Candidate, ...]:
    """The shard-order variants of a combination that meet every constraint."""
    rules = tuple(problem.dim_rules[m][j] for m, j in enumerate(combo))
    srcs = problem.sources
    k_in, k_out = len(srcs), len(problem.outputs)
    in_pl = [tuple(r.inputs[i] for r in rules) for i in range(k_in)]
    out_pl = tuple(tuple(r.outputs[o] for r in rules) for o in range(k_out))
    if not all(_partial_ok(p) for p in (*in_pl, *out_pl)):
        return ()

    # mesh dims sharding each (input, tensor dim), and which inputs the rules link
    sharded: dict[tuple[int, int], tuple[int, ...]] = {}
    parent: dict[tuple[int, int], tuple[int, int]] = {}
    link: list[tuple[int, int] | None] = []
    for m, r in enumerate(rules):
        first = None
        for i, p in enumerate(r.inputs):
            if is_shard_like(p):
                node = (i, p.dim)
                sharded[node] = sharded.get(node, ()) + (m,)
                parent.setdefault(node, node)
                if first is None:
                    first = node
                else:
                    parent[_find(parent, node)] = _find(parent, first)
        link.append(first)
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for node in sorted(sharded):
        groups.setdefault(_find(parent, node), []).append(node)

    choices: list[tuple[list[tuple[int, int]], list[tuple[int, ...]]]] = []
    for members in groups.values():
        dims = sharded[members[0]]
        if any(sharded[x] != dims for x in members):
            return ()  # linked inputs sharded by different mesh dims cannot agree locally
        if len(dims) < 2:
            continue
        cands: list[tuple[int, ...]] = []
        for i, d in members:
            cand = _derived_order(srcs[i], d, dims, in_pl[i])
            if cand not in cands:
                cands.append(cand)
        if tuple(sorted(dims)) not in cands:
            cands.append(tuple(sorted(dims)))
        choices.append((members, cands))

    out: list[Candidate] = []
    for pick in itertools.product(*(c for _, c in choices)):
        orders: dict[tuple[int, int], tuple[int, ...]] = {}
        for (members, _), order in zip(choices, pick, strict=True):
            for node in members:
                orders[node] = order
        cand = _candidate(problem, rules, in_pl, out_pl, orders, link)
        if cand is not None:
            out.append(cand)
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _spec(mesh, placements, shape, dtype, order) -> Spec:
    return Spec(mesh, placements, shape, dtype, dict(order))


def _chain_ok(length: int, stages: Sequence[tuple[Placement, int]], name: str) -> bool:
    lengths = {length}
    for p, parts in stages:
        new: set[int] = set()
        for n in lengths:
            if name == "even" and (
                n % parts
                if isinstance(p, Shard)
                else n % p.split_factor or (n // p.split_factor) % parts
            ):
                return False
            if name == "aligned" and isinstance(p, StridedShard) and n % p.split_factor:
                return False
            new.update(_stage(n, p, parts))
        lengths = new
    if name == "nonempty":
        return min(lengths) >= 1
    return True


def _candidate(problem, rules, in_pl, out_pl, orders, link) -> Candidate | None:
    mesh = problem.mesh
    sizes = mesh.shape
    n = len(rules)
    try:
        ins = tuple(
            _spec(
                mesh,
                in_pl[i],
                s.shape,
                s.dtype,
                tuple(sorted((d, o) for (j, d), o in orders.items() if j == i)),
            )
            for i, s in enumerate(problem.sources)
        )
    except PlacementError as e:
        raise StrategyError(
            f"{problem.op}: strategy {' | '.join(map(str, rules))} gives an invalid input spec: "
            f"{e}",
            value=rules,
        ) from None

    def key(m: int) -> tuple[int, int, int]:
        src = link[m]
        if src is None:
            return (1, 0, m)
        order = orders.get(src, (m,))
        return (0, -src[1], order.index(m) if m in order else m)

    out_orders = []
    full_orders: list[dict[int, tuple[int, ...]]] = []
    for o in range(len(problem.outputs)):
        by_dim: dict[int, list[int]] = {}
        for m in range(n):
            p = out_pl[o][m]
            if is_shard_like(p) and sizes[m] > 1:
                by_dim.setdefault(p.dim, []).append(m)
        full = {d: tuple(sorted(ms, key=key)) for d, ms in by_dim.items()}
        full_orders.append(full)
        out_orders.append(tuple(sorted((d, ms) for d, ms in full.items() if len(ms) > 1)))

    seen = set()
    k_out = len(problem.outputs)
    for r in rules:
        for pos, dim, name in r.constraints:
            if (pos, dim, name) in seen:
                continue
            seen.add((pos, dim, name))
            if pos < k_out:
                length = problem.outputs[pos].shape[dim]
                stages = [(out_pl[pos][m], sizes[m]) for m in full_orders[pos].get(dim, ())]
            else:
                spec = ins[pos - k_out]
                length = spec.shape[dim]
                stages = [(spec.placements[m], sizes[m]) for m in spec.order(dim)]
            if not _chain_ok(length, stages, name):
                return None
    return Candidate(ins, out_pl, tuple(out_orders), rules)


def expand(
    op: str, input_specs: Sequence[Spec], ruleset: RuleSet | None = None, **args: Any
) -> tuple[Strategy, ...]:
    """Every N-D strategy of ``op`` for inputs laid out like ``input_specs`` (full enumeration).

    The first strategy replicates everything; the rest follow the rules' order, mesh
    dim 0 varying slowest.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2))
    >>> a = Spec(mesh, (Shard(0), Shard(1)), (4, 6))
    >>> b = Spec(mesh, (Replicate(), Replicate()), (6, 2))
    >>> ss = expand("mm", (a, b))
    >>> len(ss), any(s.input_specs[0] == a for s in ss)
    (65, True)
    """
    problem = prepare(op, input_specs, ruleset, args)
    out: list[Strategy] = []
    for combo in itertools.product(*(range(len(r)) for r in problem.dim_rules)):
        out.extend(assemble(problem, combo))
    return tuple(out)

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

Placeholder constraints (``even``, ``nonempty``, ``aligned``, see ``_constraints``)
are checked on the specs; strategies breaking them, or mixing ``Partial`` ops a spec
cannot hold, are left out.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError, StrategyError
from meshplan.placement import Partial, Placement, Spec, format_placements, is_shard_like

from ..rules._constraints import chain_ok
from ..rules._rule import DimStrategy
from ..rules._ruleset import RuleSet
from ._problem import OpProblem, prepare

__all__ = ["Candidate", "Strategy", "assemble", "candidates", "expand", "realize"]


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


def realize(problem: OpProblem, cand: Candidate) -> Strategy:
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


def assemble(problem: OpProblem, combo: Sequence[int]) -> tuple[Strategy, ...]:
    """The N-D strategies (one per shard-order choice) of picking ``combo[m]`` on mesh dim m.

    Empty when the combination breaks a constraint or mixes Partial ops.
    """
    return tuple(realize(problem, c) for c in candidates(problem, tuple(combo)))


@functools.lru_cache(maxsize=65536)
def candidates(problem: OpProblem, combo: tuple[int, ...]) -> tuple[Candidate, ...]:
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
            if not chain_ok(length, stages, name):
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

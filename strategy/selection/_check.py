"""The rule checker: run a rule's strategies in the simulator against the unsharded op.

For each mesh shape, every strategy (1-D meshes) or a seeded sample of them (N-D
meshes) gets random global inputs, laid out per the strategy's input specs —
``Partial`` inputs as random parts per partial coordinate, so a rule cannot pass by
luck of a canonical split — and the op runs on every rank's local tensors. The
output, unsharded with the strategy's output spec, must match the op on the global
inputs. The checker also lists input placements no strategy accepts except full
replication (gaps a rule may want to fill).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch

from meshplan.errors import MeshplanError, StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Placement, Replicate, Shard, Spec, StridedShard
from meshplan.placement._tensor import shard_one, unshard

from ..rules._args import ALL, as_int, is_real
from ..rules._rule import DimStrategy, Meta
from ..rules._ruleset import OpRule, RuleSet, freeze_args
from ._expand import Strategy, assemble
from ._problem import OpProblem, build_problem, check_op
from ._reference import random_inputs, run_local, run_op

__all__ = ["check_rule", "RuleReport", "Failure", "Gap", "random_locals"]


@attrs.frozen
class Failure:
    """A strategy that computed a wrong result (or failed to run) on a mesh."""

    mesh_shape: tuple[int, ...]
    strategy: Strategy
    error: str

    def __str__(self) -> str:
        return f"mesh {self.mesh_shape}: {self.strategy}: {self.error}"


@attrs.frozen
class Gap:
    """An input placement that only the full-replication strategy accepts."""

    input: int
    placement: Placement

    def __str__(self) -> str:
        return f"input {self.input} as {self.placement}"


@attrs.frozen
class RuleReport:
    """What :func:`check_rule` found: wrong strategies and uncovered input placements."""

    op: str
    checked: int
    failures: tuple[Failure, ...]
    gaps: tuple[Gap, ...]

    @property
    def ok(self) -> bool:
        """No strategy computed a wrong result."""
        return not self.failures

    def __str__(self) -> str:
        lines = [f"{self.op}: {self.checked} strategies checked, {len(self.failures)} wrong"]
        lines += [f"  WRONG {f}" for f in self.failures]
        if self.gaps:
            lines.append("  only full replication accepts: " + ", ".join(map(str, self.gaps)))
        return "\n".join(lines)


def _sequence(name: str, value: object) -> tuple:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise StrategyError(f"check_rule: {name} must be a sequence, got {value!r}", value=value)
    return tuple(value)


def _metas(inputs: Sequence[Meta | Sequence[int]]) -> tuple[Meta, ...]:
    out = []
    for x in _sequence("inputs (Meta values or shapes)", inputs):
        out.append(x if isinstance(x, Meta) else Meta(x, "float64"))
    if not out:
        raise StrategyError("check_rule needs the inputs' metadata (Meta values or shapes)")
    return tuple(out)


def _mesh_shapes(meshes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    out = []
    for shape in _sequence("meshes (mesh shapes such as [(4,), (2, 3)])", meshes):
        if isinstance(shape, str | bytes) or not isinstance(shape, Iterable):
            raise StrategyError(
                f"check_rule: meshes lists mesh shapes, got {shape!r} in {meshes!r}; write a "
                f"1-D mesh as ({shape!r},)",
                value=shape,
            )
        sizes = tuple(as_int(n) for n in shape)
        if not sizes or any(n is None or n < 1 for n in sizes):
            raise StrategyError(
                f"check_rule: mesh shape {tuple(shape)!r} must hold ints >= 1", value=shape
            )
        out.append(sizes)
    return tuple(out)


def _int_at_least(name: str, value: object, lo: int) -> int:
    n = as_int(value)
    if n is None or not lo <= n < 2**62:
        raise StrategyError(
            f"check_rule: {name}={value!r} must be an int in [{lo}, 2**62)", value=value
        )
    return n


def _check_options(rule, outputs, ruleset, impl, rtol, atol) -> None:
    for name, fn in (("outputs", outputs), ("impl", impl)):
        if fn is not None and not callable(fn):
            raise StrategyError(f"check_rule: {name}= must be a function, got {fn!r}", value=fn)
    if rule is not None and not isinstance(rule, OpRule) and not callable(rule):
        raise StrategyError(
            f"check_rule: rule must be a rule function, an OpRule or None, got {rule!r}",
            value=rule,
        )
    if ruleset is not None and not isinstance(ruleset, RuleSet):
        raise StrategyError(
            f"check_rule: ruleset must be a RuleSet, got {ruleset!r}", value=ruleset
        )
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not is_real(tol) or not tol >= 0:
            raise StrategyError(f"check_rule: {name}={tol!r} must be a number >= 0", value=tol)


def random_locals(
    spec: Spec, draw: Callable[[], torch.Tensor]
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Random local tensors for ``spec`` and the global tensor they stand for.

    Each partial coordinate gets its own random tensor (``draw()``), so Partial locals
    are arbitrary parts, not a canonical split; the global is their reduction.
    """
    if not isinstance(spec, Spec) or not callable(draw):
        raise StrategyError(
            f"random_locals takes a Spec and a function drawing a global tensor, got "
            f"{spec!r:.80} and {draw!r:.80}",
            value=(spec, draw),
        )
    mesh = spec.mesh
    ranks = list(mesh.ranks)
    if not spec.is_partial:
        x = draw()
        return {r: shard_one(x, spec, r) for r in ranks}, x
    pdims = spec.partial_dims
    base = Spec(
        mesh,
        [Replicate() if isinstance(p, Partial) else p for p in spec.placements],
        spec.shape,
        spec.dtype,
        spec.shard_order,
    )
    parts: dict[tuple[int, ...], torch.Tensor] = {}
    locals_: dict[int, torch.Tensor] = {}
    for r in ranks:
        key = tuple(mesh.coordinate(r)[m] for m in pdims)
        if key not in parts:
            parts[key] = draw()
        locals_[r] = shard_one(parts[key], base, r)
    return locals_, unshard(locals_, spec)


def _matches(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if got.dtype != want.dtype:
        got = got.to(want.dtype)
    if want.is_floating_point() or want.is_complex():
        ok = torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = torch.equal(got, want)
    if ok:
        return None
    diff = (got.double() - want.double()).abs().nan_to_num(float("inf")).max().item()
    return f"values differ (max abs diff {diff:.3g})"


def _check_strategy(
    op: str,
    strategy: Strategy,
    args: dict[str, Any],
    impl,
    metas,
    seed: int,
    rtol: float,
    atol: float,
) -> str | None:
    gen = torch.Generator().manual_seed(seed)
    globals_, locals_ = [], []
    for i, spec in enumerate(strategy.input_specs):
        loc, x = random_locals(spec, lambda i=i: random_inputs(op, metas, gen)[i])
        globals_.append(x)
        locals_.append(loc)
    mesh = strategy.input_specs[0].mesh
    out_spec = strategy.output_spec
    try:
        want = run_op(op, globals_, args, impl)
        out = {
            r: run_local(op, [loc[r] for loc in locals_], args, strategy.output_specs, r, impl)
            for r in mesh.ranks
        }
        got = unshard(out, out_spec)
    except (RuntimeError, ValueError, IndexError, MeshplanError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return _matches(got, want, rtol, atol)


def _sources(problem: OpProblem, combo: tuple[int, ...], rng: random.Random) -> tuple[Spec, ...]:
    # specs laid out like the combination, with random shard orders: seeds order choices
    mesh = problem.mesh
    out = []
    for i, src in enumerate(problem.sources):
        pl = [problem.dim_rules[m][j].inputs[i] for m, j in enumerate(combo)]
        order = {}
        for d in range(len(src.shape)):
            dims = [
                m
                for m, p in enumerate(pl)
                if getattr(p, "dim", None) == d and not isinstance(p, Partial)
            ]
            if len(dims) > 1:
                rng.shuffle(dims)
                order[d] = tuple(dims)
        try:
            out.append(Spec(mesh, pl, src.shape, src.dtype, order))
        except MeshplanError:
            out.append(src)
    return tuple(out)


def _gaps(
    filled: Sequence[DimStrategy], metas: tuple[Meta, ...], kinds: Sequence[int]
) -> tuple[Gap, ...]:
    used = [set() for _ in metas]
    for s in filled:
        if s.is_replicate:
            continue
        for i, p in enumerate(s.inputs):
            used[i].add(p)
    gaps = []
    for i, m in enumerate(metas):
        cands: list[Placement] = [Replicate()] if len(metas) > 1 else []
        for d in range(m.ndim):
            cands += [Shard(d) if k == 1 else StridedShard(d, k) for k in kinds]
        cands += [Partial(op) for op in ALL]
        gaps += [Gap(i, p) for p in cands if p not in used[i]]
    return tuple(gaps)


def check_rule(
    op: str,
    rule: Callable[..., Sequence[DimStrategy]] | OpRule | None = None,
    inputs: Sequence[Meta | Sequence[int]] = (),
    *,
    outputs: Callable[..., Sequence[Meta]] | None = None,
    ruleset: RuleSet | None = None,
    impl: Callable[..., torch.Tensor] | None = None,
    meshes: Sequence[Sequence[int]] = ((4,), (2, 3), (2, 2, 2)),
    split_factors: Sequence[int] = (2,),
    samples: int = 12,
    seed: int = 0,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    **args: Any,
) -> RuleReport:
    """Run a rule's strategies in the simulator and report the wrong ones (and gaps).

    ``rule`` defaults to ``ruleset[op]`` (the built-in rules); ``inputs`` are the
    inputs' metadata (shapes mean float64). ``impl`` is the op's torch function
    (default: the built-in one for ``op``). 1-D meshes check every strategy, others a
    sample of ``samples`` combinations; placeholders are filled with ``Shard`` and
    ``StridedShard`` of each of ``split_factors``.

    >>> rep = check_rule("mm", inputs=[(5, 6), (6, 3)], meshes=[(3,)])
    >>> rep.ok, rep.checked
    (True, 11)
    """
    op = check_op(op)
    _check_options(rule, outputs, ruleset, impl, rtol, atol)
    meshes = _mesh_shapes(meshes)
    split_factors = tuple(
        _int_at_least("split_factors", k, 1) for k in _sequence("split_factors", split_factors)
    )
    samples = _int_at_least("samples", samples, 1)
    seed = _int_at_least("seed", seed, 0)
    rs = ruleset or RuleSet.default()
    if rule is None:
        entry = rs[op]
    elif isinstance(rule, OpRule):
        entry = rule
    else:
        out_fn = outputs or (rs[op].outputs if op in rs else None)
        if out_fn is None:
            raise StrategyError(f"check_rule: give outputs= for the new op {op!r}", value=op)
        entry = OpRule(rule, out_fn)
    if outputs is not None:
        entry = OpRule(entry.strategies, outputs)
    metas = _metas(inputs)
    frozen = freeze_args(args)
    kinds = tuple(sorted({1, *split_factors}))
    rng = random.Random(seed)
    failures: list[Failure] = []
    checked = 0

    def problem_on(mesh: Mesh) -> OpProblem:
        specs = tuple(Spec(mesh, [Replicate()] * mesh.ndim, m.shape, m.dtype) for m in metas)
        return build_problem(op, entry, specs, frozen, kinds)

    gaps = _gaps(problem_on(Mesh.create(2)).dim_rules[0], metas, kinds)
    for shape in meshes:
        mesh = Mesh.create(tuple(shape))
        problem = problem_on(mesh)
        combos = list(itertools.product(*(range(len(r)) for r in problem.dim_rules)))
        if len(combos) > samples:
            combos = [combos[0], *rng.sample(combos[1:], samples - 1)]
        for combo in combos:
            sources = _sources(problem, combo, rng)
            for strategy in assemble(attrs.evolve(problem, sources=sources), combo):
                checked += 1
                err = _check_strategy(op, strategy, args, impl, metas, seed + checked, rtol, atol)
                if err is not None:
                    failures.append(Failure(mesh.shape, strategy, err))
    return RuleReport(op, checked, tuple(failures), gaps)

"""A program op's candidate strategies: every mesh dim's rule, combined and priced (no torch).

Each aten call's single-mesh-dim strategies (:mod:`..rules._aten`) are combined over the mesh
into N-D candidates with plain ``Shard`` for intermediate values, their specs built and
their placeholder constraints checked; each candidate carries its local compute under a
:class:`ComputeModel`. On meshes of three or more dims an op keeps the most sharded
candidates (and full replication), at most a given number.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.errors import PlacementError, StrategyError
from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard

from ..rules._aten import Call, _sums_only, aten_strategies
from ..rules._constraints import check_constraint
from ..rules._rule import DimStrategy, Placeholder
from ..rules._ruleset import RuleSet

__all__ = ["ComputeModel", "Option", "options", "local_numel", "is_float", "realize_option"]


@attrs.frozen
class ComputeModel:
    """What local work costs: seconds per floating-point operation and per byte touched.

    The default is a GPU of ~100 TFLOP/s and ~2 TB/s; :meth:`cpu` a few CPU cores.

    >>> ComputeModel().seconds(flops=2e12, nbytes=0)
    0.02
    """

    flops_per_s: float = 100e12
    bytes_per_s: float = 2e12

    def __attrs_post_init__(self) -> None:
        for name in ("flops_per_s", "bytes_per_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise StrategyError(f"ComputeModel {name}={v!r} must be a number > 0", value=v)

    @classmethod
    def cpu(cls) -> ComputeModel:
        """A few CPU cores: ~50 GFLOP/s, ~10 GB/s."""
        return cls(50e9, 10e9)

    def seconds(self, *, flops: float, nbytes: float) -> float:
        return flops / self.flops_per_s + nbytes / self.bytes_per_s


def _fill(p: Any) -> Any:
    if isinstance(p, Placeholder):
        return Shard(p.dim) if p.split == 1 else StridedShard(p.dim, p.split)
    return p


def _plain(s: DimStrategy) -> bool:
    """No strided placeholder: programs shard intermediate values with plain Shard only
    (a strided layout of an intermediate is never cheaper to reach than a plain one in
    the ops a model holds, and it would multiply every op's candidates)."""
    return all(not isinstance(p, Placeholder) or p.split == 1 for p in s.entries)


def _constraints(p: Any) -> tuple[str, ...]:
    if not isinstance(p, Placeholder):
        return ()
    return tuple(n for n in ("even", "nonempty", "aligned") if getattr(p, n))


@attrs.frozen
class Option:
    input_specs: tuple[Spec, ...]
    output_specs: tuple[Spec | None, ...]
    compute: float


@functools.lru_cache(maxsize=4096)
def options(
    call: Call,
    mesh,
    compute: ComputeModel,
    strict: bool,
    max_options: int = 1 << 30,
    ruleset: Any = None,
) -> tuple[list[Option], bool]:
    """The call's N-D candidates (full replication first) and whether it had no rule in
    ``ruleset`` (default: the built-in :class:`~meshplan.strategy.RuleSet`)."""
    rules = aten_strategies(call, RuleSet.default() if ruleset is None else ruleset)
    fallback = rules is None
    if fallback:
        if strict:
            raise StrategyError(
                f"no sharding rule for {call.target}; add one, or call plan_program with "
                "strict=False to run it replicated",
                value=call.target,
            )
        rules = []
    # programs keep Partial(sum), what backward passes produce (a user's rule may list more)
    rules = [r for r in _sums_only(rules) if _plain(r)]
    n_in, n_out = len(call.inputs), len(call.outputs)
    rep = DimStrategy([Replicate()] * n_out, [Replicate()] * n_in)
    per_dim = []
    for size in mesh.shape:
        per_dim.append([rep] + (list(rules) if size > 1 else []))
    seen: dict[tuple, Option] = {}
    for combo in itertools.product(*per_dim):
        opt = realize_option(call, mesh, combo, compute)
        if opt is None:
            continue
        key = (opt.input_specs, opt.output_specs)
        if key not in seen:
            seen[key] = opt
    return tuple(_keep(list(seen.values()), max_options)), fallback


def _keep(options: list[Option], limit: int) -> list[Option]:
    """At most ``limit`` options: full replication and the ones of least compute (stable).

    On meshes of three or more dims an op has up to (rules + 1) ** ndim candidates and
    the pairwise prices grow with their square; the ones kept are the most sharded (least
    local work), which is where a step's time goes, and the replicated fallback.
    """
    if len(options) <= limit:
        return options
    ranked = sorted(range(1, len(options)), key=lambda i: (options[i].compute, i))
    return [options[0]] + [options[i] for i in sorted(ranked[: limit - 1])]


def realize_option(call: Call, mesh, combo: Sequence[DimStrategy], compute: ComputeModel):
    specs_in, specs_out = [], []
    try:
        for i, meta in enumerate(call.inputs):
            entries = [s.inputs[i] for s in combo]
            spec = Spec(mesh, [_fill(p) for p in entries], meta.shape, meta.dtype)
            if not _meets(spec, entries):
                return None
            specs_in.append(spec)
        for j, meta in enumerate(call.outputs):
            if meta is None:
                specs_out.append(None)
                continue
            entries = [s.outputs[j] for s in combo]
            if any(isinstance(p, Partial) for p in entries) and not is_float(meta.dtype):
                return None
            spec = Spec(mesh, [_fill(p) for p in entries], meta.shape, meta.dtype)
            if not _meets(spec, entries):
                return None
            specs_out.append(spec)
    except PlacementError:
        return None
    return Option(tuple(specs_in), tuple(specs_out), _compute(call, specs_in, specs_out, compute))


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _meets(spec: Spec, entries) -> bool:
    for p in entries:
        for name in _constraints(p):
            if not check_constraint(spec, p.dim, name):
                return False
    return True


_ITEMSIZE = {"float64": 8, "int64": 8, "complex64": 8, "float32": 4, "int32": 4, "bool": 1}


def local_numel(spec: Spec) -> int:
    """The largest local element count of ``spec`` (pure arithmetic on the mesh dims)."""
    sizes = list(spec.shape)
    for m, p in enumerate(spec.placements):
        if isinstance(p, Shard | StridedShard):
            k = spec.mesh.shape[m]
            sizes[p.dim] = -(-sizes[p.dim] // k)
    return math.prod(sizes)


def _local_dims(spec: Spec) -> list[int]:
    sizes = list(spec.shape)
    for m, p in enumerate(spec.placements):
        if isinstance(p, Shard | StridedShard):
            sizes[p.dim] = -(-sizes[p.dim] // spec.mesh.shape[m])
    return sizes


def _compute(call: Call, ins, outs, model: ComputeModel) -> float:
    nbytes = sum(local_numel(s) * _ITEMSIZE.get(s.dtype, 4) for s in list(ins) + list(outs) if s)
    flops = 0.0
    op = call.op
    if op in ("mm", "bmm", "addmm") and len(ins) >= 2:
        a, b = (ins[1], ins[2]) if op == "addmm" else (ins[0], ins[1])
        la, lb = _local_dims(a), _local_dims(b)
        flops = 2.0 * math.prod(la) * lb[-1]
    elif "scaled_dot_product" in op:
        q = _local_dims(ins[0])
        if len(q) == 4:
            flops = 4.0 * q[0] * q[1] * q[2] * q[2] * q[3] * (2.5 if "backward" in op else 1.0)
    return model.seconds(flops=flops, nbytes=nbytes)

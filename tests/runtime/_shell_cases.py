"""Cases and worker-side helpers for the runtime-shell tests (run, redistribute, failures).

Parent side: hypothesis strategies for meshes over a whole pool world (or part of it)
and for (src, dst) pairs with per-rank local tensors; cases are drawn in batches and
shipped to the pool in one task per batch. Worker side: one ``ProcessGroups`` per mesh
per worker process, kept for the life of the worker (the pool reuses its workers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Spec, shard_one
from meshplan.redistribute import Plan
from meshplan.runtime._autograd import grad_spec
from meshplan.testing import mesh_dims, specs

GROUP_TIMEOUT = 30.0
"""Seconds a collective of the tests' process groups waits for its peers."""

DTYPES = ("float32", "float32", "float64", "int64", "int32", "bfloat16", "complex64")


# -- parent side: strategies ----------------------------------------------------------------


def _factorizations(n: int, max_dims: int) -> list[tuple[int, ...]]:
    if n == 1:
        return [()]
    out = []
    for first in range(2, n + 1):
        if n % first == 0:
            out += [(first, *rest) for rest in _factorizations(n // first, max_dims - 1)]
    return [f for f in out if len(f) <= max_dims]


@st.composite
def world_meshes(
    draw,
    world: int,
    *,
    max_dims: int = 3,
    max_aliases: int = 2,
    part: bool = True,
    permuted: bool | None = None,
):
    """Meshes of 1-3 dims over all ``world`` ranks, or (``part``) over a random half of them.

    Identity or permuted rank maps (``permuted``: None for either), sometimes a size-1
    dim, up to ``max_aliases`` flattened aliases (adjacent or not, any order).
    """
    size = world
    if part and world > 2 and draw(st.integers(0, 5)) == 0:
        size = world // 2
    shape = list(draw(st.sampled_from(_factorizations(size, max_dims))))
    if len(shape) < max_dims and draw(st.integers(0, 4)) == 0:
        shape.insert(draw(st.integers(0, len(shape))), 1)
    if size == world:
        pool = list(range(world))
    else:
        pool = sorted(draw(st.permutations(range(world)))[:size])
    if permuted is None:
        permuted = draw(st.booleans())
    ranks = draw(st.permutations(pool)) if permuted else pool
    mesh = Mesh.create(tuple(shape), ranks=ranks)
    for k in range(draw(st.integers(0, max_aliases))):
        flat = mesh.flatten(draw(mesh_dims(mesh, min_size=1)), f"f{k}")
        if flat.aliases[f"f{k}"] not in mesh.aliases.values():  # one name per flattening
            mesh = flat
    return mesh


@st.composite
def spec_pairs(
    draw,
    mesh_strategy,
    *,
    dtypes=DTYPES,
    max_side: int = 9,
    partial_target: float = 1.0,
    strided: float = 1.0,
):
    """A source and a target spec on one drawn mesh, same shape and dtype.

    The target may be Partial only in a ``partial_target`` share of the draws, and the
    pair may use StridedShard only in a ``strided`` share.
    """

    def share(p: float, label: str) -> bool:
        return p >= 1 or draw(st.integers(0, 99), label=label) < 100 * p

    mesh = draw(mesh_strategy)
    allow_strided = share(strided, "strided")
    src = draw(
        specs(mesh=mesh, max_side=max_side, dtypes=dtypes, allow_strided=allow_strided),
        label="src",
    )
    dst = draw(
        specs(
            mesh=mesh,
            shape=src.shape,
            dtypes=(src.dtype,),
            allow_partial=share(partial_target, "partial target"),
            allow_strided=allow_strided,
        ),
        label="dst",
    )
    return src, dst


# -- parent side: data ----------------------------------------------------------------------


def values(shape, dtype: str, gen: torch.Generator) -> torch.Tensor:
    """Small integers in ``dtype``: every sum, max and min the tests take is exact."""
    t = torch.randint(-8, 9, tuple(shape), generator=gen)
    if dtype.startswith("complex"):
        imag = torch.randint(-8, 9, tuple(shape), generator=gen)
        return torch.complex(t.double(), imag.double()).to(getattr(torch, dtype))
    return t.to(getattr(torch, dtype))


def make_locals(spec: Spec, seed: int) -> dict[int, torch.Tensor]:
    """Every rank's local tensor for ``spec``, well formed: replicas agree, and a Partial
    spec's value is split into random parts (one global tensor per coordinate of the
    Partial dims)."""
    gen = torch.Generator().manual_seed(seed)
    base = grad_spec(spec)
    pdims = spec.partial_dims
    parts: dict[tuple[int, ...], torch.Tensor] = {}
    out = {}
    for rank in spec.mesh.ranks:
        coord = spec.mesh.coordinate(rank)
        key = tuple(coord[m] for m in pdims)
        if key not in parts:
            parts[key] = values(spec.shape, spec.dtype, gen)
        out[rank] = shard_one(parts[key], base, rank)
    return out


def contiguous_strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(tuple(shape)):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values (bit for bit for the tests' exact values)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def numel(spec: Spec) -> int:
    return math.prod(spec.shape)


# -- worker side ----------------------------------------------------------------------------

_GROUPS: dict[tuple[Mesh, float], object] = {}


def groups_for(mesh: Mesh, timeout: float = GROUP_TIMEOUT):
    """This worker's ``ProcessGroups`` for ``mesh`` (one per mesh, kept across tasks)."""
    from meshplan.runtime._groups import ProcessGroups

    key = (mesh, float(timeout))
    if key not in _GROUPS:
        _GROUPS[key] = ProcessGroups(mesh, timeout=timeout)
    return _GROUPS[key]


def run_here(plan: Plan, locals_: Mapping[int, torch.Tensor], timeout: float = GROUP_TIMEOUT):
    """Run ``plan`` on this rank (every rank of the world calls it): (output, contiguous)."""
    import torch.distributed as dist

    from meshplan.runtime._run import prepare_groups, run

    groups = groups_for(plan.src.mesh, timeout)
    prepare_groups(plan, groups)
    rank = dist.get_rank()
    if rank not in locals_:
        return None
    out = run(plan, locals_[rank], groups)
    return out, out.is_contiguous()

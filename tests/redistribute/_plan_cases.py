"""Shared strategies and oracles for the planner tests: pairs of specs on one mesh, random
partial parts that reduce to a tensor, and the check that a plan delivers the target."""

from __future__ import annotations

import itertools
import math

import attrs
import torch
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.placement import Partial, Spec, gather_index, local_intervals, shard, unshard
from meshplan.redistribute import CostModel, HardwareProfile, Link, Plan, Step, simulate
from meshplan.redistribute._engine._edges import singles
from meshplan.redistribute._engine._encoding import R, decode, encode, universe
from meshplan.redistribute._engine._problem import Problem
from meshplan.redistribute._store import default_planner
from meshplan.testing import mesh_dims, shapes, specs

OPS = ("sum", "avg", "max", "min")

# a profile whose collectives have links of their own (as ``calibrate`` measures): slow
# all_reduces, fast all_to_alls, all_permutes apart from both; the rest on two tiers
PER_COLLECTIVE = CostModel(
    HardwareProfile(
        intra=Link(2e-6, 50e9),
        inter=Link(8e-6, 10e9),
        ranks_per_node=2,
        per_collective={
            "all_reduce": Link(3e-5, 4e9),
            "all_to_all": Link(1e-6, 200e9),
            "all_permute": Link(2e-5, 20e9),
        },
    )
)

# a sentinel among the tests' models: PER_COLLECTIVE, plus links of their own for the
# group of each alias of the mesh (``HardwareProfile.flattened``, what ``calibrate``
# measures), some faster than any of its dims' links and some slower (``on_mesh``)
FLAT = "flattened links"


def on_mesh(model, mesh: Mesh) -> CostModel:
    """``model``, or for :data:`FLAT` the model with flattened links for ``mesh``'s aliases."""
    if model != FLAT:
        return model
    from meshplan.redistribute._planner import alias_dims

    flattened = {}
    for k, (_, dims) in enumerate(sorted(alias_dims(mesh).items())):
        key = tuple(sorted(dims))
        if len(key) < 2 or key in flattened:
            continue
        odd = k % 2
        flattened[key] = {
            "all_gather": Link(5e-5, 2e9) if odd else Link(4e-7, 400e9),
            "all_reduce": Link(1e-6, 300e9),
            "reduce_scatter": Link(6e-5, 500e9),
            "all_to_all": Link(1e-7, 900e9) if odd else Link(1e-7, 1e9),
        }
    return CostModel(attrs.evolve(PER_COLLECTIVE.profile, flattened=flattened))


@st.composite
def small_meshes(draw, max_ranks: int = 16, max_dims: int = 4, max_aliases: int = 0) -> Mesh:
    """Meshes of 1..max_dims dims with at most ``max_ranks`` ranks, mostly of sides >= 2
    (size-1 dims now and then), any rank map, up to ``max_aliases`` flattened aliases."""
    ndim = draw(st.integers(1, max_dims), label="mesh dims")
    shape = draw(
        st.lists(st.sampled_from([2, 2, 3, 4, 1]), min_size=ndim, max_size=ndim).filter(
            lambda s: math.prod(s) <= max_ranks
        ),
        label="mesh shape",
    )
    n = math.prod(shape)
    ranks = draw(st.permutations(range(n)), label="rank map") if draw(st.booleans()) else None
    mesh = Mesh.create(tuple(shape), ranks=ranks)
    for k in range(draw(st.integers(0, max_aliases), label="aliases")):
        dims = draw(mesh_dims(mesh, min_size=min(2, mesh.ndim)), label=f"dims of f{k}")
        if mesh.alias_for(dims) is None:
            mesh = mesh.flatten(dims, f"f{k}")
    return mesh


@st.composite
def spec_pairs(
    draw, max_ranks: int = 16, max_dims: int = 4, max_aliases: int = 0, max_side: int = 9
) -> tuple[Spec, Spec]:
    """Two specs of one tensor on one mesh: every placement kind, shard orders, uneven and
    empty sides, Partial of each op (source and target ops drawn independently)."""
    mesh = draw(small_meshes(max_ranks, max_dims, max_aliases), label="mesh")
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=max_side), label="shape")
    src_ops = draw(st.sampled_from([("sum", "avg"), ("max",), ("min",), ("sum",)]))
    dst_ops = draw(st.sampled_from([("sum", "avg"), ("max",), ("min",), ("avg",)]))
    src = draw(specs(mesh=mesh, shape=shape, dtypes=("float64",), partial_ops=src_ops))
    dst = draw(
        specs(mesh=mesh, shape=shape, dtypes=("float64",), partial_ops=dst_ops).filter(
            lambda s: s != src
        )
    )
    return src, dst


def _ranks(spec: Spec) -> tuple[int, ...]:
    return tuple(sorted(shard(torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype)), spec)))


def _select(x: torch.Tensor, per_dim) -> torch.Tensor:
    out = x
    for d, ivs in enumerate(per_dim):
        out = out.index_select(d, gather_index(ivs))
    return out.contiguous()


def partial_parts(x: torch.Tensor, spec: Spec, seed: int = 0) -> dict[int, torch.Tensor]:
    """Per-rank local tensors of ``spec`` whose parts reduce to ``x`` — random parts, not
    meshplan's canonical split (so plans cannot rely on zeros being where shard() puts them)."""
    if not spec.is_partial:
        return shard(x, spec)
    gen = torch.Generator().manual_seed(seed)
    mesh = spec.mesh
    pdims = spec.partial_dims
    ops = {spec.placements[m].op for m in pdims}
    keys = list(itertools.product(*(range(mesh.shape[m]) for m in pdims)))
    n_avg = math.prod(mesh.shape[m] for m in pdims if spec.placements[m].op == "avg")
    parts: dict[tuple[int, ...], torch.Tensor] = {}
    if ops <= {"sum", "avg"}:
        total = x * n_avg
        for k in keys[1:]:
            parts[k] = torch.randint(-5, 6, x.shape, generator=gen).to(x.dtype)
        parts[keys[0]] = total - sum(parts.values(), torch.zeros_like(x))
    else:
        op = ops.pop()
        sign = 1 if op == "max" else -1
        owner = torch.randint(0, len(keys), x.shape, generator=gen)
        for i, k in enumerate(keys):
            lower = x - sign * torch.randint(1, 5, x.shape, generator=gen).to(x.dtype)
            parts[k] = torch.where(owner == i, x, lower)
    out = {}
    for r in _ranks(spec):
        c = mesh.coordinate(r)
        out[r] = _select(parts[tuple(c[m] for m in pdims)], local_intervals(spec, r))
    assert torch.allclose(unshard(out, spec), x)
    return out


def delivers(plan, x: torch.Tensor, seed: int = 0) -> bool:
    """Run ``plan`` in the simulator from random parts of ``x``; compare with the target.

    Each step is rebuilt through :class:`Step`'s checks first (the planner builds its
    steps without them)."""
    src, dst = plan.src, plan.dst
    for s in plan.steps:
        assert Step(s.mesh_dims, s.src, s.dst, s.collective, s.alias) == s
    out = simulate(plan, partial_parts(x, src, seed))
    if dst.is_partial:
        return torch.allclose(unshard(out, dst), x)
    want = shard(x, dst)
    return set(out) == set(want) and all(
        out[r].shape == want[r].shape and torch.allclose(out[r], want[r]) for r in want
    )


def context_of(src: Spec, dst: Spec, model, bound=None, objective="time", merge=True, planner=None):
    """The search context (of ``planner``, the default one when None) that plans between
    ``src`` and ``dst``."""
    shards, ptargets = universe(src, dst)
    problem = Problem(
        src.mesh, src.shape, src.dtype, model, shards, ptargets, bound, objective, merge
    )
    return (planner or default_planner()).context(problem)


def values(shape) -> torch.Tensor:
    """Distinct small integers as float64 (exact through sums and avg scaling)."""
    n = math.prod(shape)
    return (
        (torch.arange(n, dtype=torch.float64).reshape(shape) % 17)
        - 8
        + 0.5 * (torch.arange(n, dtype=torch.float64).reshape(shape) // 17)
    )


def partial_of(spec: Spec) -> set[str]:
    return {p.op for p in spec.placements if isinstance(p, Partial)}


# -- an oracle: the per-dim plan (each mesh dim straight to its target, as torch's greedy) --


def direct_stage(a, b, m: int, src_chains, dst_chains) -> tuple:
    """Where a direct move of mesh dim ``m`` from code ``a`` towards ``b`` runs in the
    direct plan: local steps, then all_to_alls, then reductions, then gathers (innermost
    first); shards joining an order follow the target's order."""

    def pos(chains, code):
        return chains[code[0]].index(m) if m in chains[code[0]] else 0

    if a == R or (type(a) is int and type(b) is int and b != R):
        return (0, pos(dst_chains, b) if type(b) is tuple else 0)
    if type(a) is tuple:
        if type(b) is int and b != R:
            return (0, -pos(src_chains, a))
        if type(b) is tuple:
            return (1, pos(dst_chains, b))
        return (3, -pos(src_chains, a))
    return (2, pos(dst_chains, b) if type(b) is tuple else 0)


def direct_plan(src: Spec, dst: Spec, model, bound):
    """The plan moving each differing mesh dim straight to its target placement (one
    single-dim step each, a Partial changing op reduced first), or None if some move is
    not a valid step; its like-kind collectives then meet, ready to merge on an alias."""
    start_state, goal_state = encode(src), encode(dst)
    if start_state == goal_state:
        return None
    ctx = context_of(src, dst, model, bound)
    goal_codes, goal_chains = goal_state
    src_chains = start_state[1]
    moves = []
    with ctx.lock:
        ctx.trim()
        i, goal = ctx.intern(start_state), ctx.intern(goal_state)
        for _ in range(2 * len(goal_codes) + 1):
            if i == goal:
                break
            codes, chains = ctx.states[i]
            options = []
            for trans in singles(ctx, i):
                m = trans.dims[0]
                a, b = codes[m], goal_codes[m]
                if a == b:
                    continue
                ncodes, nchains = ctx.states[trans.target]
                c = ncodes[m]
                if c != b and not (c == R and type(a) is int and type(b) is int):
                    continue  # not a direct move (a Partial changing op goes through R)
                # keep each order a sub-sequence of the target's
                if type(c) is tuple:
                    chain = nchains[c[0]]
                    if chain != tuple(x for x in goal_chains[c[0]] if x in chain):
                        continue
                options.append((direct_stage(a, c, m, src_chains, goal_chains), m, trans))
            if not options:
                return None
            trans = min(options, key=lambda o: o[:2])[2]
            moves.append((i, trans))
            i = trans.target
        if i != goal:
            return None
        states = [ctx.states[t.target] for _, t in moves]
    steps = []
    a = src
    for (_, trans), state in zip(moves, states, strict=True):
        b = dst if trans.target == goal else decode(src, state)
        steps.append(Step(trans.dims, a, b, trans.collective))
        a = b
    return Plan(src, dst, tuple(steps))

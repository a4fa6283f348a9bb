"""meshplan.redistribute.plan vs torch 2.13's greedy and graph-based redistribution planners.

torch 2.13 computes a redistribution's steps in ``_gen_transform_infos_non_cached(src,
dst, use_graph_based_transform)``: the greedy planner (its default) walks mesh dims once;
the graph planner (``DTensorRedistributePlanner``) runs Dijkstra over placements and
shard orders. Both run here on a fake process group, on the same random pairs of
placements as meshplan (Replicate, Partial, Shard(0), Shard(1) per mesh dim, default
shard order, tensors of 1024 x 1024 and 1000 x 768 float32), on meshes (8,), (2, 4),
(2, 2, 2) and (2, 2, 2, 2). No real communication happens.

Timing, per plan (mean and median over the pairs; garbage collection off, as timeit does).
Every uncached time is one call on spec objects built just before it (outside the timer),
as a program meets a pair it has not planned: hashing and encoding the new specs, and every
memo a pair's first plan fills, count. So each pair is timed once per row, for torch too:

* torch greedy / graph: ``_gen_transform_infos_non_cached`` (torch keeps its planner
  object per (mesh, tensor meta) and its mesh topology cached across calls, as in a
  training run; it warms on two other pairs first);
* meshplan uncached: the pair's first ``plan()``, on a context (mesh, shape, dtype, cost
  model, placements) that has built its plan table (the analogue of torch's cached
  planner object); the one-time build of each table, on a new context (whose moves
  another tensor shape on the mesh may have generated), is reported beside it
  (``table build``);
* meshplan uncached by search: the pair's first ``plan()`` on a context without a plan
  table that has planned other random pairs (none on the 1-D mesh: its 24 pairs are all
  cases). What a context's first ``_table.lazy_pairs`` pairs cost (2 to 64, by its state
  count), and every pair of a context too big for a table;
* meshplan cold: every table cleared before each plan;
* in order, clean: the pairs planned one after another from a clean start (meshplan: no
  table, memo or context; torch: no planner object), so each one-time cost (a context's
  first searches, its table build) falls on the pair that pays it: the mean is what a
  program that plans these pairs once each spends per plan;
* cached: the second call of ``plan()`` / torch's ``_gen_transform_infos`` (mean of 50);
* model weights: the weight shapes of five transformer sizes with the pairs FSDP/TP-style
  training plans for each (:func:`model_cases`), in order from a clean start, for meshplan
  and torch greedy: many tensor sizes, few pairs (meshplan shares a plan across the sizes
  of a family, ``meshplan.redistribute._engine._family``); on meshes of 2+ dims also FSDP2 x TP
  weights as torch writes them, with ``_StridedShard`` (:func:`model_cases` ``strided``).

Quality, per plan: steps, collectives, bytes received per rank and peak local memory
per rank (the largest step's padded input plus output; the planner's memory measure).
Bytes are priced the same way for both (meshplan's cost model on the plan's steps: padded
local sizes, ring all-reduce), torch's steps converted to meshplan steps; the lower bound
is what the busiest rank must receive at least (the target elements it lacks; every
element when a reduction is due). Costs are meshplan's model (nvlink_ib, 8 GPUs per node by default: the
4-D mesh spans two nodes, its first dim crossing them; ``--gpus-per-node 16`` makes every
link intra-node). meshplan minimizes modeled time, so on a slow inter-node dim it may run
an extra collective to move fewer bytes across it.

    python benchmarks/plan_speed.py                 # 120 cases per mesh (torch graph: 12)
                                                    # (1-D: the 24 distinct pairs)
    python benchmarks/plan_speed.py --cases 30 --graph-cases 4

Writes machine-readable results to benchmarks/results/plan_speed.json
(plan_speed_<n>gpn.json for another --gpus-per-node).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

from meshplan.redistribute._sizes import padded_local_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "plan_speed.json"
MESHES = [(8,), (2, 4), (2, 2, 2), (2, 2, 2, 2)]
SHAPES = [(1024, 1024), (1000, 768)]


# -- random cases ---------------------------------------------------------------------------


def random_cases(rng: random.Random, ndim: int, count: int, avoid=()):
    """Up to ``count`` distinct random pairs, none of ``avoid`` (fewer if the space is small)."""
    kinds = ["R", "P", "S0", "S1"]
    out: list = []
    tries = 0
    while len(out) < count and tries < 100 * count:
        tries += 1
        a = tuple(rng.choice(kinds) for _ in range(ndim))
        b = tuple(rng.choice(kinds) for _ in range(ndim))
        case = (a, b, rng.choice(SHAPES))
        if a != b and case not in avoid and case not in out:
            out.append(case)
    return out


# hidden, MLP and vocabulary sizes of five transformer configurations
MODEL_DIMS = [
    (1024, 4096, 50304),
    (2048, 5632, 32000),
    (4096, 11008, 32000),
    (5120, 13824, 32000),
    (8192, 28672, 128256),
]


def model_cases(ndim: int, strided: bool = False):
    """The weight shapes of :data:`MODEL_DIMS` (attention, fused QKV, MLP in and out,
    embedding), each with the pairs FSDP/TP-style training plans for it: gather the
    sharded weight, reduce-scatter its Partial gradient, shard a replicated tensor and
    (on meshes of 2+ dims) gather the FSDP dim of an FSDP x TP weight; shape by shape.

    ``strided`` (meshes of 2+ dims): the pairs of FSDP2 over the first mesh dim with a
    column-parallel TP weight (``Shard(0)``) on the last, as torch 2.13 writes them (the
    FSDP dim a ``_StridedShard(0, split_factor=tp)``): gather the FSDP dim,
    reduce-scatter the gradient onto it, shard a TP weight over it."""
    if strided:
        mid = ("R",) * (ndim - 2)
        fsdp, tp = ("SS0",) + mid + ("S0",), ("R",) + mid + ("S0",)
        pairs = [(fsdp, tp), (("P",) + mid + ("S0",), fsdp), (tp, fsdp)]
    else:
        pairs = [(("S0",) * ndim, ("R",) * ndim), (("P",) * ndim, ("S0",) * ndim)]
        pairs.append((("R",) * ndim, ("S0",) * ndim))
        if ndim >= 2:
            pairs.append((("S0",) + ("S1",) * (ndim - 1), ("R",) + ("S1",) * (ndim - 1)))
    shapes: list = []
    for h, f, v in MODEL_DIMS:
        for shape in [(h, h), (3 * h, h), (f, h), (h, f), (v, h)]:
            if shape not in shapes:
                shapes.append(shape)
    return [(a, b, shape) for shape in shapes for a, b in pairs]


def mp_spec(mesh, kinds, shape):
    from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard

    table = {"R": Replicate(), "P": Partial(), **{f"S{d}": Shard(d) for d in range(len(shape))}}
    table["SS0"] = StridedShard(0, mesh.shape[-1])  # split by the last (TP) mesh dim
    return Spec(mesh, [table[k] for k in kinds], shape, "float32")


def torch_spec(mesh, kinds, shape):
    import torch
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.placement_types import _StridedShard

    table = {"R": Replicate(), "P": Partial(), **{f"S{d}": Shard(d) for d in range(len(shape))}}
    table["SS0"] = _StridedShard(0, split_factor=mesh.size(mesh.ndim - 1))
    stride = tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))
    meta = TensorMeta(torch.Size(shape), stride, torch.float32)
    return DTensorSpec(mesh, tuple(table[k] for k in kinds), tensor_meta=meta)


# -- activations: 3-D and 4-D tensors ------------------------------------------------------

# batch x seq x hidden and batch x heads x seq x head_dim, float32
ACTIVATIONS = {
    3: [(8, 2048, 4096), (4, 4096, 5120)],
    4: [(8, 32, 2048, 128), (4, 40, 4096, 128)],
}


def activation_cases(rng: random.Random, mesh_ndim: int, tensor_ndim: int, count: int, avoid=()):
    """Up to ``count`` distinct random pairs over R, P and Shard of every tensor dim, on
    :data:`ACTIVATIONS` shapes of ``tensor_ndim`` dims, none of ``avoid``."""
    kinds = ["R", "P", *(f"S{d}" for d in range(tensor_ndim))]
    out: list = []
    tries = 0
    while len(out) < count and tries < 100 * count:
        tries += 1
        a = tuple(rng.choice(kinds) for _ in range(mesh_ndim))
        b = tuple(rng.choice(kinds) for _ in range(mesh_ndim))
        case = (a, b, rng.choice(ACTIVATIONS[tensor_ndim]))
        if a != b and case not in avoid and case not in out:
            out.append(case)
    return out


def run_activation_cases(mesh, tmesh, model, R, rng, tensor_ndim, count, warm, graph_count):
    """Random pairs of ``tensor_ndim``-D activations planned by meshplan (the default
    ``plan()``, tables and all, as a program gets it) and by torch's planners:

    * ``new``: each pair's first plan on a context that has planned ``warm`` other pairs;
    * ``first``: each pair planned on a clean start (nothing planned before: the context's
      first pair, every one-time cost of the context included);
    * ``cached``: the second call (mean of 50);
    * torch greedy: a pair's first ``_gen_transform_infos_non_cached`` on a planner object
      torch already cached for the (mesh, tensor meta); graph: the same, ``graph_count``
      pairs; cached: ``_gen_transform_infos``' second call.
    """
    from meshplan.redistribute import clear_plan_cache, cost, plan

    cases = activation_cases(rng, mesh.ndim, tensor_ndim, count)
    others = activation_cases(rng, mesh.ndim, tensor_ndim, warm, avoid=set(cases))

    def mp_plan(src, dst):
        return plan(src, dst, cost_model=model)

    rows = [{"src": " ".join(a), "dst": " ".join(b), "shape": list(sh)} for a, b, sh in cases]
    for row, (a, b, sh) in zip(rows, cases, strict=True):
        clear_plan_cache()
        row["mp_first_s"] = first_call(fresh(mp_spec, mesh, a, b, sh), mp_plan, clear=False)
    clear_plan_cache()
    for a, b, sh in others:
        mp_plan(mp_spec(mesh, a, sh), mp_spec(mesh, b, sh))
    for row, (a, b, sh) in zip(rows, cases, strict=True):
        row["mp_new_s"] = first_call(fresh(mp_spec, mesh, a, b, sh), mp_plan, clear=False)
    for row, (a, b, sh) in zip(rows, cases, strict=True):
        src, dst = mp_spec(mesh, a, sh), mp_spec(mesh, b, sh)
        p = mp_plan(src, dst)
        row["mp_cached_s"] = timed(lambda s=src, d=dst: mp_plan(s, d), 50)
        c = cost(p, model)
        row.update(mp_collectives=len(p.collectives), mp_bytes=c.bytes, mp_cost_s=c.total)
    # torch: planner objects cached per (mesh, tensor meta), as in training
    R.clear_redistribute_planner_cache()
    for a, b, sh in others[:4]:
        R._gen_transform_infos_non_cached(torch_spec(tmesh, a, sh), torch_spec(tmesh, b, sh), False)
    for row, (a, b, sh) in zip(rows, cases, strict=True):
        row["greedy_s"] = first_call(
            fresh(torch_spec, tmesh, a, b, sh),
            lambda x, y: R._gen_transform_infos_non_cached(x, y, False),
            clear=False,
        )
        tsrc, tdst = torch_spec(tmesh, a, sh), torch_spec(tmesh, b, sh)
        R._gen_transform_infos(tsrc, tdst, False)
        row["torch_cached_s"] = timed(
            lambda x=tsrc, y=tdst: R._gen_transform_infos(x, y, False), 50
        )
        infos = R._gen_transform_infos_non_cached(tsrc, tdst, False)
        _add_torch(row, "greedy", infos, mp_spec(mesh, a, sh), mp_spec(mesh, b, sh), model, cost)
    for row, (a, b, sh) in list(zip(rows, cases, strict=True))[:graph_count]:
        row["graph_s"] = first_call(
            fresh(torch_spec, tmesh, a, b, sh),
            lambda x, y: R._gen_transform_infos_non_cached(x, y, True),
            clear=False,
        )
    return rows


def summarize_activations(rows) -> dict:
    sub = [r for r in rows if "graph_s" in r]
    priced = [r for r in rows if "greedy_cost_s" in r]
    s = {
        "cases": len(rows),
        "graph_cases": len(sub),
        "mp_new_median_us": _median(rows, "mp_new_s") * 1e6,
        "mp_new_us": _mean(rows, "mp_new_s") * 1e6,
        "mp_first_median_us": _median(rows, "mp_first_s") * 1e6,
        "mp_first_us": _mean(rows, "mp_first_s") * 1e6,
        "mp_cached_us": _mean(rows, "mp_cached_s") * 1e6,
        "greedy_median_us": _median(rows, "greedy_s") * 1e6,
        "greedy_us": _mean(rows, "greedy_s") * 1e6,
        "torch_cached_us": _mean(rows, "torch_cached_s") * 1e6,
        "graph_median_us": _median(sub, "graph_s") * 1e6,
        "graph_subset_mp_first_median_us": _median(sub, "mp_first_s") * 1e6,
        "mp_cost_us": _mean(priced, "mp_cost_s") * 1e6,
        "greedy_cost_us": _mean(priced, "greedy_cost_s") * 1e6,
        "costlier_than_greedy": sum(
            r["mp_cost_s"] > r["greedy_cost_s"] * (1 + 1e-9) for r in priced
        ),
        "greedy_priced": len(priced),
    }
    s["new_over_greedy"] = s["mp_new_median_us"] / s["greedy_median_us"]
    s["first_over_greedy"] = s["mp_first_median_us"] / s["greedy_median_us"]
    s["graph_over_first"] = s["graph_median_us"] / s["graph_subset_mp_first_median_us"]
    return s


def print_activations(shape_mesh, tensor_ndim, rows) -> None:
    s = summarize_activations(rows)
    print(
        f"  {tensor_ndim}-D activations, {s['cases']} pairs (graph on {s['graph_cases']}), "
        f"medians: new pair {s['mp_new_median_us']:.1f} us, first pair "
        f"{s['mp_first_median_us']:.1f} us, cached {s['mp_cached_us']:.2f} us; greedy "
        f"{s['greedy_median_us']:.1f} us (cached {s['torch_cached_us']:.2f}), graph "
        f"{s['graph_median_us']:.0f} us"
    )
    print(
        f"    new/greedy {s['new_over_greedy']:.2f}, first/greedy {s['first_over_greedy']:.2f}, "
        f"graph/first {s['graph_over_first']:.0f}; model cost {s['mp_cost_us']:.1f} us vs "
        f"greedy {s['greedy_cost_us']:.1f} (costlier: {s['costlier_than_greedy']} of "
        f"{s['greedy_priced']})"
    )


# -- torch plans as meshplan plans ----------------------------------------------------------


def torch_steps_as_plan(infos, src, dst):
    """torch's transform infos as a meshplan Plan (default shard orders, as torch's greedy
    plan assumes), to price both with one model."""
    from meshplan.placement import Partial, Replicate, Shard, Spec
    from meshplan.redistribute import Plan, Step

    def convert(p):
        name = type(p).__name__
        if name == "Replicate":
            return Replicate()
        if name == "Partial":
            return Partial(p.reduce_op)
        return Shard(p.dim)

    placements = list(src.placements)
    cur = src
    steps = []
    for info in infos:
        a, b = (convert(p) for p in info.src_dst_placements)
        placements[info.mesh_dim] = b
        # the mesh dim joins the end of its tensor dim's order, as torch's planners do
        order = {d: tuple(o) for d, o in cur.shard_order.items()}
        if isinstance(a, Shard):
            order[a.dim] = tuple(m for m in order[a.dim] if m != info.mesh_dim)
        if isinstance(b, Shard):
            order[b.dim] = order.get(b.dim, ()) + (info.mesh_dim,)
        order = {d: o for d, o in order.items() if o}
        nxt = Spec(src.mesh, placements, src.shape, src.dtype, order)
        kind = _kind(a, b)
        steps.append(Step(info.mesh_dim, cur, nxt, kind))
        cur = nxt
    if cur != dst:  # torch ended in another shard order than the target's default
        return None
    return Plan(src, dst, tuple(steps))


def _kind(a, b):
    from meshplan.placement import Partial, Replicate, Shard

    if isinstance(a, Partial):
        return "all_reduce" if isinstance(b, Replicate) else "reduce_scatter"
    if isinstance(a, Shard):
        if isinstance(b, Replicate):
            return "all_gather"
        if isinstance(b, Shard):
            return "all_to_all"
    return None


def lower_bound_bytes(src, dst) -> int:
    """The most any rank must receive: target elements it lacks (all, if a reduction is due)."""
    from meshplan.placement import Partial, dtype_itemsize, local_intervals

    mesh = src.mesh
    item = dtype_itemsize(src.dtype)
    reduce = any(
        isinstance(a, Partial) and a != b
        for a, b in zip(src.placements, dst.placements, strict=True)
    )
    if dst.is_partial:
        return 0
    worst = 0
    for r in mesh.ranks:
        need = local_intervals(dst, r)
        have = local_intervals(src, r)
        n_need = math.prod(sum(b - a for a, b in ivs) for ivs in need)
        if reduce:
            worst = max(worst, n_need)
            continue
        common = 1
        for h, n in zip(have, need, strict=True):
            common *= sum(max(0, min(b1, b2) - max(a1, a2)) for a1, b1 in h for a2, b2 in n)
        worst = max(worst, n_need - common)
    return worst * item


# -- timing ---------------------------------------------------------------------------------


def timed(fn, repeat: int = 1) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - t0) / repeat
    finally:
        gc.enable()


FEWEST = "collectives"  # plan()'s other objective


def fresh(make, mesh, a, b, shape):
    """A builder of a new (source, target) pair of spec objects (``make``: mp_spec or torch_spec)."""
    return lambda: (make(mesh, a, shape), make(mesh, b, shape))


def first_call(build, fn, clear=True, planner=None) -> float:
    """Seconds of one ``fn(*build())``, the arguments built outside the timer (fresh
    objects: nothing keyed by them is warm); with ``clear``, the plans ``planner`` (the
    default planner when None) remembers are forgotten first (its tables are kept)."""
    from meshplan.redistribute import clear_plan_cache

    args = build()
    if clear:
        if planner is None:
            clear_plan_cache(tables=False)
        else:
            planner.clear(tables=False)
    return timed(lambda: fn(*args))


def table_builds(planner, pairs, model, objective="time") -> list[float]:
    """Build the plan table of each distinct context of ``pairs`` on ``planner`` (none
    when too big), as ``plan()`` would use it; the seconds each took (garbage collection
    off, as for every other time here)."""
    from meshplan.redistribute._engine import _encoding, _table
    from meshplan.redistribute._engine._problem import Problem

    seen = {}
    for src, dst in pairs:
        shards, ptargets = _encoding.universe(src, dst)
        ctx = planner.context(
            Problem(src.mesh, src.shape, src.dtype, model, shards, ptargets, None, objective)
        )
        if ctx not in seen and _table.state_count(ctx) <= _table.MAX_STATES:
            with ctx.lock:
                seen[ctx] = timed(lambda c=ctx: planner.tables.table(c, after=0))
    return list(seen.values())


def run(
    cases_per_mesh: int,
    graph_cases: int,
    seed: int,
    gpus_per_node: int = 8,
    *,
    weights: bool = True,
    activations: int = 40,
    act_warm: int = 64,
    act_graph: int = 4,
) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import _redistribute as R
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meshplan.layout import Mesh
    from meshplan.redistribute import CostModel, Planner, clear_plan_cache, cost, plan

    world = max(math.prod(m) for m in MESHES)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    from meshplan.redistribute import HardwareProfile

    model = CostModel(HardwareProfile.nvlink_ib(gpus_per_node=gpus_per_node))
    rng = random.Random(seed)
    report = {"meshes": []}
    for shape_mesh in MESHES:
        names = tuple("abcd"[: len(shape_mesh)])
        n = math.prod(shape_mesh)
        tmesh = init_device_mesh("cpu", shape_mesh, mesh_dim_names=names)
        mesh = Mesh.create(shape_mesh, names)
        entry = {"mesh": list(shape_mesh), "ranks": n}
        if weights:
            cases = random_cases(rng, len(shape_mesh), cases_per_mesh)
            # other pairs only: a pair planned during warm-up would find its own memo entries
            warm = random_cases(rng, len(shape_mesh), cases_per_mesh, avoid=set(cases))
            mp = [(mp_spec(mesh, a, sh), mp_spec(mesh, b, sh)) for a, b, sh in cases]
            tt = [(torch_spec(tmesh, a, sh), torch_spec(tmesh, b, sh)) for a, b, sh in cases]
            rows = [
                {"src": " ".join(a), "dst": " ".join(b), "shape": list(sh)} for a, b, sh in cases
            ]

            def mp_plan(src, dst, objective="time", planner=None):
                return plan(src, dst, cost_model=model, objective=objective, planner=planner)

            # meshplan, cold: every table cleared before each plan
            for row, (a, b, sh) in zip(rows, cases, strict=True):
                clear_plan_cache()
                row["mp_cold_s"] = first_call(fresh(mp_spec, mesh, a, b, sh), mp_plan)
            # meshplan, in order from a clean start: every pair's first plan, one after another,
            # with nothing planned before (the default rent-or-buy: a context searches its first
            # pairs, then builds its table); every one-time cost is in some pair's time
            clear_plan_cache()
            for row, (a, b, sh) in zip(rows, cases, strict=True):
                row["mp_inorder_s"] = first_call(fresh(mp_spec, mesh, a, b, sh), mp_plan)
            # meshplan, uncached, by search: tables of the context warm from other pairs, but
            # no plan table (what a context's first lazy_pairs pairs cost)
            searching = Planner(tables="off")
            for a, b, sh in warm:
                mp_plan(mp_spec(mesh, a, sh), mp_spec(mesh, b, sh), planner=searching)
            for row, (a, b, sh) in zip(rows, cases, strict=True):
                row["mp_search_s"] = first_call(
                    fresh(mp_spec, mesh, a, b, sh),
                    lambda s, d, p=searching: mp_plan(s, d, planner=p),
                    planner=searching,
                )
            # meshplan, uncached, from each context's plan table (built first on new contexts,
            # timed apart: "table build")
            tabled = Planner(tables="eager")
            builds = table_builds(tabled, mp, model)
            for row, (a, b, sh) in zip(rows, cases, strict=True):
                row["mp_uncached_s"] = first_call(
                    fresh(mp_spec, mesh, a, b, sh),
                    lambda s, d, p=tabled: mp_plan(s, d, planner=p),
                    planner=tabled,
                )
            # meshplan, objective="collectives" (fewest collectives, then least time), tables built
            table_builds(tabled, mp, model, FEWEST)
            for row, (a, b, sh), (src, dst) in zip(rows, cases, mp, strict=True):
                row["mpc_uncached_s"] = first_call(
                    fresh(mp_spec, mesh, a, b, sh),
                    lambda s, d, p=tabled: mp_plan(s, d, FEWEST, p),
                    planner=tabled,
                )
                p = plan(src, dst, cost_model=model, objective=FEWEST, planner=tabled)
                c = cost(p, model)
                row.update(
                    mpc_collectives=len(p.collectives), mpc_bytes=c.bytes, mpc_cost_s=c.total
                )
            for row, (src, dst) in zip(rows, mp, strict=True):
                p = plan(src, dst, cost_model=model)  # cached from here on
                row["mp_cached_s"] = timed(lambda s=src, d=dst: plan(s, d, cost_model=model), 50)
                c = cost(p, model)
                row.update(
                    mp_steps=len(p.steps),
                    mp_collectives=len(p.collectives),
                    mp_bytes=c.bytes,
                    mp_cost_s=c.total,
                    mp_peak=peak_bytes(p),
                    lower_bound_bytes=lower_bound_bytes(src, dst),
                    endpoint_bytes=max(padded_local_bytes(src), padded_local_bytes(dst)),
                )
            # torch greedy, in order from a clean start (its planner objects not cached yet)
            R.clear_redistribute_planner_cache()
            for row, (a, b, sh) in zip(rows, cases, strict=True):
                row["greedy_inorder_s"] = first_call(
                    fresh(torch_spec, tmesh, a, b, sh),
                    lambda x, y: R._gen_transform_infos_non_cached(x, y, False),
                    clear=False,
                )
            # torch: one planner object per (mesh, tensor meta), cached by torch, as in training
            for tsrc, tdst in tt[:2]:
                R._gen_transform_infos_non_cached(tsrc, tdst, False)
            for row, (a, b, sh) in zip(rows, cases, strict=True):
                row["greedy_s"] = first_call(
                    fresh(torch_spec, tmesh, a, b, sh),
                    lambda x, y: R._gen_transform_infos_non_cached(x, y, False),
                    clear=False,
                )
            for row, (tsrc, tdst), (src, dst) in zip(rows, tt, mp, strict=True):
                R._gen_transform_infos(tsrc, tdst, False)
                row["torch_cached_s"] = timed(
                    lambda a=tsrc, b=tdst: R._gen_transform_infos(a, b, False), 50
                )
                infos = R._gen_transform_infos_non_cached(tsrc, tdst, False)
                _add_torch(row, "greedy", infos, src, dst, model, cost)
            for row, (tsrc, tdst), (src, dst), (a, b, sh) in list(
                zip(rows, tt, mp, cases, strict=True)
            )[:graph_cases]:
                row["graph_s"] = first_call(
                    fresh(torch_spec, tmesh, a, b, sh),
                    lambda x, y: R._gen_transform_infos_non_cached(x, y, True),
                    clear=False,
                )
                infos = R._gen_transform_infos_non_cached(tsrc, tdst, True)
                _add_torch(row, "graph", infos, src, dst, model, cost)
            model_run = run_model_cases(mesh, tmesh, model, R)
            strided_run = (
                run_model_cases(mesh, tmesh, model, R, True) if len(shape_mesh) > 1 else None
            )
            entry.update(
                cases=rows,
                table_builds_s=builds,
                model_shapes=model_run,
                model_shapes_strided=strided_run,
            )
            print_mesh(shape_mesh, rows, builds)
            print_model(model_run)
            if strided_run is not None:
                print_model(strided_run, "FSDP2 x TP weights (StridedShard)")
        if activations:
            # a fresh generator per mesh: the same activation pairs whatever else runs
            arng = random.Random(seed * 1000 + len(shape_mesh))
            if not weights:
                print(f"\nmesh {shape_mesh} ({len(shape_mesh)}-D, {n} ranks)")
            for tensor_ndim in (3, 4):
                act = run_activation_cases(
                    mesh, tmesh, model, R, arng, tensor_ndim, activations, act_warm, act_graph
                )
                entry[f"activations_{tensor_ndim}d"] = act
                print_activations(shape_mesh, tensor_ndim, act)
        report["meshes"].append(entry)
    dist.destroy_process_group()
    return report


def run_model_cases(mesh, tmesh, model, R, strided: bool = False) -> dict:
    """:func:`model_cases` planned in order from a clean start by meshplan and by torch's
    greedy planner (each pair's first call, every one-time cost included)."""
    from meshplan.redistribute import _planner, clear_plan_cache, plan

    cases = model_cases(mesh.ndim, strided)
    searched = []
    search = _planner.search

    def counted(*args, **kwargs):
        searched.append(1)
        return search(*args, **kwargs)

    clear_plan_cache()
    _planner.search = counted
    try:
        mp = [
            first_call(fresh(mp_spec, mesh, a, b, sh), lambda x, y: plan(x, y, cost_model=model))
            for a, b, sh in cases
        ]
    finally:
        _planner.search = search
    R.clear_redistribute_planner_cache()
    greedy = [
        first_call(
            fresh(torch_spec, tmesh, a, b, sh),
            lambda x, y: R._gen_transform_infos_non_cached(x, y, False),
            clear=False,
        )
        for a, b, sh in cases
    ]
    return {
        "plans": len(cases),
        "shapes": len({sh for _, _, sh in cases}),
        "searched": len(searched),
        "mp_s": mp,
        "greedy_s": greedy,
    }


def print_model(run, what: str = "model weights") -> None:
    mp, greedy = statistics.fmean(run["mp_s"]) * 1e6, statistics.fmean(run["greedy_s"]) * 1e6
    print(
        f"  {what}, in order from a clean start ({run['shapes']} shapes, "
        f"{run['plans']} plans; meshplan searched {run['searched']}, the others shared "
        f"across sizes or tabled): meshplan {mp:.1f} us/plan, greedy {greedy:.1f} "
        f"(mp/greedy {mp / greedy:.2f})"
    )


def _add_torch(row, name, infos, src, dst, model, cost):
    comm = [i for i in infos if _kind_of(i) is not None]
    row[f"{name}_steps"] = len(infos)
    row[f"{name}_collectives"] = len(comm)
    p = torch_steps_as_plan(infos, src, dst)
    if p is not None:
        c = cost(p, model)
        row[f"{name}_bytes"] = c.bytes
        row[f"{name}_cost_s"] = c.total
        row[f"{name}_peak"] = peak_bytes(p)


def peak_bytes(p) -> int:
    """The plan's peak local memory per rank: the largest step's padded input plus output."""
    return max((padded_local_bytes(s.src) + padded_local_bytes(s.dst) for s in p.steps), default=0)


def _kind_of(info):
    return info._comm_type_key()


# -- report ---------------------------------------------------------------------------------


def _mean(rows, key):
    vals = [r[key] for r in rows if key in r]
    return statistics.fmean(vals) if vals else float("nan")


def _median(rows, key):
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def summarize(rows) -> dict:
    priced = [r for r in rows if "greedy_bytes" in r]
    sub = [r for r in rows if "graph_s" in r]
    return {
        "graph_subset_mp_uncached_us": _mean(sub, "mp_uncached_s") * 1e6,
        "graph_subset_mp_collectives": _mean(sub, "mp_collectives"),
        "graph_subset_mp_bytes": _mean(sub, "mp_bytes"),
        "graph_subset_mp_cost_us": _mean(sub, "mp_cost_s") * 1e6,
        "cases": len(rows),
        "graph_cases": sum("graph_s" in r for r in rows),
        "mp_uncached_us": _mean(rows, "mp_uncached_s") * 1e6,
        "mp_uncached_median_us": _median(rows, "mp_uncached_s") * 1e6,
        "mp_search_us": _mean(rows, "mp_search_s") * 1e6,
        "mp_search_median_us": _median(rows, "mp_search_s") * 1e6,
        "mp_cold_us": _mean(rows, "mp_cold_s") * 1e6,
        "mp_inorder_us": _mean(rows, "mp_inorder_s") * 1e6,
        "greedy_inorder_us": _mean(rows, "greedy_inorder_s") * 1e6,
        "mp_cached_us": _mean(rows, "mp_cached_s") * 1e6,
        "greedy_us": _mean(rows, "greedy_s") * 1e6,
        "greedy_median_us": _median(rows, "greedy_s") * 1e6,
        "graph_us": _mean(rows, "graph_s") * 1e6,
        "torch_cached_us": _mean(rows, "torch_cached_s") * 1e6,
        "mp_steps": _mean(rows, "mp_steps"),
        "greedy_steps": _mean(rows, "greedy_steps"),
        "graph_steps": _mean(rows, "graph_steps"),
        "mp_collectives": _mean(rows, "mp_collectives"),
        "greedy_collectives": _mean(rows, "greedy_collectives"),
        "graph_collectives": _mean(rows, "graph_collectives"),
        "mp_bytes": _mean(rows, "mp_bytes"),
        "greedy_bytes": _mean(priced, "greedy_bytes"),
        "graph_bytes": _mean(rows, "graph_bytes"),
        "lower_bound_bytes": _mean(rows, "lower_bound_bytes"),
        "mp_cost_us": _mean(rows, "mp_cost_s") * 1e6,
        "greedy_cost_us": _mean(priced, "greedy_cost_s") * 1e6,
        "graph_cost_us": _mean(rows, "graph_cost_s") * 1e6,
        "more_collectives_than_greedy": sum(
            r["mp_collectives"] > r["greedy_collectives"] for r in rows
        ),
        "more_bytes_than_greedy": sum(r["mp_bytes"] > r["greedy_bytes"] for r in priced),
        "more_and_cheaper": sum(
            (r["mp_collectives"] > r["greedy_collectives"] or r["mp_bytes"] > r["greedy_bytes"])
            and r["mp_cost_s"] < r["greedy_cost_s"]
            for r in priced
        ),
        "costlier_than_greedy": sum(
            r["mp_cost_s"] > r["greedy_cost_s"] * (1 + 1e-9) for r in priced
        ),
        "greedy_priced": len(priced),
        "mp_peak": _mean(rows, "mp_peak"),
        "greedy_peak": _mean(priced, "greedy_peak"),
        "graph_peak": _mean(rows, "graph_peak"),
        "more_peak_than_greedy": sum(r["mp_peak"] > r["greedy_peak"] for r in priced),
        "less_peak_than_greedy": sum(r["mp_peak"] < r["greedy_peak"] for r in priced),
        "mp_peak_over_2x": sum(r["mp_peak"] > 2 * r["endpoint_bytes"] for r in rows),
        "greedy_peak_over_2x": sum(r["greedy_peak"] > 2 * r["endpoint_bytes"] for r in priced),
        "fewest_uncached_us": _mean(rows, "mpc_uncached_s") * 1e6,
        "fewest_collectives": _mean(rows, "mpc_collectives"),
        "fewest_bytes": _mean(rows, "mpc_bytes"),
        "fewest_cost_us": _mean(rows, "mpc_cost_s") * 1e6,
        "fewest_more_collectives_than_greedy": sum(
            r["mpc_collectives"] > r["greedy_collectives"] for r in rows
        ),
        "fewest_more_bytes_than_greedy": sum(r["mpc_bytes"] > r["greedy_bytes"] for r in priced),
        "fewest_costlier_than_greedy": sum(
            r["mpc_cost_s"] > r["greedy_cost_s"] * (1 + 1e-9) for r in priced
        ),
    }


def print_mesh(shape_mesh, rows, builds) -> None:
    s = summarize(rows)
    print(
        f"\nmesh {shape_mesh} ({len(shape_mesh)}-D, {math.prod(shape_mesh)} ranks), "
        f"{s['cases']} cases (torch graph on {s['graph_cases']})"
    )
    print(f"  {'':22}{'meshplan':>12}{'greedy':>12}{'graph':>12}{'mp/greedy':>11}{'graph/mp':>10}")
    print(
        f"  {'time/plan uncached us':22}{s['mp_uncached_us']:12.1f}{s['greedy_us']:12.1f}"
        f"{s['graph_us']:12.1f}{s['mp_uncached_us'] / s['greedy_us']:11.2f}"
        f"{s['graph_us'] / s['graph_subset_mp_uncached_us']:10.0f}"
    )
    print(
        f"  {'  (median) us':22}{s['mp_uncached_median_us']:12.1f}"
        f"{s['greedy_median_us']:12.1f}{'':12}"
        f"{s['mp_uncached_median_us'] / s['greedy_median_us']:11.2f}"
    )
    print(
        f"  {'  by search us':22}{s['mp_search_us']:12.1f}{'':24}"
        f"{s['mp_search_us'] / s['greedy_us']:11.2f}"
        f"{s['graph_us'] / _mean([r for r in rows if 'graph_s' in r], 'mp_search_s') / 1e6:10.0f}"
    )
    print(
        f"  {'    (median) us':22}{s['mp_search_median_us']:12.1f}{'':24}"
        f"{s['mp_search_median_us'] / s['greedy_median_us']:11.2f}"
    )
    if builds:
        print(
            f"  {'  table build ms':22}{1e3 * statistics.fmean(builds):12.1f}"
            f"   ({len(builds)} contexts, max {1e3 * max(builds):.1f} ms, once per context)"
        )
    print(
        f"  {'  cold tables us':22}{s['mp_cold_us']:12.1f}{'':24}"
        f"{s['mp_cold_us'] / s['greedy_us']:11.2f}"
    )
    print(
        f"  {'  in order, clean us':22}{s['mp_inorder_us']:12.1f}{s['greedy_inorder_us']:12.1f}"
        f"{'':12}{s['mp_inorder_us'] / s['greedy_inorder_us']:11.2f}"
        "   (every pair in turn from a clean start, one-time costs included)"
    )
    print(f"  {'time/plan cached us':22}{s['mp_cached_us']:12.2f}{s['torch_cached_us']:12.2f}")
    print(f"  {'steps':22}{s['mp_steps']:12.2f}{s['greedy_steps']:12.2f}{s['graph_steps']:12.2f}")
    print(
        f"  {'collectives':22}{s['mp_collectives']:12.2f}{s['greedy_collectives']:12.2f}"
        f"{s['graph_collectives']:12.2f}"
    )
    print(
        f"  {'KiB/rank received':22}{s['mp_bytes'] / 1024:12.1f}{s['greedy_bytes'] / 1024:12.1f}"
        f"{s['graph_bytes'] / 1024:12.1f}{s['mp_bytes'] / max(s['greedy_bytes'], 1):11.2f}"
    )
    print(
        f"  {'  lower bound KiB':22}{s['lower_bound_bytes'] / 1024:12.1f}"
        f"   (meshplan / bound: {s['mp_bytes'] / max(s['lower_bound_bytes'], 1):.2f})"
    )
    print(
        f"  {'model cost us':22}{s['mp_cost_us']:12.1f}{s['greedy_cost_us']:12.1f}"
        f"{s['graph_cost_us']:12.1f}{s['mp_cost_us'] / s['greedy_cost_us']:11.2f}"
    )
    print(
        f"  {'peak KiB/rank':22}{s['mp_peak'] / 1024:12.1f}{s['greedy_peak'] / 1024:12.1f}"
        f"{s['graph_peak'] / 1024:12.1f}{s['mp_peak'] / max(s['greedy_peak'], 1):11.2f}"
        f"   (a step's padded input + output, largest step)"
    )
    print(
        f"    peak above greedy's in {s['more_peak_than_greedy']} cases, below in "
        f"{s['less_peak_than_greedy']}; above twice the larger end's local size: meshplan "
        f"{s['mp_peak_over_2x']}, greedy {s['greedy_peak_over_2x']}"
    )
    print(
        f"  on the {s['graph_cases']} graph cases: meshplan {s['graph_subset_mp_collectives']:.2f} "
        f"collectives, {s['graph_subset_mp_bytes'] / 1024:.1f} KiB, cost "
        f"{s['graph_subset_mp_cost_us']:.1f} us (graph: {s['graph_collectives']:.2f}, "
        f"{s['graph_bytes'] / 1024:.1f} KiB, {s['graph_cost_us']:.1f} us)"
    )
    print(
        f"  cases where meshplan uses more collectives than greedy: "
        f"{s['more_collectives_than_greedy']}, more bytes: {s['more_bytes_than_greedy']}, "
        f"costs more: {s['costlier_than_greedy']} (of {s['greedy_priced']} priced)"
    )
    print(
        f"    of the cases with more collectives or bytes, cheaper under the cost model: "
        f"{s['more_and_cheaper']} (an extra launch buys fewer bytes, or fewer on the slower link)"
    )
    print(
        f"  objective='collectives': {s['fewest_uncached_us']:.1f} us/plan uncached, "
        f"{s['fewest_collectives']:.2f} collectives, {s['fewest_bytes'] / 1024:.1f} KiB, cost "
        f"{s['fewest_cost_us']:.1f} us; more collectives than greedy: "
        f"{s['fewest_more_collectives_than_greedy']}, more bytes: "
        f"{s['fewest_more_bytes_than_greedy']}, costs more: {s['fewest_costlier_than_greedy']}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=120, help="random pairs per mesh")
    parser.add_argument("--graph-cases", type=int, default=12, help="of which torch graph")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="cost model: nvlink_ib with this many ranks per node (16: one node, uniform links)",
    )
    parser.add_argument(
        "--activations",
        type=int,
        default=40,
        help="random pairs per mesh of 3-D and of 4-D activations (0: none)",
    )
    parser.add_argument(
        "--meshes",
        default=",".join("x".join(map(str, m)) for m in MESHES),
        help="meshes to run, e.g. 2x2x2,2x2x2x2",
    )
    parser.add_argument("--act-warm", type=int, default=64, help="pairs a context plans first")
    parser.add_argument("--act-graph", type=int, default=4, help="activation pairs for torch graph")
    parser.add_argument(
        "--no-weights", action="store_true", help="only the activations (3-D and 4-D tensors)"
    )
    parser.add_argument("--out", default=None, help="write the JSON results here instead")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)  # torch warns about unflattened meshes
    warnings.simplefilter("ignore")
    MESHES[:] = [tuple(int(n) for n in m.split("x")) for m in args.meshes.split(",")]
    report = run(
        args.cases,
        args.graph_cases,
        args.seed,
        args.gpus_per_node,
        weights=not args.no_weights,
        activations=args.activations,
        act_warm=args.act_warm,
        act_graph=args.act_graph,
    )
    report["gpus_per_node"] = args.gpus_per_node
    report["summary"] = {
        f"{len(m['mesh'])}-D": summarize(m["cases"]) for m in report["meshes"] if "cases" in m
    }
    report["summary_activations"] = {
        f"{len(m['mesh'])}-D mesh, {k[-2:]} tensors": summarize_activations(m[k])
        for m in report["meshes"]
        for k in ("activations_3d", "activations_4d")
        if k in m
    }
    report["env"] = {"python": sys.version.split()[0], "platform": platform.platform()}
    out = RESULTS
    if args.no_weights:
        out = out.with_name("plan_speed_activations.json")
    if args.gpus_per_node != 8:
        out = RESULTS.with_name(f"plan_speed_{args.gpus_per_node}gpn.json")
    if args.out is not None:
        out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")
    print_worst(report)
    return 0


def print_worst(report: dict) -> None:
    """The last lines: the worst ratio of each target over every mesh (new pairs in a warm
    context vs torch's greedy: target <= 1; a context's first pairs vs torch's graph
    planner: target >= 100x faster), with the load average they were measured at."""
    acts = report.get("summary_activations", {})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if acts:
        new = max(acts.items(), key=lambda kv: kv[1]["new_over_greedy"])
        first = min(acts.items(), key=lambda kv: kv[1]["graph_over_first"])
        print(
            f"worst new pair in a warm context vs torch greedy: {new[1]['new_over_greedy']:.2f}x "
            f"slower ({new[0]}; target <= 1x; load average {load:.1f})"
        )
        print(
            f"worst first pair of a context vs torch graph planner: "
            f"{first[1]['graph_over_first']:.1f}x faster ({first[0]}; target >= 100x)"
        )


if __name__ == "__main__":
    sys.exit(main())

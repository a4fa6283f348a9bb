"""Bucketed, overlapped collectives: the launch schedule (pure) and its runs on gloo.

A bucket merges moves of one kind on one group into one collective; it must give every
rank exactly what ``run`` gives for each move alone (bit for bit, float64), start no
move before its input exists nor after its first reader, and start the same launches on
every rank. ``run_program`` with buckets and early starts must give the loss and
gradients of the run without them, bit for bit, and of one process.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from _shell_cases import groups_for
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "strategy"))
from _program_cases import arg_specs, build, meshes, programs  # noqa: E402

from meshplan.errors import RuntimeShellError  # noqa: E402
from meshplan.layout import Mesh  # noqa: E402
from meshplan.placement import Partial, Replicate, Shard, Spec, shard, unshard  # noqa: E402
from meshplan.redistribute import plan  # noqa: E402
from meshplan.runtime import run_program, simulate_program  # noqa: E402
from meshplan.runtime._overlap import (  # noqa: E402
    GATHER_OPS,
    SEGMENT_BYTES,
    Launch,
    launches,
    releases,
    saved_for_backward,
    wire_bytes,
)
from meshplan.strategy import ComputeModel, plan_program  # noqa: E402

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
MODES = {  # (bucket_bytes, prefetch): unbucketed and started where read, then the others
    "plain": (0, 0),
    "buckets": (25 * 2**20, 0),
    "early": (0, None),
    "both": (25 * 2**20, None),
    "small buckets": (64, 2),
}


def _exp_prod(p, q, r):
    return (p.exp() * q.exp() + r.sin()).sum()


def _fsdp_like(x, a, b, c):
    return (torch.tanh(x * a + b) * c).sum()


@functools.cache
def _partial_program(shape=(2, 2)):
    """Three partial-sum arguments reduced before a non-linear op: one bucket of three."""
    mesh = Mesh.create(shape)
    p = Spec(mesh, [Partial()] + [Shard(0)] * (len(shape) - 1), (8, 6), "float64")
    return plan_program(_exp_prod, p, p, p, compute=ComputeModel.cpu())


def _random_program(data, world):
    mesh = data.draw(meshes(world), label="mesh")
    desc = data.draw(programs(), label="program")
    n = data.draw(st.integers(1, 9), label="rows")
    d = data.draw(st.integers(1, 5), label="width")
    specs = data.draw(arg_specs(mesh, n, d, 2), label="specs")
    fn = build(desc, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_program(fn, *specs, compute=ComputeModel.cpu()), fn


# -- the schedule (pure) -------------------------------------------------------------------


def _check_schedule(prog, bucket_bytes, prefetch):
    for phase, ops in (("forward", prog.forward_ops), ("backward", prog.backward_ops)):
        made = {}
        for i, op in enumerate(ops):
            for j in range(len(op.output_specs)):
                made[(op.node, j)] = i + 1
        first = {}
        reads = [(i, zip(op.inputs, op.moves, strict=True)) for i, op in enumerate(ops)]
        tail = (
            zip(prog.graph.outputs, prog.out_moves, strict=True)
            if phase == "forward"
            else zip(prog.graph.grads, prog.grad_moves, strict=True)
        )
        reads.append((len(ops), tail))
        for i, pairs in reads:
            for v, p in pairs:
                if p is not None and v is not None:
                    first.setdefault((v, p.dst), i)
        seen = set()
        sched = launches(prog, phase, bucket_bytes=bucket_bytes, prefetch=prefetch)
        assert len(sched) == len(ops) + 1
        for i, starts in enumerate(sched):
            for launch in starts:
                size = sum(wire_bytes(p.src) for _, p in launch.moves)
                assert len(launch.moves) == 1 or size <= bucket_bytes, launch
                step = launch.moves[0][1].steps[0]
                n = 1
                for m in step.mesh_dims:
                    n *= step.src.mesh.shape[m]
                if launch.kind != "all_gather" and n > 2 and len(launch.moves) > 1:
                    assert size <= n * SEGMENT_BYTES, launch  # gloo splits it alike
                for key, p in launch.moves:
                    assert key not in seen, "a move started twice"
                    seen.add(key)
                    assert len(p.steps) == 1 and p.steps[0].collective == launch.kind
                    assert made.get((key[0].node, key[0].index), 0) <= i, "started before its input"
                    assert i <= first[key], "started after its first reader"
                    ready = made.get((key[0].node, key[0].index), 0)
                    start = ready if prefetch is None else max(ready, first[key] - prefetch)
                    assert abs(i - start) <= GATHER_OPS, "moved too far to share a bucket"
                    if prefetch == 0 and len(launch.moves) == 1:
                        assert i == first[key]


def _check_releases(prog):
    saved = saved_for_backward(prog)
    backward_reads = {v for op in prog.backward_ops for v in op.inputs}
    backward_reads |= {v for v in prog.graph.grads if v is not None}
    assert saved == backward_reads
    for phase, ops in (("forward", prog.forward_ops), ("backward", prog.backward_ops)):
        tail = set(prog.graph.outputs if phase == "forward" else prog.graph.grads)
        dropped = releases(prog, phase)
        assert len(dropped) == len(ops)
        for i, values in enumerate(dropped):
            for v in values:
                assert v not in tail, "dropped before the final reads"
                assert all(v not in op.inputs for op in ops[i + 1 :]), "dropped, then read"
                assert phase == "backward" or v not in saved, "dropped, but the backward reads it"


@settings(max_examples=min(settings.default.max_examples, 10), phases=NO_SHRINK, deadline=None)
@given(data=st.data())
def test_a_value_is_dropped_only_after_its_last_reader(data):
    _check_releases(_random_program(data, None)[0])


@settings(max_examples=min(settings.default.max_examples, 10), phases=NO_SHRINK, deadline=None)
@given(
    data=st.data(),
    bucket_bytes=st.sampled_from([0, 64, 2**20]),
    prefetch=st.sampled_from([0, 1, 3, None]),
)
def test_every_launch_starts_after_its_input_and_by_its_first_reader(data, bucket_bytes, prefetch):
    _check_schedule(_random_program(data, None)[0], bucket_bytes, prefetch)


@pytest.mark.parametrize("bucket_bytes,prefetch", [(0, 0), (2**20, 0), (2**20, 4), (2**20, None)])
def test_a_transformers_launches_keep_every_rule(bucket_bytes, prefetch):
    from _program_cases import planned_transformer

    prog = planned_transformer((2, 2))[2]
    _check_schedule(prog, bucket_bytes, prefetch)
    _check_releases(prog)


def test_partial_sums_reduced_at_one_point_share_one_bucket_up_to_the_cap():
    prog = _partial_program()
    assert [len(x.moves) for x in launches(prog, "forward")[0]] == [3]
    assert [len(x.moves) for x in launches(prog, "forward", bucket_bytes=0)[0]] == [1, 1, 1]
    one = wire_bytes(prog.arg_specs[0])
    assert [len(x.moves) for x in launches(prog, "forward", bucket_bytes=2 * one)[0]] == [2, 1]
    _check_schedule(prog, 2 * one, None)


@pytest.mark.parametrize("bad", [{"bucket_bytes": -1}, {"bucket_bytes": 1.5}, {"prefetch": -2}])
def test_bad_bucket_options_are_refused_naming_the_value(bad):
    with pytest.raises(RuntimeShellError, match=str(next(iter(bad.values())))):
        run_program(_partial_program(), None, **bad)


def test_the_simulator_gives_the_same_values_with_its_single_pass_schedule():
    prog = _partial_program()
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn(8, 6, generator=g, dtype=torch.float64) for _ in range(3)]
    locals_ = [shard(t, s) for t, s in zip(tensors, prog.arg_specs, strict=True)]
    (loss,), grads = simulate_program(prog, *locals_)
    leaves = [t.clone().requires_grad_() for t in tensors]
    want = _exp_prod(*leaves)
    want.backward()
    assert torch.allclose(loss[0], want.detach(), rtol=1e-12)
    for got, leaf, spec in zip(grads, leaves, prog.grad_specs, strict=True):
        assert torch.allclose(unshard(got, spec), leaf.grad, rtol=1e-12)


# -- one bucket on gloo against run() --------------------------------------------------------

_KINDS = {
    "all_reduce": (Partial(), Replicate()),
    "reduce_scatter": (Partial(), Shard(0)),
    "all_gather": (Shard(0), Replicate()),
}


def _bucket_vs_run(plans, locals_, side_by_side=False):
    import meshplan.runtime._buckets as B
    from meshplan.runtime._run import run

    start = B.start
    if side_by_side:  # the path of backends with a true reduce_scatter (NCCL)
        by_all_reduce = B._reduce_scatters_by_all_reduce
        B._reduce_scatters_by_all_reduce = lambda group: False
        try:
            return _bucket_vs_run(plans, locals_)
        finally:
            B._reduce_scatters_by_all_reduce = by_all_reduce

    rank = dist.get_rank()
    groups = groups_for(plans[0].src.mesh)
    mine = [loc[rank] for loc in locals_]
    alone = [run(p, t, groups) for p, t in zip(plans, mine, strict=True)]
    step = plans[0].steps[0]
    launch = Launch(
        step.collective,
        tuple(step.mesh_dims),
        None if step.collective == "all_gather" else "sum",
        plans[0].src.dtype,
        tuple(((None, p.dst), p) for p in plans),
    )
    together = start(launch, mine, groups).wait()
    return alone, together


def _bucket_case(world, kind, m, shapes, seed):
    mesh = Mesh.create((2, world // 2))
    src_p, dst_p = _KINDS[kind]
    g = torch.Generator().manual_seed(seed)
    plans, locals_ = [], []
    for shape in shapes:
        pl = [Replicate(), Replicate()]
        src = Spec(mesh, [src_p if d == m else p for d, p in enumerate(pl)], shape, "float64")
        dst = Spec(mesh, [dst_p if d == m else p for d, p in enumerate(pl)], shape, "float64")
        p = plan(src, dst)
        assert [s.collective for s in p.steps] == [kind], p
        plans.append(p)
        if isinstance(src_p, Partial):
            locals_.append(
                {r: torch.randn(shape, generator=g, dtype=torch.float64) for r in range(world)}
            )
        else:
            locals_.append(shard(torch.randn(shape, generator=g, dtype=torch.float64), src))
    return plans, locals_


def _check_bucket(pool, plans, locals_):
    kind = plans[0].steps[0].collective
    for rank, (alone, together) in enumerate(pool.run(_bucket_vs_run, plans, locals_)):
        for a, b in zip(alone, together, strict=True):
            assert a.shape == b.shape and torch.equal(a, b), (rank, kind, a, b)


@pytest.mark.parametrize("kind", sorted(_KINDS))
@settings(max_examples=min(settings.default.max_examples, 4), phases=NO_SHRINK, deadline=None)
@given(data=st.data())
def test_a_bucket_gives_every_rank_exactly_what_run_gives_each_move(pool, kind, data):
    # on world 8 mesh dim 1 groups 4 ranks: their sums depend on the order
    m = data.draw(st.integers(0, 1), label="mesh dim")
    shapes = data.draw(
        st.lists(st.tuples(st.integers(1, 9), st.integers(1, 3)), min_size=1, max_size=4),
        label="shapes",  # uneven, some shards empty
    )
    seed = data.draw(st.integers(0, 2**16), label="seed")
    _check_bucket(pool, *_bucket_case(pool.world_size, kind, m, shapes, seed))


@pytest.mark.parametrize("m", [0, 1])
def test_a_reduce_scatter_bucket_side_by_side_gives_run_s_values(pool8, m):
    # NCCL's path, run on gloo: exact over two ranks (sums of two do not depend on the
    # order), within rounding over four
    plans, locals_ = _bucket_case(8, "reduce_scatter", m, [(5, 3), (8, 2), (1, 1), (9, 3)], 3)
    for rank, (alone, together) in enumerate(pool8.run(_bucket_vs_run, plans, locals_, True)):
        for a, b in zip(alone, together, strict=True):
            if m == 0:
                assert torch.equal(a, b), (rank, a, b)
            else:
                assert torch.allclose(a, b, rtol=1e-14, atol=1e-14), (rank, a, b)


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_a_bucket_as_large_as_gloo_segments_allow_stays_exact(pool8, kind):
    # four 1 MiB partial sums over 4 ranks: the most one reduction bucket holds there
    plans, locals_ = _bucket_case(8, kind, 1, [(512, 256)] * 4, 7)
    launch = launches_of(plans)
    assert [len(x.moves) for x in launch] == [4]
    _check_bucket(pool8, plans, locals_)


def launches_of(plans):
    """The launches the schedule makes of moves all ready at once."""
    from meshplan.runtime._overlap import _launch_kind, _room

    kind = _launch_kind(plans[0])
    room = _room(plans[0], kind, 25 * 2**20)
    out, size = [[]], 0
    for p in plans:
        if out[-1] and size + wire_bytes(p.src) > room:
            out.append([])
            size = 0
        out[-1].append(p)
        size += wire_bytes(p.src)
    return [Launch(*kind, moves=tuple(((None, q.dst), q) for q in group)) for group in out]


# -- run_program: every mode gives the same bits, and one process's values ------------------


def _modes_step(cases):
    rank = dist.get_rank()
    out = []
    for prog, locals_ in cases:
        groups = groups_for(prog.arg_specs[0].mesh)
        per_mode = {}
        for name, (bucket_bytes, prefetch) in MODES.items():
            xs = [
                loc[rank].clone().requires_grad_(g is not None)
                for loc, g in zip(locals_, prog.grad_specs, strict=True)
            ]
            loss = run_program(prog, groups, *xs, bucket_bytes=bucket_bytes, prefetch=prefetch)
            loss.backward()
            per_mode[name] = (loss.detach(), [x.grad for x in xs])
        out.append(per_mode)
    return out


def _compare_modes(pool, cases):
    shipped = [
        (prog, [shard(t, s) for t, s in zip(tensors, prog.arg_specs, strict=True)])
        for prog, _, tensors in cases
    ]
    results = pool.run(_modes_step, shipped)
    for i, (prog, fn, tensors) in enumerate(cases):
        leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
        want = fn(*leaves)
        want.backward()
        for per_rank in results:
            plain_loss, plain_grads = per_rank[i]["plain"]
            assert torch.allclose(plain_loss, want.detach(), rtol=1e-10, atol=1e-12)
            for name, (loss, grads) in per_rank[i].items():
                assert torch.equal(loss, plain_loss), (name, loss, plain_loss)
                for a, b in zip(grads, plain_grads, strict=True):
                    assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
        for a, (leaf, spec) in enumerate(zip(leaves, prog.grad_specs, strict=True)):
            if spec is not None:
                got = unshard({r: res[i]["plain"][1][a] for r, res in enumerate(results)}, spec)
                assert torch.allclose(got, leaf.grad, rtol=1e-10, atol=1e-10), (a, spec)


@settings(max_examples=min(settings.default.max_examples, 5), phases=NO_SHRINK, deadline=None)
@given(data=st.data())
def test_random_programs_give_the_same_bits_bucketed_early_or_neither(pool, data):
    cases = []
    for k in range(3):
        prog, fn = _random_program(data, pool.world_size)
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label=f"seed{k}"))
        tensors = [torch.randn(s.shape, generator=g, dtype=torch.float64) for s in prog.arg_specs]
        cases.append((prog, fn, tensors))
    _compare_modes(pool, cases)


def test_a_transformer_gives_the_same_bits_bucketed_early_or_neither(pool4):
    from _program_cases import planned_transformer, transformer

    tensors, _, prog = planned_transformer((2, 2))
    _compare_modes(pool4, [(prog, transformer, tensors)])


def test_partial_sums_bucketed_give_the_same_bits(pool4):
    g = torch.Generator().manual_seed(2)
    tensors = [torch.randn(8, 6, generator=g, dtype=torch.float64) for _ in range(3)]
    _compare_modes(pool4, [(_partial_program(), _exp_prod, tensors)])


# -- fewer collectives per step ----------------------------------------------------------------


def _count_collectives(prog, locals_, bucket_bytes):
    """The torch.distributed collectives one run_program step issues on this rank."""
    rank = dist.get_rank()
    groups = groups_for(prog.arg_specs[0].mesh)
    calls = collections.Counter()
    names = ("all_reduce", "reduce_scatter_single", "all_gather_single", "all_to_all_single")
    saved = {n: getattr(dist, n) for n in names}

    def counting(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return saved[name](*args, **kwargs)

        return call

    xs = [loc[rank].clone().requires_grad_() for loc in locals_]
    run_program(prog, groups, *xs, bucket_bytes=bucket_bytes)  # warm: plans agreed on
    try:
        for n in names:
            setattr(dist, n, counting(n))
        loss = run_program(prog, groups, *xs, bucket_bytes=bucket_bytes)
        loss.backward()
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
    return dict(calls)


def test_buckets_issue_fewer_collectives_per_step(pool4):
    prog = _partial_program()
    g = torch.Generator().manual_seed(3)
    locals_ = [
        shard(torch.randn(8, 6, generator=g, dtype=torch.float64), s) for s in prog.arg_specs
    ]
    alone = pool4.run(_count_collectives, prog, locals_, 0)
    together = pool4.run(_count_collectives, prog, locals_, 2**20)
    for a, b in zip(alone, together, strict=True):
        # the three arguments' all_reduces (and any others) merged: at least two fewer
        assert a["all_reduce"] >= b["all_reduce"] + 2, (a, b)


# -- what the forward keeps for the backward -----------------------------------------------------


def _chain(x):
    return (x.exp() * 3).sin().cos().sum()


def _saved_bytes(prog, locals_):
    rank = dist.get_rank()
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    x = locals_[0][rank].clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run_program(prog, groups_for(prog.arg_specs[0].mesh), x)
    loss.backward()
    return sum(saved), x.grad


def test_the_forward_keeps_only_what_the_backward_reads(pool4):
    mesh = Mesh.create((4,))
    spec = Spec(mesh, [Shard(0)], (64, 8), "float64")
    prog = plan_program(_chain, spec, compute=ComputeModel.cpu())
    x = torch.randn(64, 8, dtype=torch.float64)
    results = pool4.run(_saved_bytes, prog, [shard(x, spec)])
    local = 16 * 8 * 8  # one local (16, 8) float64 tensor
    forward_values = sum(len(op.output_specs) for op in prog.forward_ops) + 1
    needed = len(saved_for_backward(prog))
    assert needed < forward_values
    for saved, _ in results:
        assert saved <= needed * local < forward_values * local, (saved, prog.explain())
    leaf = x.clone().requires_grad_()
    _chain(leaf).backward()
    got = unshard({r: g for r, (_, g) in enumerate(results)}, prog.grad_specs[0])
    assert torch.allclose(got, leaf.grad, rtol=1e-12)


def _options_by_rank(prog, locals_):
    rank = dist.get_rank()
    x = locals_[0][rank].clone().requires_grad_()
    try:
        run_program(prog, groups_for(prog.arg_specs[0].mesh), x, bucket_bytes=rank)
    except RuntimeShellError as e:
        return str(e)
    return None


def test_ranks_passing_different_bucket_options_all_stop_before_any_collective(pool4):
    # different options start different collectives: a hang or garbled data if run
    mesh = Mesh.create((4,))
    spec = Spec(mesh, [Shard(0)], (8, 4), "float64")
    prog = plan_program(_chain, spec, compute=ComputeModel.cpu())
    errors = pool4.run(_options_by_rank, prog, [shard(torch.ones(8, 4, dtype=torch.float64), spec)])
    assert all(e is not None and "different program" in e for e in errors), errors

"""run() on real gloo processes: every rank gets exactly the simulator's local tensor.

Cases are drawn in the parent in batches (meshes of 1-3 dims over all or half of a 4-
or 8-rank world, identity and permuted rank maps, aliases, uneven and empty shapes,
shard orders, StridedShard, Partial of every op, several dtypes) and each batch runs in
one pool task. The oracle is :func:`meshplan.redistribute.simulate` (and, for
unpartial specs, ``shard`` of the global value). The same cases run through torch 2.13
DTensor in the workers where torch can express them; the outcomes are tallied and
torch must agree wherever it is not known to be wrong.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from _shell_cases import (
    GROUP_TIMEOUT,
    contiguous_strides,
    groups_for,
    make_locals,
    run_here,
    same,
    spec_pairs,
    world_meshes,
)
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    shard,
    to_torch,
    unshard,
)
from meshplan.redistribute import Plan, Step, plan, simulate
from meshplan.runtime._run import run

BATCH = 16

# A batch prints its failing case in full; shrinking a batch of 16 would rerun it for minutes.
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]

# -- tasks (run on every rank) ------------------------------------------------------------


def _run_batch(cases):
    return [run_here(p, locals_) for p, locals_ in cases]


_DEVICE_MESHES: dict = {}


def _device_mesh(mesh: Mesh):
    from torch.distributed.device_mesh import DeviceMesh

    if mesh not in _DEVICE_MESHES:
        ranks = torch.tensor(list(mesh.ranks)).reshape(mesh.shape)
        _DEVICE_MESHES[mesh] = DeviceMesh("cpu", ranks, mesh_dim_names=mesh.names)
    return _DEVICE_MESHES[mesh]


def _torch_redistribute(src: Spec, dst: Spec, local: torch.Tensor):
    """torch 2.13's DTensor.redistribute of this rank's local tensor: ("ok", local) or
    ("raised", message)."""
    from torch.distributed.tensor import DTensor

    dm = _device_mesh(src.mesh)
    d = DTensor.from_local(
        local,
        dm,
        to_torch(src),
        run_check=False,
        shape=torch.Size(src.shape),
        stride=contiguous_strides(src.shape),
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = d.redistribute(dm, to_torch(dst)).to_local()
    except Exception as exc:  # torch refuses: tallied by the parent
        return ("raised", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}")
    return ("ok", out.contiguous())


def _torch_batch(cases):
    rank = dist.get_rank()
    out = []
    for p, locals_ in cases:
        mine = run_here(p, locals_)
        theirs = _torch_redistribute(p.src, p.dst, locals_[rank])
        out.append((mine, theirs))
    return out


# -- the law: run == simulate -------------------------------------------------------------


def _check_against_simulator(cases, results):
    for i, (p, locals_) in enumerate(cases):
        expected = simulate(p, locals_)
        truth = None
        if not p.src.is_partial and not p.dst.is_partial:
            truth = shard(unshard(locals_, p.src), p.dst)
        for rank, per_rank in enumerate(results):
            got = per_rank[i]
            if rank not in expected:
                assert got is None
                continue
            out, contiguous = got
            assert contiguous, (rank, p)
            assert same(out, expected[rank]), (
                f"rank {rank}: run gave {out} but simulate gives {expected[rank]}\n{p}\n"
                f"mesh {p.src.mesh!r}"
            )
            if truth is not None:
                assert same(out, truth[rank]), (rank, p)


def _cases(pairs, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # missed-merge notes
        return [(plan(src, dst), make_locals(src, seed + i)) for i, (src, dst) in enumerate(pairs)]


@settings(max_examples=min(settings.default.max_examples, 30), phases=NO_SHRINK)
@given(data=st.data())
def test_run_gives_every_rank_exactly_the_simulators_local_tensor(pool, data):
    pairs = data.draw(
        st.lists(spec_pairs(world_meshes(pool.world_size)), min_size=BATCH, max_size=BATCH),
        label="cases",
    )
    cases = _cases(pairs, data.draw(st.integers(0, 2**30), label="seed"))
    _check_against_simulator(cases, pool.run(_run_batch, cases))


@settings(max_examples=min(settings.default.max_examples, 10), phases=NO_SHRINK)
@given(data=st.data())
def test_tensors_without_elements_run_their_plans_in_any_order(pool4, data):
    # a tensor without elements takes single-dim steps in any shard order position (no
    # rank holds or needs an element); run must still give every rank its (empty) piece
    from meshplan.testing import specs

    mesh = data.draw(world_meshes(4), label="mesh")
    sides = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=3), label="sides")
    sides[data.draw(st.integers(0, len(sides) - 1), label="empty dim")] = 0
    pairs = []
    for _ in range(BATCH):
        src = data.draw(specs(mesh=mesh, shape=tuple(sides)), label="src")
        dst = data.draw(specs(mesh=mesh, shape=src.shape, dtypes=(src.dtype,)), label="dst")
        pairs.append((src, dst))
    # mesh dim a leaves the front of dim 0's order: one collective, as nothing moves (an
    # all_gather, or an all_to_all onto dim 1, of length 0: either holds the target's layout)
    square = Mesh.create((2, 2), ("a", "b"))
    pairs.append(
        (
            _spec(square, [Shard(0), Shard(0)], (5, 0)),
            _spec(square, [Replicate(), Shard(0)], (5, 0)),
        )
    )
    cases = _cases(pairs, 0)
    assert [s.collective for s in cases[-1][0].steps] in (["all_gather"], ["all_to_all"])
    _check_against_simulator(cases, pool4.run(_run_batch, cases))


def _spec(mesh, placements, shape, dtype="float32", order=None):
    return Spec(mesh, placements, shape, dtype, order or {})


def _every_step_kind(mesh):
    """One step of every kind (and a local one of each flavour) on ``mesh`` (2 x 2)."""
    shape = (5, 3)
    S = lambda pl, order=None: _spec(mesh, pl, shape, order=order)  # noqa: E731
    R, P = Replicate(), Partial
    return [
        Step(1, S([Shard(0), Shard(0)]), S([Shard(0), R]), "all_gather"),
        Step(0, S([Shard(0), R]), S([Shard(1), R]), "all_to_all"),
        Step((0, 1), S([Shard(0), Shard(0)]), S([Shard(0), Shard(0)], {0: (1, 0)}), "all_permute"),
        # whole local tensors between ranks sharding with other mesh dims
        Step((0, 1), S([Shard(0), R]), S([R, Shard(0)]), "all_permute"),
        Step((0, 1), S([R, Shard(1)]), S([Shard(1), R]), "all_permute"),
        Step((0, 1), S([Shard(0), Shard(1)]), S([Shard(1), Shard(0)]), "all_to_all"),
        Step(0, S([R, Shard(1)]), S([P(), Shard(1)]), None),
        Step(0, S([R, Shard(1)]), S([Shard(1), Shard(1)], {1: (1, 0)}), None),
        Step(0, S([P("sum"), Shard(1)]), S([P("avg"), Shard(1)]), None),
        Step(0, S([P(), Shard(1)]), S([Shard(0), Shard(1)]), "reduce_scatter"),
        Step(0, S([P("max"), Shard(1)]), S([Shard(0), Shard(1)]), "reduce_scatter"),
        Step(0, S([P("avg"), Shard(1)]), S([R, Shard(1)]), "all_reduce"),
        Step((0, 1), S([P("min"), P("min")]), S([R, R]), "all_reduce"),
        Step(0, S([StridedShard(0, 2), R]), S([R, R]), "all_gather"),
        Step(1, S([R, StridedShard(1, 2)]), S([R, Shard(0)]), "all_to_all"),
    ]


@pytest.mark.parametrize("ranks", [range(4), (3, 1, 0, 2), (1, 3, 2, 0)], ids=str)
def test_every_step_kind_matches_the_simulator_on_identity_and_permuted_maps(pool4, ranks):
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=ranks)
    steps = _every_step_kind(mesh)
    cases = [(Plan(s.src, s.dst, (s,)), make_locals(s.src, i)) for i, s in enumerate(steps)]
    _check_against_simulator(cases, pool4.run(_run_batch, cases))


@pytest.mark.parametrize(
    "dtype",
    ["float16", "bfloat16", "float64", "complex128", "int8", "int16", "uint8", "int32", "bool"],
)
def test_every_backend_dtype_moves_and_reduces_exactly(pool4, dtype):
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(2, 0, 3, 1)).flatten(("a", "b"), "ab")
    shape = (7, 3)
    S = lambda pl, order=None: _spec(mesh, pl, shape, dtype, order)  # noqa: E731
    ops = ("sum", "avg") if dtype.startswith("complex") else ("sum", "avg", "max", "min")
    pairs = [
        (S([Shard(0), Shard(1)]), S([Replicate(), Replicate()])),
        (S([Shard(0), Replicate()]), S([Shard(1), Shard(0)])),
        (S([Shard(0), Shard(0)]), S([Shard(0), Shard(0)], {0: (1, 0)})),
    ]
    if dtype not in ("uint8", "bool"):  # the test's values are negative too
        pairs += [(S([Partial(op), Partial(op)]), S([Replicate(), Shard(0)])) for op in ops]
    _check_against_simulator(_cases(pairs, 7), pool4.run(_run_batch, _cases(pairs, 7)))


def _run_batch_with_reduce_scatters(cases):
    """``_run_batch`` with gloo's own reduce_scatter (run() uses an all_reduce there)."""
    from meshplan.runtime import _run

    real = _run._on_gloo
    _run._on_gloo = lambda pg, device_type: False
    try:
        return _run_batch(cases)
    finally:
        _run._on_gloo = real


@pytest.mark.parametrize("dtype", ["float32", "int16", "bfloat16"])
def test_reduce_scatters_match_the_simulator_by_either_collective(pool4, dtype):
    # on gloo run() reduces the whole input and keeps its block; the collective that
    # reduce-scatters (NCCL's way) must give the same, uneven and permuted too
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(2, 0, 3, 1)).flatten(("a", "b"), "ab")
    pairs = [
        (_spec(mesh, [Partial(op), Partial(op)], shape, dtype), _spec(mesh, dst, shape, dtype))
        for op in ("sum", "avg", "max")
        for shape in ((8, 3), (7, 3))
        for dst in ([Replicate(), Shard(0)], [Shard(0), Shard(1)], [Shard(1), Replicate()])
    ]
    cases = _cases(pairs, 11)
    assert any("reduce_scatter" in p.collectives for p, _ in cases)
    for run_cases in (_run_batch, _run_batch_with_reduce_scatters):
        _check_against_simulator(cases, pool4.run(run_cases, cases))


def _float8_moves(plans, locals_):
    # float8 tensors do not pickle: they travel to and from the workers as their bytes
    rank = dist.get_rank()
    out = []
    for p in plans:
        local = locals_[rank].view(torch.float8_e4m3fn)
        out.append(run(p, local, groups_for(p.src.mesh)).view(torch.uint8))
    return out


def test_a_dtype_the_backend_lacks_still_moves_bit_for_bit(pool4):
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(2, 0, 3, 1))
    S = lambda pl, order=None: _spec(mesh, pl, (7, 3), "float8_e4m3fn", order)  # noqa: E731
    src = S([Shard(0), Shard(1)])
    dsts = [S([Replicate(), Replicate()]), S([Shard(1), Shard(0)]), S([Shard(1), Shard(1)])]
    x = torch.arange(-10, 11, dtype=torch.float32).reshape(7, 3).to(torch.float8_e4m3fn)
    bytes_ = x.view(torch.uint8)
    locals_ = {r: t.view(torch.uint8) for r, t in shard(x, src).items()}
    results = pool4.run(_float8_moves, [plan(src, d) for d in dsts], locals_)
    for i, d in enumerate(dsts):
        want = shard(bytes_, Spec(mesh, d.placements, d.shape, "uint8", d.shard_order))
        for rank in range(4):
            assert same(results[rank][i], want[rank]), (rank, d)


def _float8_runs(plans, locals_, dtype):
    # float8 tensors do not pickle: they travel to and from the workers as their bytes
    rank = dist.get_rank()
    kind = getattr(torch, dtype)
    out = []
    for p in plans:
        local = locals_[rank].view(kind)
        out.append(run(p, local, groups_for(p.src.mesh)).view(torch.uint8))
    return out


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_partials_reduce_like_the_simulator(pool4, dtype):
    # 8-bit floats have no arithmetic (nor a gloo dtype): run and simulate both reduce
    # them in float64 and round once back, so they agree bit for bit
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(2, 0, 3, 1)).flatten(("a", "b"), "ab")
    kind = getattr(torch, dtype)
    S = lambda pl: _spec(mesh, pl, (5, 3), dtype)  # noqa: E731
    plans = [
        plan(S([Partial(op), Partial(op)]), S(dst))
        for op in ("sum", "avg", "max", "min")
        for dst in ([Replicate(), Replicate()], [Shard(0), Replicate()], [Replicate(), Shard(1)])
    ]
    # parts of -1, 0 and 1 (every sum and mean of them is exact in both float8 types)
    gen = torch.Generator().manual_seed(3)
    parts = {r: torch.randint(-1, 2, (5, 3), generator=gen).to(kind) for r in range(4)}
    locals_ = {r: t.view(torch.uint8) for r, t in parts.items()}
    results = pool4.run(_float8_runs, plans, locals_, dtype)
    for i, p in enumerate(plans):
        expected = simulate(p, parts)
        for rank in range(4):
            assert same(results[rank][i].view(kind), expected[rank]), (rank, p)
        src64 = Spec(mesh, p.src.placements, p.src.shape, "float64", p.src.shard_order)
        wide = unshard({r: t.to(torch.float64) for r, t in parts.items()}, src64)
        assert torch.equal(unshard(expected, p.dst).to(torch.float64), wide), p


def _run_as_parameters(plans, locals_):
    # every rank's local tensor as a leaf that requires grad (a model's parameter)
    rank = dist.get_rank()
    out = []
    for p in plans:
        local = locals_[rank].clone().requires_grad_(True)
        got = run(p, local, groups_for(p.src.mesh))
        out.append((got.detach(), got.requires_grad))
    return out


def test_a_parameter_runs_like_its_data(pool4):
    # regression: an all_gather wrote into a view of a tensor that requires grad and failed
    mesh = Mesh.create((2, 2), ("a", "b"))
    S = lambda pl: _spec(mesh, pl, (6, 4))  # noqa: E731
    src = S([Shard(0), Shard(1)])
    plans = [
        plan(src, S(d))
        for d in ([Replicate(), Replicate()], [Shard(1), Shard(0)], [Shard(0), Shard(1)])
    ]
    locals_ = shard(torch.arange(24.0).reshape(6, 4), src)
    results = pool4.run(_run_as_parameters, plans, locals_)
    for i, p in enumerate(plans):
        want = simulate(p, locals_)
        for rank in range(4):
            got, tracked = results[rank][i]
            assert same(got, want[rank]) and not tracked, (rank, p)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32"])
def test_integer_averages_wrap_the_sum_first_whatever_the_wire(pool4, dtype):
    # regression: int16 (which gloo lacks) was averaged in int64 before it was cast back,
    # where int8/int32 (which gloo carries) wrap their sum first, like the simulator
    mesh = Mesh.create((2, 2), ("a", "b"))
    S = lambda pl: _spec(mesh, pl, (3,), dtype)  # noqa: E731
    kind = getattr(torch, dtype)
    big = torch.iinfo(kind).max // 2 + 3
    parts = {r: torch.tensor([-big, r, big], dtype=kind) for r in range(4)}
    plans = [
        plan(S([Partial("avg"), Partial("avg")]), S(d))
        for d in ([Replicate(), Replicate()], [Shard(0), Replicate()])
    ]
    cases = [(p, parts) for p in plans]
    _check_against_simulator(cases, pool4.run(_run_batch, cases))


# -- permuted rank maps: round trip, and torch's sorted groups ------------------------------


def _round_trip(mesh, chain, locals_):
    groups = groups_for(mesh)
    rank = dist.get_rank()
    out = locals_[rank]
    for a, b in zip(chain, chain[1:], strict=False):
        out = run(plan(a, b), out, groups)
    return out


@pytest.mark.parametrize("ranks", [(7, 6, 5, 4, 3, 2, 1, 0), (3, 6, 0, 5, 2, 7, 4, 1)], ids=str)
def test_a_permuted_rank_map_round_trips(pool8, ranks):
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c"), ranks=ranks).flatten(("c", "a"), "ca")
    shape = (9, 6)
    S = lambda *pl, order=None: _spec(mesh, pl, shape, "int64", order)  # noqa: E731
    chain = [
        S(Shard(0), Shard(1), Shard(0), order={0: (2, 0)}),
        S(Replicate(), Shard(1), Replicate()),
        S(Shard(1), Shard(0), StridedShard(1, 2)),
        S(Partial(), Shard(0), Partial()),
        S(Replicate(), Replicate(), Replicate()),
        S(Shard(0), Shard(1), Shard(0), order={0: (2, 0)}),
    ]
    x = torch.arange(54).reshape(shape)
    locals_ = shard(x, chain[0])
    back = pool8.run(_round_trip, mesh, chain, locals_)
    for rank in range(8):
        assert same(back[rank], locals_[rank])


def _gather_both_ways(mesh, spec, locals_):
    """meshplan's all_gather to Replicate, and torch DTensor's, on the same permuted mesh."""
    rank = dist.get_rank()
    target = _spec(mesh, [Replicate()] * mesh.ndim, spec.shape, spec.dtype)
    ours = run(plan(spec, target), locals_[rank], groups_for(mesh))
    kind, theirs = _torch_redistribute(spec, target, locals_[rank])
    return ours, kind, theirs


def test_torch_dtensor_permutes_data_on_a_permuted_rank_map_and_run_does_not(pool8):
    # Regression (DESIGN.md, "Mesh coordinates, not process-group rank order"): torch
    # 2.13's DeviceMesh builds its groups with sorted ranks (new_group's default), so on
    # a permuted rank map its all_gather concatenates in rank order, not coordinate
    # order. meshplan's groups keep coordinate order.
    mesh = Mesh.create((2, 4), ("dp", "tp"), ranks=(7, 6, 5, 4, 3, 2, 1, 0))
    spec = _spec(mesh, [Replicate(), Shard(0)], (8, 2), "int64")
    x = torch.arange(16).reshape(8, 2)
    for ours, kind, theirs in pool8.run(_gather_both_ways, mesh, spec, shard(x, spec)):
        assert same(ours, x)
        assert kind == "ok"
        assert not torch.equal(theirs, x)  # torch permutes the row blocks ...
        assert torch.equal(theirs, x.view(4, 2, 2).flip(0).reshape(8, 2))  # ... in rank order


# -- torch DTensor as a second oracle -----------------------------------------------------


def _why(message: str) -> str:
    if "redistributing to Partial is for internal use" in message:
        return "a Partial target"
    if "can't be cast to the desired output type" in message:
        return "Partial(avg) of an integer tensor"
    return message[:80]


def _torch_case(src: Spec, dst: Spec) -> bool:
    """Whether torch can be handed the case at all (placements it can express)."""
    try:
        to_torch(src), to_torch(dst)
    except PlacementError:
        return False
    return True


def _uneven_strided(spec: Spec) -> bool:
    for p in spec.placements:
        if isinstance(p, StridedShard):
            parts = p.split_factor
            for k in spec.order(p.dim):
                parts *= spec.mesh.shape[k]
            if spec.shape[p.dim] % parts:
                return True
    return False


def _strided_with_company(src: Spec, dst: Spec) -> bool:
    """A StridedShard tensor dim that some other mesh dim shards, before or after."""
    strided = [
        (m, p.dim)
        for spec in (src, dst)
        for m, p in enumerate(spec.placements)
        if isinstance(p, StridedShard)
    ]
    return any({k for s in (src, dst) for k in s.order(d)} - {m} for m, d in strided)


def _torch_unimplemented(src: Spec, dst: Spec) -> bool:
    """torch 2.13 plans StridedShard only to and from Replicate (its planner's cases 7, 9
    and 10 are TODOs): other StridedShard changes give wrong data (Partial ->
    StridedShard leaves the dim unsharded: f32[4,1,8](SS(2,4) P(sum)) -> (SS(0,2)
    SS(2,4)) on 2 x 2 gives shape (2, 1, 8)) or raise on some ranks only
    (f32[6](S(0) SS(0,3)) -> (SS(0,3) SS(0,4))), which leaves the others waiting in a
    collective. The same holds when a StridedShard's tensor dim is also sharded by
    another mesh dim, before or after (i64[2,1,8](SS(2,4) S(1) R) -> (R S(2) R) on
    2 x 2 x 1 pads the gathered dim with zeros; i64[2](S(0) R SS(0,3)) -> (R S(0)
    SS(0,3)) on 2 x 2 x 2 raises on odd ranks only). Such cases are not handed to torch."""
    for a, b in zip(src.placements, dst.placements, strict=True):
        strided = isinstance(a, StridedShard) or isinstance(b, StridedShard)
        if strided and a != b and Replicate() not in (a, b):
            return True
    return _strided_with_company(src, dst)


def _known_torch_bug(src: Spec, dst: Spec) -> str | None:
    """Why torch 2.13 is expected to give wrong data for a case, or None."""
    if _uneven_strided(src) or _uneven_strided(dst):
        # e.g. f32[4](SS(0,2) P(max)) -> (SS(0,3) SS(0,2)) on 2 x 2: ranks whose
        # StridedShard piece is empty get two zeros
        return "uneven StridedShard"
    return None


def _classify(p: Plan, locals_, results, i) -> str:
    src, dst = p.src, p.dst
    mine = {r: results[r][i][0][0] for r in range(len(results))}
    outcomes = [results[r][i][1] for r in range(len(results))]
    raised = [message for kind, message in outcomes if kind == "raised"]
    if raised:
        some = "" if len(raised) == len(outcomes) else " (on some ranks only)"
        return f"torch raised{some}: {_why(raised[0])}"
    theirs = {r: results[r][i][1][1] for r in range(len(results))}
    if dst.is_partial:  # torch and meshplan may split a Partial value differently
        a, b = unshard(mine, dst), unshard(theirs, dst)
        ok = a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b)
    else:
        ok = all(same(mine[r], theirs[r]) for r in mine)
    if ok:
        return "agree"
    reason = _known_torch_bug(src, dst)
    assert reason is not None, (
        f"torch 2.13 and meshplan disagree on {src} -> {dst} ({p.src.mesh!r}):\n{p}\n"
        f"meshplan {mine}\ntorch {theirs}"
    )
    return f"torch wrong: {reason}"


@settings(max_examples=min(settings.default.max_examples, 20), phases=NO_SHRINK)
@given(data=st.data())
def test_run_agrees_with_torch_dtensor_where_torch_is_right(pool, data):
    world = pool.world_size
    meshes = world_meshes(world, max_aliases=0, part=False, permuted=False)
    pairs = data.draw(
        st.lists(
            spec_pairs(meshes, dtypes=("float32", "int64"), partial_target=0.1, strided=0.3),
            min_size=BATCH,
            max_size=BATCH,
        ),
        label="cases",
    )
    expressible = [(s, d) for s, d in pairs if _torch_case(s, d)]
    usable = [(s, d) for s, d in expressible if not _torch_unimplemented(s, d)]
    # the outcomes are hypothesis events: ``pytest --hypothesis-show-statistics`` tallies them
    if len(expressible) < len(pairs):
        event("torch cannot express")
    if len(usable) < len(expressible):
        event("torch leaves unimplemented (StridedShard)")
    if not usable:
        return
    cases = _cases(usable, data.draw(st.integers(0, 2**30), label="seed"))
    results = pool.run(_torch_batch, cases)
    _check_against_simulator(cases, [[r[0] for r in per_rank] for per_rank in results])
    outcomes = {_classify(p, locals_, results, i) for i, (p, locals_) in enumerate(cases)}
    for outcome in sorted(outcomes):
        event(outcome)


def _repeat_and_count_lookups(plans, locals_):
    from meshplan.runtime import ProcessGroups

    rank = dist.get_rank()
    groups = ProcessGroups(plans[0].src.mesh, timeout=GROUP_TIMEOUT)  # nothing resolved yet
    looked_up = []
    real_get = groups.get

    def counting_get(dims=None):
        looked_up.append(dims)
        return real_get(dims)

    groups.get = counting_get
    out = []
    for p in plans:
        first = run(p, locals_[rank], groups)
        before = len(looked_up)
        again = run(p, locals_[rank], groups)
        out.append((first, again, before > 0, len(looked_up) - before))
    return out


def test_a_repeated_plan_runs_without_looking_up_its_groups(pool4):
    # the first run of a plan on a ProcessGroups resolves its steps' groups (and agrees
    # on the plan); later runs reuse them and still give the simulator's tensors
    mesh = Mesh.create((2, 2), ("a", "b")).flatten(("a", "b"), "ab")
    S = lambda pl: _spec(mesh, pl, (8, 4))  # noqa: E731
    src = S([Shard(0), Shard(1)])
    plans = [plan(src, S(d)) for d in ([Replicate(), Replicate()], [Shard(1), Shard(0)])]
    locals_ = shard(torch.arange(32.0).reshape(8, 4), src)
    results = pool4.run(_repeat_and_count_lookups, plans, locals_)
    for i, p in enumerate(plans):
        want = simulate(p, locals_)
        for rank in range(4):
            first, again, resolved, repeated_lookups = results[rank][i]
            assert same(first, want[rank]) and same(again, want[rank]), (rank, p)
            assert resolved and repeated_lookups == 0, (rank, p)

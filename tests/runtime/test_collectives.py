"""Collective helpers on real gloo groups: per-position data in mesh-coordinate order."""

import os
import time

import pytest
import torch
import torch.distributed as dist
from _shell_cases import world_meshes
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from meshplan.errors import RuntimeShellError, WorkerDied
from meshplan.layout import Mesh
from meshplan.runtime import _collectives as C
from meshplan.runtime import _p2p as P
from meshplan.runtime._group import Group
from meshplan.runtime._groups import ProcessGroups
from meshplan.runtime._pool import WorkerPool
from meshplan.testing import mesh_dims

DTYPES = ["float32", "float64", "int64", "bfloat16"]
OPS = ["sum", "avg", "max", "min"]


def _data(rank, shape, dtype, salt=0):
    """Rank ``rank``'s deterministic input: small values, exact in bfloat16 even when summed."""
    n = 1
    for s in shape:
        n *= s
    values = (torch.arange(n) * 3 + salt) % 5 + rank
    return values.reshape(shape).to(getattr(torch, dtype))


def _reduce(parts, op, n):
    stacked = torch.stack(parts)
    if op == "max":
        return stacked.amax(0)
    if op == "min":
        return stacked.amin(0)
    total = stacked.sum(0, dtype=torch.float64 if stacked.is_floating_point() else None)
    total = total.to(parts[0].dtype)
    if op == "avg":
        return total / n if total.is_floating_point() else total // n
    return total


def _shape(sizes_at, dim, other):
    shape = [other, other]
    shape[dim] = sizes_at
    return tuple(shape)


@st.composite
def group_cases(draw, world):
    mesh = draw(world_meshes(world, max_aliases=1, part=False))
    keys = list(mesh.names) + sorted(mesh.aliases)
    key = draw(st.sampled_from(keys))
    if mesh.ndim > 1 and draw(st.booleans()):
        key = draw(mesh_dims(mesh, min_size=2))
    return mesh, key


# -- tasks (run on every rank) ------------------------------------------------------------


def _group(mesh, key, timeout=30.0):
    return ProcessGroups(mesh, timeout=timeout).get(key)


def _all_gather(mesh, key, sizes, dim, other, dtype):
    g = _group(mesh, key)
    rank = dist.get_rank()
    local = _data(rank, _shape(sizes[g.position], dim, other), dtype)
    expected = [_data(r, _shape(sizes[p], dim, other), dtype) for p, r in enumerate(g.ranks)]
    pieces = C.all_gather(local, g, sizes=sizes, dim=dim)
    concat = C.all_gather_concat(local, g, sizes=sizes, dim=dim)
    even = C.all_gather(local, g, dim=dim) if len(set(sizes)) == 1 else None
    return pieces, expected, concat, even, [p.is_contiguous() for p in pieces]


def _all_gather_chunks(mesh, key, rows, other, dtype):
    g = _group(mesh, key)
    pieces = list(torch.arange(rows).chunk(g.size)) if rows else []
    sizes = [len(p) * other for p in pieces] + [0] * (g.size - len(pieces))
    expected = [_data(r, (sizes[p],), dtype) for p, r in enumerate(g.ranks)]
    if not (C.is_chunk_sizes(sizes) and g.is_identity):
        return None, None
    local = _data(dist.get_rank(), (sizes[g.position],), dtype)
    return C.all_gather_chunks(local, g, sizes), torch.cat(expected)


def _reduce_scatter(mesh, key, sizes, dim, other, dtype, op, as_blocks):
    g = _group(mesh, key)
    total = sum(sizes)
    inputs = {r: _data(r, _shape(total, dim, other), dtype, salt=1) for r in g.ranks}
    mine = inputs[dist.get_rank()]
    expected = _reduce([inputs[r].split(sizes, dim=dim)[g.position] for r in g.ranks], op, g.size)
    if as_blocks:
        got = C.reduce_scatter(list(mine.split(sizes, dim=dim)), g, op)
    elif len(set(sizes)) == 1 and total:
        got = C.reduce_scatter(mine, g, op, dim=dim)  # even split, no sizes
    else:
        got = C.reduce_scatter(mine, g, op, sizes=sizes, dim=dim)
    return got, expected, got.is_contiguous()


def _all_reduce(mesh, key, dtype, op, shape):
    g = _group(mesh, key)
    inputs = {r: _data(r, shape, dtype, salt=2) for r in g.ranks}
    mine = inputs[dist.get_rank()]
    before = mine.clone()
    got = C.all_reduce(mine, g, op)
    return got, _reduce([inputs[r] for r in g.ranks], op, g.size), torch.equal(before, mine)


def _block_rows(sender_pos, receiver_pos):
    return (sender_pos + 2 * receiver_pos) % 3  # 0, 1 or 2 rows: empty blocks included


def _all_to_all(mesh, key, dtype):
    g = _group(mesh, key)
    me = g.position
    blocks = [_data(g.rank * 100 + q, (_block_rows(me, q), 2), dtype) for q in range(g.size)]
    recv = [(_block_rows(p, me), 2) for p in range(g.size)]
    got = C.all_to_all(blocks, g, recv)
    expected = [_data(r * 100 + me, (_block_rows(p, me), 2), dtype) for p, r in enumerate(g.ranks)]
    return got, expected


def _all_to_all_single(mesh, key, dim, dtype):
    g = _group(mesh, key)
    me = g.position
    send = [_block_rows(me, q) for q in range(g.size)]
    recv = [_block_rows(p, me) for p in range(g.size)]
    # position me sends rows [offset_q, offset_q + send[q]) of its tensor to q
    mine = _data(g.rank, _shape(sum(send), dim, 3), dtype)
    got = C.all_to_all_single(mine, g, send, recv, dim=dim)
    pieces = []
    for p, r in enumerate(g.ranks):
        theirs = [_block_rows(p, q) for q in range(g.size)]
        full = _data(r, _shape(sum(theirs), dim, 3), dtype)
        pieces.append(full.split(theirs, dim=dim)[me])
    return got, torch.cat(pieces, dim=dim)


def _shift(mesh, key, dtype):
    """Each position sends to the next and receives from the previous (a cyclic permute)."""
    g = _group(mesh, key)
    n, me = g.size, g.position
    nxt, prev = (me + 1) % n, (me - 1) % n
    mine = _data(g.rank, (2, me + 1), dtype)
    got = P.permute(mine, g, dst=nxt, src=prev, recv_shape=(2, prev + 1))
    expected = _data(g.ranks[prev], (2, prev + 1), dtype)
    # several messages to one peer, an empty one, and a message to itself
    sends = [(nxt, mine), (nxt, mine[:, :1] * 2), (nxt, mine[:0]), (me, mine + 1)]
    recvs = [(prev, (2, prev + 1)), (prev, (2, 1)), (prev, (0, prev + 1)), (me, (2, me + 1))]
    many = P.exchange(sends, recvs, g)
    theirs = _data(g.ranks[prev], (2, prev + 1), dtype)
    expected_many = [theirs, theirs[:, :1] * 2, theirs[:0], mine + 1]
    return got, expected, many, expected_many


def _argument_errors():
    g = _group(_world_mesh(), "x")
    out = {}
    checks = {
        "gather_size": lambda: C.all_gather(torch.ones(2), g, sizes=[3] * g.size),
        "gather_sizes_len": lambda: C.all_gather(torch.ones(2), g, sizes=[2]),
        "op": lambda: C.all_reduce(torch.ones(2), g, "prod"),
        "uneven": lambda: C.reduce_scatter(torch.ones(g.size + 1), g),
        "sizes_sum": lambda: C.reduce_scatter(torch.ones(4), g, sizes=[2] * g.size),
        "blocks": lambda: C.all_to_all([torch.ones(1)], g),
        "avg_bool": lambda: C.all_reduce(torch.ones(2, dtype=torch.bool), g, "avg"),
        "self_msgs": lambda: P.exchange([(g.position, torch.ones(1))], [], g),
        "recv_dtype": lambda: P.exchange([], [(0, (1,))], g),
    }
    for name, fn in checks.items():
        try:
            fn()
            out[name] = None
        except RuntimeShellError as exc:
            out[name] = str(exc)
    return out


def _world_mesh():
    return Mesh.create(dist.get_world_size(), ("x",))


def _kill_mid_collective(victim, timeout):
    g = _group(_world_mesh(), "x", timeout=timeout)
    C.all_reduce(torch.ones(4), g)  # every connection is up
    if dist.get_rank() == victim:
        os._exit(9)
    start = time.monotonic()
    try:
        C.all_reduce(torch.ones(1 << 16), g)
    except RuntimeShellError as exc:
        return "RuntimeShellError", str(exc), time.monotonic() - start
    return "finished", "", time.monotonic() - start


def _one_rank_hangs(sleeper, timeout):
    g = _group(_world_mesh(), "x", timeout=timeout)
    C.all_reduce(torch.ones(4), g)
    if dist.get_rank() == sleeper:
        time.sleep(timeout + 2)
        return "slept"
    start = time.monotonic()
    try:
        C.all_gather(torch.ones(3), g)
    except RuntimeShellError as exc:
        exc.elapsed = time.monotonic() - start
        raise  # a failed rank makes the pool restart: its gloo state is unknown
    return "finished"


# -- tests --------------------------------------------------------------------------------


def _close(actual, expected):
    assert actual.dtype == expected.dtype
    assert_close(actual, expected, rtol=0, atol=0)


@given(data=st.data())
def test_all_gather_returns_every_members_tensor_in_coordinate_order(pool, data):
    mesh, key = data.draw(group_cases(pool.world_size))
    n = mesh.size(key) if isinstance(key, str) else mesh[key].size()
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    dim = data.draw(st.integers(0, 1))
    other = data.draw(st.integers(0, 2))
    dtype = data.draw(st.sampled_from(DTYPES))
    for pieces, expected, concat, even, contiguous in pool.run(
        _all_gather, mesh, key, sizes, dim, other, dtype
    ):
        assert len(pieces) == len(expected) == n
        for got, want in zip(pieces, expected, strict=True):
            _close(got, want)
        _close(concat, torch.cat(expected, dim=dim))
        if even is not None:
            for got, want in zip(even, expected, strict=True):
                _close(got, want)
        assert all(contiguous)


@given(data=st.data())
def test_a_gather_of_chunk_sized_pieces_is_their_concatenation(pool, data):
    mesh, key = data.draw(group_cases(pool.world_size))
    rows = data.draw(st.integers(1, 11))
    other = data.draw(st.integers(1, 3))
    dtype = data.draw(st.sampled_from(DTYPES))
    for got, expected in pool.run(_all_gather_chunks, mesh, key, rows, other, dtype):
        if expected is not None:
            _close(got, expected)


def test_chunk_sizes_are_whole_pieces_then_one_short_then_empty_ones():
    assert C.is_chunk_sizes([3, 3, 2, 0]) and C.is_chunk_sizes([2, 2]) and C.is_chunk_sizes([1, 0])
    assert not C.is_chunk_sizes([3, 2, 2]) and not C.is_chunk_sizes([2, 0, 1])
    assert not C.is_chunk_sizes([0, 0]) and not C.is_chunk_sizes([])


@given(data=st.data())
def test_reduce_scatter_gives_each_position_the_reduction_of_its_block(pool, data):
    mesh, key = data.draw(group_cases(pool.world_size))
    n = mesh.size(key) if isinstance(key, str) else mesh[key].size()
    if data.draw(st.booleans()):
        sizes = [data.draw(st.integers(0, 2))] * n
    else:
        sizes = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    dim = data.draw(st.integers(0, 1))
    other = data.draw(st.integers(1, 2))
    dtype = data.draw(st.sampled_from(DTYPES))
    op = data.draw(st.sampled_from(OPS))
    as_blocks = data.draw(st.booleans())
    results = pool.run(_reduce_scatter, mesh, key, sizes, dim, other, dtype, op, as_blocks)
    for got, expected, contiguous in results:
        _close(got, expected)
        assert contiguous


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_applies_each_op_to_every_dtype(pool8, op, dtype):
    mesh = Mesh.create((2, 4), ("dp", "tp"), ranks=(5, 2, 7, 0, 3, 6, 1, 4))
    for key in ("dp", "tp"):
        for got, expected, input_kept in pool8.run(_all_reduce, mesh, key, dtype, op, (3, 2)):
            _close(got, expected)
            assert input_kept


@given(data=st.data())
def test_all_to_all_delivers_each_block_to_its_position(pool, data):
    mesh, key = data.draw(group_cases(pool.world_size))
    dtype = data.draw(st.sampled_from(DTYPES))
    for got, expected in pool.run(_all_to_all, mesh, key, dtype):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _close(g, e)


@given(data=st.data())
def test_all_to_all_single_concatenates_received_pieces_in_position_order(pool, data):
    mesh, key = data.draw(group_cases(pool.world_size))
    dim = data.draw(st.integers(0, 1))
    dtype = data.draw(st.sampled_from(DTYPES))
    for got, expected in pool.run(_all_to_all_single, mesh, key, dim, dtype):
        _close(got, expected)


@given(data=st.data())
def test_permute_and_exchange_match_messages_in_order(pool, data):
    mesh, key = data.draw(group_cases(pool.world_size))
    dtype = data.draw(st.sampled_from(DTYPES))
    for got, expected, many, expected_many in pool.run(_shift, mesh, key, dtype):
        _close(got, expected)
        assert len(many) == len(expected_many)
        for g, e in zip(many, expected_many, strict=True):
            _close(g, e)


@pytest.mark.parametrize(
    "ranks", [range(8), (7, 6, 5, 4, 3, 2, 1, 0), (6, 1, 4, 3, 0, 7, 2, 5)], ids=str
)
def test_permuted_rank_maps_keep_coordinate_order_in_every_collective(pool8, ranks):
    mesh = Mesh.create((2, 4), ("dp", "tp"), ranks=ranks).flatten(("tp", "dp"), "tpdp")
    for key in ("tp", "tpdp"):
        sizes = [1, 2, 0, 1] * (mesh[key].size() // 4)
        for pieces, expected, *_ in pool8.run(_all_gather, mesh, key, sizes, 0, 2, "int64"):
            for got, want in zip(pieces, expected, strict=True):
                _close(got, want)
        for got, expected, _ in pool8.run(
            _reduce_scatter, mesh, key, [1] * mesh[key].size(), 0, 2, "int64", "sum", False
        ):
            _close(got, expected)
        for got, expected in pool8.run(_all_to_all, mesh, key, "int64"):
            for g, e in zip(got, expected, strict=True):
                _close(g, e)


def test_bad_arguments_fail_before_any_communication(pool4):
    for errors in pool4.run(_argument_errors):
        assert all(msg is not None for msg in errors.values()), errors
        assert "sizes[" in errors["gather_size"]
        assert "one size >= 0 per member" in errors["gather_sizes_len"]
        assert "'prod'" in errors["op"]
        assert "pass sizes=" in errors["uneven"]
        assert "add up to" in errors["sizes_sum"]
        assert "4 members" in errors["blocks"]
        assert "bool" in errors["avg_bool"]
        assert "to itself" in errors["self_msgs"]
        assert "dtype=" in errors["recv_dtype"]


def _unsupported_dtype():
    g = _group(_world_mesh(), "x")
    try:
        C.all_reduce(torch.ones(3, dtype=torch.int16), g, op="sum")
    except RuntimeShellError as exc:
        return str(exc)
    return None


def test_a_dtype_the_backend_cannot_carry_is_named_as_such(pool4):
    # gloo has no int16 reductions: the error says so, not that a peer died
    for msg in pool4.run(_unsupported_dtype):
        assert msg is not None and "cannot carry this dtype" in msg, msg
        assert "peer rank died" not in msg


def test_a_rank_killed_mid_collective_ends_the_others_with_a_clear_error(pool8):
    timeout = 3.0
    start = time.monotonic()
    results = pool8.run(_kill_mid_collective, 3, timeout, return_exceptions=True)
    assert time.monotonic() - start < timeout + 15
    assert isinstance(results[3], WorkerDied)
    for rank, result in enumerate(results):
        if rank == 3:
            continue
        kind, message, seconds = result
        assert kind == "RuntimeShellError", (rank, result)
        assert "all_reduce(sum) on group 'x'" in message
        assert f"rank {rank}" in message
        assert seconds < timeout + 5
    assert pool8.run(_sum_of_ranks) == [28] * 8  # the pool restarted


def test_a_rank_that_never_joins_ends_the_others_within_the_timeout(pool4):
    timeout = 2.0
    results = pool4.run(_one_rank_hangs, 1, timeout, return_exceptions=True)
    assert results[1] == "slept"
    for rank in (0, 2, 3):
        err = results[rank]
        assert isinstance(err, RuntimeShellError), (rank, err)
        assert "all_gather" in str(err) and "2s timeout" in str(err)
        assert err.elapsed < timeout + 3
    assert pool4.run(_sum_of_ranks) == [6] * 4


def _sum_of_ranks():
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return int(t)


# -- groups of one member need no communication (pure) ------------------------------------


def test_a_group_of_one_needs_no_process_group():
    alone = Group("solo", ranks=(5,), pg_ranks=(5,), rank=5, pg=None)
    x = torch.arange(6.0).view(2, 3)
    _close(C.all_gather(x, alone, dim=1)[0], x)
    _close(C.all_reduce(x, alone, "avg"), x)
    _close(C.reduce_scatter(x, alone, "max", dim=1), x)
    _close(C.all_to_all([x], alone)[0], x)
    _close(P.permute(x, alone, dst=0, src=0), x)
    assert P.permute(x, alone, dst=None, src=None) is None


# -- calibrate ----------------------------------------------------------------------------


def _calibrate(mesh):
    from meshplan.runtime._calibrate import calibrate

    groups = ProcessGroups(mesh)
    return calibrate(groups, nbytes=1 << 16, repeats=3)


def test_calibrate_measures_each_collective_per_mesh_dim_and_agrees_across_ranks(pool8):
    from meshplan.redistribute import CostModel, HardwareProfile, Link
    from meshplan.redistribute._profile import COLLECTIVES

    mesh = Mesh.create((2, 1, 4), ("dp", "one", "tp"), ranks=(3, 1, 0, 2, 7, 5, 4, 6))
    # aliases: steps merge onto (tp, dp)'s group (timed once, though two aliases name it);
    # (dp, one) is dp's own group
    mesh = mesh.flatten(("tp", "dp"), "tpdp").flatten(("dp", "tp"), "dptp")
    mesh = mesh.flatten(("dp", "one"), "dp1")
    profiles = pool8.run(_calibrate, mesh)
    first = profiles[0]
    assert isinstance(first, HardwareProfile)
    assert all(p == first for p in profiles)  # one profile everywhere: plans agree
    assert len(first.dims) == mesh.ndim
    dp, one, tp = first.dims
    for link in (dp, tp):
        # (a dim's latency may fit to 0 when the launch, measured apart, takes all of its
        # small all_gather's time: noise on a busy machine; the two together never do)
        assert 0 <= link.latency_s < 1.0
        assert 0 < first.launch_s + link.latency_s < 1.0
        assert 1e5 < link.bytes_per_s < 1e13
    assert one.latency_s == 0.0  # a dim of size 1 never communicates
    # every collective has its own fitted links per dim; the all_gather's are ``dims``
    assert set(first.per_collective) == set(COLLECTIVES)
    assert first.per_collective["all_gather"] == first.dims
    permute = first.per_collective["all_permute"]  # spans mesh dims: one link over all
    assert 0 <= permute.latency_s < 1.0 and 1e5 < permute.bytes_per_s < 1e13
    for kind, links in first.per_collective.items():
        if kind == "all_permute":
            continue
        assert len(links) == mesh.ndim, kind
        assert links[1] == Link(0.0, first.copy_bytes_per_s), kind
        for link in (links[0], links[2]):
            assert 0 <= link.latency_s < 1.0, kind
            assert 1e5 < link.bytes_per_s < 1e13, kind
    # the alias's group has links of its own for each collective a merged step runs
    assert set(first.flattened) == {(0, 2)}
    assert set(first.flattened[0, 2]) == {
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_to_all",
    }
    for kind, link in first.flattened[0, 2].items():
        assert 0 <= link.latency_s < 1.0 and 1e5 < link.bytes_per_s < 1e13, kind
    assert 0 <= first.launch_s < 1.0 and first.local_launch_s > 0
    assert first.copy_bytes_per_s > 0 and first.reduce_bytes_per_s > 0
    # gloo runs a reduce_scatter as an all_reduce of its input: the profile prices it so
    assert first.reduce_scatter_via_all_reduce is True
    CostModel(first)  # usable by the planner


def test_calibrate_waits_for_queued_work_before_reading_the_clock(monkeypatch):
    # on an accelerator a collective returns once queued: a timing that did not wait for
    # it would measure launches only
    from meshplan.runtime import _calibrate as K

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    K._synchronizer("cuda:1")()
    assert waited == ["cuda:1"]
    assert K._synchronizer("cpu")() is None and waited == ["cuda:1"]
    events = []
    seconds = K._time_all(
        [(lambda: events.append("call"), 2), None], lambda: events.append("wait"), rounds=1
    )
    assert events == ["call", "wait", "call", "call", "wait"]  # warm-up, then one round
    assert seconds[0] > 0 and seconds[1] == 0.0


def test_calibrate_tells_the_launch_apart_from_the_per_hop_latency():
    # small all_gathers along each dim (1 and 2 hops) and over the whole mesh (3 hops),
    # timed as launch + hops * latency + bytes / bandwidth, give back the launch
    from meshplan.redistribute import HardwareProfile
    from meshplan.runtime import _calibrate as K

    shape = HardwareProfile()
    mesh = Mesh.create((2, 1, 4), ("dp", "one", "tp"))
    counts = K._counts(1 << 18)

    def timings(n, hops, launch, latency):
        return [launch + hops * latency + (n - 1) * 4 * c / 1e9 for c in counts[:2]]

    def times(launch, latency, whole_latency=None):
        return {
            ("dp", "all_gather"): timings(2, 1, launch, latency),
            ("tp", "all_gather"): timings(4, 2, launch, latency),
            (("dp", "one", "tp"), "all_gather"): timings(8, 3, launch, whole_latency or latency),
        }

    assert K._launch(shape, mesh, counts, times(2e-5, 3e-6), 1e-12) == pytest.approx(2e-5)
    assert K._launch(shape, mesh, counts, times(0.0, 3e-6), 1e-12) == pytest.approx(0.0, abs=1e-12)
    # noise that makes the whole mesh look faster than a dim: never more than a dim's own
    fast = times(2e-5, 3e-6, whole_latency=1e-7)
    assert K._launch(shape, mesh, counts, fast, 1e-12) <= 2e-5 + 2 * 3e-6 + 1e-12
    # one active dim: no second hop count to tell them apart
    flat = Mesh.create((4, 1), ("tp", "one"))
    one = {
        ("tp", "all_gather"): timings(4, 2, 2e-5, 3e-6),
        (("tp", "one"), "all_gather"): timings(4, 2, 2e-5, 3e-6),
    }
    assert K._launch(shape, flat, counts, one, 1e-12) == 0.0


def test_calibrate_on_a_mesh_over_part_of_the_world(pool8):
    # ranks outside the mesh take part in creating its groups, the alias's too, in the
    # members' order (else the world's group names would disagree and creation would hang)
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(4, 6, 5, 7)).flatten(("b", "a"), "ba")
    profiles = pool8.run(_calibrate, mesh)
    assert profiles[:4] == [None] * 4
    assert all(p == profiles[4] for p in profiles[4:])
    assert len(profiles[4].dims) == 2
    assert set(profiles[4].flattened) == {(0, 1)}


# -- torch.compile ------------------------------------------------------------------------


def _compiled():
    g = _group(Mesh.create(2, ("x",), ranks=(1, 0)), "x")  # coordinate order != torch's

    def collectives(x):
        y = C.all_gather_concat(x * 2, g)
        z = C.all_reduce(y, g, "avg")
        w = C.reduce_scatter(z, g, "sum")
        return torch.cat(C.all_to_all(list(w.chunk(2)), g)) + 1

    def point_to_point(x):
        return P.permute(x, g, dst=1 - g.position, src=1 - g.position) * 3

    x = torch.arange(4.0) + dist.get_rank()
    full = torch.compile(collectives, backend="eager", fullgraph=True)
    p2p = torch.compile(point_to_point, backend="eager")  # graph breaks allowed
    return collectives(x), full(x), point_to_point(x), p2p(x)


def test_collectives_trace_under_torch_compile():
    with WorkerPool(2, timeout=120) as fresh:
        results = fresh.run(_compiled)
    for eager, compiled, eager_p2p, compiled_p2p in results:
        _close(compiled, eager)
        _close(compiled_p2p, eager_p2p)

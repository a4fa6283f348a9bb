"""ProcessGroups: one torch group per distinct rank set, members in mesh-coordinate order."""

import datetime
import time

import pytest
import torch
import torch.distributed as dist
from _shell_cases import world_meshes
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import MeshError, RuntimeShellError
from meshplan.layout import Mesh
from meshplan.runtime import _collectives as C
from meshplan.runtime._group import Group
from meshplan.runtime._groups import ProcessGroups
from meshplan.runtime._pool import WorkerPool
from meshplan.testing import mesh_dims

# -- tasks (run on every rank) ------------------------------------------------------------


def _views(mesh, keys, timeout=30.0):
    """Per key: the group's coordinate order, torch order, and an all_gather of rank ids."""
    rank = dist.get_rank()
    groups = ProcessGroups(mesh, timeout=timeout)
    if not groups.is_member:  # takes part in creating the mesh's groups, has none
        return [groups.create(key) for key in keys]
    out = {}
    for key in keys:
        g = groups.get(key)
        gathered = C.all_gather(torch.tensor([rank]), g)
        out[key] = {
            "ranks": g.ranks,
            "pg_ranks": g.pg_ranks,
            "torch_pg_ranks": tuple(dist.get_process_group_ranks(g.pg)),
            "gathered": tuple(int(t) for t in gathered),
            "expected": mesh.group_of(rank, list(key) if isinstance(key, tuple) else key),
            "position": g.position,
            "coordinate": mesh.coordinate(rank),
        }
    return out


def _torch_new_group_order(mesh, dim):
    """all_gather of rank ids on torch's own new_group(coordinate-ordered ranks) vs ours."""
    rank = dist.get_rank()
    mine = None
    for ranks in mesh.groups(dim):  # every rank creates every group, as new_group requires
        pg = dist.new_group(list(ranks))
        if rank in ranks:
            mine = (ranks, pg)
    ranks, pg = mine
    out = torch.empty(len(ranks), dtype=torch.int64)
    dist.all_gather_single(out, torch.tensor([rank]), group=pg)
    ours = C.all_gather_concat(torch.tensor([rank]), ProcessGroups(mesh).get(dim))
    return ranks, tuple(out.tolist()), tuple(ours.tolist())


def _dedup(mesh, keys, timeout):
    groups = ProcessGroups(mesh, timeout=timeout)
    again = ProcessGroups(mesh, timeout=timeout)
    before = dist.get_pg_count()
    handles = {k: groups.get(k) for k in keys}
    created = dist.get_pg_count() - before
    same_pg = {
        (a, b): handles[a].pg is handles[b].pg for i, a in enumerate(keys) for b in keys[i + 1 :]
    }
    shared_across_objects = all(again.get(k).pg is handles[k].pg for k in keys)
    gathered = {
        k: tuple(int(t) for t in C.all_gather(torch.tensor([dist.get_rank()]), h))
        for k, h in handles.items()
    }
    return {
        "created": created,
        "same_pg": same_pg,
        "ranks": {k: h.ranks for k, h in handles.items()},
        "gathered": gathered,
        "shared_across_objects": shared_across_objects,
        "count_after_reuse": dist.get_pg_count() - before,
    }


def _lazy(mesh, timeout):
    before = dist.get_pg_count()
    groups = ProcessGroups(mesh, timeout=timeout)
    after_init = dist.get_pg_count() - before
    groups.get(mesh.names[0])
    after_one = dist.get_pg_count() - before
    groups.get(mesh.names[0])
    after_again = dist.get_pg_count() - before
    made = groups.create_all()
    return after_init, after_one, after_again, [g.name for g in made], len(groups.process_groups)


def _errors():
    rank = dist.get_rank()
    world = dist.get_world_size()
    out = {}
    for label, make in {
        "outside": lambda: ProcessGroups(Mesh.create(1, ranks=[(rank + 1) % world])).get(0),
        "outside_local": lambda: ProcessGroups(
            Mesh.create(1, ranks=[(rank + 1) % world]), local=True
        ),
        "too_big": lambda: ProcessGroups(Mesh.create(world * 2)),
        "timeout": lambda: ProcessGroups(Mesh.create(world), timeout=0),
        "not_a_mesh": lambda: ProcessGroups((2, 2)),
        "unknown_dim": lambda: ProcessGroups(Mesh.create(world, ("x",))).get("nope"),
    }.items():
        try:
            make()
            out[label] = None
        except (RuntimeShellError, MeshError) as exc:
            out[label] = (type(exc).__name__, str(exc))
    return out


def _timeout_is_configured(seconds):
    g = ProcessGroups(Mesh.create(dist.get_world_size()), timeout=seconds).get(0)
    return g.timeout, g.pg._get_backend(torch.device("cpu")).options._timeout


def _local_create_all(meshes):
    out = []
    for mesh in meshes:
        if not mesh.contains(dist.get_rank()):
            continue  # local creation: only the mesh's ranks take part
        groups = ProcessGroups(mesh, timeout=20, local=True)
        rank = torch.tensor([dist.get_rank()])
        made = groups.create_all()
        out.append([(g.name, g.ranks, tuple(int(t) for t in C.all_gather(rank, g))) for g in made])
    return out


def _local_after_uneven_history(seconds):
    if dist.get_rank() == 0:  # rank 0 alone has created one more process group
        dist.new_group([0], use_local_synchronization=True)
    start = time.monotonic()
    try:
        ProcessGroups(Mesh.create(dist.get_world_size()), timeout=seconds, local=True).get(0)
    except RuntimeShellError as exc:
        return "RuntimeShellError", str(exc), time.monotonic() - start
    return "created", "", time.monotonic() - start


# -- tests --------------------------------------------------------------------------------


def _check_views(mesh, views):
    for rank, per_rank in enumerate(views):
        if isinstance(per_rank, list):
            assert not mesh.contains(rank)
            assert per_rank == [None] * len(per_rank)
            continue
        for key, v in per_rank.items():
            assert v["ranks"] == v["expected"], (rank, key)
            assert v["gathered"] == v["ranks"], (rank, key)  # coordinate order, not sorted
            assert v["torch_pg_ranks"] == v["pg_ranks"], (rank, key)
            assert sorted(v["pg_ranks"]) == sorted(v["ranks"])
            assert v["ranks"][v["position"]] == rank


@settings(max_examples=15)
@given(data=st.data())
def test_groups_list_members_in_mesh_coordinate_order(pool, data):
    mesh = data.draw(world_meshes(pool.world_size, part=False))
    keys = list(mesh.names) + sorted(mesh.aliases)
    if mesh.ndim > 1:
        keys.append(data.draw(mesh_dims(mesh, min_size=2)))
    _check_views(mesh, pool.run(_views, mesh, keys))


@pytest.mark.parametrize(
    "ranks", [range(8), (7, 6, 5, 4, 3, 2, 1, 0), (3, 6, 0, 5, 2, 7, 4, 1)], ids=str
)
def test_identity_and_permuted_rank_maps_gather_in_coordinate_order(pool8, ranks):
    mesh = Mesh.create((2, 4), ("dp", "tp"), ranks=ranks).flatten(("tp", "dp"), "tpdp")
    views = pool8.run(_views, mesh, ["dp", "tp", "tpdp", ("dp", "tp")])
    _check_views(mesh, views)
    if ranks == (7, 6, 5, 4, 3, 2, 1, 0):
        assert views[0]["tp"]["gathered"] == (3, 2, 1, 0)
        assert views[0]["dp"]["gathered"] == (4, 0)


def test_torch_new_group_sorts_ranks_and_would_permute_data(pool8):
    # Regression: torch 2.13's new_group sorts its ranks, so with a permuted rank map the
    # gather order is not the mesh-coordinate order. meshplan's groups keep mesh order.
    mesh = Mesh.create((2, 4), ("dp", "tp"), ranks=(7, 6, 5, 4, 3, 2, 1, 0))
    for ranks, torch_order, ours in pool8.run(_torch_new_group_order, mesh, "tp"):
        assert torch_order == tuple(sorted(ranks))
        assert torch_order != ranks  # torch permutes
        assert ours == ranks  # meshplan does not


def test_names_for_the_same_ranks_share_one_process_group(pool8):
    mesh = (
        Mesh.create((2, 2, 2), ("a", "b", "c"))
        .flatten(("a", "c"), "ac")
        .flatten(("c", "a"), "ca")
        .flatten(("b",), "bb")
    )
    keys = ["b", "bb", "ac", "ca", ("a", "c")]
    results = pool8.run(_dedup, mesh, keys, 41.0)  # a timeout no other test uses
    for rank, r in enumerate(results):
        # every rank takes part in creating both families, each group once: the four
        # groups along b and the two along (a, c); the other names reuse them
        assert r["created"] == 6
        assert r["count_after_reuse"] == 6
        assert r["shared_across_objects"]
        assert r["same_pg"][("b", "bb")]
        assert r["same_pg"][("ac", "ca")]
        assert r["same_pg"][("ac", ("a", "c"))]
        assert not r["same_pg"][("b", "ac")]
        assert r["ranks"]["ac"] == mesh.group_of(rank, ("a", "c"))
        assert r["ranks"]["ca"] == mesh.group_of(rank, ("c", "a"))
        assert r["ranks"]["ac"] != r["ranks"]["ca"]
        for key in keys:
            assert r["gathered"][key] == r["ranks"][key]


def test_groups_are_created_on_first_use_one_dim_at_a_time(pool8):
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "b"), "ab")
    for after_init, after_one, after_again, names, count in pool8.run(_lazy, mesh, 42.0):
        assert (after_init, after_one, after_again) == (0, 4, 4)  # the 4 groups along a
        assert names == ["a", "b", "c", "ab"]
        assert count == 4  # the calling rank holds one group per dim and alias


def test_a_mesh_over_part_of_the_world(pool8):
    # ranks 4..7 take part in creating the groups but hold none
    mesh = Mesh.create((2, 2), ("x", "y"), ranks=(2, 0, 3, 1))
    views = pool8.run(_views, mesh, ["x", "y"])
    assert views[4:] == [[None, None]] * 4
    _check_views(mesh, views)


def test_bad_arguments_raise_clear_errors(pool4):
    for r in pool4.run(_errors):
        assert r["outside"][0] == "RuntimeShellError" and "not in mesh" in r["outside"][1]
        assert "groups.create" in r["outside"][1]
        assert "local=True" in r["outside_local"][1]
        assert r["too_big"][0] == "RuntimeShellError" and "world has only 4" in r["too_big"][1]
        assert r["timeout"][0] == "RuntimeShellError" and "timeout" in r["timeout"][1]
        assert r["not_a_mesh"][0] == "RuntimeShellError"
        assert r["unknown_dim"][0] == "MeshError" and "'nope'" in r["unknown_dim"][1]


def test_process_groups_need_an_initialized_world(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RuntimeShellError, match="init_process_group"):
        ProcessGroups(Mesh.create(2))


def test_every_group_gets_the_configured_timeout(pool4):
    for timeout, torch_timeout in pool4.run(_timeout_is_configured, datetime.timedelta(seconds=43)):
        assert timeout == 43.0
        assert torch_timeout == datetime.timedelta(seconds=43)


def test_local_creation_needs_only_the_members_when_processes_start_alike():
    meshes = [
        Mesh.create((2, 2), ("x", "y"), ranks=(3, 1, 2, 0)).flatten(("y", "x"), "yx"),
        Mesh.create(2, ("z",), ranks=(2, 0)),  # ranks 1 and 3 stay out
    ]
    with WorkerPool(4, timeout=60) as fresh:  # new processes: no groups created yet
        results = fresh.run(_local_create_all, meshes)
    for rank, per_mesh in enumerate(results):
        for mesh, made in zip([m for m in meshes if m.contains(rank)], per_mesh, strict=True):
            for name, ranks, gathered in made:
                assert ranks == mesh.group_of(rank, name)
                assert gathered == ranks


def test_local_creation_with_uneven_histories_fails_loudly_within_the_timeout():
    with WorkerPool(4, timeout=60) as fresh:
        results = fresh.run(_local_after_uneven_history, 2.0)
    for kind, message, seconds in results:
        assert kind == "RuntimeShellError"
        assert "equally many process groups" in message
        assert seconds < 10


# -- the Group helpers (pure) -------------------------------------------------------------


@given(st.permutations(range(6)), st.permutations(range(6)), st.integers(0, 5))
def test_position_and_group_rank_maps_are_inverse(coord_order, pg_order, me):
    g = Group("g", ranks=coord_order, pg_ranks=pg_order, rank=coord_order[me], pg=None)
    assert g.position == me
    for p in range(6):
        assert g.position_of(g.group_rank(p)) == p
        assert g.pg_ranks[g.group_rank(p)] == g.ranks[p]
    items = [f"item{p}" for p in range(6)]
    assert g.to_position_order(g.to_group_order(items)) == items
    assert g.to_group_order(list(g.ranks)) == list(g.pg_ranks)
    assert g.is_identity == (tuple(coord_order) == tuple(pg_order))


def test_group_rejects_inconsistent_orders_and_bad_indices():
    with pytest.raises(RuntimeShellError, match="same distinct ranks"):
        Group("g", ranks=(0, 1), pg_ranks=(0, 2), rank=0, pg=None)
    with pytest.raises(RuntimeShellError, match="does not contain"):
        Group("g", ranks=(0, 1), pg_ranks=(1, 0), rank=5, pg=None)
    g = Group("g", ranks=(0, 1), pg_ranks=(1, 0), rank=0, pg=None)
    with pytest.raises(RuntimeShellError, match="out of range"):
        g.group_rank(2)
    with pytest.raises(RuntimeShellError, match="one item per member"):
        g.to_group_order([1, 2, 3])

"""torch interop on 4 gloo ranks: DeviceMesh <-> Mesh, adopted process groups,
DTensor <-> Sharded, and redistribute_dtensor against DTensor.redistribute."""

import warnings

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from meshplan.errors import PlacementError, RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Spec
from meshplan.redistribute import plan
from meshplan.runtime import (
    ProcessGroups,
    from_dtensor,
    redistribute_dtensor,
    run,
    to_device_mesh,
    to_dtensor,
)

# -- tasks (run on every rank) ------------------------------------------------------------


def _device_mesh():
    """A (2, 2) DeviceMesh ("dp", "tp") with the flattened dim "dp_tp"."""
    dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dm["dp", "tp"]._flatten("dp_tp")
    return dm


def _torch_groups(dm, keys):
    root = dm._get_root_mesh()
    out = {}
    for key in keys:
        pg = (
            root._flatten_mapping[key].get_group()
            if key in root._flatten_mapping
            else dm.get_group(key)
        )
        out[key] = tuple(dist.get_process_group_ranks(pg))
    return out


def _mesh_round_trip():
    dm = _device_mesh()
    mesh = Mesh.from_device_mesh(dm)
    back = to_device_mesh(mesh)
    keys = ("dp", "tp", "dp_tp")
    rank = dist.get_rank()
    sub = Mesh.from_device_mesh(dm["tp"])
    flat = Mesh.from_device_mesh(dm["dp_tp"])
    return {
        "names": (mesh.names, tuple(back.mesh_dim_names)),
        "aliases": tuple(mesh.aliases),
        "theirs": _torch_groups(dm, keys),
        "back": _torch_groups(back, keys),
        "ours": {k: mesh.group_of(rank, k) for k in keys},
        "again": Mesh.from_device_mesh(back) == mesh,
        "sub": (sub.names, sub.groups(), mesh["tp"].groups()),
        "flat": (flat.names, flat.groups(), mesh["dp_tp"].groups()),
        "sub_back": tuple(dist.get_process_group_ranks(to_device_mesh(sub).get_group())),
    }


def _adopted_run():
    from meshplan.placement import Replicate as R
    from meshplan.placement import Shard as S

    dm = _device_mesh()
    before = dist.get_pg_count()
    groups = ProcessGroups.from_device_mesh(dm)
    mesh = groups.mesh
    x = torch.arange(24.0).reshape(8, 3)
    moves = [
        ((S(0), S(0)), (R(), R())),  # one all_gather merged onto dp_tp
        ((S(0), R()), (R(), S(1))),
        ((S(0), S(1)), (S(1), S(0))),
    ]
    ok = []
    for a, b in moves:
        src, dst = Spec(mesh, a, (8, 3)), Spec(mesh, b, (8, 3))
        local = from_global(x, src)
        got = run(plan(src, dst), local, groups)
        ok.append(torch.equal(got, from_global(x, dst)))
    pgs = {id(g.pg) for g in groups._handles.values() if g is not None}
    theirs = {id(dm.get_group(n)) for n in ("dp", "tp")} | {
        id(dm._get_root_mesh()._flatten_mapping["dp_tp"].get_group())
    }
    whole = groups.get(None).pg  # the whole (2, 2) mesh: the flattened dim's group
    created = dist.get_pg_count() - before
    plain = ProcessGroups.from_device_mesh(init_device_mesh("cpu", (2, 2)))
    count = dist.get_pg_count()
    plain_whole = plain.get(None).ranks  # no flattened dim holds these ranks: made once
    plain.get(None)
    made = dist.get_pg_count() - count
    return {
        "created": created,
        "ok": ok,
        "subset": pgs <= theirs,
        "whole": whole is dm._get_root_mesh()._flatten_mapping["dp_tp"].get_group(),
        "made": (made, plain_whole),
    }


def from_global(x, spec):
    from meshplan.placement import Sharded

    return Sharded.from_global(x, spec, dist.get_rank()).local


_PLACEMENTS = [
    [Shard(0), Replicate()],
    [Shard(1), Shard(0)],
    [Replicate(), Partial("sum")],
    [Partial("avg"), Shard(0)],
    [Partial("max"), Partial("max")],
    [Partial("min"), Replicate()],
    [_StridedShard(0, split_factor=2), Shard(0)],
    [Shard(0), Shard(0)],
]


def _dtensor_round_trip(shape):
    from meshplan.placement import Sharded, from_torch

    dm = _device_mesh()
    mesh = Mesh.from_device_mesh(dm)
    torch.manual_seed(0)
    x = torch.randn(shape)
    out = []
    for placements in _PLACEMENTS:
        spec = from_torch(placements, mesh, shape)
        local = Sharded.from_global(x, spec, dist.get_rank()).local
        local = local + dist.get_rank()  # a Partial's terms differ per rank
        stride = torch.empty(shape).stride()
        dt = DTensor.from_local(local, dm, placements, shape=torch.Size(shape), stride=stride)
        placed_alike = True  # a Partial's split of the value is a choice: not compared
        try:  # torch's own placement of the data agrees where torch can place it
            if not any(p.is_partial() for p in placements):
                oracle = distribute_tensor(x, dm, placements).to_local() + dist.get_rank()
                placed_alike = torch.equal(oracle, local)
        except AssertionError:  # torch 2.13 cannot place a _StridedShard unevenly
            pass
        sharded = from_dtensor(dt)
        back = to_dtensor(sharded, dm)
        out.append(
            (
                str(sharded.spec),
                placed_alike,
                torch.equal(sharded.local, dt.to_local()),
                torch.equal(back.to_local(), dt.to_local()),
                tuple(back.placements) == tuple(dt.placements),
                tuple(back.shape) == tuple(dt.shape),
            )
        )
    return out


_MOVES = [
    ([Shard(0), Replicate()], [Replicate(), Replicate()]),
    ([Shard(0), Shard(0)], [Replicate(), Replicate()]),
    ([Shard(0), Shard(1)], [Shard(1), Shard(0)]),
    ([Replicate(), Replicate()], [Shard(1), Shard(0)]),
    ([Partial("sum"), Replicate()], [Replicate(), Replicate()]),
    ([Partial("sum"), Partial("sum")], [Shard(0), Replicate()]),
    ([Partial("avg"), Shard(1)], [Replicate(), Shard(1)]),
    ([Shard(1), Shard(0)], [Shard(0), Shard(1)]),
    ([Replicate(), Shard(0)], [Shard(0), Replicate()]),
]


def _source(x, dm, placements):
    """A leaf DTensor on ``placements`` whose value is ``x`` (Partials split it unevenly)."""
    locals_ = x
    if any(p.is_partial() for p in placements):
        coord = dm.get_coordinate()
        plain = [Replicate() if p.is_partial() else p for p in placements]
        locals_ = distribute_tensor(x, dm, plain).to_local()
        for m, p in enumerate(placements):
            if p.is_partial() and p.reduce_op == "sum":
                locals_ = locals_ * (0.25 + coord[m]) / (0.25 * 2 + 1)
        dt = DTensor.from_local(
            locals_, dm, placements, shape=x.shape, stride=x.stride(), run_check=False
        )
    else:
        dt = distribute_tensor(x, dm, placements)
    return dt.detach().requires_grad_(True)


def _against_torch(shape):
    # no flattened dim here: on one, torch 2.13's merged all_gather of an uneven dim
    # mismatches its collectives (see _flattened_uneven for meshplan on that mesh)
    dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64)
    weight = torch.randn(shape, dtype=torch.float64)
    out = []
    for src, dst in _MOVES:
        results = []
        for mine in (False, True):
            leaf = _source(x, dm, src)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = redistribute_dtensor(leaf, dst) if mine else leaf.redistribute(dm, dst)
            w = from_global(weight, from_dtensor(y).spec)
            (y.to_local() * w).sum().backward()
            results.append((y, leaf.grad))
        (ty, tg), (my, mg) = results
        out.append(
            (
                str(src),
                str(dst),
                tuple(my.placements) == tuple(ty.placements),
                # bit-exact, except that sums may be added in another order
                torch.equal(my.to_local(), ty.to_local())
                or (
                    any(p.is_partial() for p in src)
                    and torch.allclose(my.to_local(), ty.to_local(), rtol=1e-14, atol=0)
                ),
                tuple(mg.placements) == tuple(tg.placements),
                torch.allclose(mg.to_local(), tg.to_local()),
            )
        )
    return out


def _flattened_uneven():
    """S(0) S(0) -> R R of an uneven dim on a mesh with a flattened dim (merged gather)."""
    dm = _device_mesh()
    x = torch.arange(15.0).reshape(5, 3)
    dt = distribute_tensor(x, dm, [Shard(0), Shard(0)])
    y = redistribute_dtensor(dt, [Replicate(), Replicate()])
    steps = plan(from_dtensor(dt).spec, from_dtensor(y).spec).steps
    return torch.equal(y.to_local(), x), [s.alias for s in steps]


def _double_backward():
    dm = _device_mesh()
    x0 = distribute_tensor(torch.randn(4, 4, dtype=torch.float64), dm, [Shard(0), Shard(1)])
    got = []
    for mine in (False, True):
        x = x0.detach().requires_grad_(True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = (
                redistribute_dtensor(x, [Replicate(), Shard(1)])
                if mine
                else x.redistribute(dm, [Replicate(), Shard(1)])
            )
            (g,) = torch.autograd.grad((y.to_local() ** 3).sum(), x, create_graph=True)
            (gg,) = torch.autograd.grad((g.to_local() ** 2).sum(), x)
        got.append(gg)
    x = x0.detach()
    # what DTensor refuses ("redistributing to Partial is for internal use only"):
    z = redistribute_dtensor(x.detach(), [Shard(0), Partial("sum")])
    return (
        torch.allclose(got[0].to_local(), got[1].to_local()),
        got[1].placements,
        torch.equal(z.full_tensor(), x.detach().full_tensor()),
    )


def _bad_inputs():
    dm = _device_mesh()
    errors = []
    for call in (
        lambda: from_dtensor(torch.zeros(2)),
        lambda: to_dtensor(torch.zeros(2), dm),
        lambda: redistribute_dtensor(torch.zeros(2), [Replicate()]),
        lambda: redistribute_dtensor(
            distribute_tensor(torch.zeros(4), dm, [Replicate()] * 2), [Replicate()]
        ),
        lambda: Mesh.from_device_mesh("dp"),
    ):
        try:
            call()
            errors.append(None)
        except (PlacementError, RuntimeShellError, ValueError) as exc:
            errors.append(type(exc).__name__)
    return errors


def _meshplan_placements():
    """redistribute_dtensor given meshplan's own placements, and given neither kind."""
    import meshplan.placement as mp

    dm = _device_mesh()
    x = torch.arange(20.0).reshape(4, 5)
    dt = distribute_tensor(x, dm, [Shard(0), Shard(0)])
    ours = redistribute_dtensor(dt, [mp.Replicate(), mp.Shard(1)])
    theirs = dt.redistribute(dm, [Replicate(), Shard(1)])
    mixed = redistribute_dtensor(dt, [Replicate(), mp.Partial("sum")])
    try:
        redistribute_dtensor(dt, ["R", mp.Shard(1)])
        message = None
    except PlacementError as exc:
        message = str(exc)
    return (
        tuple(ours.placements),
        torch.equal(ours.to_local(), theirs.to_local()),
        tuple(mixed.placements),
        torch.equal(mixed.full_tensor(), x),
        message,
    )


# -- tests ----------------------------------------------------------------------------------


def test_device_mesh_to_mesh_and_back_keeps_every_group(pool4):
    for rank, r in enumerate(pool4.run(_mesh_round_trip)):
        assert r["names"] == (("dp", "tp"), ("dp", "tp")), rank
        assert r["aliases"] == ("dp_tp",)
        assert r["theirs"] == r["back"] == r["ours"], rank
        assert r["again"]
        assert r["sub"][0] == ("tp",) and r["sub"][1] == r["sub"][2]
        assert r["flat"][0] == ("dp_tp",) and r["flat"][1] == r["flat"][2]
        assert r["sub_back"] == r["ours"]["tp"]


def test_process_groups_from_device_mesh_creates_no_group(pool4):
    for r in pool4.run(_adopted_run):
        assert r["created"] == 0
        assert r["ok"] == [True, True, True]
        assert r["subset"]
        assert r["whole"]
        assert r["made"] == (1, (0, 1, 2, 3))


@pytest.mark.parametrize("shape", [(8, 4), (5, 3)], ids=["even", "uneven"])
def test_dtensor_to_sharded_and_back_keeps_local_and_placements(pool4, shape):
    for per_rank in pool4.run(_dtensor_round_trip, shape):
        for spec, *same in per_rank:
            assert all(same), (spec, same)


@pytest.mark.parametrize("shape", [(8, 4), (5, 3), (3, 1)], ids=["even", "uneven", "empty"])
def test_redistribute_dtensor_equals_dtensor_redistribute(pool4, shape):
    for per_rank in pool4.run(_against_torch, shape):
        for src, dst, placements, values, grad_placements, grads in per_rank:
            assert placements and values, (src, dst)
            assert grad_placements and grads, (src, dst)


def test_redistribute_dtensor_is_twice_differentiable(pool4):
    for ok, placements, to_partial in pool4.run(_double_backward):
        assert ok and to_partial
        assert tuple(placements) == (Shard(0), Shard(1))


def test_interop_rejects_wrong_inputs_naming_them(pool4):
    for errors in pool4.run(_bad_inputs):
        assert errors == [
            "PlacementError",
            "PlacementError",
            "PlacementError",
            "PlacementError",
            "MeshError",
        ]


def test_redistribute_dtensor_merges_an_uneven_gather_onto_the_flattened_dim(pool4):
    for ok, aliases in pool4.run(_flattened_uneven):
        assert ok
        assert aliases == ["dp_tp"]


def test_redistribute_dtensor_accepts_meshplan_placements(pool4):
    for placements, same, mixed, mixed_ok, message in pool4.run(_meshplan_placements):
        assert placements == (Replicate(), Shard(1)) and same
        assert mixed == (Replicate(), Partial("sum")) and mixed_ok
        assert message is not None and "'R' is a builtins.str" in message

"""The shell on NCCL: plans, a training step and a checkpoint round trip on GPUs.

Marked ``cuda`` and skipped unless this machine has at least two CUDA GPUs; run them
with ``python -m pytest -m cuda tests``. One NCCL worker per GPU (up to four).
"""

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs at least two CUDA GPUs (NCCL)",
    ),
]


def _world() -> int:
    return min(torch.cuda.device_count(), 4)


def _mesh():
    from meshplan.layout import Mesh

    world = _world()
    if world == 4:
        return Mesh.create((2, 2), ("dp", "tp"), device_type="cuda").flatten(("dp", "tp"), "all")
    return Mesh.create(world, "tp", device_type="cuda")


# -- tasks (run on every rank) ------------------------------------------------------------


def _plans_on_nccl():
    import torch.distributed as dist

    from meshplan.placement import Partial, Replicate, Shard, Spec, shard
    from meshplan.redistribute import plan
    from meshplan.runtime import ProcessGroups, run

    mesh = _mesh()
    groups = ProcessGroups(mesh)
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)
    n = mesh.ndim
    moves = [
        ([Shard(0)] * n, [Replicate()] * n),  # all_gather (merged on a 2-D mesh)
        ([Shard(0)] * n, [Shard(1)] * n),  # all_to_all
        ([Partial()] * n, [Shard(0)] * n),  # reduce_scatter
        ([Partial()] * n, [Replicate()] * n),  # all_reduce
    ]
    if n == 2:
        moves.append(([Shard(0), Shard(1)], [Shard(1), Shard(0)]))  # a permute (exchange)
    ok = []
    for a, b in moves:
        src, dst = Spec(mesh, a, x.shape), Spec(mesh, b, x.shape)
        local = shard(x, src)[rank].to(device)
        got = run(plan(src, dst), local, groups)
        ok.append(got.device.type == "cuda" and torch.equal(got.cpu(), shard(x, dst)[rank]))
    return ok


def _training_step():
    """Column-parallel linear layer: one forward, backward and SGD step on the GPU."""
    import torch.distributed as dist

    from meshplan.placement import Replicate, Shard, Spec, shard
    from meshplan.runtime import ProcessGroups, redistribute

    mesh = _mesh()
    groups = ProcessGroups(mesh)
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(0)
    w_full = torch.randn(8, 5, generator=g, dtype=torch.float64)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    n = mesh.ndim
    w_spec = Spec(mesh, [Shard(0)] * n, w_full.shape, "float64")
    w = shard(w_full, w_spec)[rank].to(device).requires_grad_()
    y_local = x.to(device) @ w.t()  # this rank's columns of y
    y_spec = Spec(mesh, [Shard(1)] * n, (3, 8), "float64")
    y_full = Spec(mesh, [Replicate()] * n, (3, 8), "float64")
    y = redistribute(y_local, y_spec, y_full, groups, dst_grad=y_full)
    loss = (y**2).sum()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
    # the same step in one process
    ref = w_full.clone().requires_grad_()
    ((x @ ref.t()) ** 2).sum().backward()
    want = shard((ref - 0.1 * ref.grad).detach(), w_spec)[rank]
    return torch.allclose(w.detach().cpu(), want), float(loss)


def _checkpoint_round_trip(path):
    import torch.distributed as dist

    from meshplan.checkpoint import load, save
    from meshplan.placement import Replicate, Shard, Sharded, Spec, shard
    from meshplan.runtime import ProcessGroups

    mesh = _mesh()
    groups = ProcessGroups(mesh)
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(1))
    n = mesh.ndim
    src = Spec(mesh, [Shard(0)] * n, x.shape)
    save({"x": Sharded(shard(x, src)[rank].to(device), src, rank)}, path, groups)
    dst = Spec(mesh, [Replicate()] * (n - 1) + [Shard(1)], x.shape)
    got = load(path, {"x": dst}, groups, device=device)["x"].local
    return got.device.type == "cuda" and torch.equal(got.cpu(), shard(x, dst)[rank])


# -- tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nccl_pool():
    from meshplan.runtime import WorkerPool

    pool = WorkerPool(_world(), "nccl", timeout=120.0, pg_timeout=60.0)
    yield pool
    pool.shutdown()


def test_plans_run_on_nccl(nccl_pool):
    for ok in nccl_pool.run(_plans_on_nccl):
        assert all(ok), ok


def test_a_training_step_on_nccl_matches_one_process(nccl_pool):
    results = nccl_pool.run(_training_step)
    assert all(ok for ok, _ in results)
    assert len({loss for _, loss in results}) == 1


def test_checkpoint_round_trip_on_nccl_loads_onto_the_gpu(nccl_pool, tmp_path):
    assert all(nccl_pool.run(_checkpoint_round_trip, str(tmp_path)))

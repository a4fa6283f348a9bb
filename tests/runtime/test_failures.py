"""Failures while running a plan are loud and bounded: a clear RuntimeShellError on every
surviving rank within the groups' timeout, never a hang or wrong data; the pool recovers.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from _shell_cases import groups_for

from meshplan.errors import RuntimeShellError, WorkerDied, WorkerError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, shard
from meshplan.redistribute import plan
from meshplan.runtime._autograd import redistribute
from meshplan.runtime._run import prepare_groups, run, run_step

TIMEOUT = 2.5  # seconds; no other test uses groups with this timeout
SLACK = 6.0  # seconds beyond the timeout a busy 2-core machine may need to notice

# -- tasks (run on every rank) ------------------------------------------------------------


def _faulty_run(p, x, fault, at_step):
    """Run ``p`` step by step; ``fault = (kind, rank)`` strikes that rank before step
    ``at_step``. Returns ("ok", elapsed, shape) or ("raised", elapsed, type, message)."""
    rank = dist.get_rank()
    groups = groups_for(p.src.mesh, TIMEOUT)
    prepare_groups(p, groups)
    local = shard(x, p.src)[rank]
    kind, victim = fault
    start = time.monotonic()
    try:
        if rank == victim and kind == "wrong shape":
            local = torch.cat([local, local])
            out = run(p, local, groups)
        elif rank == victim and kind == "wrong dtype":
            out = run(p, local.double(), groups)
        else:
            out = local
            for i, step in enumerate(p.steps):
                if rank == victim and i == at_step:
                    if kind == "exit":
                        os._exit(3)
                    if kind == "stall":
                        time.sleep(60)
                out = run_step(step, out, groups)
    except Exception as exc:  # reported to the parent
        return ("raised", time.monotonic() - start, type(exc).__name__, str(exc))
    return ("ok", time.monotonic() - start, tuple(out.shape))


def _sum_of_ranks():
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return int(t)


def _check_survivors(outcomes, victims):
    for rank, outcome in outcomes.items():
        if rank in victims:
            continue
        assert outcome[0] == "raised", (rank, outcome)
        _, elapsed, kind, message = outcome
        assert kind == "RuntimeShellError", (rank, kind, message)
        assert elapsed < TIMEOUT + SLACK, (rank, elapsed)
        assert "failed on rank" in message and "group" in message, message


# -- tests --------------------------------------------------------------------------------


def _gather_plan(world):
    mesh = Mesh.create((2, world // 2), ("dp", "tp"))
    src = Spec(mesh, [Partial(), Shard(0)], (world + 1, 3))
    dst = Spec(mesh, [Replicate(), Replicate()], (world + 1, 3))
    p = plan(src, dst, merge=False)
    assert len(p.steps) == 2  # a reduction and a gather, one mesh dim each
    return p, torch.arange((world + 1) * 3, dtype=torch.float32).reshape(world + 1, 3)


@pytest.mark.parametrize("at_step", [0, 1])
def test_a_rank_that_dies_mid_plan_fails_every_peer_within_the_timeout(pool, at_step):
    p, x = _gather_plan(pool.world_size)
    pool.run(_sum_of_ranks)  # the pool is up
    victim = 1
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        pool.run(_faulty_run, p, x, ("exit", victim), at_step)
    assert time.monotonic() - start < TIMEOUT + 2 * SLACK
    err = info.value
    assert isinstance(err.errors[victim], WorkerDied)
    assert "exit code 3" in str(err)
    outcomes = dict(err.results)
    # every rank that shares a group with the victim in the remaining steps fails loudly;
    # the others may finish the steps that do not need it
    needs_victim = {
        r
        for step in p.steps[at_step:]
        for r in p.src.mesh.group_of(victim, step.mesh_dims)
        if r != victim
    }
    for rank in needs_victim:
        assert outcomes[rank][0] == "raised", (rank, outcomes[rank])
    _check_survivors({r: o for r, o in outcomes.items() if o[0] == "raised"}, {victim})
    # the pool recovers
    n = pool.world_size
    assert pool.run(_sum_of_ranks) == [n * (n - 1) // 2] * n


@pytest.mark.parametrize("kind", ["wrong shape", "wrong dtype"])
def test_a_rank_with_a_wrong_local_tensor_fails_everyone_clearly(pool4, kind):
    p, x = _gather_plan(4)
    victim = 2
    try:
        outcomes = dict(enumerate(pool4.run(_faulty_run, p, x, (kind, victim), 0)))
    finally:
        pool4.restart()  # the survivors' groups timed out: start clean
    _, _, exc_kind, message = outcomes[victim]
    assert exc_kind == "RuntimeShellError"
    assert f"rank {victim}'s local tensor has" in message
    assert ("shape" if kind == "wrong shape" else "dtype float64") in message
    _check_survivors(outcomes, {victim})
    assert pool4.run(_sum_of_ranks) == [6] * 4


def test_a_stalled_rank_makes_its_peers_time_out_with_a_clear_error(pool4):
    p, x = _gather_plan(4)
    victim = 3
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        pool4.run(_faulty_run, p, x, ("stall", victim), 0, timeout=TIMEOUT + 4)
    assert time.monotonic() - start < TIMEOUT + 4 + SLACK
    outcomes = dict(info.value.results)
    assert victim not in outcomes  # it never answered: the pool reports a timeout
    _check_survivors(outcomes, {victim})
    assert any("timeout" in o[3] or "Timed out" in o[3] for o in outcomes.values())
    assert pool4.run(_sum_of_ranks) == [6] * 4


def _wrong_mesh():
    rank = dist.get_rank()
    mesh = Mesh.create((2, 2), ("a", "b"))
    other = Mesh.create((2, 2), ("a", "b"), ranks=(3, 2, 1, 0))
    spec = Spec(other, [Shard(0), Replicate()], (4,))
    local = shard(torch.arange(4.0), spec)[rank]
    try:
        redistribute(local, spec, Spec(other, [Replicate(), Replicate()], (4,)), groups_for(mesh))
    except RuntimeShellError as exc:
        return str(exc)
    return None


def test_process_groups_of_another_mesh_are_refused_before_any_collective(pool4):
    for message in pool4.run(_wrong_mesh):
        assert message is not None and "differs from the process groups' mesh" in message

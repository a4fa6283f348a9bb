"""Fail-stop: a rank that raises mid-program stops every other rank within seconds, with a
RuntimeShellError naming it and its error, instead of leaving them blocked in a collective
until the groups' timeout; the world it leaves is never reported alive, and the next
task runs on a fresh one."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from meshplan.errors import RuntimeShellError, WorkerError
from meshplan.layout import Mesh
from meshplan.placement import Shard, Spec, shard
from meshplan.runtime import ProcessGroups, run_program
from meshplan.strategy import plan_program

MESH = Mesh.create((2, 2), ("dp", "tp"))
GROUP_TIMEOUT = 60.0  # what a blocked peer would wait without fail-stop
STOPPED_WITHIN = 10.0  # seconds: every rank raises within this after the failure
VICTIM = 2


def _model(x):
    return (x * 2).relu().sum()


@pytest.fixture(scope="module")
def program():
    # mul and relu run on the shards, then the sum needs every rank's: a rank failing at
    # its second op (relu) leaves the others waiting for it in that gather
    x = Spec(MESH, (Shard(0), Shard(1)), (8, 4), "float32")
    return plan_program(_model, x)


def _locals(program):
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(s.shape, generator=gen) for s in program.arg_specs]
    return [shard(t, s) for t, s in zip(xs, program.arg_specs, strict=True)]


# -- tasks (run on every rank) ------------------------------------------------------------


class _FailAt:
    """Make the victim's ``at``-th local op of a program raise ``MemoryError``."""

    def __init__(self, at: int) -> None:
        from meshplan.runtime import _program

        self.shell = _program._Shell
        self.original = self.shell.call
        self.at, self.calls = at, 0

    def __enter__(self) -> _FailAt:
        original, fault = self.original, self

        def call(shell, op, tensors):
            fault.calls += 1
            if dist.get_rank() == VICTIM and fault.calls == fault.at:
                raise MemoryError(f"planned failure at op {fault.at}")
            return original(shell, op, tensors)

        self.shell.call = call
        return self

    def __exit__(self, *exc: object) -> None:
        self.shell.call = self.original


def _run_failing(program, locals_, catch):
    """Run ``program`` with the victim failing at its second op: ``("raised", seconds,
    type, message)`` when ``catch`` (else the error propagates), or ``("ok", seconds)``."""
    rank = dist.get_rank()
    groups = ProcessGroups(MESH, timeout=GROUP_TIMEOUT)
    xs = [loc[rank] for loc in locals_]
    run_program(program, groups, *xs)  # a healthy call first: the world works
    start = time.monotonic()
    with _FailAt(2):
        try:
            run_program(program, groups, *xs)
        except Exception as exc:
            if not catch:
                raise
            return ("raised", time.monotonic() - start, type(exc).__name__, str(exc))
    return ("ok", time.monotonic() - start)


def _call_again_after_a_failure(program, locals_):
    """After the failure, every rank's next call refuses at once: (seconds, message)."""
    rank = dist.get_rank()
    groups = ProcessGroups(MESH, timeout=GROUP_TIMEOUT)
    xs = [loc[rank] for loc in locals_]
    with _FailAt(2), pytest.raises((MemoryError, RuntimeShellError)):
        run_program(program, groups, *xs)
    start = time.monotonic()
    try:
        run_program(program, groups, *xs)
    except RuntimeShellError as exc:
        return time.monotonic() - start, str(exc)
    return time.monotonic() - start, None


def _sum_of_ranks():
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return int(t)


def _check_stopped(outcomes):
    kind, _, victim_type, victim_message = outcomes[VICTIM]
    assert (kind, victim_type) == ("raised", "MemoryError"), outcomes[VICTIM]
    assert "planned failure at op 2" in victim_message
    for rank, outcome in outcomes.items():
        if rank == VICTIM:
            continue
        assert outcome[0] == "raised", (rank, outcome)
        _, seconds, kind, message = outcome
        assert kind == "RuntimeShellError", (rank, kind, message)
        assert seconds < STOPPED_WITHIN, (rank, seconds)
        assert f"rank {VICTIM}" in message and "MemoryError" in message, message


# -- tests --------------------------------------------------------------------------------


def test_a_rank_raising_mid_program_stops_every_rank_within_seconds(pool4, program):
    outcomes = dict(
        enumerate(pool4.run(_run_failing, program, _locals(program), True, timeout=180))
    )
    _check_stopped(outcomes)
    # every task caught its error, but the groups are dead: the pool says so ...
    assert pool4.alive is False
    # ... and the next call runs on a fresh world
    assert pool4.run(_sum_of_ranks) == [6] * 4
    assert pool4.alive


def test_a_task_that_lets_the_error_out_fails_on_every_rank_within_seconds(pool4, program):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        pool4.run(_run_failing, program, _locals(program), False, timeout=180)
    assert time.monotonic() - start < 180
    errors = info.value.errors
    assert sorted(errors) == [0, 1, 2, 3]
    assert isinstance(errors[VICTIM], MemoryError)
    for rank in (0, 1, 3):
        assert isinstance(errors[rank], RuntimeShellError)
        assert f"rank {VICTIM}" in str(errors[rank]) and "MemoryError" in str(errors[rank])
    # the report leads with the rank that failed first
    assert "MemoryError: planned failure at op 2" in str(info.value).split("--- traceback")[1]
    assert pool4.run(_sum_of_ranks) == [6] * 4


def test_after_a_failure_the_next_call_refuses_at_once_on_every_rank(pool4, program):
    outcomes = pool4.run(_call_again_after_a_failure, program, _locals(program), timeout=180)
    for seconds, message in outcomes:
        assert message is not None and "unusable" in message, message
        assert f"rank {VICTIM}" in message and "MemoryError" in message, message
        assert seconds < 1.0
    assert pool4.alive is False
    assert pool4.run(_sum_of_ranks) == [6] * 4

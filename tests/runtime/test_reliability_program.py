"""Regressions of run_program on gloo: arguments that do not fit (a dtype on one rank) stop
every rank at once with a typed error, and a result back-propagates twice with
``retain_graph=True`` as torch's own autograd does."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from meshplan.errors import RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard
from meshplan.runtime import ProcessGroups, run_program
from meshplan.strategy import plan_program

MESH = Mesh.create((2, 2), ("dp", "tp"))


def _loss(x, w):
    return (x @ w).pow(2).sum()


@pytest.fixture(scope="module")
def program():
    x = Spec(MESH, (Shard(0), Replicate()), (8, 4), "float32")
    w = Spec(MESH, (Replicate(), Shard(1)), (4, 6), "float32")
    return plan_program(_loss, x, w)


def _inputs(program):
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(s.shape, generator=gen) for s in program.arg_specs]
    return xs, [shard(t, s) for t, s in zip(xs, program.arg_specs, strict=True)]


# -- arguments that do not fit on one rank --------------------------------------------------


def _run_with_bad(program, locals_, bad_rank, how):
    rank = dist.get_rank()
    groups = ProcessGroups(MESH, timeout=30)
    xs = [loc[rank] for loc in locals_]
    if rank == bad_rank:
        if how == "dtype":
            xs[0] = xs[0].double()
        elif how == "shape":
            xs[1] = xs[1][:, :1]
        else:
            xs = xs[:1]
    try:
        run_program(program, groups, *xs)
    except RuntimeShellError as e:
        return str(e)
    return None


@pytest.mark.parametrize("how", ["dtype", "shape", "count"])
def test_arguments_that_do_not_fit_on_one_rank_stop_every_rank_at_once(pool4, program, how):
    _, locals_ = _inputs(program)
    errors = pool4.run(_run_with_bad, program, locals_, 2, how, timeout=120)
    assert all(e is not None for e in errors), errors
    word = {"dtype": "float64", "shape": "shape", "count": "local tensors"}[how]
    assert word in errors[2], errors[2]
    for rank in (0, 1, 3):
        assert "rank 2" in errors[rank] and "did not start" in errors[rank], errors[rank]


def _run_other_program(programs, locals_):
    rank = dist.get_rank()
    program = programs[rank % 2]
    groups = ProcessGroups(MESH, timeout=30)
    try:
        run_program(program, groups, *[loc[rank] for loc in locals_])
    except RuntimeShellError as e:
        return str(e)
    return None


def test_ranks_that_run_different_programs_all_raise(pool4, program):
    other = plan_program(lambda x, w: (x @ w).sum(), *program.arg_specs)
    _, locals_ = _inputs(program)
    errors = pool4.run(_run_other_program, (program, other), locals_, timeout=120)
    assert all(e is not None and "different program" in e for e in errors), errors


# -- backward twice -------------------------------------------------------------------------


def _backward_twice(program, locals_):
    rank = dist.get_rank()
    groups = ProcessGroups(MESH, timeout=30)
    xs = [loc[rank].clone().requires_grad_() for loc in locals_]
    loss = run_program(program, groups, *xs)
    loss.backward(retain_graph=True)
    once = [x.grad.clone() for x in xs]
    loss.backward()
    twice = [x.grad.clone() for x in xs]
    try:
        loss.backward()  # the graph is freed now, as torch's own
    except RuntimeError as e:
        third = type(e).__name__
    else:
        third = None
    return once, twice, third


def test_a_program_result_back_propagates_twice_with_retain_graph(pool4, program):
    _, locals_ = _inputs(program)
    results = pool4.run(_backward_twice, program, locals_, timeout=120)
    for once, twice, third in results:
        for a, b in zip(once, twice, strict=True):
            torch.testing.assert_close(b, 2 * a)
        assert third == "RuntimeError"


# -- one process (a fake world): the dtype check itself, with and without the agreement ----


@pytest.mark.parametrize("check", [True, False])
def test_a_float64_argument_of_a_float32_program_is_a_typed_error(fake_world, program, check):
    _, locals_ = _inputs(program)
    groups = ProcessGroups(MESH, check_specs=check)
    xs = [loc[0] for loc in locals_]
    xs[0] = xs[0].double()
    with pytest.raises(RuntimeShellError, match="argument 0 has dtype float64 on rank 0"):
        run_program(program, groups, *xs)

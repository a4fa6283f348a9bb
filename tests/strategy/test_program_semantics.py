"""A planned program means what the function means in eager torch: writes, draws, buffers.

Three kinds of ordinary model code once gave wrong results with no error: writes into a
strided view (a decoder's shift-right), random ops (every rank drew its own dropout
mask) and in-place buffer updates of a moved buffer (BatchNorm's running statistics
given ``S(0)``). Each is checked here in the simulator against one process: eager torch
where the function draws nothing, else :func:`~meshplan.runtime.run_unsharded` (the
traced program on whole tensors, drawing from the same stream).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard, unshard
from meshplan.runtime import run_unsharded, simulate_program
from meshplan.strategy import plan_module, plan_program

F64 = "float64"


def _eager(fn, tensors):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*leaves)
    out.backward()
    return out.detach(), [t.grad for t in leaves]


def _simulated(prog, tensors, **kw):
    locals_ = [shard(t, s) for t, s in zip(tensors, prog.arg_specs, strict=True)]
    outs, grads = simulate_program(prog, *locals_, **kw)
    return outs, grads


# -- writes into views ----------------------------------------------------------------------


def shift_right(ids, w):
    shifted = ids.new_zeros(ids.shape)
    shifted[..., 1:] = ids[..., :-1]
    shifted[..., 0] = 5
    return w[shifted].square().sum()


@pytest.mark.parametrize("ids_placement", [Replicate(), Shard(0), Shard(1)])
def test_a_shift_right_written_into_a_strided_view_equals_eager(ids_placement):
    mesh = Mesh.create((2,))
    ids = torch.randint(0, 7, (4, 6))
    w = torch.randn(7, 3, dtype=torch.float64)
    prog = plan_program(
        shift_right,
        Spec(mesh, [ids_placement], ids.shape, "int64"),
        Spec(mesh, [Replicate()], w.shape, F64),
    )
    want, want_grads = _eager(shift_right, [ids, w])
    outs, grads = _simulated(prog, [ids, w])
    for r, t in outs[0].items():
        assert torch.allclose(t, want, rtol=1e-12), (r, t, want)
    got = unshard(grads[1], prog.grad_specs[1])
    assert torch.allclose(got, want_grads[1], rtol=1e-12)


def test_a_write_through_a_transposed_view_of_an_argument_copy_reads_the_new_value():
    def fn(x):
        y = x.clone()
        y.t()[1:, ::2].fill_(2.0)
        y.t()[0].copy_(torch.arange(4, dtype=y.dtype))
        return (y * x).sum()

    mesh = Mesh.create((2,))
    x = torch.randn(4, 5, dtype=torch.float64)
    for p in (Replicate(), Shard(0), Shard(1)):
        prog = plan_program(fn, Spec(mesh, [p], x.shape, F64))
        want, want_grads = _eager(fn, [x])
        outs, grads = _simulated(prog, [x])
        assert torch.allclose(unshard(outs[0], prog.out_specs[0]), want, rtol=1e-12)
        assert torch.allclose(unshard(grads[0], prog.grad_specs[0]), want_grads[0], rtol=1e-12)


# -- casts ----------------------------------------------------------------------------------


def _rel(got, want):
    """Norm-wise relative error ``||got - want|| / ||want||``."""
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def test_a_partial_sum_cast_to_float32_and_back_rounds_once_as_one_process():
    # Mamba's pattern: a float64 sum cast to float32 and back. Cast piece by piece (each
    # rank's partial sum rounded to float32, then summed) it was off by float32's rounding
    # of each piece (2.6e-8 relative in Mamba's gradients); the sum is taken first now
    def fn(x, w):
        return (x @ w).float().double().square().sum()

    mesh = Mesh.create((4,))
    torch.manual_seed(0)
    x, w = torch.randn(8, 16, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    prog = plan_program(
        fn, Spec(mesh, [Shard(1)], x.shape, F64), Spec(mesh, [Shard(0)], w.shape, F64)
    )
    outs, grads = _simulated(prog, [x, w])
    one, one_grads = run_unsharded(prog, x, w)
    assert _rel(unshard(outs[0], prog.out_specs[0]), one[0]) <= 1e-15
    for a in range(2):
        assert _rel(unshard(grads[a], prog.grad_specs[a]), one_grads[a]) <= 1e-15, a


# -- random ops -----------------------------------------------------------------------------


def dropout_loss(x, w):
    return F.dropout(x @ w, 0.5, True).square().mean()


def _dropout_program():
    mesh = Mesh.create((4,))
    return plan_program(
        dropout_loss,
        Spec(mesh, [Shard(0)], (8, 5), F64),
        Spec(mesh, [Replicate()], (5, 6), F64),
    )


def test_dropout_draws_one_mask_every_rank_agrees_and_equals_one_process_with_the_seed():
    torch.manual_seed(0)
    x, w = torch.randn(8, 5, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    prog = _dropout_program()
    outs, grads = _simulated(prog, [x, w], seed=11, step=3)
    losses = list(outs[0].values())
    assert all(torch.equal(t, losses[0]) for t in losses), losses
    one, one_grads = run_unsharded(prog, x, w, seed=11, step=3)
    assert torch.allclose(losses[0], one[0], rtol=1e-12)
    for a in range(2):
        got = unshard(grads[a], prog.grad_specs[a])
        assert torch.allclose(got, one_grads[a], rtol=1e-12, atol=1e-14), a
    # the mask is a draw: another step or seed draws another one
    other, _ = run_unsharded(prog, x, w, seed=11, step=4)
    assert not torch.allclose(other[0], one[0])
    # and the draw is dropout's: about half the entries kept, scaled by 2
    assert 0 < one[0] < 4 * (x @ w).square().mean()


def test_a_random_op_in_a_program_needs_a_seed():
    prog = _dropout_program()
    x, w = torch.randn(8, 5, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    with pytest.raises(RuntimeShellError, match="seed"):
        _simulated(prog, [x, w])


@pytest.mark.parametrize(
    "draw",
    [
        lambda x: torch.rand_like(x) * x,
        lambda x: torch.randn(x.shape, dtype=x.dtype) + x,
        lambda x: x.clone().uniform_(-1, 1) * x,
        lambda x: x.clone().normal_(2.0, 0.5) * x,
        lambda x: torch.bernoulli(torch.sigmoid(x)) * x,
        lambda x: x.clone().bernoulli_(0.3) * x,
    ],
)
def test_each_random_op_gives_each_rank_its_shard_of_one_draw(draw):
    def fn(x):
        return draw(x).exp()

    mesh = Mesh.create((2, 2))
    x = torch.randn(6, 4, dtype=torch.float64)
    spec = Spec(mesh, [Shard(0), Shard(1)], x.shape, F64)
    prog = plan_program(fn, spec, out_specs=[spec], requires_grad=[False])
    (out,), _ = _simulated(prog, [x], seed=5)
    (one,), _ = run_unsharded(prog, x, seed=5)
    assert torch.allclose(unshard(out, spec), one, rtol=1e-12)
    (again,), _ = run_unsharded(prog, x, seed=6)
    assert not torch.allclose(again, one)


# -- buffers --------------------------------------------------------------------------------


def test_batchnorm_buffers_given_s0_hold_one_process_state_after_a_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).double()
    model.train()
    mesh = Mesh.create((2,))
    x = torch.randn(8, 4, dtype=torch.float64)
    b = Spec(mesh, [Shard(0)], x.shape, F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mp = plan_module(
            model,
            b,
            specs={"1.running_mean": "S(0)", "1.running_var": "S(0)"},
            forward=lambda m, x: m(x).square().mean(),
        )
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    locals_ = [
        shard(t, s) for t, s in zip(mp.arguments(state, x), mp.program.arg_specs, strict=True)
    ]
    outs, grads = simulate_program(mp.program, *locals_)
    assert set(mp.written) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    new = mp.state_after(outs)
    loss = model(x).square().mean()  # one process: updates the module's buffers in place
    assert torch.allclose(unshard(outs[0], mp.program.out_specs[0]), loss.detach(), rtol=1e-12)
    for name, t in model.named_buffers():
        spec = mp.specs[name]
        assert str(spec.placements[0]) == ("S(0)" if "running" in name else "R")
        assert torch.allclose(unshard(new[name], spec).to(t.dtype), t, rtol=1e-12), name
    assert not torch.allclose(
        model[1].running_mean, torch.zeros(6, dtype=torch.float64)
    )  # the step moved it


def test_a_function_writing_into_a_differentiated_argument_is_refused():
    from meshplan.errors import StrategyError

    def fn(x, w):
        w.mul_(2)
        return (x @ w).sum()

    mesh = Mesh.create((2,))
    with pytest.raises(StrategyError, match=r"in place .*test_program_semantics.py:\d+"):
        plan_program(
            fn, Spec(mesh, [Shard(0)], (4, 3), F64), Spec(mesh, [Replicate()], (3, 2), F64)
        )


# -- property: random writes into random views -----------------------------------------------


@st.composite
def view_writes(draw):
    """A function writing into views of a clone of its argument, with its shape: slices of
    it or of its transpose (every other row or column from some start), diagonals, and
    windows of its storage (``as_strided``, rows of up to two strided columns)."""
    shape = (draw(st.integers(2, 5)), draw(st.integers(2, 5)))
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["slice", "slice", "diagonal", "as_strided"]))
        transpose = kind != "as_strided" and draw(st.booleans())
        dims = shape[::-1] if transpose else shape
        if kind == "slice":
            d = draw(st.integers(0, 1))
            where = (d, draw(st.integers(0, dims[d] - 1)), draw(st.integers(1, 2)))
        elif kind == "diagonal":
            where = (draw(st.integers(1 - dims[0], dims[1] - 1)),)
        else:
            step = draw(st.integers(1, 2))
            cols = draw(st.integers(1, (shape[1] - 1) // step + 1))
            rows = draw(st.integers(1, shape[0]))
            span = (cols - 1) * step  # no element twice: the columns stay within a row
            first = draw(st.integers(0, (shape[0] - rows) * shape[1] + shape[1] - 1 - span))
            where = ((rows, cols), (shape[1], step), first)
        how = draw(st.sampled_from(["copy_", "fill_", "masked_fill_", "index_put_", "setitem"]))
        steps.append((kind, transpose, where, how))
    return shape, tuple(steps)


def _view(t, kind, transpose, where):
    base = t.t() if transpose else t
    if kind == "slice":
        d, start, stride = where
        index = [slice(None), slice(None)]
        index[d] = slice(start, None, stride)
        return base[tuple(index)]
    if kind == "diagonal":
        return base.diagonal(where[0])
    return base.as_strided(*where)


def _apply(shape, steps):
    def fn(x):
        y = x.clone() * 1.5
        for kind, transpose, where, how in steps:
            view = _view(y, kind, transpose, where)
            if how == "copy_":
                view.copy_(_view(x, kind, transpose, where))
            elif how == "fill_":
                view.fill_(-2.0)
            elif how == "masked_fill_":
                view.masked_fill_(view > 0, 0.25)
            elif how == "index_put_":
                rows = torch.arange(0, view.shape[0], 2)
                view.index_put_((rows,), view[rows] * 3)
            elif kind == "slice":
                base = y.t() if transpose else y
                d, start, stride = where
                index = [slice(None), slice(None)]
                index[d] = slice(start, None, stride)
                base[tuple(index)] = view * -1 + 1
            else:
                view[...] = view * -1 + 1
        return (y * x).sum()

    return fn


@settings(max_examples=min(settings.default.max_examples, 25), deadline=None)
@given(case=view_writes(), placement=st.sampled_from([Replicate(), Shard(0), Shard(1)]))
def test_random_writes_into_random_views_equal_one_process(case, placement):
    shape, steps = case
    fn = _apply(shape, steps)
    mesh = Mesh.create((2,))
    x = torch.randn(shape, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = plan_program(fn, Spec(mesh, [placement], shape, F64))
    want, want_grads = _eager(fn, [x])
    outs, grads = _simulated(prog, [x])
    assert torch.allclose(unshard(outs[0], prog.out_specs[0]), want, rtol=1e-12), steps
    assert torch.allclose(unshard(grads[0], prog.grad_specs[0]), want_grads[0], rtol=1e-12)
    assert prog.replicated == 0, prog.fallbacks

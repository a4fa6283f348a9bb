"""Output dtypes: the rules' type promotion agrees with torch, and they refuse what torch refuses."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import DTYPES, Replicate, Shard, Spec, shard, unshard
from meshplan.strategy import OPS, Meta, RuleSet, check_rule, propagate_simulated, select
from meshplan.strategy.rules._dtypes import ALL_DTYPES, promote_types, result_type

MESH = Mesh.create(2)
EINSUM_DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128")
SHAPES_2 = [[(3, 4), (3, 4)], [(3, 4), ()], [(), (3, 4)], [(), ()], [(3, 4), (4,)]]
SCALARS = [2, -1, 2.5, 0.5, np.int64(3), np.float32(0.5), np.float64(-2.0)]

# (op, input shapes, args): every built-in op, with 0-d operands and scalars for the
# binary ops (torch ranks dimensioned tensors, 0-d tensors and scalars differently)
CASES = [
    *[(op, [(3, 4)], {}) for op in ("neg", "clone", "exp", "relu", "sigmoid", "tanh")],
    *[(op, [(3, 4)], {}) for op in ("abs", "sin", "cos", "square", "gelu", "silu")],
    *[
        (op, shapes, {})
        for op in ("add", "sub", "mul", "div", "maximum", "minimum")
        for shapes in SHAPES_2
    ],
    *[(op, [(3, 4)], {"other": c}) for op in ("add", "sub", "mul", "div") for c in SCALARS],
    *[(op, [()], {"other": c}) for op in ("add", "mul") for c in (2, 2.5)],
    *[(op, [(3, 4)], {"dim": d}) for op in ("sum", "mean", "amax", "amin") for d in (0, None)],
    ("softmax", [(3, 4)], {"dim": 1}),
    ("log_softmax", [(3, 4)], {"dim": 0}),
    ("cat", [(3, 4), (2, 4)], {"dim": 0}),
    ("cat", [(3, 4), (3, 1), (3, 2)], {"dim": 1}),
    ("stack", [(3, 4), (3, 4)], {"dim": 1}),
    ("stack", [(), ()], {"dim": 0}),
    ("transpose", [(3, 4)], {"dim0": 0, "dim1": 1}),
    ("permute", [(3, 4, 2)], {"dims": (2, 0, 1)}),
    ("view", [(3, 4)], {"shape": (12,)}),
    ("reshape", [(3, 4)], {"shape": (2, 6)}),
    ("mm", [(3, 4), (4, 5)], {}),
    ("bmm", [(2, 3, 4), (2, 4, 5)], {}),
    ("addmm", [(5,), (3, 4), (4, 5)], {}),
    ("addmm", [(3, 5), (3, 4), (4, 5)], {"beta": 0.5, "alpha": 2}),
    ("linear", [(3, 4), (5, 4)], {}),
    ("linear", [(3, 4), (5, 4), (5,)], {}),
    ("einsum", [(3, 4), (4, 5)], {"equation": "ij,jk->ik"}),
    ("einsum", [(3, 4)], {"equation": "ij->i"}),
    ("einsum", [(3, 4), (3, 4)], {"equation": "ij,ij->ij"}),
    ("embedding", [(3,), (6, 4)], {}),
]


def _meshplan_dtype(op, dtypes, shapes, args):
    """The selected strategy's output dtype, or None when meshplan refuses the call."""
    specs = [Spec(MESH, (Replicate(),), s, d) for s, d in zip(shapes, dtypes, strict=True)]
    try:
        return select(op, specs, **args).output_spec.dtype
    except StrategyError:
        return None


def _torch_dtype(op, dtypes, shapes, args):
    """torch's output dtype on CPU, or None when torch refuses the call."""
    tensors = [
        torch.zeros(s, dtype=getattr(torch, d))
        if op == "embedding" and i == 0
        # ones: a value every dtype holds (embedding indices stay in range as zeros)
        else torch.ones(s, dtype=getattr(torch, d))
        for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))
    ]
    try:
        return str(OPS[op](*tensors, **args).dtype).removeprefix("torch.")
    except (RuntimeError, TypeError, ValueError):  # NotImplementedError is a RuntimeError
        return None


def _limitation(op, dtypes, want):
    """Where meshplan refuses on purpose though torch computes a result."""
    if want not in DTYPES:  # e.g. complex32: no meshplan dtype to name the result
        return True
    # torch's einsum result dtype for integers depends on its contraction path
    return op == "einsum" and (len(set(dtypes)) > 1 or not set(dtypes) <= set(EINSUM_DTYPES))


def _agree(op, dtypes, shapes, args):
    got = _meshplan_dtype(op, dtypes, shapes, args)
    want = _torch_dtype(op, dtypes, shapes, args)
    if got is None and want is not None:
        assert _limitation(op, dtypes, want), (
            f"meshplan refuses {op}{tuple(dtypes)} {args} but torch computes {want}"
        )
    else:
        assert got == want, f"{op}{tuple(dtypes)} shapes {shapes} {args}: {got} != torch {want}"


def test_the_cases_cover_every_builtin_op():
    # (ops whose rule reads traced aten calls only take their dtypes from the trace)
    rs = RuleSet.default()
    assert {op for op, _, _ in CASES} == {op for op in rs.ops if rs[op].outputs is not None}


@pytest.mark.parametrize(("op", "shapes", "args"), [c for c in CASES if len(c[1]) == 1])
def test_single_input_output_dtypes_agree_with_torch_for_every_dtype(op, shapes, args):
    for dtype in ALL_DTYPES:
        _agree(op, [dtype], shapes, args)


@settings(max_examples=4 * settings.default.max_examples)  # 400 in CI
@given(data=st.data())
def test_output_dtypes_agree_with_torch_or_both_refuse(data):
    op, shapes, args = data.draw(st.sampled_from([c for c in CASES if len(c[1]) > 1]))
    same = data.draw(st.booleans(), label="one dtype")  # ops like mm need one dtype
    first = data.draw(st.sampled_from(ALL_DTYPES))
    dtypes = [first if same else data.draw(st.sampled_from(ALL_DTYPES)) for _ in shapes]
    dtypes[0] = first
    _agree(op, dtypes, shapes, args)


def test_promote_types_is_torch_promote_types():
    for a, b in itertools.product(ALL_DTYPES, repeat=2):
        try:
            want = str(torch.promote_types(getattr(torch, a), getattr(torch, b)))[6:]
        except RuntimeError:
            with pytest.raises(StrategyError, match="float8"):
                promote_types(a, b)
        else:
            assert promote_types(a, b) == want, (a, b)


@pytest.mark.parametrize(
    ("op", "dtypes", "args", "dtype"),
    [
        # the audit's examples: each was the first input's dtype before
        ("sum", ["int32"], {}, "int64"),
        ("sum", ["bool"], {}, "int64"),
        ("add", ["int64", "float32"], {}, "float32"),
        ("mul", ["int64"], {"other": 2.5}, "float32"),
        ("div", ["int64", "int64"], {}, "float32"),
        ("abs", ["complex64"], {}, "float32"),
        ("cat", ["int8", "uint8"], {}, "int16"),
    ],
)
def test_output_dtype_follows_torch_promotion(op, dtypes, args, dtype):
    specs = [Spec(MESH, (Replicate(),), (4,), d) for d in dtypes]
    assert select(op, specs, **args).output_spec.dtype == dtype


@pytest.mark.parametrize(
    ("op", "dtypes", "match"),
    [
        ("mm", ["float32", "float64"], "one dtype"),
        ("relu", ["bool"], "relu for bool"),
        ("sub", ["bool", "bool"], "sub for bool"),
        ("mean", ["int64"], "mean for int64"),
        ("maximum", ["complex64", "complex64"], "maximum for complex64"),
        ("add", ["float8_e4m3fn", "float8_e4m3fn"], "float8"),
        ("softmax", ["int32"], "softmax for int32"),
    ],
)
def test_dtypes_torch_refuses_are_refused(op, dtypes, match):
    shape = (4, 4)
    args = {"dim": 0} if op == "softmax" else {}
    specs = [Spec(MESH, (Replicate(),), shape, d) for d in dtypes]
    with pytest.raises(StrategyError, match=match):
        select(op, specs, **args)


def test_zero_dim_operands_and_scalars_only_raise_the_category():
    def meta(shape, dtype):
        return Meta(shape, dtype)

    assert result_type("add", [meta((2,), "int8"), meta((), "int64")]) == "int8"
    assert result_type("add", [meta((2,), "int8"), meta((), "float64")]) == "float64"
    assert result_type("add", [meta((2,), "float16"), meta((), "float64")]) == "float16"
    assert result_type("add", [meta((2,), "uint8")], [-1]) == "uint8"
    assert result_type("add", [meta((2,), "bool")], [np.int64(2)]) == "int64"
    with pytest.raises(StrategyError, match="complex dtype of float16"):
        result_type("add", [meta((2,), "float16"), meta((), "complex64")])


def test_simulated_integer_ops_give_the_promoted_dtype_on_every_rank():
    x = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    spec = Spec(MESH, (Shard(0),), (4, 2), "int32")
    out, choice = propagate_simulated("sum", [shard(x, spec)], [spec], dim=0)
    assert choice.output_spec.dtype == "int64"
    assert all(t.dtype == torch.int64 for t in out.values())
    assert torch.equal(unshard(out, choice.output_spec), x.sum(0))


@pytest.mark.parametrize(
    ("op", "inputs", "args"),
    [
        ("sum", [Meta((5, 7), "int32")], {"dim": 1}),
        ("add", [Meta((5, 7), "int64"), Meta((5, 7), "float32")], {}),
        ("mul", [Meta((5, 7), "int64")], {"other": 2.5}),
        ("div", [Meta((5, 7), "int16")], {"other": 2}),
        ("maximum", [Meta((5, 7), "bool"), Meta((7,), "uint8")], {}),
        ("cat", [Meta((5, 7), "int8"), Meta((3, 7), "int16")], {"dim": 0}),
    ],
)
def test_rules_with_promoted_dtypes_compute_the_op(op, inputs, args):
    report = check_rule(op, inputs=inputs, meshes=[(2,), (2, 2)], **args)
    assert report.ok, str(report)


def test_type_promotion_runs_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from meshplan.layout import Mesh\n"
        "from meshplan.placement import Spec, Replicate\n"
        "from meshplan.strategy import select\n"
        "m = Mesh.create(2)\n"
        "a, b = Spec(m, (Replicate(),), (4,), 'int64'), Spec(m, (Replicate(),), (4,), 'float16')\n"
        "print(select('add', (a, b)).output_spec.dtype, select('sum', (a,)).output_spec.dtype)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["float16", "int64"]

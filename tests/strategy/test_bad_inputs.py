"""Bad input raises a StrategyError naming the value and the fix; numpy scalars work as ints."""

import time

import numpy as np
import pytest
import torch

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, shard, unshard
from meshplan.strategy import (
    DimStrategy,
    Meta,
    OpRule,
    Placeholder,
    RuleSet,
    check_constraint,
    check_rule,
    expand,
    meta_of,
    propagate,
    propagate_simulated,
    replicate_strategy,
    run_local,
    select,
    shard_kinds,
)

MESH = Mesh.create(2)
A = Spec(MESH, (Replicate(),), (4, 4))
B = Spec(MESH, (Replicate(),), (4, 4))


def _rule(inputs):
    return [DimStrategy([Placeholder(0)], [Placeholder(0)])]


# -- local tensors are checked against their specs --------------------------------


def test_simulated_locals_of_the_wrong_shape_are_refused():
    # regression: (7, 7) locals for a (4, 3) spec sharded in (2, 3) pieces gave (7, 7) outputs
    spec = Spec(MESH, (Shard(0),), (4, 3))
    with pytest.raises(StrategyError, match=r"rank 0's local input 0 has shape \(7, 7\).*\(2, 3\)"):
        propagate_simulated("neg", [{0: torch.ones(7, 7), 1: torch.ones(7, 7)}], [spec])


def test_simulated_locals_must_hold_every_rank_of_the_mesh():
    locals_a = shard(torch.ones(4, 4), A)
    with pytest.raises(StrategyError, match=r"local input 1 must hold exactly the ranks \[0, 1\]"):
        propagate_simulated("mm", [locals_a, {}], (A, B))  # was a KeyError
    with pytest.raises(StrategyError, match=r"\[5\] not in the mesh"):
        propagate_simulated("mm", [locals_a, {**shard(torch.ones(4, 4), B), 5: None}], (A, B))


def test_simulated_locals_of_the_wrong_dtype_or_kind_are_refused():
    with pytest.raises(StrategyError, match="has dtype float64, but .* says float32"):
        propagate_simulated(
            "neg", [{r: torch.ones(4, 4, dtype=torch.float64) for r in (0, 1)}], [A]
        )
    with pytest.raises(StrategyError, match="not a torch.Tensor"):
        propagate_simulated("neg", [{0: [1.0], 1: [1.0]}], [A])
    with pytest.raises(StrategyError, match="locals_ must be a sequence"):
        propagate_simulated("mm", None, (A, B))  # was a TypeError
    with pytest.raises(StrategyError, match="1 local inputs for 2 specs"):
        propagate_simulated("mm", [shard(torch.ones(4, 4), A)], (A, B))


def test_propagate_needs_process_groups_to_redistribute():
    # regression: groups=None raised AttributeError 'rank' inside redistribute
    spec = Spec(MESH, (Shard(1),), (4, 6))
    x = Sharded(torch.ones(4, 3), spec, 0)
    with pytest.raises(StrategyError, match="needs the mesh's ProcessGroups as groups=, got None"):
        propagate("softmax", [x], None, dim=1)


def test_run_local_view_needs_the_output_spec():
    with pytest.raises(StrategyError, match="give the output's Spec in output_specs"):
        run_local("view", [torch.ones(2, 3, 4)], {"shape": (24,)}, [], 0)  # was an IndexError
    out = Spec(MESH, (Shard(0),), (24,))
    with pytest.raises(StrategyError, match="rank 7 is not in the mesh"):
        run_local("view", [torch.ones(2, 3, 4)], {"shape": (24,)}, [out], 7)
    with pytest.raises(StrategyError, match="tensors must be a sequence"):
        run_local("neg", torch.ones(2), {}, [out], 0)


# -- constraints and counts ---------------------------------------------------------


def test_unknown_constraints_are_refused():
    spec = Spec(MESH, (Shard(0),), (4,))
    with pytest.raises(StrategyError, match="unknown constraint 'bogus'"):
        check_constraint(spec, 0, "bogus")  # returned True
    with pytest.raises(StrategyError, match="dim 1 is not a tensor dim"):
        check_constraint(spec, 1, "even")
    assert check_constraint(spec, np.int64(-1), "even")
    with pytest.raises(StrategyError, match="constraint .* not a"):
        DimStrategy([Replicate()], [Replicate()], constraints=[(0, 0, "bogus")])


def test_replicate_strategy_validates_its_counts_without_hanging():
    with pytest.raises(StrategyError, match="n_outputs=-1"):
        replicate_strategy(-1, 2)  # returned a strategy with no outputs
    start = time.monotonic()
    with pytest.raises(StrategyError, match="n_outputs=1000000000"):
        replicate_strategy(10**9, 1)  # hung building a billion placements
    assert time.monotonic() - start < 1
    with pytest.raises(StrategyError, match="n_inputs='2'"):
        replicate_strategy(1, "2")
    assert replicate_strategy(np.int64(1), np.int64(2)) == replicate_strategy(1, 2)


# -- bad arguments: StrategyErrors, never bare builtins -------------------------------


class _Unhashable:
    """A callable that cannot be hashed (it defines __eq__ alone)."""

    def __eq__(self, other):
        return self is other

    def __call__(self, *args, **kwargs):
        return []


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: expand("mm", None), "input_specs must be a sequence of Spec"),
        (lambda: expand(["mm"], (A, B)), r"op must be an op name .* got \['mm'\]"),
        (lambda: expand("mm", (A, B), ruleset="x"), "ruleset must be a RuleSet"),
        (lambda: select("mm", (A, B), cost_model="x"), "cost_model must be a .*CostModel"),
        (lambda: select("mm", (A, B), cost_model={}), "cost_model must be a .*CostModel"),
        (lambda: RuleSet({"mm": 5}), "the rule for 'mm' is 5, not an OpRule"),
        (lambda: RuleSet([("mm", 5)]), "mapping of op names"),
        (lambda: RuleSet.default().with_rule("mm", _rule, outputs=5), "outputs= for 'mm'"),
        (lambda: OpRule(5, 5), "OpRule strategies must be a function"),
        # regression: an unhashable rule raised the FrozenMap's MeshError
        (lambda: RuleSet.default().with_rule("mm", _Unhashable()), "rule for 'mm' must be hash"),
        (lambda: RuleSet({"mm": OpRule(_rule, _Unhashable())}), "outputs= for 'mm' must be hash"),
        (lambda: OpRule(_rule, 5), "OpRule outputs must be a function"),
        (lambda: RuleSet.default()[["mm"]], r"op names are strings, got \['mm'\]"),
        (lambda: Meta(None), "tensor shape None is not a sequence"),
        (lambda: Placeholder(0).fill(None), "split factor None"),
        (lambda: Placeholder(0, even="yes"), "even= must be True or False"),
        (lambda: DimStrategy([Placeholder(0)], [Placeholder(0)]).fill(0), "split factor 0"),
        # regression: these three raised a bare AttributeError / TypeError
        (lambda: meta_of(None), "meta_of takes a Spec, got None"),
        (lambda: shard_kinds(None), "shard_kinds takes a sequence of Spec values .* got None"),
        (lambda: DimStrategy(None, None), "None is not a sequence of placements"),
    ],
)
def test_bad_arguments_raise_strategy_errors(call, match):
    with pytest.raises(StrategyError, match=match):
        call()


def test_cached_int_arguments_do_not_answer_float_or_bool_ones():
    # regression: 48.0 == 48 and True == 1 share a cache key, so after a call with ints
    # the same call with floats or bools (which the rules refuse) answered from the cache
    x = Spec(MESH, (Replicate(),), (48,))
    assert select("view", (x,), shape=(48,)).output_spec.shape == (48,)
    with pytest.raises(StrategyError, match=r"shape=\(48.0,\) needs ints"):
        select("view", (x,), shape=(48.0,))
    one = Spec(MESH, (Replicate(),), (1,))
    assert select("view", (one,), shape=(1,)).output_spec.shape == (1,)
    with pytest.raises(StrategyError, match=r"shape=\(True,\) needs ints"):
        select("view", (one,), shape=(True,))
    assert select("sum", (A,), dim=1, keepdim=True).output_spec.shape == (4, 1)
    with pytest.raises(StrategyError, match="keepdim=1 must be a bool"):
        select("sum", (A,), dim=1, keepdim=1)


def test_membership_of_unhashable_op_names_is_false():
    assert ["mm"] not in RuleSet.default()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"samples": 0}, "samples=0 must be an int"),  # was a ValueError from random.sample
        ({"seed": None}, "seed=None must be an int"),
        ({"meshes": [5]}, r"meshes lists mesh shapes, got 5 .* as \(5,\)"),
        ({"meshes": [(2, 0)]}, r"mesh shape \(2, 0\) must hold ints >= 1"),
        ({"impl": 5}, "impl= must be a function"),
        ({"inputs": [None, (6, 3)]}, "tensor shape None is not a sequence"),
        ({"inputs": None}, "inputs .* must be a sequence"),
        ({"split_factors": [0]}, "split_factors=0"),
        ({"rtol": "x"}, "rtol='x' must be a number"),
    ],
)
def test_check_rule_validates_its_arguments(kwargs, match):
    args = {"inputs": [(5, 6), (6, 3)], "meshes": [(2, 2)], **kwargs}
    with pytest.raises(StrategyError, match=match):
        check_rule("mm", **args)


def test_cat_of_zero_dim_tensors_is_refused_as_in_torch():
    x = Spec(MESH, (Replicate(),), ())
    with pytest.raises(StrategyError, match="cannot concatenate 0-d tensors"):
        select("cat", (x, x))
    assert select("stack", (x, x)).output_spec.shape == (2,)


# -- numpy scalars are ints and floats ------------------------------------------------


@pytest.mark.parametrize(
    ("op", "shapes", "dtypes", "args", "plain"),
    [
        ("sum", [(4, 6)], ["float32"], {"dim": np.int64(0)}, {"dim": 0}),
        ("sum", [(4, 6)], ["float32"], {"dim": (np.int32(1),)}, {"dim": (1,)}),
        ("softmax", [(4, 6)], ["float32"], {"dim": np.int64(-1)}, {"dim": -1}),
        (
            "transpose",
            [(4, 6)],
            ["float32"],
            {"dim0": np.int64(0), "dim1": np.int8(1)},
            {"dim0": 0, "dim1": 1},
        ),
        ("view", [(4, 6)], ["float32"], {"shape": (np.int64(24),)}, {"shape": (24,)}),
        ("view", [(4, 6)], ["float32"], {"shape": (np.int64(-1), 2)}, {"shape": (-1, 2)}),
        (
            "embedding",
            [(5,), (10, 4)],
            ["int64", "float32"],
            {"padding_idx": np.int64(1)},
            {"padding_idx": 1},
        ),
        (
            "addmm",
            [(4, 4), (4, 4), (4, 4)],
            ["float32"] * 3,
            {"beta": np.float32(0.5), "alpha": np.int64(2)},
            {"beta": 0.5, "alpha": 2},
        ),
        ("mul", [(4, 6)], ["int64"], {"other": np.float64(2.5)}, {"other": 2.5}),
        ("add", [(4, 6)], ["int8"], {"other": np.int64(2)}, {"other": 2}),
    ],
)
def test_numpy_scalar_arguments_act_like_python_numbers(op, shapes, dtypes, args, plain):
    specs = [
        Spec(MESH, (Shard(0),) if i == 0 else (Replicate(),), s, d)
        for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))
    ]
    assert expand(op, specs, **args) == expand(op, specs, **plain)
    assert select(op, specs, **args).output_spec == select(op, specs, **plain).output_spec


def test_numpy_dims_run_in_the_simulator():
    spec = Spec(MESH, (Shard(0),), (4, 6), "float64")
    x = torch.randn(4, 6, dtype=torch.float64)
    out, choice = propagate_simulated("sum", [shard(x, spec)], [spec], dim=np.int64(1))
    assert torch.allclose(unshard(out, choice.output_spec), x.sum(1))


def test_numpy_integers_build_metadata_and_placeholders():
    assert Meta((np.int64(4), 3)) == Meta((4, 3))
    assert type(Meta((np.int64(4),)).shape[0]) is int
    assert Placeholder(np.int64(0)) == Placeholder(0)
    assert Placeholder(0, split=np.int32(2)) == Placeholder(0, split=2)
    assert Placeholder(0).fill(np.int64(2)) == Placeholder(0).fill(2)
    with pytest.raises(StrategyError, match="Placeholder dim"):
        Placeholder(True)
    with pytest.raises(StrategyError, match="sizes are ints"):
        Meta((np.float64(4.0),))


def _moe_by_nonzero(x, w):
    # a mixture-of-experts loop over the tokens each expert got: nonzero's result
    scores = x @ w
    top = scores.argmax(-1)
    out = torch.zeros_like(x)
    for e in range(w.shape[1]):
        idx = (top == e).nonzero().flatten()
        out = out.index_add(0, idx, x[idx] * scores[idx, e : e + 1])
    return out.sum()


@pytest.mark.parametrize(
    "fn,op",
    [
        (_moe_by_nonzero, "nonzero"),
        (lambda x, w: torch.masked_select(x, x > 0).sum() + w.sum(), "masked_select"),
        (lambda x, w: x[x > 0].sum() + w.sum(), "nonzero"),
        (lambda x, w: torch.unique(x).sum() + w.sum(), "unique"),
    ],
)
def test_an_op_whose_output_shape_depends_on_the_data_is_named_with_the_fix(fn, op):
    from meshplan.strategy import plan_program

    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 4), "float64")
    w = Spec(mesh, [Replicate()], (4, 3), "float64")
    with pytest.raises(StrategyError) as info:
        plan_program(fn, x, w)
    text = str(info.value)
    assert op in text and "depends on the data" in text, text
    assert "mask instead" in text and "locally" in text, text
    assert "argument specs" not in text, text


@pytest.mark.parametrize(
    "args",
    [
        (None, (), (), (), {}, ()),  # no target
        ("aten.mm.default", None, (), (), {}, ()),  # no inputs
        ("aten.mm.default", (), 3, (), {}, ()),
        ("aten.mm.default", (), (), None, {}, ()),
        ("aten.mm.default", (), (), (), [1, 2], ()),  # kwargs not a mapping
        ("aten.mm.default", (), (), (), {}, None),  # no tags
        ("aten.mm.default", torch.tensor(3), (), (), {}, ()),  # iterable, refuses iteration
        ("aten.mm.default", (), (), (), {}, [[1]]),  # a tag that cannot be hashed
    ],
)
def test_a_malformed_call_is_named_not_a_type_error(args):
    from meshplan.strategy import Call

    with pytest.raises(StrategyError, match="a Call's"):
        Call(*args)

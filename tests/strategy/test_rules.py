"""Rules, placeholders, rule sets and argument errors (pure: no torch needed)."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard
from meshplan.strategy import (
    DimStrategy,
    Meta,
    Placeholder,
    RuleSet,
    check_rule,
    expand,
    fill,
    select,
    shard_kinds,
)
from meshplan.strategy.rules._rules_shape import view_blocks

R = Replicate


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4).map(lambda x: tuple(sorted(set(x)))))
def test_filling_gives_one_strategy_per_kind_plus_full_replication(kinds):
    rules = [
        DimStrategy([Placeholder(0)], [Placeholder(0), R()]),
        DimStrategy([Partial()], [Placeholder(1), Placeholder(0)]),
    ]
    filled = fill(rules, kinds, 1, 2)
    assert filled[0].is_replicate
    assert len(filled) == 1 + 2 * len(kinds)
    for s in filled[1:]:
        sfs = {
            getattr(p, "split_factor", 1) for p in s.entries if isinstance(p, Shard | StridedShard)
        }
        assert len(sfs) == 1  # one kind per strategy


def test_a_placeholder_split_multiplies_the_kind():
    s = DimStrategy([Placeholder(0, split=3)], [Placeholder(1)])
    assert [str(f) for f in fill([s], (1, 2), 1, 1)[1:]] == [
        "S(1) -> SS(0,3)",
        "SS(1,2) -> SS(0,6)",
    ]


def test_shard_kinds_always_offer_shard():
    mesh = Mesh.create((2, 2))
    x = Spec(mesh, (StridedShard(0, 3), Partial()), (6, 4))
    y = Spec(mesh, (R(), R()), (6, 4))
    assert shard_kinds([x, y]) == (1, 3) and shard_kinds([y]) == (1,)


def test_with_rule_returns_a_new_ruleset():
    base = RuleSet.default()

    def only_rows(inputs):
        return [DimStrategy([Placeholder(0)], [Placeholder(0)])]

    changed = base.with_rule("relu", only_rows)
    assert changed["relu"].strategies is only_rows
    assert base["relu"].strategies is not only_rows
    assert changed["relu"].outputs is base["relu"].outputs
    mesh = Mesh.create(2)
    x = Spec(mesh, (Shard(1),), (4, 6))
    assert select("relu", (x,), changed).input_specs[0].placements != (Shard(1),)
    assert select("relu", (x,)).input_specs[0] == x


@pytest.mark.parametrize(
    ("op", "shapes", "args", "match"),
    [
        ("mm", [(2, 3, 4), (4, 5)], {}, "mm takes"),
        ("mm", [(2, 3)], {}, "takes 2 tensor inputs"),
        ("softmax", [(2, 3)], {}, "dim="),
        ("sum", [(2, 3)], {"dim": 5}, "out of range"),
        ("einsum", [(2, 3), (3, 4)], {"equation": "ij,jk->iz"}, "appear in no operand"),
        ("einsum", [(2, 3), (4, 4)], {"equation": "ij,jk->ik"}, "sizes"),
        ("view", [(2, 3)], {"shape": (4, 2)}, "elements"),
        ("add", [(2, 3), (4, 3)], {}, "broadcast"),
        ("permute", [(2, 3)], {"dims": (0, 0)}, "permutation"),
        ("cat", [(2, 3), (2, 4)], {"dim": 0}, "do not match"),
        ("sum", [(2, 3)], {"dim": 0.0}, "not an int or a sequence"),
        # an argument the op does not take is named (it was a TypeError)
        ("mm", [(2, 3), (3, 4)], {"dim": 0}, r"mm does not take the arguments \['dim'\]"),
        ("linear", [(2, 3), (4, 3)], {"bias": 1}, "linear does not take"),
        ("einsum", [(2, 3), (3, 4)], {"equation": "ij,jk->ik", "optimize": 1}, "optimize"),
        ("addmm", [(2, 4), (2, 3), (3, 4)], {"beta": "x"}, "beta='x' must be a number"),
    ],
)
def test_bad_op_arguments_raise_strategy_errors(op, shapes, args, match):
    mesh = Mesh.create(2)
    specs = [Spec(mesh, (R(),), s) for s in shapes]
    with pytest.raises(StrategyError, match=match):
        select(op, specs, **args)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("dim", [(), []])
def test_reducing_over_no_listed_dims_reduces_every_dim_as_in_torch(op, dim):
    # regression: dim=() reduced nothing (an output of the input's shape, S(0) -> S(0))
    mesh = Mesh.create(2)
    x = Spec(mesh, (Shard(0),), (4, 6), "float64")
    every = select(op, (x,), dim=None)
    assert select(op, (x,), dim=dim).output_spec == every.output_spec
    assert every.output_spec.shape == ()
    keep = select(op, (x,), dim=dim, keepdim=True).output_spec
    assert keep.shape == (1, 1)
    report = check_rule(op, inputs=[(4, 6)], dim=dim, meshes=[(2,), (2, 2)])
    assert report.checked and not report.failures


def test_torch_keywords_that_keep_the_strategies_are_taken():
    # addmm's beta/alpha scale the terms; embedding's padding_idx only masks a gradient
    assert not check_rule(
        "addmm", inputs=[(4, 6), (4, 5), (5, 6)], beta=0.5, alpha=2.0, meshes=[(2,), (2, 2)]
    ).failures
    ids = Meta((5,), "int64")
    assert not check_rule("embedding", inputs=[ids, (10, 4)], padding_idx=1, meshes=[(2,)]).failures
    with pytest.raises(StrategyError, match="padding_idx=10"):
        select("embedding", (Spec(Mesh.create(2), (R(),), (5,), "int64"),
                             Spec(Mesh.create(2), (R(),), (10, 4))), padding_idx=10)  # fmt: skip


def test_zero_dim_transpose_and_permute_are_identities():
    for op, args in (("transpose", {"dim0": 0, "dim1": -1}), ("permute", {"dims": ()})):
        assert not check_rule(op, inputs=[()], meshes=[(2,)], **args).failures


def test_a_rule_sharding_a_missing_dim_is_reported():
    def bad(inputs):
        return [DimStrategy([Placeholder(3)], [Placeholder(0)])]

    rs = RuleSet.default().with_rule("relu", bad)
    with pytest.raises(StrategyError, match="shards dim 3"):
        expand("relu", (Spec(Mesh.create(2), (R(),), (4,)),), rs)


def test_inputs_on_different_meshes_are_refused():
    a = Spec(Mesh.create(2), (R(),), (4, 4))
    b = Spec(Mesh.create(2, names="x"), (R(),), (4, 4))
    with pytest.raises(StrategyError, match="different meshes"):
        select("mm", (a, b))


@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.data())
def test_view_blocks_pair_dims_of_equal_size(atoms, data):
    def group(cuts):
        out, cur = [], atoms[0]
        for a, cut in zip(atoms[1:], cuts, strict=True):
            out, cur = (out + [cur], a) if cut else (out, cur * a)
        return tuple(out + [cur])

    n = len(atoms) - 1
    src = group(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    dst = group(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    for ins, outs in view_blocks(src, dst):
        prod_in = prod_out = 1
        for i in ins:
            prod_in *= src[i]
        for o in outs:
            prod_out *= dst[o]
        assert prod_in == prod_out > 1


def test_meta_rejects_bad_shapes():
    with pytest.raises(StrategyError):
        Meta((2, -1))


def test_the_planning_part_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from meshplan.layout import Mesh\n"
        "from meshplan.placement import Spec, Shard, Replicate, Partial\n"
        "from meshplan.strategy import select, expand, RuleSet\n"
        "mesh = Mesh.create((2, 2))\n"
        "a = Spec(mesh, (Shard(1), Partial()), (8, 4))\n"
        "b = Spec(mesh, (Replicate(), Shard(0)), (4, 6))\n"
        "c = select('mm', (a, b))\n"
        "print(c.priced > 0, c.cost > 0, len(expand('mm', (a, b))) > 1)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True True True"

"""The rule checker passes every built-in rule and catches wrong ones."""

import pytest

from meshplan.placement import Partial, Replicate, Shard
from meshplan.strategy import DimStrategy, Gap, Meta, Placeholder, RuleSet, check_rule

P, R = Partial, Replicate

# (op, input shapes or metas, args): uneven sizes on meshes of 4, (2, 3) and (2, 2, 2)
CASES = [
    ("mm", [(5, 6), (6, 7)], {}),
    ("bmm", [(3, 5, 6), (3, 6, 7)], {}),
    ("addmm", [(7,), (5, 6), (6, 7)], {}),
    ("addmm", [(5, 1), (5, 6), (6, 7)], {}),
    ("linear", [(3, 5, 6), (7, 6), (7,)], {}),
    ("linear", [(5, 6), (7, 6)], {}),
    ("einsum", [(5, 6), (6, 7), (7, 3)], {"equation": "ij,jk,kl->il"}),
    ("einsum", [(5, 6), (5, 6)], {"equation": "ij,ij->i"}),
    ("embedding", [Meta((3, 5), "int64"), Meta((11, 6), "float64")], {}),
    *[(op, [(5, 7)], {}) for op in ("neg", "clone", "exp", "relu", "sigmoid", "tanh")],
    *[(op, [(5, 7)], {}) for op in ("abs", "sin", "cos", "square", "gelu", "silu")],
    ("add", [(5, 7), (7,)], {}),
    ("add", [(5, 7)], {"other": 2.5}),
    ("sub", [(5, 1), (5, 7)], {}),
    ("sub", [(5, 7)], {"other": -1.0}),
    ("mul", [(5, 7), (5, 7)], {}),
    ("mul", [(5, 7)], {"other": -2.0}),
    ("div", [(5, 7), (1, 7)], {}),
    ("div", [(5, 7)], {"other": 3.0}),
    ("maximum", [(5, 7), (5, 7)], {}),
    ("minimum", [(5, 7), (7,)], {}),
    ("sum", [(5, 7, 3)], {"dim": 1}),
    ("sum", [(5, 7)], {}),
    ("mean", [(4, 6, 3)], {"dim": (0, 2), "keepdim": True}),
    ("mean", [(5, 7)], {"dim": 1}),
    ("amax", [(5, 7)], {"dim": 0}),
    ("amin", [(5, 7, 2)], {"dim": (1,), "keepdim": True}),
    ("softmax", [(5, 7)], {"dim": 1}),
    ("log_softmax", [(5, 7, 3)], {"dim": 0}),
    ("cat", [(5, 7), (3, 7)], {"dim": 0}),
    ("stack", [(5, 7), (5, 7)], {"dim": 1}),
    ("transpose", [(5, 7, 3)], {"dim0": 0, "dim1": 2}),
    ("permute", [(5, 7, 3)], {"dims": (2, 0, 1)}),
    ("view", [(4, 6, 5)], {"shape": (24, 5)}),
    ("view", [(5, 4, 6)], {"shape": (5, 24)}),
    ("view", [(2, 3, 4)], {"shape": (24,)}),
    ("reshape", [(24, 5)], {"shape": (4, 6, 5)}),
    ("reshape", [(4, 6)], {"shape": (3, 8)}),
    ("reshape", [(6, 4)], {"shape": (2, 3, 2, 2)}),
]


@pytest.mark.parametrize(("op", "inputs", "args"), CASES, ids=lambda x: str(x)[:30])
def test_every_builtin_rule_computes_the_op(op, inputs, args):
    report = check_rule(op, inputs=inputs, **args)
    assert report.ok, str(report)
    assert report.checked > 10


def test_the_cases_cover_every_builtin_op():
    # (the ops whose rule reads traced aten calls only are checked by the aten sweep,
    # tests/strategy/test_aten_rules.py)
    rs = RuleSet.default()
    assert {op for op, _, _ in CASES} == {op for op in rs.ops if rs[op].strategies is not None}


def test_check_rule_catches_the_all_partial_rule_for_elementwise_einsum():
    # torch 2.13 gives einsum with only batch dims all-Partial inputs -> Partial output;
    # (a1 + a2) * (b1 + b2) is not a1*b1 + a2*b2
    def all_partial(inputs, equation):
        return [DimStrategy([P()], [P(), P()])]

    report = check_rule("einsum", all_partial, [(4, 5), (4, 5)], equation="ij,ij->ij")
    assert not report.ok
    assert all(f.strategy.output_spec.is_partial for f in report.failures)


def test_check_rule_catches_a_scalar_add_on_partial_sum():
    def add_to_each_part(inputs, other):
        return [DimStrategy([P("sum")], [P("sum")]), DimStrategy([P("max")], [P("max")])]

    report = check_rule("add", add_to_each_part, [(4, 5)], other=1.0, meshes=[(3,)])
    wrong = {f.strategy.output_spec.placements for f in report.failures}
    assert wrong == {(P("sum"),)}  # max commutes with adding a constant; sum does not


def test_check_rule_catches_a_mean_over_unbalanced_shards():
    def unbalanced(inputs, dim):
        return [DimStrategy([P("avg")], [Placeholder(dim)])]

    assert not check_rule("mean", unbalanced, [(5, 4)], dim=0, meshes=[(2,)]).ok
    assert check_rule("mean", unbalanced, [(8, 4)], dim=0, meshes=[(2,)]).ok


def test_check_rule_catches_softmax_over_its_sharded_dim():
    def over_dim(inputs, dim):
        return [DimStrategy([Placeholder(dim)], [Placeholder(dim)])]

    assert not check_rule("softmax", over_dim, [(4, 6)], dim=1, meshes=[(2,)]).ok


def test_check_rule_reports_placements_only_replication_accepts():
    report = check_rule("embedding", inputs=[Meta((3, 5), "int64"), Meta((11, 6))], meshes=[(2,)])
    assert Gap(1, Shard(0)) in report.gaps  # row-wise embedding needs masking, not a plain lookup
    assert Gap(1, Shard(1)) not in report.gaps


def test_check_rule_needs_outputs_for_a_new_op():
    with pytest.raises(ValueError, match="outputs="):
        check_rule("frob", lambda inputs: [], [(4,)])

"""Text form: str(spec), format_placements and parse_placements round trip."""

from __future__ import annotations

import pytest
from hypothesis import given

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    format_placements,
    parse_placements,
)
from meshplan.testing import specs


@given(specs(dtypes=["float32", "bfloat16", "int8", "complex128"]))
def test_parse_inverts_format(spec):
    text = format_placements(spec.placements, spec.shard_order)
    placements, order = parse_placements(text)
    assert Spec(spec.mesh, placements, spec.shape, spec.dtype, order) == spec
    assert format_placements(placements, order) == text
    assert str(spec).endswith(f"({text})")


def test_str_of_spec():
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c"))
    s = Spec(mesh, (Shard(0), Shard(0), Partial("avg")), (8, 4), shard_order={0: (1, 0)})
    assert str(s) == "f32[8,4](S(0)[1,0] S(0) P(avg))"
    assert str(Spec(mesh, (Replicate(),) * 3, (), "int64")) == "i64[](R R R)"
    s = Spec(mesh, (StridedShard(1, 2), Replicate(), Replicate()), (3, 5), "bfloat16")
    assert str(s) == "bf16[3,5](SS(1,2) R R)"


def test_parse_accepts_torch_spellings_and_bare_partial():
    assert parse_placements("_S(0, 2) S(1) P R") == (
        (StridedShard(0, 2), Shard(1), Partial("sum"), Replicate()),
        {},
    )
    assert parse_placements("  S( 0 )[1, 0]  S(0)  ") == ((Shard(0), Shard(0)), {0: (1, 0)})
    assert parse_placements("") == ((), {})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("S(0) Q", "at 'Q'"),
        ("S(x)", "at 'S(x)'"),
        ("R[1,0]", "only shards take an order"),
        ("P(prod)", "'prod'"),
        ("SS(0,0)", "split_factor"),
        # glued tokens would change the number of placements silently
        ("PR", "at 'PR'"),
        ("R PS(0)", "at 'PS(0)'"),
        ("PP", "at 'PP'"),
        ("S(0)S(1)", "at 'S(0)S(1)'"),
    ],
)
def test_bad_text_raises(text, needle):
    with pytest.raises(PlacementError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_placements(text)

"""propagate() on real gloo processes: every rank's output is the simulated choice's output."""

import torch

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard, unshard
from meshplan.strategy import OPS, propagate_simulated

MESH = Mesh.create((2, 2), ("dp", "tp"))
F64 = "float64"

CASES = [
    (
        "mm",
        [
            Spec(MESH, (Shard(1), Replicate()), (6, 5), F64),
            Spec(MESH, (Replicate(), Shard(1)), (5, 3), F64),
        ],
        {},
    ),
    (
        "mm",
        [
            Spec(MESH, (Partial(), Shard(0)), (6, 5), F64),
            Spec(MESH, (Shard(1), Partial()), (5, 3), F64),
        ],
        {},
    ),
    (
        "add",
        [
            Spec(MESH, (Partial(), Shard(1)), (4, 6), F64),
            Spec(MESH, (Shard(0), Partial("avg")), (4, 6), F64),
        ],
        {},
    ),
    ("sum", [Spec(MESH, (StridedShard(0, 2), Shard(1)), (8, 5), F64)], {"dim": 0}),
    ("softmax", [Spec(MESH, (Shard(1), Partial()), (3, 7), F64)], {"dim": 1}),
    ("view", [Spec(MESH, (Shard(1), Replicate()), (3, 8), F64)], {"shape": (24,)}),
]


def _globals(case_index):
    gen = torch.Generator().manual_seed(case_index)
    return [torch.randn(s.shape, generator=gen, dtype=torch.float64) for s in CASES[case_index][1]]


def _propagate_all():
    import torch.distributed as dist

    from meshplan.placement import Sharded
    from meshplan.runtime._groups import ProcessGroups
    from meshplan.strategy import propagate

    rank = dist.get_rank()
    groups = ProcessGroups(MESH)
    out = []
    for k, (op, specs, args) in enumerate(CASES):
        xs = _globals(k)
        inputs = [_local_input(x, s, rank) for x, s in zip(xs, specs, strict=True)]
        inputs = [Sharded(t, s, rank) for t, s in zip(inputs, specs, strict=True)]
        y = propagate(op, inputs, groups, **args)
        out.append((y.local, y.spec))
    return out


def _local_input(x, spec, rank):
    # meshplan's canonical layout of x (Partial dims: parts that reduce to x)
    from meshplan.placement import shard

    return shard(x, spec)[rank]


def test_propagate_on_gloo_matches_the_simulated_choice_and_the_op(pool4):
    per_rank = pool4.run(_propagate_all)
    for k, (op, specs, args) in enumerate(CASES):
        from meshplan.placement import shard

        xs = _globals(k)
        want_locals, choice = propagate_simulated(
            op, [shard(x, s) for x, s in zip(xs, specs, strict=True)], specs, **args
        )
        spec = per_rank[0][k][1]
        assert spec == choice.output_spec
        got = {r: per_rank[r][k][0] for r in range(4)}
        for r in range(4):
            assert torch.allclose(got[r], want_locals[r], rtol=1e-12, atol=1e-12), (op, r)
        assert torch.allclose(unshard(got, spec), OPS[op](*xs, **args), rtol=1e-9, atol=1e-12)

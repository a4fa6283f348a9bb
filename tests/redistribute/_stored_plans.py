"""A stored sample of plans: pairs of specs drawn from a fixed seed, with the plan the
planner made for each when the sample was written (``data/stored_plans.txt.gz``).

``python tests/redistribute/_stored_plans.py write`` draws the pairs and plans them with
the planner on the import path; ``test_stored_plans.py`` plans them again and checks each
plan is the stored one or cheaper. One line per pair, tab-separated::

    mesh shape  tensor shape  dtype  src placements  dst placements  cost (s)  steps

each step ``collective:mesh dims:placements after it`` (``;`` between steps), or
``error:ClassName`` when no plan exists.
"""

from __future__ import annotations

import gzip
import os
import random
import sys

from meshplan.errors import MeshplanError
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

DATA = os.path.join(os.path.dirname(__file__), "data", "stored_plans.txt.gz")

# (how many pairs, mesh shape, tensor dims, sides to draw from, StridedShards, Partials)
KINDS = (
    (320, (2, 2, 2, 2), 4, (4, 8, 16, 6, 3, 1), True, True),  # 4-D, strided, partial
    (150, (2, 2, 2, 2), 3, (8, 16, 64), False, True),  # batch x seq x hidden
    (120, (2, 2, 2), 3, (8, 16, 64, 6), True, True),
    (100, (2, 2, 2), 4, (4, 8, 16), False, True),  # batch x heads x seq x dim
    (60, (4,), 2, (8, 16, 6), True, True),  # 2-D weights on 1-D to 4-D meshes
    (60, (2, 4), 2, (8, 16, 12), True, True),
    (60, (4, 2), 2, (8, 16), False, True),
    (60, (2, 2, 2), 2, (8, 16, 5), True, True),
    (60, (2, 2, 2, 2), 2, (16, 32, 6), True, True),
    (30, (2, 2, 2, 2, 2), 1, (32, 64, 7), False, True),
)
OP_SETS = (("sum",), ("sum", "avg"), ("max",), ("min",))


def _placement(rng: random.Random, ndim: int, strided: bool, ops: tuple[str, ...] | None):
    kinds = ["R", "S", "S"] + (["SS"] if strided else []) + (["P"] if ops else [])
    kind = rng.choice(kinds)
    if kind == "R":
        return Replicate()
    if kind == "S":
        return Shard(rng.randrange(ndim))
    if kind == "SS":
        return StridedShard(rng.randrange(ndim), rng.choice((2, 2, 4)))
    return Partial(rng.choice(ops))


def _spec(rng, mesh, shape, strided, ops) -> Spec:
    while True:
        placements = [_placement(rng, len(shape), strided, ops) for _ in mesh.shape]
        order = {}
        for d in range(len(shape)):
            dims = [m for m, p in enumerate(placements) if getattr(p, "dim", None) == d]
            if len(dims) > 1 and rng.random() < 0.4:
                rng.shuffle(dims)
                order[d] = tuple(dims)
        try:
            return Spec(mesh, placements, shape, "float32", order)
        except MeshplanError:
            continue


def pairs(seed: int = 36):
    """The sample's pairs, drawn afresh from ``seed``: [(src, dst)]."""
    rng = random.Random(seed)
    out = []
    for count, mesh_shape, ndim, sides, strided, partial in KINDS:
        mesh = Mesh.create(mesh_shape)
        for _ in range(count):
            shape = tuple(rng.choice(sides) for _ in range(ndim))
            ops = rng.choice(OP_SETS) if partial else None
            src = _spec(rng, mesh, shape, strided, ops)
            dst = src
            while dst == src:
                dst = _spec(rng, mesh, shape, strided, ops)
            out.append((src, dst))
    return out


def spec_text(spec: Spec) -> str:
    return format_placements(spec.placements, spec.shard_order)


def parse_spec(mesh: Mesh, shape, dtype: str, text: str) -> Spec:
    placements, order = parse_placements(text)
    return Spec(mesh, placements, shape, dtype, order)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def plan_text(p) -> str:
    return ";".join(
        f"{s.collective}:{','.join(map(str, s.mesh_dims))}:{spec_text(s.dst)}" for s in p.steps
    )


def read():
    """The stored sample: [(src, dst, cost or None, steps text or 'error:Name')]."""
    out = []
    meshes: dict = {}
    with gzip.open(DATA, "rt") as f:
        for line in f:
            mesh_t, shape_t, dtype, src_t, dst_t, cost_t, steps = line.rstrip("\n").split("\t")
            mesh_shape = _ints(mesh_t)
            mesh = meshes.get(mesh_shape) or meshes.setdefault(mesh_shape, Mesh.create(mesh_shape))
            shape = _ints(shape_t)
            src = parse_spec(mesh, shape, dtype, src_t)
            dst = parse_spec(mesh, shape, dtype, dst_t)
            out.append((src, dst, float(cost_t) if cost_t else None, steps))
    return out


def write(start: int = 0, stop: int | None = None, path: str = DATA) -> None:
    """Plan pairs ``start:stop`` of the sample and write them to ``path``."""
    from meshplan.redistribute import clear_plan_cache, cost, plan

    lines = []
    for k, (src, dst) in enumerate(pairs()[start:stop], start):
        if k % 50 == 0:  # (bounds the memory the planner keeps)
            clear_plan_cache()
        try:
            p = plan(src, dst)
            cost_t, steps = repr(cost(p).total), plan_text(p)
        except MeshplanError as e:
            cost_t, steps = "", f"error:{type(e).__name__}"
        lines.append(
            "\t".join(
                (
                    ",".join(map(str, src.mesh.shape)),
                    ",".join(map(str, src.shape)),
                    src.dtype,
                    spec_text(src),
                    spec_text(dst),
                    cost_t,
                    steps,
                )
            )
        )
        print(k, lines[-1], flush=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    # write [start stop path]: a part of the sample (parts join with zcat ... | gzip)
    if sys.argv[1:2] == ["write"]:
        args = sys.argv[2:]
        if args:
            write(int(args[0]), int(args[1]), args[2])
        else:
            write()

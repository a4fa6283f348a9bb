"""An opt-in check that every rank of a mesh runs the same plan (``check_specs=True``).

Ranks that disagree on a spec (one builds a 4x6 tensor's spec, another a 6x4 one: the
same local size) would run different plans whose collectives still match in size, and
silently reinterpret each other's data. With ``ProcessGroups(mesh, check_specs=True)``,
the first time a plan runs on those groups every rank hashes the plan's text (source and
target specs with their meshes, and each step's collective and mesh dims) to a 63-bit
fingerprint, and one ``all_reduce`` of two int64 (max of the fingerprint and of its
negation) over the mesh's group tells every rank whether all fingerprints agree. On a
mismatch every rank raises :class:`RuntimeShellError` before any step runs.

Cost: one 16-byte all_reduce per distinct plan per :class:`ProcessGroups`, the first
time it runs (tens of microseconds within a node), and hashing the plan's text once;
nothing on later runs of the same plan.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from meshplan.errors import RuntimeShellError

__all__ = ["check_same_plan", "plan_fingerprint"]

_REMEMBERED = 4096  # plans agreed on per ProcessGroups, at most (then forgotten)


def plan_fingerprint(plan: Any) -> int:
    """A 63-bit fingerprint of a plan or step: equal plans give equal fingerprints in any
    process (no ``hash()`` randomization).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, Spec
    >>> from meshplan.redistribute import plan
    >>> m = Mesh.create(2)
    >>> a = plan(Spec(m, [Shard(0)], (4, 6)), Spec(m, [Replicate()], (4, 6)))
    >>> b = plan(Spec(m, [Shard(0)], (6, 4)), Spec(m, [Replicate()], (6, 4)))
    >>> plan_fingerprint(a) == plan_fingerprint(a), plan_fingerprint(a) == plan_fingerprint(b)
    (True, False)
    """
    steps = getattr(plan, "steps", (plan,))
    parts = [repr(plan.src.mesh), str(plan.src), str(plan.dst)]
    parts += [f"{s.collective}@{tuple(s.mesh_dims)}:{s.src}->{s.dst}" for s in steps]
    digest = hashlib.blake2b("\n".join(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_same_plan(plan: Any, groups: Any) -> None:
    """Raise :class:`RuntimeShellError` on every rank unless every rank of the mesh runs
    ``plan`` (checked once per plan and ``groups``)."""
    agreed = groups._agreed_plans
    if plan in agreed:
        return
    import torch.distributed as dist

    mine = plan_fingerprint(plan)
    group = groups.get(None)
    votes = torch.tensor([mine, -mine], dtype=torch.int64)
    try:
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=group.pg)
    except RuntimeError as e:
        raise RuntimeShellError(
            f"checking that every rank of {groups.mesh} runs the same plan failed on rank "
            f"{groups.rank}: {str(e).strip().splitlines()[0] if str(e).strip() else e}",
            value=plan,
        ) from e
    high, low = int(votes[0]), -int(votes[1])
    if high != low:
        raise RuntimeShellError(
            f"ranks of {groups.mesh} run different plans (fingerprints from {low} to {high}; "
            f"rank {groups.rank} runs {plan.src} -> {plan.dst}, fingerprint {mine}): their "
            "specs disagree (e.g. another global shape with the same local size); build "
            "every rank's specs from the same values",
            value=plan,
        )
    if len(agreed) >= _REMEMBERED:
        agreed.clear()
    agreed.add(plan)

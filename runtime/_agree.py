"""Checks that every rank of a mesh runs the same thing (``ProcessGroups(check_specs=...)``).

Ranks that disagree on a spec (one builds a 4x6 tensor's spec, another a 6x4 one: the
same local size) would run different plans whose collectives may still match in size
and silently reinterpret each other's data, or wait on each other in different
collectives until a timeout. So, unless ``ProcessGroups(mesh, check_specs=False)``:

* ``run`` (and so ``redistribute``): the first time a plan runs on those groups, every
  rank hashes the plan's text (source and target specs with their meshes, and each
  step's collective and mesh dims) to a 63-bit fingerprint, and one ``all_reduce`` of
  two int64 (max of the fingerprint and of its negation) over the mesh's group tells
  every rank whether all fingerprints agree. On a mismatch every rank raises
  :class:`RuntimeShellError` before any step runs.
* ``run_program``: every call checks its arguments on each rank (count, shapes, dtypes),
  then one ``all_reduce`` of three int64 carries the program's fingerprint and the
  highest rank whose arguments do not fit. If any rank's do not, or the programs differ,
  every rank raises before anything runs: the rank at fault its own error, the others
  one naming it (instead of waiting for it until their timeout).

Cost: one 32-byte all_reduce per distinct plan per :class:`ProcessGroups`, the first
time it runs (tens of microseconds within a node), and hashing the plan's text once;
nothing on later runs of the same plan. One 24-byte all_reduce per ``run_program`` call.

Limit: specs already agreed on are not checked again (their agreed plan runs), so a
rank that runs them while another rank runs specs new to it is not caught by the check
(the collectives then fail at the groups' timeout, or exchange wrong data).
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch

from meshplan.errors import RuntimeShellError

__all__ = ["check_same_plan", "check_same_call", "plan_fingerprint", "program_fingerprint"]

_REMEMBERED = 4096  # plans agreed on per ProcessGroups, at most (then forgotten)


def _fingerprint(parts: list[str]) -> int:
    digest = hashlib.blake2b("\n".join(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


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
    return _fingerprint(parts)


_PROGRAMS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def program_fingerprint(program: Any) -> int:
    """A 63-bit fingerprint of a :class:`~meshplan.strategy.Program`: its mesh, its
    arguments', outputs' and gradients' specs, and each op's aten call and output specs
    (computed once per program value)."""
    found = _PROGRAMS.get(program)
    if found is None:
        specs = (*program.arg_specs, *program.out_specs, *program.cot_specs, *program.grad_specs)
        parts = [repr(program.arg_specs[0].mesh) if program.arg_specs else ""]
        parts += [str(s) for s in specs]
        parts += [f"{op.call.target}:{tuple(map(str, op.output_specs))}" for op in program.ops]
        found = _PROGRAMS[program] = _fingerprint(parts)
    return found


def _vote(groups: Any, values: list[int], what: str, value: Any) -> list[int]:
    """Every rank's ``values``, reduced by max over the mesh's group."""
    import torch.distributed as dist

    from ._collectives import _collective
    from ._failstop import Failure
    from ._run import _prepare_every

    _prepare_every(groups)  # a mesh over part of the world: its group exists already
    group = groups.get(None)
    votes = torch.tensor(values, dtype=torch.int64)
    try:
        _collective(dist.all_reduce, "all_reduce(max)", group, votes, op=dist.ReduceOp.MAX)
    except RuntimeError as e:
        if isinstance(getattr(e, "value", None), Failure):
            raise  # a peer failed: say so, as every collective does
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeShellError(
            f"checking that every rank of {groups.mesh} runs the same {what} failed on rank "
            f"{groups.rank}: {first}",
            value=value,
        ) from e
    return [int(v) for v in votes]


def check_same_plan(plan: Any, groups: Any) -> Any:
    """The plan every rank of the mesh runs in place of ``plan`` (checked once per plan
    and ``groups``): ``plan`` itself where every rank has it. Where the ranks' plans
    differ but their source and target specs agree, the plans are two answers to one
    question (a search the planner's budget cut, which counts each process's CPU time,
    stopped at different points on a loaded machine): every rank runs the plan of the
    mesh's lowest rank, sent to the others. Where the specs differ, a
    :class:`RuntimeShellError` on every rank."""
    agreed = groups._agreed_plans
    if groups.mesh.size() == 1:
        return plan
    # kept by source and target: ranks whose searches stopped at other points hold
    # other plans between the same specs, and must skip (or vote) alike
    key = (plan.src, plan.dst)
    known = agreed.get(key)
    if known is not None:
        return known
    mine = plan_fingerprint(plan)
    specs = _fingerprint([repr(plan.src.mesh), str(plan.src), str(plan.dst)])
    high, low, specs_high, specs_low = _vote(groups, [mine, -mine, specs, -specs], "plan", plan)
    low, specs_low = -low, -specs_low
    runs = plan
    if high != low:
        if specs_high != specs_low:
            raise RuntimeShellError(
                f"ranks of {groups.mesh} run different plans (fingerprints from {low} to "
                f"{high}; rank {groups.rank} runs {plan.src} -> {plan.dst}, fingerprint "
                f"{mine}): their specs disagree (e.g. another global shape with the same "
                "local size); build every rank's specs from the same values",
                value=plan,
            )
        runs = _first_ranks_plan(plan, groups)
    if len(agreed) >= _REMEMBERED:
        agreed.clear()
    agreed[key] = runs
    return runs


def _first_ranks_plan(plan: Any, groups: Any) -> Any:
    """The plan of the mesh's lowest rank, on every rank of the mesh (one object
    broadcast over its group)."""
    import torch.distributed as dist

    box = [plan]
    try:
        dist.broadcast_object_list(box, src=min(groups.mesh.ranks), group=groups.get(None).pg)
    except (RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeShellError(
            f"agreeing on one plan over {groups.mesh} failed on rank {groups.rank}: {first}",
            value=plan,
        ) from e
    return box[0]


def check_same_call(
    groups: Any, fingerprint: int, problem: BaseException | None, what: str
) -> None:
    """Agree with every rank of the mesh before a call runs: raise ``problem`` (this rank's
    own error, or None) where it is set, and on the other ranks a
    :class:`RuntimeShellError` naming the rank at fault; raise on every rank when their
    ``fingerprint`` (of what they run) differ."""
    if groups.mesh.size() > 1:
        me = groups.rank
        high, low, bad = _vote(
            groups, [fingerprint, -fingerprint, me + 1 if problem else 0], what, fingerprint
        )
        low = -low
        if problem is None and bad:
            raise RuntimeShellError(
                f"{what} did not start: the arguments of rank {bad - 1} do not fit it (its "
                f"error says how); every rank of {groups.mesh} stops here (this is rank {me})",
                value=bad - 1,
            )
        if problem is None and high != low:
            raise RuntimeShellError(
                f"ranks of {groups.mesh} run different {what}s (fingerprints from {low} to "
                f"{high}; rank {me} has {fingerprint}): plan it from the same function and "
                "specs on every rank",
                value=fingerprint,
            )
    if problem is not None:
        raise problem

"""Measure a :class:`HardwareProfile` on the real process groups of a mesh.

``calibrate(groups)`` times every collective a plan runs along each mesh dim
(all_gather, reduce_scatter, all_reduce, all_to_all; an all_permute, which spans mesh
dims, over all of them) at five sizes up to ``nbytes`` per rank, each a quarter of the
next, and local copies and additions. It fits each collective's own link to the cost
model's price of that collective (:func:`._step_cost.link_terms`), by least squares on
relative errors: e.g. along a dim of ``n`` ranks an all_gather of ``b`` bytes per rank
is priced ``launch + latency * ceil(log2 n) + (n - 1) * b / bandwidth``, an all_reduce
``launch + 2 latency * ceil(log2 n) + 2 (n - 1) / n * b / bandwidth`` plus the
reduction. Small all_gathers over the whole mesh, with more hops than any one dim's,
tell the fixed cost of a launch (the profile's ``launch_s``) apart from the per-hop
latency; on a mesh of one active dim the launch is folded into the latency. A
backend's collectives differ (gloo's all_gather moves bytes far slower than its
all_reduce), so each gets its links (``HardwareProfile.per_collective``); the
all_gather's are the profile's ``dims``. The group of each flattened alias of the mesh
(two or more dims of size > 1; one per set of ranks) is timed the same way for the
collectives a merged step runs, and fitted to links of its own
(``HardwareProfile.flattened``): a merged step runs on one group of all its dims' ranks,
whose ring or tree need not be as slow as its slowest dim's. Every rank of the world calls it at the same
time: it runs collectives, and ranks outside the mesh take part in creating the groups
(they measure nothing and get None). Every rank of the mesh returns the *same* profile
-- each number the slowest rank's -- so plans chosen with it agree everywhere. On gloo
the profile prices a reduce_scatter as gloo runs it: an all_reduce of the whole input
(``HardwareProfile.reduce_scatter_via_all_reduce``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from meshplan.errors import RuntimeShellError
from meshplan.redistribute._planner import alias_dims
from meshplan.redistribute._profile import COLLECTIVES, FLATTENED, HardwareProfile, Link
from meshplan.redistribute._step_cost import link_terms

from . import _collectives as C
from . import _p2p
from ._groups import ProcessGroups

__all__ = ["calibrate", "measure"]


def measure(
    groups: ProcessGroups,
    *,
    nbytes: int = 4 << 20,
    repeats: int = 10,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """What ``calibrate`` fits: per collective and mesh dim name ``(latency_s,
    bytes_per_s)`` (``"collectives"``, the all_permute's keyed by the tuple of every mesh
    dim name; ``"links"``: the all_gather's), per alias name and collective a merged step
    runs the same (``"flattened"``), a collective's ``launch_s``, local
    ``copy_bytes_per_s``, ``reduce_bytes_per_s`` and ``local_launch_s``, and whether the
    backend runs a reduce_scatter as an all_reduce (gloo). Dims of size 1 are left out.

    The same dict on every rank of the mesh (each value the slowest rank's).

    It runs collectives on every rank (see ``tests/runtime/test_collectives.py``) and
    checks its arguments first:

    >>> measure(None)
    Traceback (most recent call last):
    ...
    meshplan.errors.RuntimeShellError: calibrate needs ProcessGroups, got None
    """
    if not isinstance(groups, ProcessGroups):
        raise RuntimeShellError(f"calibrate needs ProcessGroups, got {groups!r}", value=groups)
    if not isinstance(nbytes, int) or nbytes < 1024 or not isinstance(repeats, int) or repeats < 1:
        raise RuntimeShellError(
            f"calibrate needs nbytes >= 1024 and repeats >= 1, got {nbytes!r} and {repeats!r}",
            value=(nbytes, repeats),
        )
    mesh = groups.mesh
    flats = _flattened_groups(mesh)
    if not groups.is_member:
        # take part in creating the groups, in the order the members do; measure nothing
        for name in (*mesh.names, tuple(mesh.names), *flats):
            groups.create(name)
        return {}
    if device is None:
        device = default_device(mesh.device_type, _backend(groups))
    numel = max(1, nbytes // 4)
    sync = _synchronizer(device)
    row = _local_row(numel, repeats, device, sync)
    counts = _counts(numel)
    every = tuple(mesh.names)
    plan = _runs_planned(mesh, flats, counts)
    runs = []  # (call, back-to-back calls per round), None where the group is one rank
    for name, kind, sizes in plan:
        group = groups.get(name)
        for n in sizes:
            runs.append(
                (_call(kind, group, n, device), _reps(n, repeats)) if group.size > 1 else None
            )
    row += _time_all(runs, sync)
    # every rank keeps the slowest rank's numbers, so every rank plans alike
    # (on the device: an NCCL group reduces no CPU tensor)
    row_t = torch.tensor(row, dtype=torch.float64, device=device)
    slowest = C.all_reduce(row_t, groups.get(every), "max")
    values = slowest.tolist()
    copy_per_byte, add_per_byte, local_launch = values[:3]
    via_all_reduce = _on_gloo(groups, device)
    shape = HardwareProfile(
        copy_bytes_per_s=1.0 / copy_per_byte,
        reduce_bytes_per_s=1.0 / add_per_byte,
        reduce_scatter_via_all_reduce=via_all_reduce,
    )
    times: dict = {}
    at = 3
    for name, kind, sizes in plan:
        times[name, kind] = values[at : at + len(sizes)]
        at += len(sizes)
    launch = _launch(shape, mesh, counts, times, copy_per_byte)
    links, flattened = _fit_links(groups, shape, plan, times, launch, copy_per_byte, flats)
    return {
        "links": links["all_gather"],
        "collectives": links,
        "flattened": flattened,
        "launch_s": launch,
        "copy_bytes_per_s": 1.0 / copy_per_byte,
        "reduce_bytes_per_s": 1.0 / add_per_byte,
        "local_launch_s": local_launch,
        "reduce_scatter_via_all_reduce": via_all_reduce,
    }


def _local_row(numel: int, repeats: int, device, sync) -> list[float]:
    """Seconds per byte of a local copy and of a local add, and a local launch's seconds."""
    big = torch.ones(numel, dtype=torch.float32, device=device)
    tiny = torch.ones(1, dtype=torch.float32, device=device)
    src, dst = big.clone(), torch.empty_like(big)
    copy_s = _time(lambda: dst.copy_(src), repeats, sync)
    add_s = _time(lambda: torch.add(src, big, out=dst), repeats, sync)
    local_s = _time(lambda: tiny.clone(), repeats * 10, sync)
    # no link moves bytes faster than a local copy: the floor when noise hides the transfer
    copy_per_byte = copy_s / (numel * 4)
    return [max(copy_per_byte, 1e-15), add_s / (numel * 4), local_s]


def _runs_planned(mesh, flats: tuple[str, ...], counts) -> list:
    """What ``measure`` times: ``(group name, collective, element counts)``."""
    # per mesh dim and collective (an all_permute spans mesh dims: over all of them), the
    # seconds of a run at each of ``counts``; and small all_gathers over the whole mesh,
    # whose extra hops tell a collective's launch apart from its per-hop latency
    every = tuple(mesh.names)
    plan = [
        (name, kind, counts) for name in mesh.names for kind in COLLECTIVES if kind != "all_permute"
    ]
    plan += [(every, "all_permute", counts), (every, "all_gather", counts[:2])]
    # each alias's group, for the steps merged onto it
    plan += [(alias, kind, counts) for alias in flats for kind in FLATTENED]
    return plan


def _fit_links(groups, shape, plan, times, launch: float, copy_per_byte: float, flats):
    """Per collective and group name, the fitted ``(latency_s, bytes_per_s)``: of mesh
    dims (``links``) and of aliases (``flattened``)."""
    every = tuple(groups.mesh.names)
    links: dict[str, dict] = {kind: {} for kind in COLLECTIVES}
    flattened: dict[str, dict] = {alias: {} for alias in flats}
    for name, kind, sizes in plan:
        if (name, kind) == (every, "all_gather"):
            continue  # (the launch's)
        n = groups.get(name).size
        if n > 1:
            intercept, per_byte = _fit(shape, kind, n, sizes, times[name, kind], copy_per_byte)
            hops = max(1, link_terms(shape, kind, n, n)[0])
            link = (max(0.0, intercept - launch) / hops, 1.0 / per_byte)
            if name in flattened:
                flattened[name][kind] = link
            else:
                links[kind][name] = link
    return links, flattened


def _flattened_groups(mesh) -> tuple[str, ...]:
    """The aliases of ``mesh`` whose groups steps merge onto (two or more dims, none of
    size 1), one per set of ranks, in name order."""
    seen = set()
    out = []
    for name, dims in sorted(alias_dims(mesh).items()):
        key = tuple(sorted(dims))
        if len(key) > 1 and all(mesh.shape[m] > 1 for m in key) and key not in seen:
            seen.add(key)
            out.append(name)
    return tuple(out)


def _launch(shape, mesh, counts, times: dict, copy_per_byte: float) -> float:
    """The fixed seconds of launching a collective, apart from its per-hop latency: from
    small all_gathers along the slowest mesh dim (``h`` hops) and over the whole mesh
    (``H`` more hops, on a group as slow as that dim), ``launch + h * latency`` and
    ``launch + H * latency``. 0 when no group has more hops than a dim's (one active
    dim); never above a dim's small all_gather."""
    small = counts[:2]
    every = tuple(mesh.names)
    total = mesh.size()
    found = []  # (intercept, hops) of the all_gather along each active dim
    for name in mesh.names:
        n = mesh.size(name)
        if n > 1:
            intercept, _ = _fit(
                shape, "all_gather", n, small, times[name, "all_gather"][:2], copy_per_byte
            )
            found.append((intercept, link_terms(shape, "all_gather", n, n)[0]))
    if not found:
        return 0.0
    whole, _ = _fit(shape, "all_gather", total, small, times[every, "all_gather"], copy_per_byte)
    hops_all = link_terms(shape, "all_gather", total, total)[0]
    slowest, hops = max(found)
    if hops_all <= hops:
        return 0.0
    per_hop = (whole - slowest) / (hops_all - hops)
    launch = slowest - hops * per_hop
    return min(max(0.0, launch), min(i for i, _ in found))


def _counts(numel: int) -> tuple[int, ...]:
    """Input elements per rank of the timed runs: ``numel`` and four sizes below it, each a
    quarter of the next (the fit weighs them alike, relative to their times)."""
    return tuple(max(1, numel >> (2 * k)) for k in (4, 3, 2, 1, 0))


def _reps(count: int, repeats: int) -> int:
    return repeats * 4 if count < 1 << 14 else repeats


def _sizes(kind: str, n: int, count: int) -> tuple[int, int]:
    """Elements in and out per rank of ``kind`` over ``n`` ranks on ``count`` input ones
    (the runs round it down to whole blocks, at least one per rank)."""
    count = max(n, count - count % n)
    if kind == "all_gather":
        return count, count * n
    if kind == "reduce_scatter":
        return count, count // n
    return count, count


def _call(kind: str, group, count: int, device):
    """A call of collective ``kind`` over ``group`` on ``count`` float32 elements per rank
    (rounded to whole blocks), as the runtime makes it."""
    n = group.size
    x = torch.zeros(_sizes(kind, n, count)[0], dtype=torch.float32, device=device)
    if kind == "all_gather":
        return lambda: C.all_gather_concat(x, group)
    if kind == "all_reduce":
        return lambda: C.all_reduce(x, group, "sum")
    if kind == "reduce_scatter":
        return lambda: C.reduce_scatter(x, group, "sum")
    if kind == "all_to_all":
        sizes = [x.numel() // n] * n
        return lambda: C.all_to_all_single(x, group, sizes, sizes)
    # all_permute: one batch of sends and receives, each rank to the next
    me = group.position
    sends, recvs = [((me + 1) % n, x)], [((me - 1) % n, x.shape)]
    return lambda: _p2p.exchange(sends, recvs, group, dtype=x.dtype, device=x.device)


def _fit(
    shape: HardwareProfile,
    kind: str,
    n: int,
    counts: tuple[int, ...],
    times: list[float],
    copy_per_byte: float,
) -> tuple[float, float]:
    """``(seconds at no bytes, seconds per byte)`` that make the cost model's price of
    ``kind`` over ``n`` ranks (:func:`._step_cost.link_terms`) meet its timings at ``counts``:
    least squares on relative errors, after the local compute the model charges (copies,
    reductions); neither below what is physical (nothing below 0, no link faster than a
    local copy)."""
    _, y_in, y_out, comp_in, comp_out, _ = link_terms(shape, kind, n, n)
    rows = []  # (bytes on the link, seconds left for it, weight)
    for count, t in zip(counts, times, strict=True):
        e_in, e_out = _sizes(kind, n, count)
        b_in, b_out = 4 * e_in, 4 * e_out
        rows.append((y_in * b_in + y_out * b_out, t - comp_in * b_in - comp_out * b_out, t))
    floor = max(copy_per_byte, 1e-15)
    # weighted normal equations of t ~ intercept + y * per_byte, weights 1 / t^2
    sw = sum(1 / t**2 for _, _, t in rows)
    sy = sum(y / t**2 for y, _, t in rows)
    syy = sum(y * y / t**2 for y, _, t in rows)
    sr = sum(r / t**2 for _, r, t in rows)
    syr = sum(y * r / t**2 for y, r, t in rows)
    det = sw * syy - sy * sy
    if det > 0:
        per_byte = (sw * syr - sy * sr) / det
        intercept = (sr - sy * per_byte) / sw
    else:
        per_byte, intercept = floor, -1.0
    if intercept < 0:  # no fixed cost: the line through the origin
        intercept = 0.0
        per_byte = syr / syy if syy > 0 else floor
    if per_byte < floor:
        per_byte = floor
        intercept = max(0.0, (sr - sy * per_byte) / sw)
    return intercept, per_byte


def calibrate(
    groups: ProcessGroups,
    *,
    nbytes: int = 4 << 20,
    repeats: int = 10,
    device: torch.device | str | None = None,
) -> HardwareProfile | None:
    """A :class:`HardwareProfile` with measured links per collective and mesh dim (see the
    module docs).

    Every rank of the world calls it together; ranks outside the mesh get None. A dim of
    size 1 gets a free link (no latency, the local copy bandwidth). ``nbytes`` is the
    largest input per rank it times (4 MiB): the fit is best for steps up to about that
    size, so give the size of the tensors the plans will move.

    It runs collectives on every rank (see ``tests/runtime/test_collectives.py``); a
    profile it fits is plain data that plans take as their cost model:

    >>> calibrate(object())
    Traceback (most recent call last):
    ...
    meshplan.errors.RuntimeShellError: calibrate needs ProcessGroups, got <object object at ...>
    """
    found = measure(groups, nbytes=nbytes, repeats=repeats, device=device)
    if not found:
        return None
    copy_bw = found["copy_bytes_per_s"]
    free = (0.0, copy_bw)
    per_kind: dict = {}
    for kind, measured in found["collectives"].items():
        if kind == "all_permute":  # one link over all the mesh dims (or none to fit)
            per_kind[kind] = Link(*next(iter(measured.values()), free))
        else:  # (the fit keeps every bandwidth finite; a dim of size 1 has none)
            per_kind[kind] = [measured.get(name, free) for name in groups.mesh.names]
    dims_of = alias_dims(groups.mesh)
    flattened = {  # (an alias of one rank, as a mesh dim of size 1, has none)
        tuple(sorted(dims_of[alias])): {k: Link(*v) for k, v in kinds.items()}
        for alias, kinds in found["flattened"].items()
        if kinds
    }
    return HardwareProfile.from_dims(
        per_kind["all_gather"],
        launch_s=found["launch_s"],
        local_launch_s=found["local_launch_s"],
        copy_bytes_per_s=copy_bw,
        reduce_bytes_per_s=found["reduce_bytes_per_s"],
        reduce_scatter_via_all_reduce=found["reduce_scatter_via_all_reduce"],
        per_collective=per_kind,
        flattened=flattened,
    )


def _backend(groups: ProcessGroups) -> str:
    import torch.distributed as dist

    return str(dist.get_backend(groups.get(tuple(groups.mesh.names)).pg)).lower()


def default_device(device_type: str, backend: str) -> torch.device:
    """The device to time collectives on: the mesh's, unless its groups' backend cannot
    reduce tensors there -- a mesh built with the default ``device_type="cpu"`` on an
    NCCL world times on the current CUDA device (NCCL takes no CPU tensors).

    >>> default_device("cpu", "gloo"), default_device("cpu", "nccl")
    (device(type='cpu'), device(type='cuda'))
    >>> default_device("cpu", "cpu:gloo,cuda:nccl"), default_device("cuda", "nccl")
    (device(type='cpu'), device(type='cuda'))
    """
    backend = backend.lower()
    if device_type == "cpu" and "nccl" in backend and "cpu:" not in backend:
        return torch.device("cuda")
    return torch.device(device_type)


def _on_gloo(groups: ProcessGroups, device) -> bool:
    """Whether the mesh's collectives on ``device`` run on gloo, which runs a reduce_scatter
    as an all_reduce of the whole input (torch 2.13): a gloo group, or a group of several
    backends (``"cpu:gloo,cuda:nccl"``) on the CPU. The same on every rank."""
    backend = _backend(groups)
    if ":" not in backend:
        return backend == "gloo"
    kind = torch.device(device).type
    return any(part.strip() == f"{kind}:gloo" for part in backend.split(","))


def _synchronizer(device) -> Any:
    """What waits for ``device``'s queued work: on an accelerator, collectives and copies
    return once queued, so a timing without it would measure launches only; on the CPU
    they have finished when they return (nothing to wait for)."""
    kind = torch.device(device).type
    if kind == "cpu":
        return lambda: None
    if kind == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: torch.accelerator.synchronize(device)


def _time_all(runs: list, sync: Any, rounds: int = 3) -> list[float]:
    """Seconds per call of each ``(fn, repeats)`` of ``runs`` (None: 0.0): the best of
    ``rounds`` means over ``repeats`` back-to-back calls (``sync`` waits for them to
    finish). Every round runs them all, so a passing slowdown of the machine weighs on
    all of them alike, not on a few."""
    best = [math.inf if run else 0.0 for run in runs]
    for run in runs:
        if run:
            run[0]()
    for _ in range(rounds):
        for i, run in enumerate(runs):
            if run:
                fn, repeats = run
                sync()
                start = time.perf_counter()
                for _ in range(repeats):
                    fn()
                sync()
                best[i] = min(best[i], (time.perf_counter() - start) / repeats)
    return best


def _time(fn: Any, repeats: int, sync: Any, rounds: int = 3) -> float:
    """Seconds per call of ``fn``, as :func:`_time_all` measures it."""
    return _time_all([(fn, repeats)], sync, rounds)[0]

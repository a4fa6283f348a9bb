"""Measure a :class:`HardwareProfile` on the real process groups of a mesh.

``calibrate(groups)`` times all_gathers along each mesh dim (a tiny one for latency, a
large one for bandwidth) and local copies and additions, and fits the cost model's
alpha-beta form to them: along a dim of ``n`` ranks an all_gather of ``b`` bytes per
rank is priced ``latency * ceil(log2 n) + (n - 1) * b / bandwidth`` (the launch overhead
is folded into the latency, so the profile's ``launch_s`` is 0). Every rank of the world
calls it at the same time: it runs collectives, and ranks outside the mesh take part in
creating the groups (they measure nothing and get None). Every rank of the mesh returns
the *same* profile -- each number the slowest rank's -- so plans chosen with it agree
everywhere. On gloo the profile prices a reduce_scatter as gloo runs it: an all_reduce
of the whole input (``HardwareProfile.reduce_scatter_via_all_reduce``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from meshplan.errors import RuntimeShellError

from . import _collectives as C
from ._cost import HardwareProfile
from ._groups import ProcessGroups

__all__ = ["calibrate", "measure"]


def measure(
    groups: ProcessGroups,
    *,
    nbytes: int = 1 << 20,
    repeats: int = 10,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """The raw measurements ``calibrate`` fits: per mesh dim ``(latency_s, bytes_per_s)``,
    plus local ``copy_bytes_per_s``, ``reduce_bytes_per_s`` and ``local_launch_s``, and
    whether the backend runs a reduce_scatter as an all_reduce (gloo).

    The same dict on every rank of the mesh (each value the slowest rank's).

    >>> measure.__name__   # runs collectives; see tests/redistribute/test_collectives.py
    'measure'
    """
    if not isinstance(groups, ProcessGroups):
        raise RuntimeShellError(f"calibrate needs ProcessGroups, got {groups!r}", value=groups)
    if not isinstance(nbytes, int) or nbytes < 1024 or not isinstance(repeats, int) or repeats < 1:
        raise RuntimeShellError(
            f"calibrate needs nbytes >= 1024 and repeats >= 1, got {nbytes!r} and {repeats!r}",
            value=(nbytes, repeats),
        )
    mesh = groups.mesh
    if not groups.is_member:
        for name in mesh.names:  # take part in creating the groups, measure nothing
            groups.create(name)
        groups.create(tuple(mesh.names))
        return {}
    if device is None:
        device = "cpu" if mesh.device_type == "cpu" else torch.device(mesh.device_type)
    numel = max(1, nbytes // 4)
    big = torch.ones(numel, dtype=torch.float32, device=device)
    tiny = torch.ones(1, dtype=torch.float32, device=device)
    src, dst = big.clone(), torch.empty_like(big)
    copy_s = _time(lambda: dst.copy_(src), repeats)
    add_s = _time(lambda: torch.add(src, big, out=dst), repeats)
    launch_s = _time(lambda: tiny.clone(), repeats * 10)
    # no link moves bytes faster than a local copy: the floor when noise hides the transfer
    copy_per_byte = copy_s / (numel * 4)
    row: list[float] = []
    for name in mesh.names:
        group = groups.get(name)
        n = group.size
        if n == 1:
            row += [0.0, 0.0]
            continue
        small_s = _time(lambda g=group: C.all_gather_concat(tiny, g), repeats * 4)
        large_s = _time(lambda g=group: C.all_gather_concat(big, g), repeats)
        hops = max(1, math.ceil(math.log2(n)))
        per_byte = (large_s - small_s) / ((n - 1) * big.numel() * big.element_size())
        per_byte = max(per_byte, copy_per_byte, 1e-15)
        row += [small_s / hops, per_byte]  # seconds, seconds per byte (both: larger = slower)
    row += [max(copy_per_byte, 1e-15), add_s / (numel * 4), launch_s]
    # every rank keeps the slowest rank's numbers, so every rank plans alike
    slowest = C.all_reduce(
        torch.tensor(row, dtype=torch.float64), groups.get(tuple(mesh.names)), "max"
    )
    values = slowest.tolist()
    links = {}
    for i, name in enumerate(mesh.names):
        latency, per_byte = values[2 * i], values[2 * i + 1]
        links[name] = (latency, 1.0 / per_byte if per_byte > 0 else math.inf)
    copy_per_byte, add_per_byte, launch = values[2 * mesh.ndim :]
    return {
        "links": links,
        "copy_bytes_per_s": 1.0 / copy_per_byte,
        "reduce_bytes_per_s": 1.0 / add_per_byte,
        "local_launch_s": launch,
        "reduce_scatter_via_all_reduce": _on_gloo(groups, device),
    }


def calibrate(
    groups: ProcessGroups,
    *,
    nbytes: int = 1 << 20,
    repeats: int = 10,
    device: torch.device | str | None = None,
) -> HardwareProfile | None:
    """A :class:`HardwareProfile` with one measured link per mesh dim (see the module docs).

    Every rank of the world calls it together; ranks outside the mesh get None. A dim of
    size 1 gets a free link (no latency, the local copy bandwidth).

    >>> calibrate.__name__   # runs collectives; see tests/redistribute/test_collectives.py
    'calibrate'
    """
    found = measure(groups, nbytes=nbytes, repeats=repeats, device=device)
    if not found:
        return None
    copy_bw = found["copy_bytes_per_s"]
    links = []
    for name in groups.mesh.names:
        latency, bandwidth = found["links"][name]
        if groups.mesh.size(name) == 1 or not math.isfinite(bandwidth):
            latency, bandwidth = 0.0, copy_bw
        links.append((latency, bandwidth))
    return HardwareProfile.from_dims(
        links,
        launch_s=0.0,
        local_launch_s=found["local_launch_s"],
        copy_bytes_per_s=copy_bw,
        reduce_bytes_per_s=found["reduce_bytes_per_s"],
        reduce_scatter_via_all_reduce=found["reduce_scatter_via_all_reduce"],
    )


def _on_gloo(groups: ProcessGroups, device) -> bool:
    """Whether the mesh's collectives on ``device`` run on gloo, which runs a reduce_scatter
    as an all_reduce of the whole input (torch 2.13): a gloo group, or a group of several
    backends (``"cpu:gloo,cuda:nccl"``) on the CPU. The same on every rank."""
    import torch.distributed as dist

    backend = str(dist.get_backend(groups.get(tuple(groups.mesh.names)).pg)).lower()
    if ":" not in backend:
        return backend == "gloo"
    kind = torch.device(device).type
    return any(part.strip() == f"{kind}:gloo" for part in backend.split(","))


def _time(fn: Any, repeats: int, rounds: int = 3) -> float:
    """Seconds per call: the best of ``rounds`` means over ``repeats`` back-to-back calls."""
    fn()
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best

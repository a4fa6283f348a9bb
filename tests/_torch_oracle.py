"""torch 2.13 as an oracle in one process: a fake default process group, and mesh helpers.

Every test that builds torch ``DeviceMesh`` or DTensor values shares one fake default
group (``dist.init_process_group("fake", ...)``, rank 0), created on first use and
large enough for every test (:data:`DEFAULT_WORLD` ranks). Ask for more with
``ensure_fake_world(n)``: the group is then destroyed and re-created with ``n`` ranks,
which invalidates torch meshes built before — so build torch meshes inside the test
that uses them, never keep them across tests.

Use it through the session fixture ``fake_world`` (defined in ``tests/conftest.py``) or
call :func:`ensure_fake_world` directly. torch is imported lazily, so importing this
module costs nothing for pure tests.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

DEFAULT_WORLD = 4096

__all__ = [
    "DEFAULT_WORLD",
    "ensure_fake_world",
    "torch_mesh",
    "torch_groups",
    "torch_instance",
    "quiet_torch_warnings",
]


def ensure_fake_world(world_size: int = DEFAULT_WORLD) -> int:
    """Make sure a fake default process group of at least ``world_size`` ranks exists.

    Returns the world size in force. This process is rank 0 of it.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise RuntimeError(
                f"a {dist.get_backend()!r} default process group is already initialized; "
                "torch oracle tests need the fake backend"
            )
        current = dist.get_world_size()
        if current >= world_size:
            return current
        dist.destroy_process_group()
    size = max(world_size, DEFAULT_WORLD)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    return size


def torch_mesh(shape: Sequence[int], names: Sequence[str], ranks: Sequence[int]) -> Any:
    """A torch ``DeviceMesh`` of ``shape`` holding ``ranks`` row-major (process groups created).

    The fake world must already hold every rank, and rank 0 should be among ``ranks``
    (torch can only slice meshes that contain the calling rank).
    """
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    ensure_fake_world(max(ranks) + 1)
    tensor = torch.tensor(list(ranks), dtype=torch.int).reshape(tuple(shape))
    return DeviceMesh("cpu", tensor, mesh_dim_names=tuple(names))


def torch_groups(mesh: Any, dims: Sequence[int] | None = None) -> list[list[int]]:
    """Every rank group of a torch mesh along ``dims`` (default: all its dims), as torch lists
    them when it creates process groups (each group in mesh order)."""
    from torch.distributed._mesh_layout import _MeshLayout

    layout = mesh._layout
    if dims is not None:
        layout = _MeshLayout([layout[i] for i in dims])
    full = layout.remap_to_tensor(mesh._rank_map)
    return full.reshape(full.shape[0], -1).tolist()


def torch_instance(mesh: Any) -> list[int]:
    """The ranks of the instance of ``mesh`` that holds this process (rank 0), in mesh order."""
    return mesh.mesh.flatten().tolist()


@contextlib.contextmanager
def quiet_torch_warnings() -> Iterator[None]:
    """Hide torch's deprecation warning for slicing flattened dims from a root mesh."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
        yield

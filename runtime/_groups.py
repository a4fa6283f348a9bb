"""Process groups for a mesh: one torch group per distinct rank set, ordered by mesh coordinate.

:class:`ProcessGroups` is the shell's process-group table for one :class:`~meshplan.layout.Mesh`.
``groups.get(dims)`` returns a :class:`Group`: the torch ``ProcessGroup`` that the calling
rank shares with its neighbours along ``dims`` (mesh dims, indices or flattened aliases),
together with the members' global ranks in mesh-coordinate order.

Why the order matters: a torch process group numbers its members by its own rank list,
and torch sorts that list by default, so with a permuted rank map "group rank i" is not
"mesh coordinate i" and collectives that assume so silently permute data. Every meshplan
collective takes and returns per-position data (position = coordinate along the group's
dims) and maps positions to torch group ranks through the :class:`Group` helpers.

How groups are created (torch 2.13; verified on gloo, written for any backend):

* One torch group per distinct rank set: two names for the same ranks (a dim and a
  one-dim alias of it, an alias of ``("a", "c")`` and one of ``("c", "a")``) share one
  group, whatever order their coordinates list the ranks in. The torch group lists its
  members in mesh-layout order (the order of ``mesh.ranks``), so for ascending dims of a
  row-major mesh -- permuted rank map or not -- no reordering is needed at all.
* Groups are created on first use of a dim or alias (``get``), or all at once with
  :meth:`ProcessGroups.create_all`, and kept for the life of the process in one table
  (the shell's process-group table, keyed by member set, backend and timeout, shared by
  every ``ProcessGroups``), so building ``ProcessGroups`` again reuses them.
* :meth:`ProcessGroups.from_device_mesh` adopts the groups a torch ``DeviceMesh``
  already holds instead, and creates only those it lacks.
* Default ("world" creation): like ``DeviceMesh``, every rank of the world takes part in
  creating the groups of a dim -- each rank calls ``new_group(ranks, sort_ranks=False)``
  for every group of that dim, in one order; ranks outside a group return at once
  without communicating, and only a group's members connect to each other. torch names
  these groups by a counter that every rank advances identically, so this is robust;
  the price is that every rank of the world must call ``get`` (or ``create``) for a new
  dim in the same order -- which SPMD programs do -- including ranks outside the mesh,
  which call ``create``/``create_all`` (they get no group).
* ``local=True`` creates a group with only its members, via
  ``new_group(ranks, use_local_synchronization=True, sort_ranks=False)``. It works on
  gloo, but torch 2.13 names such a group after its ranks *and the number of process
  groups the calling process has created so far*, so it is only safe when every member
  has created equally many process groups before (e.g. every process calls
  ``create_all()`` for the same meshes in the same order right after
  ``init_process_group``). If the counts differ the members wait under different names;
  creation then fails after ``timeout`` with a ``RuntimeShellError`` instead of hanging.
* Groups are never destroyed: with torch 2.13's naming a destroyed and re-created group
  can get its old name back, and gloo then reads the old members' stale addresses from
  the store ("Connection refused").
* ``torch.distributed.split_group`` (one call per dim) requires a device-bound NCCL
  default group; it is not available on gloo and not used.
* Every group gets ``timeout`` (seconds): a collective that waits longer on a dead or
  stuck peer fails, and the collective helpers turn that into a ``RuntimeShellError``.
"""

from __future__ import annotations

import atexit
import datetime
import gc
from collections.abc import Sequence
from typing import Any

from meshplan.errors import RuntimeShellError
from meshplan.layout import Mesh

from ._backend_model import backend_plan_options, check_plan_options
from ._device_mesh import device_mesh_groups, mesh_from_device_mesh
from ._failstop import check
from ._group import DEFAULT_TIMEOUT, Group

__all__ = ["ProcessGroups"]

DimsKey = int | str | Sequence[int | str] | None


class ProcessGroups:
    """The process groups of ``mesh`` for the calling rank, created on first use.

    Needs ``torch.distributed`` to be initialized (any backend). ``get(dims)`` (or
    ``groups[dims]``) returns the calling rank's :class:`Group` along ``dims``: a mesh dim
    name or index, a flattened alias, or several of them (``None``: the whole mesh).
    ``timeout`` (seconds or a ``timedelta``) bounds every collective on these groups.
    ``warm_up`` runs one all_reduce of every member right after a group is created
    (default: on NCCL, whose first collective on a group must involve every member).
    Every rank of the world builds it and asks for new dims in the same order (ranks
    outside the mesh call ``create``); with ``local=True`` only the mesh's ranks do (see
    the module docs for when that is safe). ``check_specs`` (default on): ``run`` (and so
    ``redistribute``) checks once per plan that every rank of the mesh runs the same
    plan, raising :class:`RuntimeShellError` on every rank where their specs differ (and
    running the lowest rank's plan where only the plans differ), and
    ``run_program`` that every rank runs the same program on arguments that fit it:
    one 32-byte all_reduce the first time each plan runs, one 24-byte all_reduce per
    ``run_program`` call (see :mod:`meshplan.runtime._agree`). ``check_specs=False``
    saves them; then ranks that disagree wait on each other until ``timeout`` or
    exchange wrong data. ``cost_model`` and ``objective`` are what
    :func:`~meshplan.runtime.redistribute` and ``redistribute_dtensor`` plan with when
    their caller names no cost model (:meth:`plan_options`); None picks the backend's
    (see :mod:`meshplan.runtime._backend_model`: on gloo the gloo host preset and the
    fewest collectives, else the GPU preset and the least modeled time).

    It is built on every rank of a running world (see ``tests/runtime``) and checks its
    arguments first:

    >>> ProcessGroups("dp")
    Traceback (most recent call last):
    ...
    meshplan.errors.RuntimeShellError: ProcessGroups needs a Mesh, got 'dp'
    """

    def __init__(
        self,
        mesh: Mesh,
        *,
        timeout: float | datetime.timedelta = DEFAULT_TIMEOUT,
        backend: str | None = None,
        local: bool = False,
        warm_up: bool | None = None,
        check_specs: bool = True,
        cost_model: Any = None,
        objective: str | None = None,
    ) -> None:
        import torch.distributed as dist

        check_plan_options(cost_model, objective)
        if not isinstance(mesh, Mesh):
            raise RuntimeShellError(f"ProcessGroups needs a Mesh, got {mesh!r}", value=mesh)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeShellError(
                "torch.distributed is not initialized; call "
                "torch.distributed.init_process_group(...) before ProcessGroups(mesh)"
            )
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise RuntimeShellError(
                f"timeout must be a positive number of seconds, got {timeout!r}", value=timeout
            )
        if not isinstance(check_specs, bool):
            raise RuntimeShellError(
                f"check_specs must be True or False, got {check_specs!r}", value=check_specs
            )
        self.mesh = mesh
        self.check_specs = check_specs
        # per (source, target) checked: the plan every rank runs between them
        self._agreed_plans: dict[Any, Any] = {}
        self._runs: dict[Any, Any] = {}  # plan -> its steps with their groups (see _run)
        self.timeout = float(timeout)
        self.backend = backend
        self.local = bool(local)
        self.warm_up = warm_up
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if max(mesh.ranks) >= self.world_size:
            raise RuntimeShellError(
                f"mesh {mesh} uses rank {max(mesh.ranks)} but the world has only "
                f"{self.world_size} ranks; build the mesh over ranks below {self.world_size}",
                value=mesh,
            )
        if self.local and not mesh.contains(self.rank):
            raise RuntimeShellError(
                f"rank {self.rank} is not in mesh {mesh} (ranks {mesh.ranks!r}); with "
                "local=True create ProcessGroups only on the mesh's ranks",
                value=self.rank,
            )
        self._index: dict[int, int] | None = None
        self._handles: dict[Any, Group | None] = {}
        self._adopted = False
        self._cost_model = cost_model
        self._objective = objective
        self._default_options: dict[str, Any] | None = None

    @property
    def cost_model(self) -> Any:
        """The cost model given to the constructor (None: the backend's, see
        :meth:`plan_options`)."""
        return self._cost_model

    @property
    def objective(self) -> str | None:
        """The objective given to the constructor (None: the backend's)."""
        return self._objective

    def plan_options(self, cost_model: Any = None) -> dict[str, Any]:
        """The ``cost_model`` and ``objective`` to plan a move on these groups with: the
        caller's ``cost_model`` (least modeled time under it) when given, else this
        object's own, each of them left None filled in by the backend of the world's
        groups (:func:`~meshplan.runtime._backend_model.backend_plan_options`)."""
        if cost_model is not None:  # plan() checks it
            return {"cost_model": cost_model, "objective": self.objective or "time"}
        found = self._default_options
        if found is None:
            model, objective = self._backend_options()
            found = self._default_options = {
                "cost_model": self._cost_model if self._cost_model is not None else model,
                "objective": self._objective if self._objective is not None else objective,
            }
        return dict(found)

    def _backend_options(self) -> tuple[Any, str]:
        import torch.distributed as dist

        backend = self.backend if self.backend is not None else dist.get_backend()
        return backend_plan_options(str(backend), self.mesh.device_type)

    @classmethod
    def from_device_mesh(
        cls,
        device_mesh: Any,
        *,
        timeout: float | datetime.timedelta = DEFAULT_TIMEOUT,
        warm_up: bool | None = None,
        check_specs: bool = True,
        cost_model: Any = None,
        objective: str | None = None,
    ) -> ProcessGroups:
        """The groups of a torch ``DeviceMesh``, reusing its own process groups.

        Its mesh is ``Mesh.from_device_mesh(device_mesh)``; every dim and flattened dim
        maps to the torch group the DeviceMesh holds for it (no second set of
        communicators: each NCCL communicator costs device memory and start-up time),
        and so does any set of dims with the same members. Only a set of dims the
        DeviceMesh has no group for (a step across two dims with no flattened dim over
        them) gets a new one, created by every rank of the world as the constructor
        does; flatten it in torch first (``device_mesh[dims]._flatten(name)``) to share
        torch's. Call it on every rank of the world.

        ``warm_up`` (default: on NCCL) runs one all_reduce on each adopted group, in one
        order on every rank: NCCL requires every member in a group's first collective,
        and a DeviceMesh's groups may not have run one yet. ``check_specs`` is the
        constructor's. Build it once and reuse it.
        """
        import torch.distributed as dist

        mesh = mesh_from_device_mesh(device_mesh)
        groups = cls(
            mesh,
            timeout=timeout,
            warm_up=warm_up,
            check_specs=check_specs,
            cost_model=cost_model,
            objective=objective,
        )
        rank = groups.rank
        if not mesh.contains(rank):
            raise RuntimeShellError(
                f"rank {rank} is not in {device_mesh}; call ProcessGroups.from_device_mesh "
                "on the DeviceMesh's ranks",
                value=rank,
            )
        theirs = device_mesh_groups(device_mesh)
        adopted: dict[Any, Group] = {}

        def adopt(key: Any, dim: str) -> Group:
            pg = theirs[dim]
            pg_ranks = tuple(dist.get_process_group_ranks(pg))
            ranks = mesh.group_of(rank, dim)
            adopted[key] = Group(dim, ranks, pg_ranks, rank, pg, groups.timeout)
            return adopted[key]

        for i, name in enumerate(mesh.names):
            adopted[(i,)] = adopt((name,), name)
        for alias in mesh.aliases:
            adopt((alias,), alias)
        groups._adopt(adopted)
        seen = set()
        for group in adopted.values():
            if id(group.pg) not in seen and _needs_warm_up(group.pg, warm_up):
                _warm_up(group.pg, rank, group.pg_ranks, groups.timeout)
            seen.add(id(group.pg))
        return groups

    def _adopt(self, handles: dict[Any, Group]) -> None:
        """Serve ``handles`` (keyed like ``_key``), and any key whose members one of them has."""
        self._handles.update(handles)
        self._adopted = True

    @property
    def is_member(self) -> bool:
        """True when the calling rank is in the mesh (and so has groups)."""
        return self.mesh.contains(self.rank)

    # -- lookup -----------------------------------------------------------------------

    def get(self, dims: DimsKey = None) -> Group:
        """The calling rank's group along ``dims`` (created on first use)."""
        if not self.is_member:
            raise RuntimeShellError(
                f"rank {self.rank} is not in mesh {self.mesh} (ranks {self.mesh.ranks!r}), "
                "so it has no group; call groups.create(dims) on it to take part in "
                "creating the mesh's groups",
                value=self.rank,
            )
        group = self.create(dims)
        assert group is not None  # a member always has a group
        return group

    def __getitem__(self, dims: DimsKey) -> Group:
        return self.get(dims)

    def create(self, dims: DimsKey = None) -> Group | None:
        """Take part in creating the groups along ``dims``; the calling rank's, or None.

        Every rank of the world calls it (or ``get``) for a new ``dims`` in the same order;
        with ``local=True`` only the mesh's ranks do.
        """
        key = _key(dims)
        if key in self._handles:
            return self._handles[key]
        if self._adopted:
            found = self._reuse(key)
            if found is not None:
                return found
        picked = None if key is None else list(key)
        name = ",".join(self.mesh.names) if key is None else ",".join(map(str, key))
        if self.local:
            family = (self.mesh.group_of(self.rank, picked),)
        else:
            family = self.mesh.groups(picked)
        table = _table(self.local)
        handle = None
        for ranks in family:
            entry = (tuple(sorted(ranks)), self.backend, self.timeout)
            if entry not in table:
                table[entry] = self._new_group(ranks, name)
            if self.rank in ranks:
                pg, order = table[entry]
                handle = Group(name, ranks, order, self.rank, pg, self.timeout)
        self._handles[key] = handle
        return handle

    def _reuse(self, key: Any) -> Group | None:
        """An adopted group with the members ``key`` gives the calling rank, if any."""
        picked = None if key is None else list(key)
        ranks = self.mesh.group_of(self.rank, picked)
        for handle in list(self._handles.values()):
            if handle is not None and handle.ranks == ranks:
                self._handles[key] = handle
                return handle
        return None

    def create_all(self) -> tuple[Group, ...]:
        """Create every mesh dim's and alias's groups now: dims in order, then aliases by name.

        Returns the calling rank's groups (none for a rank outside the mesh).
        """
        keys = list(self.mesh.names) + sorted(self.mesh.aliases)
        made = [self.create(k) for k in keys]
        return tuple(g for g in made if g is not None)

    @property
    def process_groups(self) -> dict[tuple[int, ...], Any]:
        """The torch groups this object has handed out, keyed by their sorted member ranks."""
        return {tuple(sorted(h.ranks)): h.pg for h in self._handles.values() if h is not None}

    def __repr__(self) -> str:
        mode = ", local=True" if self.local else ""
        return (
            f"ProcessGroups({self.mesh}, rank={self.rank}, timeout={self.timeout}{mode}, "
            f"groups={len(self.process_groups)})"
        )

    # -- creation ---------------------------------------------------------------------

    def _layout_index(self, rank: int) -> int:
        ranks = self.mesh.ranks
        if isinstance(ranks, range):
            return ranks.index(rank)
        if self._index is None:
            self._index = {r: i for i, r in enumerate(ranks)}
        return self._index[rank]

    def _new_group(self, ranks: tuple[int, ...], name: str) -> tuple[Any, tuple[int, ...]]:
        import torch.distributed as dist

        order = tuple(sorted(ranks, key=self._layout_index))
        check(f"creating the process group {name!r} over ranks {order!r}", None)
        try:
            pg = dist.new_group(
                list(order),
                timeout=datetime.timedelta(seconds=self.timeout),
                backend=self.backend,
                use_local_synchronization=self.local,
                sort_ranks=False,
                group_desc=f"meshplan:{name}",
            )
        except (RuntimeError, ValueError) as exc:
            if self.local:
                hint = (
                    "with local=True every member must create it after creating equally "
                    "many process groups before it"
                )
            else:
                hint = (
                    "every rank of the world must take part, asking for new dims in the "
                    "same order (ranks outside the mesh call groups.create(dims))"
                )
            raise RuntimeShellError(
                f"creating the process group {name!r} over ranks {order!r} failed on rank "
                f"{self.rank}: {_first_line(exc)}; {hint}",
                value=order,
            ) from exc
        if self.rank not in order:
            return None, order
        if _needs_warm_up(pg, self.warm_up):
            _warm_up(pg, self.rank, order, self.timeout)
        return pg, order


# The shell's process-group table, one per creation mode: (sorted ranks, backend, timeout)
# -> (torch group or None for a non-member, its rank order). Shared by every
# ProcessGroups of the process and dropped when torch.distributed is re-initialized;
# groups are never destroyed (see the module docstring).
_TABLES: dict[Any, Any] = {}


@atexit.register
def _release_at_exit() -> None:
    # torch groups still alive when the interpreter tears down can abort the process
    # ("terminate called without an active exception", gloo, torch 2.13): drop ours
    # (and the cycles that hold them) while Python still runs.
    _TABLES.clear()
    gc.collect()


def _table(local: bool) -> dict[Any, Any]:
    import torch.distributed as dist

    world = dist.group.WORLD
    if _TABLES.get("world") is not world:
        _TABLES.clear()
        _TABLES["world"] = world
    return _TABLES.setdefault(local, {})


def _needs_warm_up(pg: Any, flag: bool | None) -> bool:
    """Whether a new group runs a first collective of all its members at once: asked for,
    or (``None``) when its backend sets up communicators lazily at the first collective
    and requires every member to take part in it (NCCL). On NCCL that first collective
    could otherwise be a ``batch_isend_irecv`` (``exchange``) that ranks with nothing to
    send or receive skip: undefined behaviour (a hang) under NCCL. gloo connects on
    creation and needs none."""
    if flag is not None:
        return bool(flag)
    import torch.distributed as dist

    return "nccl" in str(dist.get_backend(pg)).lower()


def _warm_up(pg: Any, rank: int, order: tuple[int, ...], timeout: float) -> None:
    """One tiny all_reduce of every member, on the device the group's backend runs on."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(pg)).lower()
    if "nccl" in backend and "cpu:" not in backend:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    try:
        work = dist.all_reduce(torch.zeros(1, device=device), group=pg, async_op=True)
        work.wait(datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise RuntimeShellError(
            f"the first collective of the new process group over ranks {order!r} failed on "
            f"rank {rank}: {_first_line(exc)}; every member must create the group",
            value=order,
        ) from exc


def _key(dims: DimsKey) -> Any:
    if dims is None:
        return None
    if isinstance(dims, int | str):
        return (dims,)
    return tuple(dims)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

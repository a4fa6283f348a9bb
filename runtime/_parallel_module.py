"""The module :func:`~._parallelize.parallelize` returns: this rank's shards as parameters,
the planned step as its forward, and the whole-mesh parts of training (gradient clipping,
state dicts, checkpoints, loading real weights shard by shard): see
:mod:`._parallelize`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import attrs
import torch

from meshplan.errors import RuntimeShellError
from meshplan.placement import Replicate, Sharded, Spec, local_shape, shard_one
from meshplan.strategy import ModuleProgram, Program, plan_module

from ._optim_state import OPTIM_PREFIX, load_optimizer_state, optimized_names, optimizer_state
from ._program import run_program

__all__ = ["LoadResult", "ParallelModule", "STEP_KEY"]


STEP_KEY = "parallelize.step"
"""Where :meth:`ParallelModule.save` keeps :attr:`ParallelModule.step` (the random stream's)."""


class LoadResult(NamedTuple):
    """What :meth:`ParallelModule.load_state_dict` did not match (as torch's own)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class ParallelModule(torch.nn.Module):
    """One rank's shards of a planned model (see :func:`parallelize`).

    ``named_parameters()`` / ``named_buffers()`` keep the model's names, and hold this
    rank's local tensors; :attr:`specs` gives each one's spec. Calling it with this rank's
    part of the batch (:meth:`local_batch` cuts it from the global batch) runs the planned
    step and returns its outputs (the loss), differentiably.
    """

    def __init__(
        self,
        program: ModuleProgram,
        groups: Any,
        *,
        device: Any = None,
        persistent: set[str] | None = None,
        aliases: Mapping[str, str] | None = None,
        source: torch.nn.Module | None = None,
        replan: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check_groups(groups)
        mp = program
        if not isinstance(mp, ModuleProgram):
            raise RuntimeShellError(
                f"ParallelModule takes a ModuleProgram, got {mp!r:.80}; use parallelize(...)",
                value=mp,
            )
        mesh = mp.program.arg_specs[0].mesh
        if groups.mesh != mesh:
            raise RuntimeShellError(
                f"the program is planned on {mesh} but the groups are of {groups.mesh}; "
                "build ProcessGroups(mesh) of the program's mesh",
                value=groups.mesh,
            )
        # plain attributes (not submodules): only the shards are the module's tensors
        object.__setattr__(self, "_source", source)
        self._groups, self._rank = groups, groups.rank
        self._programs = {bool(source.training if source is not None else True): mp}
        self._replan = dict(replan or {})
        self._specs = mp.specs
        grads = mp.named(mp.program.grad_specs)
        self._params = tuple(n for n in mp.names if grads[n] is not None)
        self._persistent = set(mp.names) if persistent is None else set(persistent)
        self._aliases = dict(aliases or {})
        self._loaded = False
        # the random stream of the step's draws: (seed, step), step counting training calls
        self.seed, self.step = seed, 0
        self.training = next(iter(self._programs))
        for name in mp.names:
            spec = self._specs[name]
            local = torch.zeros(local_shape(spec, self._rank), dtype=getattr(torch, spec.dtype))
            if device is not None:
                local = local.to(device)
            if name in self._params:
                if spec.is_partial:
                    raise RuntimeShellError(
                        f"parameter {name!r} is planned {spec}: an optimizer cannot step a "
                        "partial sum; give it Shard or Replicate placements",
                        value=spec,
                    )
                self._slot(name, torch.nn.Parameter(local))
            else:
                self._slot(name, local, persistent=name in self._persistent)

    # -- what it holds ----------------------------------------------------------------

    @property
    def groups(self) -> Any:
        return self._groups

    @property
    def mesh(self) -> Any:
        return self._groups.mesh

    @property
    def module_program(self) -> ModuleProgram:
        """The planned step this mode runs (:attr:`training`)."""
        return self._program_for(self.training)

    @property
    def program(self) -> Program:
        return self.module_program.program

    @property
    def specs(self) -> dict[str, Spec]:
        """Each parameter's and buffer's spec, by name."""
        return dict(self._specs)

    def spec_of(self, name: str) -> Spec:
        """The spec of the parameter or buffer ``name`` (its gradient's too)."""
        try:
            return self._specs[name]
        except KeyError:
            raise RuntimeShellError(
                f"no parameter or buffer is named {name!r}; names are like "
                f"{list(self._specs)[:6]!r}",
                value=name,
            ) from None

    @property
    def batch_specs(self) -> tuple[Spec, ...]:
        return self.module_program.batch_specs

    def local_batch(self, *batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's part of each global batch tensor, in its batch spec."""
        specs = self.batch_specs
        if len(batch) != len(specs):
            raise RuntimeShellError(
                f"the model's step takes {len(specs)} batch tensors, got {len(batch)}",
                value=len(batch),
            )
        device = self._device()
        return tuple(
            shard_one(t, s, self._rank).to(device) for t, s in zip(batch, specs, strict=True)
        )

    # -- the step -----------------------------------------------------------------------

    def forward(self, *local_batch: torch.Tensor, **run_args: Any) -> Any:
        """Run the planned step on this rank's part of the batch; returns its outputs.

        ``run_args`` go to :func:`~meshplan.runtime.run_program` (``bucket_bytes=``,
        ``prefetch=``). Random ops (dropout) draw from the stream of (:attr:`seed`,
        :attr:`step`): each call in training mode draws anew and counts ``step`` up (it is
        saved and loaded with the checkpoint, so a resumed run continues the stream).
        Buffers the step writes (a BatchNorm's running statistics) are updated in place,
        each rank its shard, as on one process.
        """
        if not self._loaded:
            raise RuntimeShellError(
                "the shards hold no weights yet (the model was on the meta device or a "
                "program was given without state=): load them with pm.load_state_dict("
                "whole_model_state) or pm.load(checkpoint_path)"
            )
        mp = self._program_for(self.training)
        tensors = [self._tensor(n) for n in mp.names]
        run_args.setdefault("seed", self.seed)
        run_args.setdefault("step", self.step)
        out = run_program(mp.program, self._groups, *local_batch, *tensors, **run_args)
        if self.training:
            self.step += 1
        return out

    def _program_for(self, training: bool) -> ModuleProgram:
        mp = self._programs.get(bool(training))
        if mp is not None:
            return mp
        source = self._source
        if source is None:
            have = "train" if next(iter(self._programs)) else "eval"
            raise RuntimeShellError(
                f"this model was planned in {have} mode only; call parallelize with the "
                "module (not a planned program) to run it in the other mode, or switch "
                f"back with pm.{have}()",
                value=training,
            )
        was = source.training
        source.train(bool(training))
        try:
            args = self._replan
            plan_args = {
                k: v
                for k, v in args["plan_args"].items()
                if k not in ("choose", "memory_budget", "state_budget")
            }
            specs = {n: self._specs[n] for n in self._specs}
            mp = _plan_once(
                self._groups,
                lambda: plan_module(
                    source,
                    *args["batch_specs"],
                    specs=specs,
                    forward=args["forward"],
                    **plan_args,
                ),
            )
        finally:
            source.train(was)
        self._programs[bool(training)] = mp
        return mp

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> torch.Tensor:
        """Scale every shard's gradient so the whole model's gradient norm is at most
        ``max_norm``; returns that norm (as ``torch.nn.utils.clip_grad_norm_`` on one
        process). Every rank of the mesh calls it.

        Each element is counted once: a shard replicated over a mesh dim counts at that
        dim's coordinate 0 only (gradients are never Partial: a parameter's gradient is in
        the parameter's spec).
        """
        import torch.distributed as dist

        p = float(norm_type)
        coord = self.mesh.coordinate(self._rank)
        grads, counted = [], []
        for name in self._params:
            g = self._tensor(name).grad
            if g is None:
                continue
            grads.append(g)
            spec = self._specs[name]
            if all(
                c == 0
                for c, pl in zip(coord, spec.placements, strict=True)
                if isinstance(pl, Replicate)
            ):
                counted.append(g)
        device = self._device()
        dtype = grads[0].dtype if grads else torch.float32
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        if p == float("inf"):
            local = max(
                (g.detach().abs().max().to(acc) for g in counted if g.numel()), default=None
            )
            total = torch.zeros((), dtype=acc, device=device) if local is None else local
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self._groups.get(None).pg)
        else:
            total = torch.zeros((), dtype=acc, device=device)
            for g in counted:
                total += torch.linalg.vector_norm(g.detach(), p).to(acc) ** p
            dist.all_reduce(total, group=self._groups.get(None).pg)
            total = total ** (1.0 / p)
        total = total.to(dtype)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeShellError(
                f"the total norm of order {p} of the gradients is {total.item()}; "
                "pass error_if_nonfinite=False to clip anyway",
                value=total.item(),
            )
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.detach().mul_(coef.to(g.device, g.dtype))
        return total

    # -- weights and checkpoints ----------------------------------------------------------

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Sharded]:  # type: ignore[override]
        """Every persistent parameter and buffer as a :class:`~meshplan.placement.Sharded`
        of this rank (what :func:`meshplan.checkpoint.save` takes)."""
        if args or kwargs:
            raise RuntimeShellError(
                "ParallelModule.state_dict() takes no arguments; its values are Sharded "
                "(this rank's shard with its spec)",
                value=args or kwargs,
            )
        return {
            n: Sharded(self._tensor(n).detach(), self._specs[n], self._rank)
            for n in self._specs
            if n in self._persistent
        }

    def load_state_dict(  # type: ignore[override]
        self, state: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> LoadResult:
        """Copy weights into the shards: a :class:`~meshplan.placement.Sharded` value is
        this rank's shard (in this model's spec), a tensor is the whole (global) value
        and is cut to this rank's shard, one at a time — a whole model's
        ``state_dict()`` loads as it is (tied names and non-persistent buffers may be
        left out). With ``strict`` a name missing or unknown raises."""
        if assign:
            raise RuntimeShellError("assign=True is not supported: the shards are copied into")
        aliases = self._aliases
        if isinstance(state, torch.nn.Module):  # every tensor, non-persistent buffers too
            aliases = {**_tied_aliases(state), **aliases}
            module = state
            state = dict(module.named_parameters(remove_duplicate=False))
            state.update(module.named_buffers(remove_duplicate=False))
        if not isinstance(state, Mapping):
            raise RuntimeShellError(
                "load_state_dict takes a mapping of name -> tensor or Sharded (or the whole "
                f"nn.Module), got {state!r:.80}",
                value=state,
            )
        canonical = {a: n for a, n in aliases.items() if a not in self._specs}
        unexpected, seen = [], set()
        with torch.no_grad():
            for key, value in state.items():
                name = canonical.get(key, key)
                if name not in self._specs:
                    unexpected.append(key)
                    continue
                if name in seen:
                    continue
                seen.add(name)
                self._tensor(name).copy_(self._local_of(name, value))
        missing = [n for n in self._specs if n not in seen and n in self._persistent]
        if strict and (missing or unexpected):
            raise RuntimeShellError(
                f"load_state_dict: missing {missing[:5]!r} ({len(missing)} in all), "
                f"unexpected {unexpected[:5]!r} ({len(unexpected)} in all); names are like "
                f"{list(self._specs)[:4]!r} (or pass strict=False)",
                value=(missing, unexpected),
            )
        if not missing:
            self._loaded = True
        return LoadResult(missing, unexpected)

    def _local_of(self, name: str, value: Any) -> torch.Tensor:
        spec = self._specs[name]
        if isinstance(value, Sharded):
            if value.spec != spec or value.rank != self._rank:
                raise RuntimeShellError(
                    f"{name!r} is given as rank {value.rank}'s shard of {value.spec}, but this "
                    f"model holds rank {self._rank}'s of {spec}; load a checkpoint into the "
                    "model's specs with pm.load(path) (it reshards), or pass the whole tensor",
                    value=value,
                )
            return value.local
        if not isinstance(value, torch.Tensor):
            raise RuntimeShellError(
                f"{name!r} is given as {value!r:.60}; give a tensor (the whole value) or a "
                "Sharded (this rank's shard)",
                value=value,
            )
        if _is_meta(value):
            raise RuntimeShellError(
                f"{name!r} is on the meta device (it has no values); initialize the model "
                "first (model.to_empty(device='cpu') and its init) or load a checkpoint",
                value=name,
            )
        if tuple(value.shape) != spec.shape:
            raise RuntimeShellError(
                f"{name!r} has shape {tuple(value.shape)} but the model's is {spec.shape}; "
                "give the whole (unsharded) tensor",
                value=tuple(value.shape),
            )
        return shard_one(value.detach(), spec, self._rank)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Sharded]:
        """The optimizer's state as Sharded values: each per-parameter tensor shaped like
        its parameter in the parameter's spec (``optim.<name>.<key>``, e.g. AdamW's
        ``exp_avg``), other tensors (``step``) replicated, and the param groups'
        settings (``optim.param_groups``, JSON bytes)."""
        names = self._optimized_names(optimizer)
        return optimizer_state(optimizer, names, self._specs, self._rank, self._replicated)

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state: Mapping[str, Sharded]
    ) -> None:
        """Set the optimizer's state from :meth:`optimizer_state_dict`'s values (e.g. as
        loaded by :func:`meshplan.checkpoint.load` into :meth:`checkpoint_specs`)."""
        load_optimizer_state(optimizer, state, self._optimized_names(optimizer))

    def checkpoint_specs(self, path: str | os.PathLike[str]) -> dict[str, Spec]:
        """Targets for :func:`meshplan.checkpoint.load` of a checkpoint saved by
        :meth:`save`: every tensor of the model and its optimizer found there, in this
        model's specs (other tensors are left out)."""
        from meshplan.checkpoint import read_metadata

        meta = read_metadata(path)
        out = {}
        for key, t in meta.tensors.items():
            if key in self._specs:
                out[key] = self._specs[key]
            elif key == STEP_KEY:
                out[key] = self._replicated((1,), "int64")
            elif key.startswith(OPTIM_PREFIX):
                name = key[len(OPTIM_PREFIX) :].rpartition(".")[0]
                spec = self._specs.get(name)
                if spec is not None and tuple(t.shape) == spec.shape and t.shape:
                    out[key] = attrs.evolve(spec, dtype=t.dtype)
                else:
                    out[key] = self._replicated(tuple(t.shape), t.dtype)
        return out

    def save(
        self,
        path: str | os.PathLike[str],
        optimizer: torch.optim.Optimizer | None = None,
        *,
        extra: Mapping[str, Sharded] | None = None,
        blocking: bool = True,
    ) -> Any:
        """Save the model's shards (and the optimizer's state, and ``extra`` values) with
        :func:`meshplan.checkpoint.save`; every rank of the mesh calls it."""
        from meshplan.checkpoint import save

        state: dict[str, Sharded] = dict(self.state_dict())
        step = torch.tensor([self.step], device=self._device())
        state[STEP_KEY] = Sharded(step, self._replicated((1,), "int64"), self._rank)
        if optimizer is not None:
            state |= self.optimizer_state_dict(optimizer)
        state |= dict(extra or {})
        return save(state, path, self._groups, blocking=blocking)

    def load(
        self,
        path: str | os.PathLike[str],
        optimizer: torch.optim.Optimizer | None = None,
        *,
        extra: Mapping[str, Spec] | None = None,
    ) -> dict[str, Sharded]:
        """Load a checkpoint of :meth:`save` (from any mesh) into the shards (and the
        optimizer); returns the ``extra`` tensors, loaded in the specs given."""
        from meshplan.checkpoint import load

        targets = self.checkpoint_specs(path)
        if optimizer is None:
            targets = {k: s for k, s in targets.items() if not k.startswith(OPTIM_PREFIX)}
        targets |= dict(extra or {})
        got = load(path, targets, self._groups, device=self._device())
        if STEP_KEY in got:
            self.step = int(got[STEP_KEY].local[0])
        self.load_state_dict({k: v for k, v in got.items() if k in self._specs})
        if optimizer is not None:
            self.load_optimizer_state_dict(optimizer, got)
        return {k: got[k] for k in extra or {}}

    # -- helpers ------------------------------------------------------------------------

    def _slot(self, name: str, value: torch.Tensor, persistent: bool = True) -> None:
        *path, leaf = name.split(".")
        mod: torch.nn.Module = self
        try:
            for part in path:
                child = mod._modules.get(part)
                if child is None:
                    child = torch.nn.Module()
                    mod.add_module(part, child)
                mod = child
            if isinstance(value, torch.nn.Parameter):
                mod.register_parameter(leaf, value)
            else:
                mod.register_buffer(leaf, value, persistent=persistent)
        except (KeyError, TypeError, AttributeError) as exc:
            raise RuntimeShellError(
                f"cannot hold {name!r} under its name ({exc}); rename the tensor (a name "
                "that is also a module attribute or another tensor's prefix)",
                value=name,
            ) from None

    def _tensor(self, name: str) -> torch.Tensor:
        *path, leaf = name.split(".")
        mod: Any = self
        for part in path:
            mod = mod._modules[part]
        return getattr(mod, leaf)

    def _device(self) -> torch.device:
        return next((self._tensor(n).device for n in self._specs), torch.device("cpu"))

    def _replicated(self, shape: tuple[int, ...], dtype: str) -> Spec:
        return Spec(self.mesh, [Replicate()] * self.mesh.ndim, shape, dtype)

    def _optimized_names(self, optimizer: torch.optim.Optimizer) -> dict[int, str]:
        return optimized_names(optimizer, {id(self._tensor(n)): n for n in self._params})

    def named_shards(self) -> Iterator[tuple[str, Sharded]]:
        """Each parameter as a Sharded (its local tensor and spec)."""
        for n in self._params:
            yield n, Sharded(self._tensor(n), self._specs[n], self._rank)


def _is_meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def _tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Every name of a tied parameter or buffer -> the name it is planned under (its first)."""
    first: dict[int, str] = {}
    out = {}
    params = model.named_parameters(remove_duplicate=False)
    buffers = model.named_buffers(remove_duplicate=False)
    for name, t in [*params, *buffers]:
        out[name] = first.setdefault(id(t), name)
    return out


def _check_groups(groups: Any) -> None:
    from ._groups import ProcessGroups

    if not isinstance(groups, ProcessGroups):
        raise RuntimeShellError(
            f"parallelize runs on ProcessGroups(mesh), got {groups!r:.80}", value=groups
        )
    if not groups.is_member:
        raise RuntimeShellError(
            f"rank {groups.rank} is not in mesh {groups.mesh}; call parallelize on the mesh's "
            "ranks only",
            value=groups.rank,
        )


def _plan_once(groups: Any, plan: Callable[[], ModuleProgram]) -> ModuleProgram:
    """The plan, made on this rank: planning is deterministic, so every rank makes the
    same one (and :func:`~meshplan.runtime.run_program` checks that the ranks agree) with
    no collective waiting meanwhile, however long planning takes."""
    return plan()

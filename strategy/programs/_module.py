"""Planning a module whole: :func:`plan_module` and the :class:`ModuleProgram` value.

A training step is usually written against an ``nn.Module`` that holds its parameters
and buffers. :func:`plan_module` makes it a function of them (torch's
``functional_call``: the module itself is not changed) and plans that with
:func:`~meshplan.strategy.plan_program`: the batch first, then every parameter and
buffer by name. Layouts are given by name or by glob pattern, in the spirit of torch's
tensor-parallel plans (``{"*.q_proj.weight": [Shard(0), Shard(0)], "*norm.weight":
"R R"}``); a parameter no pattern names, and every buffer unless one does, is
replicated. Tied parameters (one tensor under two names) are one argument, under the
first name. A step that writes into a buffer (BatchNorm's running statistics) has the
buffer's new value as an output, in the buffer's spec (:attr:`ModuleProgram.written`),
whatever spec is given for it. Imports torch only when called.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import StrategyError
from meshplan.placement import Placement, Replicate, Spec, parse_placements

from ._program_value import Program

__all__ = ["ModuleProgram", "plan_module", "match_specs"]


@attrs.frozen(eq=False)
class ModuleProgram:
    """A planned module step: the :class:`Program` and the names of its arguments.

    The program's arguments are the batch (``n_batch`` tensors) then the module's
    tensors in ``names`` order; ``specs`` maps each name to its layout.
    :meth:`arguments` orders tensors so, and :meth:`named` reads the program's
    gradients back by name.
    """

    program: Program
    names: tuple[str, ...]
    n_batch: int

    @property
    def specs(self) -> dict[str, Spec]:
        """Each parameter's and buffer's spec, by name."""
        return dict(zip(self.names, self.program.arg_specs[self.n_batch :], strict=True))

    @property
    def batch_specs(self) -> tuple[Spec, ...]:
        return self.program.arg_specs[: self.n_batch]

    def arguments(self, state: Mapping[str, Any], *batch: Any) -> tuple[Any, ...]:
        """The program's arguments: ``batch``, then ``state[name]`` for every name (local
        tensors for :func:`~meshplan.runtime.run_program`, or per-rank dicts for
        :func:`~meshplan.runtime.simulate_program`)."""
        if len(batch) != self.n_batch:
            raise StrategyError(
                f"the module program takes {self.n_batch} batch tensors, got {len(batch)}",
                value=batch,
            )
        missing = [n for n in self.names if n not in state]
        if missing:
            raise StrategyError(
                f"state lacks {missing[:5]!r} (of {len(missing)} missing); pass every "
                "parameter and buffer by name (model.state_dict() or their local shards)",
                value=missing,
            )
        return (*batch, *(state[n] for n in self.names))

    @property
    def written(self) -> tuple[str, ...]:
        """The buffers (or parameters) the step writes into, by name (BatchNorm's running
        statistics): their new values are the program's outputs after the step's own,
        each in its own spec; :func:`~meshplan.runtime.run_program` writes them into
        the local tensors passed in, as the module's step does on one process."""
        return tuple(self.names[k - self.n_batch] for k in self.program.writes)

    def state_after(self, outputs: Sequence[Any]) -> dict[str, Any]:
        """The written tensors' new values, ``{name: value}``, from a run's outputs (those
        of :func:`~meshplan.runtime.simulate_program` or
        :func:`~meshplan.runtime.run_unsharded`, which return them after the step's own)."""
        outputs = tuple(outputs)
        n = self.program.graph.n_results
        if len(outputs) != n + len(self.written):
            raise StrategyError(
                f"expected {n + len(self.written)} outputs (the step's {n}, then the "
                f"{len(self.written)} written tensors), got {len(outputs)}",
                value=len(outputs),
            )
        return dict(zip(self.written, outputs[n:], strict=True))

    def named(self, values: Sequence[Any]) -> dict[str, Any]:
        """Per-argument values (e.g. the program's gradients) as ``{name: value}`` for the
        module's tensors (the batch's left out)."""
        values = tuple(values)
        if len(values) != self.n_batch + len(self.names):
            raise StrategyError(
                f"expected {self.n_batch + len(self.names)} values (one per argument), got "
                f"{len(values)}",
                value=values,
            )
        return dict(zip(self.names, values[self.n_batch :], strict=True))


def _placements(mesh: Any, given: Any, name: str) -> tuple[tuple[Placement, ...], Any] | Spec:
    """A Spec as given, or (placements, shard order) from placements or their text."""
    if isinstance(given, Spec):
        return given
    order = None
    if isinstance(given, str):
        given, order = parse_placements(given)
    try:
        placements = tuple(given)
    except TypeError:
        raise StrategyError(
            f"the layout given for {name!r} is {given!r}; give a Spec, placements (one per "
            "mesh dim) or their text, e.g. 'S(0) R'",
            value=given,
        ) from None
    if len(placements) != mesh.ndim:
        raise StrategyError(
            f"the layout for {name!r} has {len(placements)} placements for a {mesh.ndim}-D "
            f"mesh {mesh}; give one per mesh dim",
            value=given,
        )
    return placements, order or None


def match_specs(
    mesh: Any, tensors: Mapping[str, Any], specs: Mapping[str, Any] | None
) -> dict[str, Spec]:
    """Each named tensor's spec: an exact name first, else the first matching glob pattern
    (in the mapping's order), else replicated. A pattern that names nothing is an error.

    ``tensors`` maps names to objects with ``shape`` and ``dtype`` (tensors).
    """
    specs = dict(specs or {})
    used: set[str] = set()
    out = {}
    for name, t in tensors.items():
        key = (
            name
            if name in specs
            else next((p for p in specs if fnmatch.fnmatchcase(name, p)), None)
        )
        shape = tuple(int(s) for s in t.shape)
        dtype = str(t.dtype).removeprefix("torch.")
        if key is None:
            out[name] = Spec(mesh, [Replicate()] * mesh.ndim, shape, dtype)
            continue
        used.add(key)
        got = _placements(mesh, specs[key], name)
        if isinstance(got, Spec):
            if got.shape != shape or got.dtype != dtype or got.mesh != mesh:
                raise StrategyError(
                    f"the spec given for {name!r} ({got}) disagrees with the tensor "
                    f"({dtype}{list(shape)}) or the batch's mesh",
                    value=got,
                )
            out[name] = got
        else:
            placements, order = got
            out[name] = Spec(mesh, placements, shape, dtype, shard_order=order)
    unused = [
        p for p in specs if p not in used and not any(fnmatch.fnmatchcase(n, p) for n in tensors)
    ]
    if unused:
        raise StrategyError(
            f"the layouts {unused!r} name no parameter or buffer; names are like "
            f"{list(tensors)[:6]!r} (glob patterns such as '*.q_proj.weight' match them)",
            value=unused,
        )
    return out


def plan_module(
    model: Any,
    *batch_specs: Spec,
    specs: Mapping[str, Any] | None = None,
    forward: Callable[..., Any] | None = None,
    state: Mapping[str, Any] | None = None,
    **plan_args: Any,
) -> ModuleProgram:
    """Plan a module's step whole: ``forward(model, *batch)`` (default ``model(*batch)``).

    ``batch_specs`` lay out the batch tensors; ``specs`` each parameter and buffer, by
    name or glob pattern (a :class:`~meshplan.placement.Spec`, placements, or their
    text); the rest are replicated. ``model`` may also be a plain function
    ``model(state, *batch)`` of a mapping of named tensors, given as ``state``. Other
    keywords go to :func:`~meshplan.strategy.plan_program` (``ruleset=``,
    ``out_specs=``, ``compute=``, ``memory_budget=`` ...); ``choose=`` names the tensors
    whose layouts the planner picks by name or glob pattern (``choose=["*"]``: every
    parameter and buffer). A model built on the ``meta`` device plans as well: only
    shapes and dtypes are read, nothing of parameter size is allocated. Parameters (tensors that require grad) are
    differentiated; the batch and buffers are not.

    >>> import torch
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> mesh = Mesh.create((2,), ("dp",))
    >>> model = torch.nn.Linear(4, 3, dtype=torch.float64)
    >>> x = Spec(mesh, [Shard(0)], (8, 4), "float64")
    >>> mp = plan_module(model, x, forward=lambda m, x: m(x).square().mean(),
    ...                  specs={"*weight": "S(0)"})
    >>> mp.names, str(mp.specs["weight"])
    (('weight', 'bias'), 'f64[3,4](S(0))')
    """
    import torch

    if not batch_specs:
        raise StrategyError(
            "plan_module needs the batch's specs (they give the mesh)", value=batch_specs
        )
    for i, s in enumerate(batch_specs):
        if not isinstance(s, Spec):
            raise StrategyError(f"plan_module: batch spec {i} is {s!r}, not a Spec", value=s)
    mesh = batch_specs[0].mesh
    if isinstance(model, torch.nn.Module):
        if state is not None:
            raise StrategyError(
                "state= is for a plain function; a module's state is its own parameters and "
                "buffers",
                value=state,
            )
        tensors = dict(model.named_parameters())
        tensors.update(model.named_buffers())
        step = _module_step(model, forward, tuple(tensors))
    elif callable(model):
        if state is None or forward is not None:
            raise StrategyError(
                "a plain function is planned as model(state, *batch): give state= (name -> "
                "tensor), and no forward=",
                value=model,
            )
        tensors = dict(state)
        names = tuple(tensors)

        def step(*args: Any) -> Any:
            n = len(batch_specs)
            return model(dict(zip(names, args[n:], strict=True)), *args[:n])

    else:
        raise StrategyError(
            f"plan_module plans an nn.Module or a function, got {model!r:.80}", value=model
        )
    by_name = match_specs(mesh, tensors, specs)
    names = tuple(tensors)
    requires_grad = [False] * len(batch_specs) + [
        bool(getattr(tensors[n], "requires_grad", False)) for n in names
    ]
    from ._auto import resolve_choose
    from ._program import plan_program

    if plan_args.get("choose") is not None:  # names and glob patterns of the module's tensors
        every = [f"<batch {i}>" for i in range(len(batch_specs))] + list(names)
        plan_args["choose"] = resolve_choose(plan_args["choose"], len(every), names=every)
    program = plan_program(
        step,
        *batch_specs,
        *(by_name[n] for n in names),
        requires_grad=plan_args.pop("requires_grad", requires_grad),
        **plan_args,
    )
    return ModuleProgram(program, names, len(batch_specs))


def _module_step(model: Any, forward: Callable[..., Any] | None, names: tuple[str, ...]):
    import torch
    from torch.func import functional_call

    class _Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *batch: Any) -> Any:
            return self.model(*batch) if forward is None else forward(self.model, *batch)

    wrapper = _Step()

    def step(*args: Any) -> Any:
        n = len(args) - len(names)
        state = {"model." + k: t for k, t in zip(names, args[n:], strict=True)}
        return functional_call(wrapper, state, tuple(args[:n]))

    return step

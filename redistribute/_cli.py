"""The ``meshplan`` command: plan a redistribution and print the explained plan.

    meshplan plan --mesh 2x2x2 --names a,b,c --flatten a,c --src "P R P" --dst "R R R" --shape 8,8

Prices come from a preset (``--hardware``) or from a profile saved with
:meth:`~meshplan.redistribute.HardwareProfile.to_json` (``--profile FILE``, e.g. what
``calibrate`` measured on the real process groups). Pure: builds values, calls
:func:`~meshplan.redistribute.plan`, prints :func:`~meshplan.redistribute.explain`. No
torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

from meshplan.errors import MeshplanError
from meshplan.layout import Mesh
from meshplan.placement import Spec, parse_placements

from ._merge import MergeWarning
from ._plan import explain
from ._planner import plan
from ._profile import CostModel, HardwareProfile

__all__ = ["main", "build_parser"]

_PROFILES = {
    "nvlink-ib": lambda args: HardwareProfile.nvlink_ib(
        gpus_per_node=8 if args.gpus_per_node is None else args.gpus_per_node
    ),
    "gloo-cpu": lambda args: HardwareProfile.gloo_cpu(),
}


def _ints(text: str, sep: str, what: str) -> tuple[int, ...]:
    text = text.replace(" ", "")
    try:
        # "" is a 0-D shape; otherwise every part is an int ("8,,8" and "2x" are typos)
        out = tuple(int(x) for x in text.split(sep)) if text else ()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} {text!r} must be integers separated by {sep!r}, e.g. "
            + ("2x4" if sep == "x" else "8,8")
        ) from None
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``meshplan`` command."""
    parser = argparse.ArgumentParser(
        prog="meshplan", description="Plan how to move a sharded tensor between two layouts."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "plan",
        help="print the minimum-cost plan between two placements",
        description="Print the minimum-cost plan turning --src into --dst, explained.",
    )
    p.add_argument("--mesh", required=True, help="mesh shape, e.g. 2x2x2")
    p.add_argument("--names", help="mesh dim names, e.g. a,b,c (default d0,d1,...)")
    p.add_argument(
        "--flatten",
        action="append",
        default=[],
        metavar="DIMS[=NAME]",
        help="register a flattened alias of these dims (repeatable), e.g. a,c or a,c=ac",
    )
    p.add_argument("--src", required=True, help='source placements, e.g. "S(0)[1,0] S(0) P"')
    p.add_argument("--dst", required=True, help='target placements, e.g. "R R R"')
    p.add_argument("--shape", required=True, help="global tensor shape, e.g. 8,8")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--no-merge", action="store_true", help="do not merge onto flattened aliases")
    p.add_argument("--max-local-bytes", type=int, help="bound each step's input+output bytes")
    p.add_argument(
        "--objective",
        choices=("time", "collectives"),
        default="time",
        help="least modeled time (default), or fewest collectives, then time",
    )
    hw = p.add_mutually_exclusive_group()
    hw.add_argument(
        "--hardware",
        choices=sorted(_PROFILES),
        default="nvlink-ib",
        help="hardware profile for the cost model (default nvlink-ib)",
    )
    hw.add_argument(
        "--profile",
        metavar="FILE",
        help="a hardware profile saved by HardwareProfile.to_json (e.g. what calibrate "
        "measured on the real process groups)",
    )
    p.add_argument("--gpus-per-node", type=int, help="ranks per node (nvlink-ib; default 8)")
    return parser


def _mesh(args) -> Mesh:
    shape = _ints(args.mesh, "x", "--mesh")
    names = tuple(args.names.replace(" ", "").split(",")) if args.names else None
    mesh = Mesh.create(shape, names)
    for spec in args.flatten:
        dims, eq, name = spec.partition("=")
        dims = tuple(dims.replace(" ", "").split(","))
        name = name.strip()
        if eq and (not name or any(c in name for c in ",= ")):
            raise argparse.ArgumentTypeError(
                f"--flatten {spec!r}: the alias after '=' is one name (no ',', '=' or "
                "spaces), e.g. a,c=ac"
            )
        if not all(dims):
            raise argparse.ArgumentTypeError(
                f"--flatten {spec!r} must list mesh dims separated by ',', e.g. a,c or a,c=ac"
            )
        mesh = mesh.flatten(dims, name or "_".join(dims))
    return mesh


def _spec(mesh: Mesh, text: str, shape, dtype: str) -> Spec:
    placements, order = parse_placements(text)
    return Spec(mesh, placements, shape, dtype, order)


def _profile(args) -> HardwareProfile:
    if args.gpus_per_node is not None and (args.profile or args.hardware != "nvlink-ib"):
        raise argparse.ArgumentTypeError(
            "--gpus-per-node sets the nvlink-ib preset's node size; "
            + (
                "a saved --profile has its own links"
                if args.profile
                else f"--hardware {args.hardware} has no nodes"
            )
        )
    if args.profile is None:
        return _PROFILES[args.hardware](args)
    try:
        with open(args.profile, "rb") as f:  # from_json decodes (and names bad bytes)
            text = f.read()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"--profile {args.profile!r}: {e.strerror}") from None
    return HardwareProfile.from_json(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input).

    >>> main(["plan", "--mesh", "2", "--src", "S(0)", "--dst", "R", "--shape", "4"])
    ... # doctest: +ELLIPSIS
    Plan f32[4](S(0)) -> f32[4](R) on Mesh((2,), names=('d0',))
    ...
    0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        mesh = _mesh(args)
        shape = _ints(args.shape, ",", "--shape")
        src = _spec(mesh, args.src, shape, args.dtype)
        dst = _spec(mesh, args.dst, shape, args.dtype)
        model = CostModel(_profile(args))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MergeWarning)
            p = plan(
                src,
                dst,
                cost_model=model,
                merge=not args.no_merge,
                max_local_bytes=args.max_local_bytes,
                objective=args.objective,
            )
    except (MeshplanError, argparse.ArgumentTypeError) as e:
        print(f"meshplan: error: {e}", file=sys.stderr)
        return 2
    try:
        print(explain(p, model))
        for w in caught:
            if issubclass(w.category, MergeWarning):
                print(f"note: {w.message}")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left early (e.g. `| head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

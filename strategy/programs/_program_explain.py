"""A program's table: each op's strategy, and where the communication goes (no torch)."""

from __future__ import annotations

from typing import Any

from meshplan.placement import format_placements

__all__ = ["explain_program"]


def _text(spec: Any) -> str:
    return "-" if spec is None else format_placements(spec.placements, spec.shard_order)


def _move_text(plan: Any, model: Any = None) -> str:
    if plan is None:
        return ""
    kinds = [s.collective or "local" for s in plan.steps]
    return "+".join(kinds) if kinds else "relabel"


def explain_program(program: Any) -> str:
    """Rows: phase, op, its inputs' and outputs' layouts, the moves into it, and totals."""
    from meshplan.redistribute import cost as plan_cost

    rows = [("phase", "op", "inputs", "outputs", "moves in", "comm (s)")]
    by_kind: dict[str, float] = {}
    copies = {c for c, _ in program.graph.recomputes}
    for op in program.ops:
        moved = [(i, m) for i, m in enumerate(op.moves) if m is not None]
        comm = sum(plan_cost(m).total for _, m in moved)
        for _, m in moved:
            for s in m.steps:
                if s.collective:
                    by_kind[s.collective] = by_kind.get(s.collective, 0) + 1
        rows.append(
            (
                "recompute" if op.node in copies else op.phase,
                op.call.target.removeprefix("aten.")
                + (" [replicated]" if op.replicated_fallback else ""),
                ", ".join(_text(s) for s in op.input_specs),
                ", ".join(_text(s) for s in op.output_specs if s is not None),
                "; ".join(f"in{i}: {_move_text(m)}" for i, m in moved),
                f"{comm:.3g}" if moved else "",
            )
        )
    for name, moves, specs in (
        ("output", program.out_moves, program.out_specs),
        ("gradient", program.grad_moves, program.grad_specs),
    ):
        for i, (m, s) in enumerate(zip(moves, specs, strict=True)):
            if m is None:
                continue
            for st in m.steps:
                if st.collective:
                    by_kind[st.collective] = by_kind.get(st.collective, 0) + 1
            rows.append(
                ("final", f"{name} {i}", "", _text(s), _move_text(m), f"{plan_cost(m).total:.3g}")
            )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    c = program.cost
    lines.append("")
    lines.append(
        f"total {c.total:.4g} s = comm {c.comm:.4g} s + compute {c.compute:.4g} s; "
        f"{c.collectives} collectives, {c.bytes:.4g} bytes per rank; method {program.method}"
        + (f" (lower bound {program.lower_bound:.4g} s)" if not program.exact else "")
    )
    if program.graph.recomputes:
        lines.append(
            f"recomputed in the backward: {len(program.graph.recomputes)} forward calls, "
            f"{c.recompute:.4g} s of the total (compute and the moves they repeat)"
        )
    if by_kind:
        lines.append("collectives: " + ", ".join(f"{k} x{v}" for k, v in sorted(by_kind.items())))
    if program.fallbacks:
        lines.append(
            f"replicated for want of a rule: {program.replicated} ops ("
            + ", ".join(program.fallbacks)
            + ")"
        )
    return "\n".join(lines)

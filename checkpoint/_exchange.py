"""Exchanging small Python values between the ranks of a save or a load, in few collectives.

torch's object collectives take two collectives each (the sizes, then the pickled bytes)
and a pickle even for a fixed-size value. The values a save and a load exchange are
small and, on the common path, of a known form: a save id is 8 bytes, a commit outcome
is "ok", a rank's chunk records fit in a few kilobytes. Each exchange here takes one
collective on that path, and a second only when a value does not fit.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["all_gather_small", "broadcast_id", "broadcast_result"]

INLINE = 16384  # bytes per rank of an all-gather's first collective (length + pickle)


def broadcast_id(save_id: str | None, src: int, group: Any) -> str:
    """``src``'s save id (16 hex digits) on every rank of ``group``: one broadcast of
    its 8 bytes; the other ranks pass None."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(8, dtype=torch.uint8)
    if save_id is not None:
        buf.copy_(torch.frombuffer(bytearray.fromhex(save_id), dtype=torch.uint8))
    dist.broadcast(buf, src=src, group=group.pg)
    return bytes(buf.tolist()).hex()


def broadcast_result(result: str, src: int, group: Any) -> str:
    """``src``'s outcome (``"ok"`` or an error's text) on every rank of ``group``: "ok"
    costs one broadcast of a flag; a failure's text follows in a second one."""
    import torch
    import torch.distributed as dist

    failed = torch.tensor([int(result != "ok")], dtype=torch.int64)
    dist.broadcast(failed, src=src, group=group.pg)
    if not failed.item():
        return "ok"
    message: list[Any] = [result]
    dist.broadcast_object_list(message, src=src, group=group.pg)
    return message[0]


def all_gather_small(value: Any, group: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order of ``group``.

    One all-gather of ``INLINE`` bytes per rank (the pickle's length and its first
    bytes); a second one, only when some rank's pickle is longer, carries the rest.
    """
    import torch
    import torch.distributed as dist

    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    head = INLINE - 8
    buf = torch.zeros(INLINE, dtype=torch.uint8)
    buf[:8] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
    first = data[:head]
    if first:
        buf[8 : 8 + len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
    heads = [torch.empty_like(buf) for _ in range(group.size)]
    dist.all_gather(heads, buf, group=group.pg)
    lengths = [int(h[:8].view(torch.int64).item()) for h in heads]
    parts = [bytes(h[8 : 8 + min(n, head)].numpy()) for h, n in zip(heads, lengths, strict=True)]
    rest = max(lengths) - head
    if rest > 0:  # some rank's value did not fit: every rank sends the rest of its own
        tail = torch.zeros(rest, dtype=torch.uint8)
        mine = data[head:]
        if mine:
            tail[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        tails = [torch.empty_like(tail) for _ in range(group.size)]
        dist.all_gather(tails, tail, group=group.pg)
        parts = [
            p + bytes(t[: max(n - head, 0)].numpy())
            for p, t, n in zip(parts, tails, lengths, strict=True)
        ]
    return [pickle.loads(p) for p in parts]

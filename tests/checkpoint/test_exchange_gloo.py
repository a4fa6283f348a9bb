"""The small exchanges of a save and a load (one collective on the common path) give every
rank the same values as torch's object collectives, whatever their sizes."""

from meshplan.layout import Mesh

MESH = Mesh.create(4)


def _exchange(sizes):
    import torch.distributed as dist

    from meshplan.checkpoint._exchange import all_gather_small, broadcast_id, broadcast_result
    from meshplan.runtime import ProcessGroups

    groups = ProcessGroups(MESH)
    group = groups.create(None)
    rank = dist.get_rank()
    out = []
    for size in sizes:  # each rank's value has its own length; some exceed the inline part
        value = (rank, "x" * (size * (rank + 1)), [rank] * rank)
        out.append(sorted(all_gather_small(value, group)))  # in the group's rank order
    out.append(broadcast_id("0123456789abcdef" if rank == 0 else None, 0, group))
    out.append(broadcast_result("ok", 0, group))
    out.append(broadcast_result("ok" if rank else "CheckpointError: disk full", 0, group))
    return out


def test_small_exchanges_agree_with_the_values_sent(pool4):
    from meshplan.checkpoint._exchange import INLINE

    sizes = [0, 10, INLINE // 4 - 20, INLINE // 2, 3 * INLINE]
    got = pool4.run(_exchange, sizes)
    want = [[(r, "x" * (s * (r + 1)), [r] * r) for r in range(4)] for s in sizes]
    want += ["0123456789abcdef", "ok", "CheckpointError: disk full"]
    assert all(g == want for g in got)

"""Reading a checkpoint's index: meshplan's ``read_metadata`` vs DCP's ``read_metadata``.

The index is a hostile one: ``2 * rows`` chunks tiling a (1, rows, rows + 1) tensor, each
row cut at its own column, so the grid of the chunks' boundaries has rows * (rows + 1)
cells and every chunk overlaps every other along dim 0 (a pairwise check is quadratic).
meshplan parses the JSON and checks that the chunks tile the tensor exactly once; DCP
unpickles the same chunk list (and checks nothing). The table shows the best of a few
rounds and meshplan's time relative to DCP's (>1: meshplan slower), with the load average.

    python benchmarks/checkpoint_index_speed.py                # 4200 and 21000 rows
    python benchmarks/checkpoint_index_speed.py --rows 1000
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
import warnings


def _meshplan_index(rows: int, directory: str) -> int:
    from meshplan.checkpoint import ChunkRecord, Metadata, TensorMeta, metadata_to_json

    chunks = []
    for i in range(rows):
        chunks.append(ChunkRecord((0, i, 0), (1, 1, i + 1), "f", f"w#{2 * i}", ""))
        chunks.append(ChunkRecord((0, i, i + 1), (1, 1, rows - i), "f", f"w#{2 * i + 1}", ""))
    meta = Metadata({"w": TensorMeta("w", (1, rows, rows + 1), "float32", chunks)})
    text = metadata_to_json(meta)
    with open(os.path.join(directory, "index.json"), "w") as f:
        f.write(text)
    return len(text)


def _dcp_index(rows: int, directory: str) -> int:
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    chunks = []
    for i in range(rows):
        chunks.append(ChunkStorageMetadata(torch.Size([0, i, 0]), torch.Size([1, 1, i + 1])))
        chunks.append(ChunkStorageMetadata(torch.Size([0, i, i + 1]), torch.Size([1, 1, rows - i])))
    item = TensorStorageMetadata(
        TensorProperties(dtype=torch.float32), torch.Size([1, rows, rows + 1]), chunks
    )
    data = pickle.dumps(Metadata({"w": item}, storage_data={}))
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        f.write(data)
    return len(data)


def _best(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[4200, 21000])
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    from torch.distributed.checkpoint import FileSystemReader

    from meshplan.checkpoint import read_dcp_metadata, read_metadata

    print(f"load average {os.getloadavg()[0]:.1f}; best of {opts.rounds}")
    print(
        f"{'chunks':>8} {'index MB':>9} {'meshplan s':>11} {'DCP s':>8} {'ratio':>6}"
        f" {'meshplan DCP-read s':>20}"
    )
    for rows in opts.rows:
        with tempfile.TemporaryDirectory() as mine, tempfile.TemporaryDirectory() as theirs:
            size = _meshplan_index(rows, mine)
            _dcp_index(rows, theirs)
            ours = _best(lambda: read_metadata(mine), opts.rounds)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peer = _best(lambda: FileSystemReader(theirs).read_metadata(), opts.rounds)
            dcp_checked = _best(lambda: read_dcp_metadata(theirs), opts.rounds)
        print(
            f"{2 * rows:>8} {size / 1e6:>9.2f} {ours:>11.3f} {peer:>8.3f} {ours / peer:>6.1f}"
            f" {dcp_checked:>20.3f}"
        )


if __name__ == "__main__":
    main()

"""The index and chunk-planning part of meshplan.checkpoint imports and works with torch blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_index_and_read_planning_need_no_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import meshplan.checkpoint as c
        from meshplan.layout import Mesh
        from meshplan.placement import Shard, Spec, StridedShard

        src = Spec(Mesh.create(2), (StridedShard(0, 2),), (8, 3))
        recs = [
            c.ChunkRecord(b.chunk.offsets, b.chunk.sizes, "f", f"x#{r}.{i}", "crc32:0")
            for r in (0, 1) if c.writes(src, r) for i, b in enumerate(c.local_boxes(src, r))
        ]
        meta = c.Metadata({"x": c.TensorMeta("x", (8, 3), "float32", recs)})
        c.check_tiles(meta["x"])
        assert c.metadata_from_json(c.metadata_to_json(meta)) == meta
        reads = c.plan_reads(meta["x"], Spec(Mesh.create(4), (Shard(0),), (8, 3)), 1)
        assert sum(r.numel() for r in reads) == 6
        try:
            c.save
        except ImportError:
            pass
        else:
            raise AssertionError("save imported without torch")
        assert not [m for m in sys.modules if m.startswith("torch") and sys.modules[m]]
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

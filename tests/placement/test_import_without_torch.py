"""The planning part of meshplan.placement imports and works with torch blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_planning_part_needs_no_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import meshplan.placement as p
        from meshplan.layout import Mesh

        mesh = Mesh.create((2, 3), ("dp", "tp"))
        spec = p.Spec.from_partition_spec(mesh, (7, 4), (("tp", "dp"),), partial=None)
        assert spec.partition_spec()[0] == ("tp", "dp")
        assert p.local_shape(spec, 2) == (1, 4) and p.global_offset(spec, 2) == (6, 0)
        assert p.local_shape(spec, 5) == (0, 4) and p.global_offset(spec, 5) == (7, 0)
        assert p.local_chunks(spec, 0)
        assert p.parse_placements(p.format_placements(spec.placements, spec.shard_order))
        assert "│" in p.visualize(spec) and str(spec)
        try:
            p.to_torch(spec)
        except ImportError:
            pass
        else:
            raise AssertionError("to_torch ran without torch")
        try:
            p.shard
        except ImportError:
            pass
        else:
            raise AssertionError("shard imported without torch")
        assert not [m for m in sys.modules if m.startswith("torch") and sys.modules[m]]
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

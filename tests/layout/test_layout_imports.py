"""meshplan.layout is pure: it imports without torch (or numpy) and never loads them."""

import subprocess
import sys
import textwrap


def test_layout_imports_without_torch():
    code = textwrap.dedent(
        """
        import sys
        for name in ("torch", "numpy"):
            sys.modules[name] = None  # any import of them now fails
        import meshplan.errors
        import meshplan.layout
        from meshplan.layout import Mesh
        mesh = Mesh.create((2, 4), ("dp", "tp")).flatten(("dp", "tp"), "world")
        assert mesh["world"].groups() == ((0, 1, 2, 3, 4, 5, 6, 7),)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")
                        and sys.modules[m] is not None)
        assert not loaded, loaded
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_blocking_torch_is_observable():
    # The check above can fail: importing torch with it blocked raises.
    code = "import sys; sys.modules['torch'] = None; import torch"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode != 0

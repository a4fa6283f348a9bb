"""The planning packages are pure: meshplan.redistribute and meshplan.strategy import, plan
and select without torch or numpy; only meshplan.runtime (the shell) needs torch."""

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_planning_imports_and_plans_without_torch_or_numpy():
    result = _run(
        """
        import sys
        for name in ("torch", "numpy"):
            sys.modules[name] = None  # any import of them now fails
        import meshplan.redistribute, meshplan.strategy, meshplan.runtime
        from meshplan.layout import Mesh
        from meshplan.placement import Partial, Replicate, Shard, Spec
        from meshplan.redistribute import plan
        mesh = Mesh.create((2, 2), ("dp", "tp"))
        src = Spec(mesh, (Shard(0), Partial()), (8, 8))
        dst = Spec(mesh, (Replicate(), Replicate()), (8, 8))
        assert plan(src, dst).steps
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")
                        and sys.modules[m] is not None)
        assert not loaded, loaded
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_shell_lives_in_runtime_not_redistribute():
    import meshplan.redistribute as R
    import meshplan.runtime as rt

    for name in ("ProcessGroups", "run", "redistribute", "calibrate", "WorkerPool", "grad_spec"):
        assert hasattr(rt, name), name
        assert name not in R.__all__, name
    assert rt.ProcessGroups.__module__ == "meshplan.runtime._groups"


def test_the_guard_can_fail():
    # touching a shell name with torch blocked must fail, or the first test proves nothing
    result = _run(
        """
        import sys
        sys.modules["torch"] = None
        import meshplan.runtime
        meshplan.runtime.run
        """
    )
    assert result.returncode != 0


def test_importing_the_planning_packages_loads_each_module_only_when_a_name_needs_it():
    # (import time: ``import meshplan.redistribute, meshplan.strategy`` loads none of the
    # planner's modules, nor the torch conversions; the first use of a name loads its own)
    result = _run(
        """
        import sys
        import meshplan.redistribute, meshplan.strategy
        def loaded(prefix):
            return sorted(m for m in sys.modules if m.startswith(prefix))
        print(loaded("meshplan.redistribute."), loaded("meshplan.placement._torch_compat"))
        from meshplan.redistribute import CostModel, exchange
        print(loaded("meshplan.redistribute._engine"), exchange.__name__)
        from meshplan.redistribute import plan
        print(bool(loaded("meshplan.redistribute._engine.")))
        """
    )
    assert result.returncode == 0, result.stderr
    first, second, third = result.stdout.splitlines()
    assert first == "[] []"
    assert second == "[] meshplan.redistribute.exchange"
    assert third == "True"

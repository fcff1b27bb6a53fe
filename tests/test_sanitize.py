"""The engine under AddressSanitizer and UndefinedBehaviorSanitizer.

tools/sanitize.sh builds libpyalloc with both sanitizers and internal check level 2
(allocator/src/check.h: the pool's invariants after every operation) and runs the stress
and state-machine tests against that build. A sanitizer report, a failed check or a
failed test fails this test, with the run's output.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _sanitizer_runtime_missing() -> str:
    if not shutil.which("cmake"):
        return "cmake is not installed"
    compiler = os.environ.get("CXX", "c++")
    if not shutil.which(compiler):
        return f"no C++ compiler ({compiler})"
    for runtime in ("libasan.so", "libubsan.so"):
        found = subprocess.run([compiler, f"-print-file-name={runtime}"], capture_output=True,
                               text=True).stdout.strip()
        if not os.path.isabs(found):
            return f"{compiler} has no {runtime}"
    return ""


@pytest.mark.slow
def test_stress_and_state_machine_under_asan_and_ubsan(tmp_path):
    missing = _sanitizer_runtime_missing()
    if missing:
        pytest.skip(f"sanitizer build unavailable: {missing}")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(ROOT / "tools" / "sanitize.sh"), str(tmp_path / "build")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (
        f"sanitize.sh failed ({proc.returncode}):\n--- stdout\n{proc.stdout[-8000:]}"
        f"\n--- stderr\n{proc.stderr[-8000:]}")
    assert " passed" in proc.stdout

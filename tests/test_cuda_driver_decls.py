"""cuda_driver.h's declarations of the driver API, and the check that guards them.

The CUDA backend takes the driver's types and prototypes from allocator/src/cuda_driver.h
rather than from a toolkit's cuda.h (Note [Declaring the driver API ourselves]), and
allocator/src/cuda_driver_check.cpp compares the two; this test compiles it wherever a toolkit
is found (it is no part of the library's build). Here: the
backend compiles with no toolkit on the include path, the check passes against the toolkit on
this machine, and the check fails, naming what differs, on declarations made wrong on purpose,
so that it cannot pass by checking nothing. Skipped where no C++ compiler or no cuda.h is found.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "allocator" / "src"
COMPILER = os.environ.get("CXX", "c++")


def _toolkit_include() -> str:
    """A toolkit's include folder holding cuda.h, or ''."""
    candidates = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH")
                  if os.environ.get(v)]
    candidates += ["/usr/local/cuda/include", "/opt/cuda/include"]
    candidates += [os.path.join(d, "include")
                   for d in sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    return next((d for d in candidates if os.path.isfile(os.path.join(d, "cuda.h"))), "")


def _syntax_check(source: Path, *include_dirs: Path | str) -> subprocess.CompletedProcess:
    command = [COMPILER, "-std=c++17", "-fsyntax-only"]
    command += [f"-I{d}" for d in include_dirs] + [str(source)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


needs_compiler = pytest.mark.skipif(shutil.which(COMPILER) is None,
                                    reason=f"no C++ compiler ({COMPILER})")


@needs_compiler
def test_the_backend_compiles_without_a_toolkit():
    result = _syntax_check(SRC / "cuda_backend.cpp", SRC)
    assert result.returncode == 0, result.stderr


@needs_compiler
@pytest.mark.parametrize("mistake, named", [
    # (a change to the header, what the failed check must name)
    (("std::size_t size, std::size_t offset,", "std::size_t size, int offset,"), "cuMemMap"),
    (("CUDA_ERROR_NOT_READY = 600", "CUDA_ERROR_NOT_READY = 601"), "CUDA_ERROR_NOT_READY"),
    (("void* win32HandleMetaData;", "int win32HandleMetaData;"), "CUmemAllocationProp"),
    (("const char** name", "char** name"), "cuGetErrorName"),
    (("CU_MEMHOSTALLOC_PORTABLE = 0x01", "CU_MEMHOSTALLOC_PORTABLE = 0x02"),
     "CU_MEMHOSTALLOC_PORTABLE"),
    (("CUresult cuEventQuery(CUevent event);", "CUresult cuEventQuery(CUstream event, int);"),
     "cuEventQuery"),
])
def test_the_check_matches_cuda_h_and_names_each_difference(tmp_path, mistake, named):
    include = _toolkit_include()
    if not include:
        pytest.skip("no CUDA toolkit's cuda.h on this machine to check against")
    check = SRC / "cuda_driver_check.cpp"
    # The declarations as they are: the check passes.
    result = _syntax_check(check, SRC, include)
    assert result.returncode == 0, result.stderr
    # A copy with one mistake, beside a copy of the check (a quoted include looks in the
    # including file's folder first): the check fails and names it.
    header = (SRC / "cuda_driver.h").read_text()
    old, new = mistake
    assert header.count(old) == 1, f"the test's pattern {old!r} no longer matches cuda_driver.h"
    (tmp_path / "cuda_driver.h").write_text(header.replace(old, new))
    shutil.copy(check, tmp_path / check.name)
    result = _syntax_check(tmp_path / check.name, include)
    assert result.returncode != 0, f"the check let a wrong {named} through"
    assert f"{named}:" in result.stderr, result.stderr[-2000:]

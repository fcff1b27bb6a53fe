"""Shared test configuration.

* ``gpu`` tests need CUDA and are skipped cleanly without it.
* ``--stress-ops N`` sets how many operations the native stress test runs (default: a
  fast run; pass 1000000 or more for the long run the issue asks for).
* ``install()`` is one-way per process, so tests that install pyalloc into PyTorch run
  a program of tests/programs/ in a fresh interpreter (``run_program``, ``run_unit``,
  ``train``).
* Intra-op parallelism is one thread (``OMP_NUM_THREADS=1`` unless the environment sets
  it), here and in every program the tests run: many tests compare a policy's training with
  plain PyTorch's bit for bit, across processes, and PyTorch's CPU kernels with two or more
  OpenMP threads do not repeat their own bits under load (plain PyTorch gave another result
  in about one process in fifteen on a two-core VM; docs/design.md, "The first sgemm after a
  parallel region"). With one thread they do, so a difference is pyalloc's.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Before torch reads it (the pytest process imports torch later, the programs inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress-ops", type=int, default=200_000,
                     help="operations for the multi-threaded stress test (>= 1000000 for the long run)")


def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def stress_ops(request: pytest.FixtureRequest) -> int:
    return request.config.getoption("--stress-ops")


PROGRAMS = Path(__file__).resolve().parent / "programs"

# The programs the tests run in a fresh interpreter (see run_program) are not tests.
collect_ignore = ["programs"]


def run_python(*args, timeout: float = 600, env: dict | None = None) -> str:
    """Runs ``python ARGS`` in a fresh interpreter (PYALLOC_CONF and PYTHONOPTIMIZE unset
    unless ``env`` sets them); returns its stdout, failing the test with its stdout and
    stderr on error."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.pop("PYALLOC_CONF", None)
    full_env.pop("PYTHONOPTIMIZE", None)   # the programs check with assert
    if env:
        full_env.update(env)
    command = [sys.executable, *map(str, args)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=str(Path(__file__).resolve().parent))
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(command[1:])} failed ({proc.returncode}):\n"
                    f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc.stdout


def run_program(name: str, *args, timeout: float = 600, env: dict | None = None) -> str:
    """Runs ``tests/programs/<name>.py ARGS`` in a fresh interpreter (see run_python)."""
    path = PROGRAMS / f"{name}.py"
    assert path.is_file(), f"no program {path}"
    return run_python(path, *args, timeout=timeout, env=env)


def run_unit(program: str, check: str, env: dict | None = None) -> None:
    """Runs the check named ``check`` of the unit-check program ``program``
    (tests/programs/unit_harness.py), which must reach its end; ``env`` as run_python's."""
    assert run_program(program, check, env=env).strip().endswith("ok")


TRAIN_BATCH = {"mlp": 4096, "cnn": 64, "transformer": 32}


@functools.lru_cache(maxsize=None)
def _train(args: tuple, env: tuple) -> str:
    return run_program("train", *args, env=dict(env))


def train(task: str, budget, steps: int = 20, batch: int | None = None, device: str = "cpu",
          flags: tuple = (), env: dict | None = None, optimizer: str = "sgd",
          **options) -> dict:
    """Trains ``task`` in a fresh process (tests/programs/train.py; ``flags`` are its
    further flags, ``options`` install()'s); returns ``{"record": lines that must match bit
    for bit, "peak": peak reserved bytes, "output": everything printed, **registry
    counters}``. Identical calls are run once per test session (the unconstrained reference
    runs are shared)."""
    if batch is None:
        from pyalloc.bench.models import TASKS

        batch = TRAIN_BATCH.get(task) or TASKS[task].default_batch
    args = ("--task", task, "--budget", str(budget), "--steps", str(steps), "--batch",
            str(batch), "--device", device, "--optimizer", optimizer,
            "--options", json.dumps(options, sort_keys=True), *flags)
    out = _train(args, tuple(sorted((env or {}).items())))
    lines = out.splitlines()
    return {"record": training_record(out), "peak": int(lines[-2].split()[1]), "output": out,
            **json.loads(lines[-1])}


def printed(run: dict, name: str) -> int:
    """The integer a training program printed on its line ``name N`` (``run`` as train's)."""
    return next(int(line.split()[1]) for line in run["output"].splitlines()
                if line.startswith(name + " "))


def training_record(output: str) -> list:
    """The lines of a training program's output that must match bit for bit."""
    return [line for line in output.splitlines() if line.startswith(("loss", "params"))]


@pytest.fixture
def make_engine():
    """Creates isolated simulated-device engines; at teardown each must still satisfy its
    invariants and close cleanly, so a test that leaks a block fails."""
    from pyalloc import Engine

    engines = []

    def make(budget="64MiB", sim_capacity="256MiB", **options):
        engine = Engine("host", budget=budget, sim_capacity=sim_capacity, **options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        if engine._handle is None:
            continue
        engine.synchronize()
        engine.check_invariants()
        engine.empty_cache()  # completes frees that waited on other streams
        engine.close()

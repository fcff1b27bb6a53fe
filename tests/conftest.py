"""Shared test configuration.

* ``gpu`` tests need CUDA and are skipped cleanly without it.
* ``--stress-ops N`` sets how many operations the native stress test runs (default: a
  fast run; pass 1000000 or more for the long run the issue asks for).
* ``install()`` is one-way per process, so tests that install pyalloc into PyTorch run
  their body in a fresh interpreter (``run_in_subprocess``).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


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


# Appended to a training script run in a subprocess (which names its model `model`): a
# digest of every parameter, so two runs can be compared bit for bit.
PARAM_DIGEST = """
import hashlib as _hashlib
_h = _hashlib.sha256()
for _p in model.parameters():
    _h.update(_p.detach().cpu().numpy().tobytes())
print("params", _h.hexdigest())
"""


# The same for everything training changes: parameters, buffers (BatchNorm's running
# statistics) and the optimizer's state (named `opt`), on any device.
STATE_DIGEST = """
import hashlib as _hashlib
_h = _hashlib.sha256()
for _t in list(model.state_dict().values()) + [
        _v for _s in opt.state_dict()["state"].values() for _v in _s.values()
        if isinstance(_v, torch.Tensor)]:
    _h.update(_t.detach().cpu().contiguous().numpy().tobytes())
print("params", _h.hexdigest())
"""


# A training run of one of pyalloc.bench.models' tasks in a fresh process: install with the
# given options, run `setup`, train with `optimizer` (SGD with momentum unless the caller
# names another), run `report`, print the losses,
# the state digest, the peak reserved bytes, and the registry's counters ("remat.*",
# without the prefix) with num_ooms.
TRAIN = """
import json, torch, pyalloc
pyalloc.install(device={device!r}, budget={budget!r}, **{options!r})
from pyalloc.bench.models import TASKS
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
{setup}
task = TASKS[{task!r}]
model = task.build().to({device!r})
opt = {optimizer}
x, y = task.batch({batch}, torch.Generator().manual_seed(1))
x, y = x.to({device!r}), y.to({device!r})
for step in range({steps}):
    opt.zero_grad(set_to_none=True)
    loss = task.loss(model, x, y)
    loss.backward()
    opt.step()
    print("loss", loss.item().hex())
{digest}
{report}
pyalloc.check_invariants()
s = pyalloc.memory_stats()
print("peak_reserved", s["reserved_bytes.all.peak"])
print(json.dumps({{"num_ooms": s["num_ooms"],
                  **{{k[6:]: v for k, v in s.items() if k.startswith("remat.")}}}}))
"""

TRAIN_BATCH = {"mlp": 4096, "cnn": 64, "transformer": 32}


@functools.lru_cache(maxsize=None)
def _train(task: str, budget, steps: int, batch: int, device: str, options: tuple, setup: str,
           report: str, env: tuple, optimizer: str) -> str:
    return run_in_subprocess(TRAIN.format(task=task, budget=budget, options=dict(options),
                                          steps=steps, batch=batch, device=device, setup=setup,
                                          report=report, digest=STATE_DIGEST,
                                          optimizer=optimizer), env=dict(env))


SGD = "torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)"


def train(task: str, budget, steps: int = 20, batch: int | None = None, device: str = "cpu",
          setup: str = "", report: str = "", env: dict | None = None, optimizer: str = SGD,
          **options) -> dict:
    """Trains ``task`` in a subprocess (see TRAIN); returns ``{"record": lines that must match
    bit for bit, "peak": peak reserved bytes, "output": everything printed, **registry
    counters}``. Identical calls are run once per test session (the unconstrained reference
    runs are shared)."""
    if batch is None:
        from pyalloc.bench.models import TASKS

        batch = TRAIN_BATCH.get(task) or TASKS[task].default_batch
    out = _train(task, budget, steps, batch, device,
                 tuple(sorted(options.items())), setup, report,
                 tuple(sorted((env or {}).items())), optimizer)
    lines = out.splitlines()
    return {"record": training_record(out), "peak": int(lines[-2].split()[1]), "output": out,
            **json.loads(lines[-1])}


def training_record(output: str) -> list:
    """The lines of a training script's output that must match bit for bit."""
    return [line for line in output.splitlines() if line.startswith(("loss", "params"))]


def run_in_subprocess(code: str, timeout: float = 600, env: dict | None = None) -> str:
    """Runs ``code`` in a fresh Python; returns its stdout, failing the test on error."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.pop("PYALLOC_CONF", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=full_env,
        cwd=str(Path(__file__).resolve().parent),
    )
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc.stdout


# A unit test of PyTorch under pyalloc on the simulated device, in a fresh process: the
# body runs after install() with these names defined, and must reach the end.
UNIT = """
import pytest, torch, pyalloc
from pyalloc.errors import SwapCopyError
pyalloc.install(device="cpu", budget="2GiB")
torch.manual_seed(0)
engine = pyalloc._engine(None)
{body}
print("ok")
"""


def run_unit(body: str) -> None:
    assert run_in_subprocess(UNIT.format(body=textwrap.dedent(body))).strip().endswith("ok")


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

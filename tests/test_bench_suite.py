"""The head-to-head benchmark suite (pyalloc.bench.suite, tools/bench_suite.py,
``pyalloc-bench``): a real, small run on the simulated device, its files and figures, the
batch search, and the errors for arguments it cannot honour."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyalloc.bench import suite as bench_suite

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One task, stock and recompute, --quick, a small batch: two worker processes."""
    out = tmp_path_factory.mktemp("suite")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYALLOC_CONF", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_suite.py"), "--quick", "--tasks", "cnn",
         "--configs", "stock", "recompute", "--batch", "16", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.mark.slow
def test_quick_run_writes_json_markdown_and_plot_with_real_figures(quick_run):
    out, proc = quick_run
    data = json.loads((out / "bench_suite.json").read_text())
    assert data["meta"]["command"].startswith("python tools/bench_suite.py --quick")
    rows = {r["config"]: r for r in data["results"]}
    assert list(rows) == ["stock", "recompute"]
    for config, r in rows.items():
        assert "error" not in r, r
        assert r["budget"] == rows["stock"]["budget"] > 0   # one budget: stock's peak
        assert r["max_batch"] >= 1
        for trial in (r["at_max"], r["at_default"]):
            assert trial["samples_per_s"] > 0 and trial["step_s"] > 0
            assert 0 < trial["peak_reserved"] <= r["budget"]
            assert 0 < trial["utilization"] <= 1
    # Evicting and recomputing trains a larger batch in the same memory.
    assert rows["recompute"]["max_batch"] >= rows["stock"]["max_batch"]
    assert rows["recompute"]["at_max"]["recomputes_per_step"] > 0
    ratios = {q["config"]: q for q in data["ratios"]}
    assert ratios["stock"]["max_batch_x"] == 1.0
    assert ratios["recompute"]["max_batch_x"] == (rows["recompute"]["max_batch"]
                                                  / rows["stock"]["max_batch"])
    md = (out / "bench_suite.md").read_text()
    assert "| cnn | stock |" in md and "| cnn | recompute |" in md and "PyTorch" in md
    assert (out / "bench_suite.png").stat().st_size > 10_000
    assert not (out / "bench_suite.partial.json").exists()
    assert "| cnn | recompute |" in proc.stdout   # the table is printed too


@pytest.mark.parametrize("argv,message", [
    (["--tasks", "resnet"], "unknown task(s): resnet"),
    (["--configs", "stock", "defrag"], "unknown configuration(s): defrag"),
    (["--configs", "expandable"], "expandable: a setting of PyTorch's CUDA caching allocator"),
    (["--steps", "1"], "--steps must be at least 2"),
])
def test_bad_arguments_are_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_suite.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cuda_on_a_machine_without_a_gpu_is_a_clear_error(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        bench_suite.main(["--device", "cuda"])
    assert "PyTorch sees no CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("threshold,start,limit,expected", [
    (37, 8, 64, 37),     # doubling passes 32, fails 64: bisection finds 37 exactly
    (100, 8, 64, 64),    # the cap itself trains: the search stops there
    (5, 8, 64, 5),       # the start fails: bisection below it
    (0, 8, 64, 0),       # nothing trains
    (50, 8, 40, 40),     # a cap that is not a power of two times the start
])
def test_largest_batch(threshold, start, limit, expected):
    tried = []

    def trains(batch):
        tried.append(batch)
        return batch <= threshold

    assert bench_suite.largest_batch(trains, start, limit, lambda good: 1) == expected
    assert len(tried) == len(set(tried))   # no batch is tried twice


def test_largest_batch_stops_at_the_resolution():
    tried = []
    found = bench_suite.largest_batch(lambda b: tried.append(b) or b <= 37, 8, 64,
                                      lambda good: 8)
    assert 37 - 8 < found <= 37
    assert tried == [8, 16, 32, 64, 48, 40]   # 32..64, 32..48, 32..40: a gap of 8, done


def test_a_largest_batch_that_does_not_train_again_is_searched_below():
    # Batches up to 48 train every time; 56 trains once and then never again.
    tries = []

    def trains(n):
        tries.append(n)
        return n <= 48 or n == 56

    def again(n):
        tries.append(("again", n))
        return n <= 48

    best = bench_suite.repeated_largest_batch(trains, again, 16, 128, lambda good: 2)
    assert best == 48
    # The search found 56; its repeat failed, so the search went on below it, reusing what
    # it knew (48 trained: tried once by the search, then once by its own repeat).
    assert tries.count(56) == 1 and tries.index(("again", 56)) < tries.index(("again", 48))
    assert tries.count(48) == 1 and 55 in tries


def test_a_repeat_that_fails_at_the_smallest_batch_gives_zero():
    assert bench_suite.repeated_largest_batch(lambda n: n == 1, lambda n: False, 1, 8,
                                              lambda good: 1) == 0

"""The rematerialization benchmark's floor (pyalloc.bench.remat, tools/bench_remat.py): the budget below which no eviction strategy can train.

BENCHMARKS.md uses the floor to say how much of the gap between the strategies is left
for victim choice to win, so it must be a true lower bound (every strategy fails below it)
and not a vacuous one (the best strategy trains not far above it).
"""
from __future__ import annotations

import json

import pytest

from conftest import run_program, run_python


def _worker(config: str, budgets=()) -> dict:
    # The floor search trains the MLP many times: minutes on two cores, more when loaded.
    out = run_program("bench_remat_worker", "--config", config, "--budgets", *budgets,
                      timeout=1800)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_no_strategy_trains_below_the_floor_and_the_best_trains_near_it():
    floor = _worker("floor")
    assert floor["op"].startswith("aten.") and 0 < floor["droppable"] < floor["allocated"]
    # Not vacuous: recomputing frees most of what the unconstrained run holds at its peak.
    assert floor["bytes"] < 0.5 * floor["peak_reserved"], floor
    below, near = floor["bytes"] - (1 << 20), int(floor["bytes"] * 1.5)
    for strategy in ("dtr", "dte", "window"):
        trained = _worker(strategy, [below, near])
        assert not trained[str(below)], (strategy, floor)
        assert trained[str(near)], (strategy, floor)


@pytest.mark.slow
def test_skip_leaves_out_the_searches_and_keeps_the_step_times(tmp_path):
    """--skip, for a short GPU lease: no min-budget or max-batch search and no per-op
    figure, but the step times at 0.9 and 0.5 of the peak are still measured."""
    run_python("-m", "pyalloc.bench.remat", "--tasks", "mlp_small", "--configs", "baseline",
               "window", "--steps", "3", "--skip", "min-budget", "max-batch", "overhead",
               "--out", tmp_path)

    results = {r["config"]: r for r in json.loads((tmp_path / "bench_remat.json").read_text())["results"]}
    window = results["window"]
    assert "min_budget" not in window and "max_batch" not in window and window["overhead"] is None
    assert window["at_0.9"]["step_s"] > 0
    table = (tmp_path / "bench_remat.md").read_text()
    assert "| mlp_small | window | — | " in table


def test_an_unknown_task_is_refused_before_any_run(capsys):
    """A misspelt task name used to pass until its turn came, then end the run with a
    KeyError: the figures of the tasks before it, minutes or hours of trials, were lost."""
    from pyalloc.bench import remat

    with pytest.raises(SystemExit) as exit_info:
        remat.main(["--tasks", "cnn", "zoo_transformer", "--configs", "window"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown task(s): zoo_transformer" in err and "zoo_vit" in err

"""One worker of the rematerialization benchmark (pyalloc.bench.remat.Worker) on the MLP.

tests/test_bench_remat.py runs it as::

    python tests/programs/bench_remat_worker.py --config floor
    python tests/programs/bench_remat_worker.py --config dtr --budgets 1000000 2000000

With ``--config floor`` it prints, as JSON, the floor the worker measures below 2 GiB
(the budget below which no strategy can train); with a strategy's configuration, a JSON
object of whether a 3-step trial at batch 1024 trained under each budget.
"""
from __future__ import annotations

import argparse
import json

from pyalloc.bench.remat import Worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help='"floor" or a configuration name')
    parser.add_argument("--budgets", type=int, nargs="*", default=[],
                        help="budgets in bytes to try a configuration at")
    args = parser.parse_args()
    w = Worker("mlp", args.config, "cpu", 1024)
    if args.config == "floor":
        print(json.dumps(w.floor(2 << 30)))
    else:
        print(json.dumps({str(b): w.trial(b, 1024, 3) is not None for b in args.budgets}))


if __name__ == "__main__":
    main()

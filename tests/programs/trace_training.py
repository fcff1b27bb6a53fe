"""A trace of training on the simulated device, with stacks, replays to the live run's peak.

tests/test_trace_replay.py runs it as ``python tests/programs/trace_training.py --trace
PATH.json``. It trains a small CNN three steps while recording the trace with stacks,
replays it, and checks that the peaks agree, that no free was skipped, and that the op
contexts name the ops and this program's own frames (``trace_training.py:<line>``).
Prints ``peak <bytes> events <n> tagged <events with a context>``.

The trace takes every frame under the directory that holds the pyalloc package for
library code, which with an editable install is the checkout: the test runs a copy of this
file from outside it.
"""
from __future__ import annotations

import argparse
import os

import torch
from torch import nn

import pyalloc
from pyalloc.replay import replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="where to record the trace")
    args = parser.parse_args()
    pyalloc.install(device="cpu", budget="512MiB")
    with pyalloc.record_trace(args.trace, stacks=True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                              nn.Linear(16 * 16 * 16, 10))
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            x = torch.randn(32, 3, 16, 16)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    trace = pyalloc.files.load(args.trace)
    live = trace["final"]["stats"]
    r = replay(trace)
    assert r.peak_reserved == live["reserved_bytes.all.peak"], (r, live)
    assert r.skipped_frees == 0
    ops = [c for c in trace["contexts"] if "@" in c]
    assert any(c.startswith("addmm") or c.startswith("mm") for c in ops), ops[:20]
    here = os.path.basename(__file__) + ":"
    assert any(here in c for c in ops), ops[:20]   # the user's frame is named
    tagged = sum(1 for ev in trace["events"] if ev[6] != 0)
    print("peak", r.peak_reserved, "events", len(trace["events"]), "tagged", tagged)


if __name__ == "__main__":
    main()

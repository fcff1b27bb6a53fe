"""A trace of training on a GPU replays to the peak the live run reserved.

tests/test_gpu.py runs it as ``python tests/programs/gpu_trace_replay.py --trace
PATH.json.gz`` (needs a GPU): it trains an MLP five steps while recording the trace to
PATH, replays it, and prints ``ok <peak reserved>`` when the peaks agree.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

import pyalloc
from pyalloc.replay import replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="where to record the trace")
    args = parser.parse_args()
    pyalloc.install(device="cuda", budget="4GiB")
    with pyalloc.record_trace(args.trace):
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(5):
            x = torch.randn(256, 1024, device="cuda")
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        torch.cuda.synchronize()
    trace = pyalloc.files.load(args.trace)
    r = replay(trace)
    live = trace["final"]["stats"]
    assert r.peak_reserved == live["reserved_bytes.all.peak"], (
        r.peak_reserved, live["reserved_bytes.all.peak"])
    print("ok", r.peak_reserved)


if __name__ == "__main__":
    main()

"""install() marks the model's construction, optimizer steps and long_lived() blocks long-lived.

tests/test_lifetime.py runs it as ``python tests/programs/lifetime_phases.py --trace
PATH.json.gz``. After install() (simulated device) it builds a small model and trains it
with SGD with momentum, checking the lifetime phase in forward, backward, the step and
after it, while recording one step's trace to PATH (the phase changes are traced); that
parameters and momentum sit in long-lived segments; that ``pyalloc.long_lived()`` nests;
and that a step that raised leaves the phase long-lived only until the next step ends.
Prints ``ok`` at the end.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict

import pytest
import torch

import pyalloc
from pyalloc import files, lifetime


def segment_of(engine: pyalloc.Engine, ptr: int) -> Dict[str, Any]:
    """The segment of the block that starts at ``ptr``."""
    for segment in engine.snapshot()["segments"]:
        if any(block["address"] == ptr for block in segment["blocks"]):
            return segment
    raise AssertionError(f"no block starts at 0x{ptr:x}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="where to record one step's trace")
    trace_path = parser.parse_args().trace
    pyalloc.install(device="cpu", budget="2GiB")
    torch.manual_seed(0)
    engine = pyalloc._engine(None)
    assert lifetime.is_long_lived(), "the model is built after install()"
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    opt.register_step_pre_hook(lambda *args: seen.append(lifetime.is_long_lived()))
    x = torch.randn(32, 64)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        assert not lifetime.is_long_lived(), "forward is short-lived"
        loss.backward()
        assert not lifetime.is_long_lived(), "backward is short-lived"
        opt.step()
        assert not lifetime.is_long_lived(), "the phase after a step is short-lived"

    step()
    with pyalloc.record_trace(trace_path):
        step()
    assert seen == [True, True]

    # Parameters (made while the model was built) and momentum (made in the first step) are
    # in long-lived segments.
    for p in model.parameters():
        assert segment_of(engine, p.data_ptr())["long_lived"]
        assert segment_of(engine, opt.state[p]["momentum_buffer"].data_ptr())["long_lived"]

    trace = files.load(trace_path)
    action, size = trace["columns"].index("action"), trace["columns"].index("size")
    assert [e[size] for e in trace["events"] if e[action] == "lifetime"] == [0, 1, 0]

    with pyalloc.long_lived():
        assert lifetime.is_long_lived()
        with pyalloc.long_lived():
            pass
        assert lifetime.is_long_lived(), "an inner block leaves the outer one long-lived"
        opt.step()
        assert lifetime.is_long_lived(), "a step inside the block leaves it long-lived"
    assert not lifetime.is_long_lived()

    # A step that raised (here: a hook of its own, before pyalloc's) leaves the phase
    # long-lived until the next step ends, not for good.
    def failing(optimizer, args, kwargs):
        raise RuntimeError("boom")

    handle = opt.register_step_post_hook(failing)
    with pytest.raises(RuntimeError, match="boom"):
        opt.step()
    assert lifetime.is_long_lived()
    handle.remove()
    opt.step()
    assert not lifetime.is_long_lived()
    print("ok")


if __name__ == "__main__":
    main()

"""pyalloc.on_oom and PyTorch's out-of-memory observer route on the simulated device.

Run by tests/test_oom_callbacks.py in a fresh interpreter (install() is once a process):
    python tests/programs/oom_callbacks.py
Prints one JSON object of what it saw; the test asserts on it.
"""
import json
import logging

import torch

import pyalloc
from pyalloc import torch_compat

MiB = 1 << 20
events = []
first = pyalloc.on_oom(lambda r: events.append(("first", r)))  # before install()
pyalloc.install(device="cpu", budget="64MiB")
second = pyalloc.on_oom(lambda r: events.append(("second", r["size"])))


def failing(report):
    events.append(("failing", report["size"]))
    raise ValueError("a callback that fails")


third = pyalloc.on_oom(failing)
logging.disable(logging.CRITICAL)  # the failing callback's log line is expected

held = torch.empty(40 * MiB, dtype=torch.uint8)
stats_before = pyalloc.memory_stats()
try:
    torch.empty(30 * MiB, dtype=torch.uint8)
    raised = False
except torch.OutOfMemoryError as error:
    raised = True
    events.append(("raised", str(error)[:40]))
report = events[0][1]

# Removing: the first goes, the others stay; a second remove() does nothing.
first.remove()
first.remove()
third.remove()
events_after_remove = []
with pyalloc.on_oom(lambda r: events_after_remove.append(r["size"])):
    try:
        torch.empty(50 * MiB, dtype=torch.uint8)
    except torch.OutOfMemoryError:
        pass
try:
    torch.empty(51 * MiB, dtype=torch.uint8)  # the with-block's callback is gone
except torch.OutOfMemoryError:
    pass
second.remove()

# PyTorch's observer signature, routed (what install(device="cuda") patches in).
observed = []
handle = torch_compat._attach_out_of_memory_observer(
    lambda device, alloc, device_alloc, device_free: observed.append(
        [device, alloc, device_alloc, device_free]))
try:
    torch.empty(60 * MiB, dtype=torch.uint8)
except torch.OutOfMemoryError:
    pass
try:
    pyalloc.on_oom("not callable")
    refused = ""
except TypeError as error:
    refused = str(error)

print(json.dumps({
    "raised": raised,
    "order": [name for name, _ in events],
    "report": report,
    "allocated_before": stats_before["allocated_bytes.all.current"],
    "events_after_remove": events_after_remove,
    "second_sizes": [v for name, v in events if name == "second"],
    "observed": observed,
    "refused": refused,
}))

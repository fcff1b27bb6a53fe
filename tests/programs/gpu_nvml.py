"""NVML's device-wide view on a real GPU: in the OOM report and in pyalloc-stats watch.

    python tests/programs/gpu_nvml.py STATS_FILE
Needs a GPU and nvidia-ml-py (the `gpu` extra). Prints the watch row, the report's NVML
part as JSON, and ``ok``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyalloc

path = Path(sys.argv[1])
pyalloc.install(device="cuda", budget="1GiB", stats_file=str(path), stats_interval=0.2)

import torch  # noqa: E402

reports = []
pyalloc.on_oom(reports.append)
held = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
try:
    torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    pass
assert len(reports) == 1, reports
seen = reports[0]["nvml"]
assert isinstance(seen, dict), f"no NVML view in the OOM report: {seen}"
assert seen["total"] > seen["used"] >= 256 << 20 and seen["free"] > 0, seen
assert seen["name"].startswith("NVIDIA"), seen

from pyalloc.stats_cli.watch import frame_sections  # noqa: E402

time.sleep(1.0)   # the publisher writes every 0.2 s
doc = json.loads(path.read_text())
rows = dict(frame_sections(doc, path, [0], True, 0.0, 0.2)[0].rows)
assert rows["device (NVML)"].startswith("NVIDIA"), rows
print(rows["device (NVML)"])
print(json.dumps(seen))
print("ok")

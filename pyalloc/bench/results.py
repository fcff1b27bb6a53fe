"""Writing a benchmark's results: ``<name>.json`` (for machines) and ``<name>.md`` (for
people, also printed), with the device, date, PyTorch version, duration and exact command.

In the package (not only beside the scripts in ``tools/``) so that the console script
``pyalloc-bench`` can use it from an installed wheel.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional


def sim_device_name() -> str:
    """What the simulated device runs on: its copies and kernels are this machine's CPU."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:   # not Linux: the core count still says something
        pass
    return f"simulated device (host memory{': ' + model if model else ''}), {os.cpu_count()} cores"


def write_results(out: str, name: str, device: str, started: float,
                  argv: Optional[List[str]], payload: Dict[str, Any], table: str,
                  program: Optional[str] = None) -> Dict[str, Any]:
    """Writes ``out/<name>.json`` and ``out/<name>.md`` and prints the latter; returns the
    metadata. ``program`` is how the command line starts (default ``python tools/<name>.py``)."""
    import torch

    program = program or f"python tools/{name}.py"
    meta = {"device": device, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "seconds": round(time.time() - started),
            "command": " ".join([program, *(sys.argv[1:] if argv is None else argv)])}
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps({"meta": meta, **payload}, indent=1))
    text = (f"{device}, PyTorch {meta['torch']}, {meta['date']}, {meta['seconds']} s. "
            f"Command: `{meta['command']}`.\n\n{table}\n")
    (directory / f"{name}.md").write_text(text)
    print(text)
    return meta

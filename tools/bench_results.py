"""Writing a benchmark's results: ``<name>.json`` (for machines) and ``<name>.md`` (for
people, also printed), with the device, date, PyTorch version, duration and exact command."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional


def write_results(out: str, name: str, device: str, started: float,
                  argv: Optional[List[str]], payload: Dict[str, Any], table: str) -> None:
    import torch

    meta = {"device": device, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "seconds": round(time.time() - started),
            "command": f"python tools/{name}.py " + " ".join(sys.argv[1:] if argv is None
                                                           else argv)}
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps({"meta": meta, **payload}, indent=1))
    text = (f"{device}, PyTorch {meta['torch']}, {meta['date']}, {meta['seconds']} s. "
            f"Command: `{meta['command']}`.\n\n{table}\n")
    (directory / f"{name}.md").write_text(text)
    print(text)

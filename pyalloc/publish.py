"""Publishing stats to a file for ``pyalloc-stats watch``.

A daemon thread writes ``{"format": "pyalloc-stats", ...}`` atomically every ``interval``
seconds and once more at exit. ``path="auto"`` (or ``PYALLOC_STATS_FILE=auto``) uses
``<tempdir>/pyalloc-stats-<pid>.json``, which ``pyalloc-stats watch PID`` finds.
"""
from __future__ import annotations

import atexit
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Optional

from . import files, state
from .memory import memory_stats

log = logging.getLogger("pyalloc")


def default_path(pid: Optional[int] = None) -> Path:
    return Path(tempfile.gettempdir()) / f"pyalloc-stats-{pid or os.getpid()}.json"


class StatsPublisher:
    def __init__(self, path: str, interval: float = 1.0) -> None:
        if interval <= 0:
            raise ValueError(f"stats interval must be positive, got {interval}")
        self.path = default_path() if path in ("auto", "1", "true") else Path(path)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyalloc-stats", daemon=True)

    def start(self) -> "StatsPublisher":
        self.publish()  # fail now, in install(), if the path is unwritable
        self._thread.start()
        atexit.register(self.stop)
        return self

    def publish(self) -> None:
        doc = {"format": "pyalloc-stats", "version": files.VERSION, "time": files.now_iso(),
               "pid": os.getpid(), "device": state.installed_device(), "stats": memory_stats(0)}
        files.save(self.path, doc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except Exception as e:  # a full disk must not kill training
                log.warning("pyalloc: could not publish stats to %s: %s", self.path, e)

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            try:
                self.publish()
            except Exception:
                pass

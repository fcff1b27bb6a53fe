"""Building the torch-built library (pyalloc/_torch_shim.py): once per cache folder, and
never stuck behind a build that was killed half way."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyalloc import _torch_shim


@pytest.fixture
def fake_cpp_extension(monkeypatch):
    """cpp_extension.load replaced by a stand-in that records its calls and writes the
    library file a real build would."""
    from torch.utils import cpp_extension

    calls = []

    def load(name, build_directory, **kwargs):
        calls.append({"lock_was_there": (Path(build_directory) / "lock").exists()})
        (Path(build_directory) / f"{name}.so").write_bytes(b"built")

    monkeypatch.setattr(cpp_extension, "load", load)
    return calls


def test_a_lock_left_by_a_killed_build_is_cleared_and_the_build_runs(tmp_path,
                                                                      fake_cpp_extension):
    # What a SIGKILL during cpp_extension.load leaves: its lock file, no finished build.
    # torch's own wait on that file never ends; pyalloc's flock says no build is running.
    (tmp_path / "lock").write_text("")
    built = _torch_shim._build(_torch_shim._source_root(), tmp_path, "lib")
    assert built == tmp_path / "lib.so" and built.read_bytes() == b"built"
    assert fake_cpp_extension == [{"lock_was_there": False}]


def test_a_finished_build_is_loaded_without_asking_cpp_extension_again(tmp_path,
                                                                       fake_cpp_extension):
    # cpp_extension bumps the library's version and rebuilds when the include paths
    # differ, which they do between the installed copy and a checkout of the same sources.
    root = _torch_shim._source_root()
    _torch_shim._build(root, tmp_path, "lib")
    _torch_shim._build(root, tmp_path, "lib")
    assert len(fake_cpp_extension) == 1


def test_a_build_that_failed_is_tried_again(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    def broken(**kwargs):
        raise RuntimeError("compiler error")

    monkeypatch.setattr(cpp_extension, "load", broken)
    with pytest.raises(RuntimeError, match="compiler error"):
        _torch_shim._build(_torch_shim._source_root(), tmp_path, "lib")
    assert not (tmp_path / "lib.finished").exists()

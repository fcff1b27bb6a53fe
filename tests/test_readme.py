"""The README's promises that a script can check: CI runs its test command; docs list every option."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import pyalloc

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


@pytest.mark.skipif(not (ROOT / "README.md").is_file(), reason="run from a source checkout")
def test_ci_runs_exactly_the_readme_test_command():
    demo, tests = _readme_commands()[:2]
    assert "pyalloc-demo" in demo
    assert "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="run from a source checkout")
def test_design_doc_carries_the_options_table_as_generated():
    from pyalloc.options import markdown_table

    design = (ROOT / "docs" / "design.md").read_text()
    assert markdown_table() in design, (
        "docs/design.md's options table is not the table in allocator/src/options.h: run "
        "python tools/options_table.py --write docs/design.md")
    names = [row["name"] for row in pyalloc.options_table()]
    assert all(f"| `{name}` |" in design for name in names)

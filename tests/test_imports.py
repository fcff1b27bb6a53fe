"""pyalloc's modules import on their own, and none imports another that imports it back.

A cycle hidden behind a function-level import still ties two modules together (each one's
behaviour depends on the other's state); the graph below counts those imports too."""
from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Set

import pytest

import pyalloc

PACKAGE = Path(pyalloc.__file__).resolve().parent


def _modules() -> Dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The pyalloc modules `name` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """A cycle of `graph`, or []."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # The package itself is a node: a module it imports that imports `pyalloc` back (to
    # reach the installed engine, say) is a cycle. The lab and the demo import `pyalloc`
    # as any program does; nothing in the package imports them.
    assert _cycle(graph) == [], "import cycle: " + " -> ".join(_cycle(graph))


@pytest.mark.slow
def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    def load(name: str) -> str:
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                              text=True, timeout=300)
        return "" if proc.returncode == 0 else f"{name}:\n{proc.stderr[-2000:]}"

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(load, _modules()) if f]
    assert not failures, "\n".join(failures)


def test_pyalloc_stats_and_import_pyalloc_do_not_import_torch():
    """`import pyalloc` and `pyalloc-stats` (which reads files) leave torch unimported:
    importing it takes seconds, and `pyalloc-stats --help` must answer at once."""
    code = ("import sys, contextlib, io\n"
            "import pyalloc\n"
            "from pyalloc.stats_cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n"
            "        main(['--help'])\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0, e.code\n"
            "assert 'usage' in out.getvalue()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout

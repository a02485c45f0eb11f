"""The tree's layout rules: no import circle anywhere, the core never imports the annex (tools/), Gradio only
in ui/ and the annex's tab, one concern per file of a readable size."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = {"tests", "bench"}
MAX_LINES = 600  # about: one concern per file, never split only for size


def source_paths(root: Path = ROOT) -> list[Path]:
    """Every .py file git tracks or does not ignore under ``root``: a virtualenv (.venv/), caches and outputs
    that .gitignore lists are never read."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "*.py"],
                            cwd=root, capture_output=True, text=True, check=True).stdout.split("\0")
    return sorted(root / f for f in listed if f and (root / f).is_file())  # a tracked file may be deleted


def project_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py outside tests/ and bench/."""
    out = {}
    for path in source_paths(root):
        rel = path.relative_to(root)
        if SKIP & set(rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every project module ``path`` imports, at module level or inside functions."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known and n != module}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    files = project_files()
    return {m: imports_of(m, p, set(files)) for m, p in files.items()}


def test_the_checker_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_checker_reads_relative_and_lazy_imports():
    graph = import_graph()
    assert "neuron_backend.chat.text" in graph["neuron_backend.chat.engine"]  # from .text import ...
    assert "neuron_backend.chat.engine" in graph["neuron_backend.runtime"]  # imported inside a function
    assert "neuron_backend.devices" in graph["neuron_backend.chat.engine"]  # from .. import devices


def test_no_import_circle_anywhere():
    assert find_cycle(import_graph()) is None


def test_the_core_never_imports_the_annex():
    graph = import_graph()
    core = {m for m in graph if m.split(".")[0] in ("neuron_backend", "ui")}
    assert len(core) > 30 and any(m.startswith("tools.") for m in graph)
    leaks = {m: sorted(i for i in graph[m] if i.split(".")[0] == "tools") for m in core}
    assert not {m: found for m, found in leaks.items() if found}, "the core imports the annex"


def test_the_core_names_no_plug_in():
    """What is optional is a plug-in that app.py lists: the core's code, docstrings and words never name one."""
    core = [path for module, path in project_files().items() if module.split(".")[0] in ("neuron_backend", "ui")]
    named = {str(p.relative_to(ROOT)): found for p in [*core, ROOT / "neuron_backend" / "arabic.json"]
             if (found := re.findall(r"\btools[./]\w+|\bannex\b", p.read_text()))}
    assert not named, named


def test_gradio_only_in_ui():
    for module, path in project_files().items():
        if module.startswith("ui") or module in ("app", "tools.qa.tab", "tools.qa.views", "tools.qa.feedback_row",
                                                        "tools.cache.panel", "tools.mcp.server",
                                                        "tools.paste_back.drop_box", "tools.conversation_files.row"):
            continue
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(n == "gradio" or n.startswith("gradio.") for n in names), module


def test_sha1_and_md5_only_name_things():
    # They key caches and records, never guard anything: usedforsecurity=False says so (and to bandit).
    calls = []
    for module, path in project_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("sha1", "md5") and ast.unparse(node.func.value) == "hashlib"):
                said = {k.arg: ast.unparse(k.value) for k in node.keywords}
                calls.append((module, node.lineno, said.get("usedforsecurity")))
    assert calls and all(said == "False" for *_, said in calls), calls


@pytest.mark.slow
def test_backend_import_loads_no_gradio():
    code = ("import sys, neuron_backend.runtime, neuron_backend.chat.engine, neuron_backend.image.engine, "
            "tools.qa.runs, tools.qa.report; assert 'gradio' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_files_stay_readable():
    long = {str(p.relative_to(ROOT)): n for p in project_files().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_every_package_says_what_lives_there():
    for module, path in project_files().items():
        if path.name == "__init__.py":
            assert ast.get_docstring(ast.parse(path.read_text())), module


def test_what_git_ignores_is_never_read(tmp_path):
    (tmp_path / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    for rel in ("app.py", "pkg/__init__.py", ".venv/lib/python3.12/site-packages/big/mod.py",
                "outputs/made.py", "tests/test_x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('"""x"""\n')
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "app.py"], cwd=tmp_path, check=True)  # tracked; pkg/ untracked, not ignored
    assert sorted(project_files(tmp_path)) == ["app", "pkg"]
    assert not [p for p in source_paths() if ".venv" in p.relative_to(ROOT).parts]  # this checkout's, if any

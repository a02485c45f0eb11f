"""The docs stay true to the tree: the architecture page names every source file, the README is a
short front door whose links to docs/ resolve."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in listed if not f.startswith("tests/") and (ROOT / f).exists())


def test_the_architecture_page_names_every_source_file():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    files = source_files()
    assert len(files) > 50 and "app.py" in files
    missing = [f for f in files if f"`{f}`" not in page]
    assert not missing, f"docs/architecture.md does not name: {missing}"
    named = set(re.findall(r"`((?:neuron_backend|ui|tools|bench)/[\w/]+\.py)`", page))
    gone = sorted(named - set(files))
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"


def test_every_file_the_docs_name_exists():
    pattern = re.compile(r"\b((?:app|neuron_backend/[\w/]+|ui/[\w/]+|tools/[\w/]+|bench/[\w/]+|tests/[\w/]+)\.py)\b")
    gone = sorted({(page.name, path) for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
                   for path in pattern.findall(page.read_text(encoding="utf-8")) if not (ROOT / path).exists()})
    assert not gone, f"named in the docs, not in the tree: {gone}"


def test_the_readme_is_a_front_door_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(((?:docs/)[^)#]+)", readme)
    assert len(links) >= 8, links
    assert not [link for link in links if not (ROOT / link).exists()]
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in readme, f"README's index lacks docs/{page.name}"


def test_the_kubernetes_probes_tolerate_one_slow_answer():
    """The documented probes: a busy host answered /healthz in over 1 s now and then, so no probe keeps
    Kubernetes' 1 s default timeout and readiness does not drop a pod on a single miss."""
    import yaml

    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(startupProbe:.*?)```", page, re.S)
    assert block, "docs/api.md has no probe example"
    probes = yaml.safe_load(block.group(1))
    assert set(probes) == {"startupProbe", "readinessProbe", "livenessProbe"}
    for name, probe in probes.items():
        assert probe.get("timeoutSeconds", 1) >= 3, name
        assert probe.get("failureThreshold", 3) >= 3, name
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_configuration_page_lists_every_flag_with_its_variable():
    from app import PLUGINS
    from neuron_backend.settings import build_parser, env_name

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| `--")]
    flags = [o[2:] for a in build_parser(PLUGINS)._actions for o in a.option_strings if o.startswith("--") and
             o != "--help"]
    assert len(flags) > 50
    missing = [f for f in flags if not any(f"`--{f}" in row and env_name(f) in row for row in rows)]
    assert not missing, f"docs/configuration.md has no row with the flag and its variable for: {missing}"

"""Compile-cache bundles: export/install round trip, per-field mismatch report, refusal of bad archives."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from neuron_backend.cache import bundle, manifest
from neuron_backend.cache.__main__ import main as cache_cli
from neuron_backend.errors import CacheBundleError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings

ROOT = Path(__file__).parents[1]
ARGS = ["--models", "tiny", "--device", "cpu", "--sizes", "64x64", "--chat-buckets", "32,64"]
FAKE_CACHE = {"neff/MODULE_1/model.neff": b"\x01neff" * 100, "inductor/fxgraph/ab/entry": b"graph",
              "inductor/aotautograd/cd/entry": b"aot"}


def backend_at(root: Path, *extra: str) -> Backend:
    return Backend(parse_settings([*ARGS, "--cache-dir", str(root), *extra], env={}))


def manifest_at(root: Path) -> dict:
    """This server's manifest at ``root`` once its weights are found (fingerprints need the folders)."""
    backend = backend_at(root)
    for step in backend.runner._steps:
        if step.task.kind == "weights":
            backend.runner._run_step(step)
    return backend.warm_start.here()


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def exported(tmp_path):
    """A warmed-up cache root with a few cache files, its live manifest, and its bundle."""
    source = tmp_path / "source"
    backend = backend_at(source)
    backend.runner.run()
    for rel, data in FAKE_CACHE.items():
        path = source / "compile-cache" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    backend.warm_start.record()
    out = tmp_path / "bundle.tar.gz"
    assert cache_cli(["export", str(out), "--cache-dir", str(source)]) == 0
    return source, out


def test_export_then_install_into_a_fresh_root(tmp_path, exported, capsys):
    source, out = exported
    with tarfile.open(out) as tar:
        described, members = bundle.read_manifest(tar)
    assert set(FAKE_CACHE) <= set(described["files"]) and set(members) == set(described["files"])
    assert described["engines"]["chat"]["shapes"] == ["prefill-32", "prefill-64"]
    assert described["engines"]["image"]["shapes"] == ["64x64"]
    assert described["files"]["neff/MODULE_1/model.neff"]["bytes"] == 500
    assert described["software"]["torch"] and described["device"]["machine"]

    fresh = tmp_path / "fresh"
    backend = backend_at(fresh, "--cache-bundle", str(out))
    first_load = next(i for i, t in enumerate(backend.runner.tasks) if t.kind == "load")
    assert [t.kind for t in backend.runner.tasks[:first_load]] == ["weights", "weights", "bundle"]
    backend.runner.run()
    status = backend.status()
    task = next(t for t in status["tasks"] if t["kind"] == "bundle")
    assert task["state"] == "ready", task
    assert task["detail"].startswith("3 of 3 graphs usable")
    assert status["bundle"]["usable_graphs"] == 3 and status["bundle"]["mismatches"] == []
    assert all(t["from_bundle"] for t in status["tasks"] if t["kind"] == "compile")
    installed = files_under(fresh / "compile-cache")
    for rel, data in FAKE_CACHE.items():
        assert installed[rel] == data
    assert not [p for p in (fresh / "compile-cache").iterdir() if p.name.startswith(".bundle-")]

    assert cache_cli(["show", str(out)]) == 0
    assert "chat: demo Qwen3" in capsys.readouterr().out


def test_mismatches_are_listed_by_field(exported):
    _, out = exported
    with tarfile.open(out) as tar:
        theirs, _ = bundle.read_manifest(tar)
    here = copy.deepcopy(theirs)
    here["software"]["torch"] = "2.14.0"
    usable, mismatches, total = manifest.compare(theirs, here)
    assert usable == {} and total == 3
    assert f"torch 2.14.0 here, {theirs['software']['torch']} in the bundle" in mismatches

    here = copy.deepcopy(theirs)
    here["engines"]["chat"]["context_length"] = 512  # every chat graph depends on the cache length
    here["engines"]["image"]["shapes"] = ["64x64", "96x64"]  # a size the bundle lacks: compiled here later
    usable, mismatches, _ = manifest.compare(theirs, here)
    assert usable == {"image": ["64x64"]}
    assert mismatches == [f"chat context_length: 512 here, {theirs['engines']['chat']['context_length']} in the bundle"]

    here = copy.deepcopy(theirs)
    here["engines"]["chat"]["shapes"] = ["prefill-32"]
    del here["engines"]["image"]
    usable, mismatches, _ = manifest.compare(theirs, here)
    assert usable == {"chat": ["prefill-32"]}
    assert "chat shapes prefill-64: in the bundle, not declared here" in mismatches
    assert "image engine: not enabled here (1 graphs unused)" in mismatches


def test_a_bundle_that_fits_nothing_installs_nothing(tmp_path, exported, monkeypatch):
    _, out = exported
    fresh = tmp_path / "other-torch"
    backend = backend_at(fresh, "--cache-bundle", str(out))
    real = manifest.software
    monkeypatch.setattr(manifest, "software", lambda: dict(real(), torch="2.14.0"))
    backend.runner.run()
    task = next(t for t in backend.status()["tasks"] if t["kind"] == "bundle")
    assert task["state"] == "failed"
    assert "0 of 3 graphs usable" in task["error"] and "torch 2.14.0 here" in task["error"]
    assert not any((fresh / "compile-cache" / rel).exists() for rel in FAKE_CACHE)
    assert all(t["state"] == "ready" for t in backend.status()["tasks"] if t["kind"] != "bundle")  # served cold


def _rewrite(out: Path, target: Path, change) -> Path:
    """A copy of the bundle with ``change(members)`` applied to its (name, TarInfo, bytes) list."""
    with tarfile.open(out) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]
    members = change(members)
    with tarfile.open(target, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return target


def _tamper_file(members):
    return [(i, data + b"x" if i.name == "files/neff/MODULE_1/model.neff" else data) for i, data in members]


def _tamper_manifest(members):
    out = []
    for info, data in members:
        if info.name == "manifest.json":
            described = json.loads(data)
            described["files"]["inductor/fxgraph/ab/entry"]["sha256"] = "0" * 64
            data = json.dumps(described).encode()
        out.append((info, data))
    return out


def _escape(members):
    evil = tarfile.TarInfo("files/../../escaped.txt")
    return [*members, (evil, b"owned")]


def _absolute(members):
    return [*members, (tarfile.TarInfo("/tmp/absolute-evil.txt"), b"owned")]


def _symlink(members):
    link = tarfile.TarInfo("files/neff/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return [*members, (link, b"")]


def _unlisted(members):
    return [*members, (tarfile.TarInfo("files/neff/unlisted.neff"), b"not in the manifest")]


def _no_manifest(members):
    return [(i, d) for i, d in members if i.name != "manifest.json"]


@pytest.mark.parametrize("change, reason", [
    (_tamper_file, "sha256|bytes"), (_tamper_manifest, "sha256"), (_escape, "outside files/"),
    (_absolute, "outside files/"), (_symlink, "not a regular file"), (_unlisted, "disagree"),
    (_no_manifest, "no manifest.json"),
])
def test_bad_archives_are_refused_whole(tmp_path, exported, change, reason):
    _, out = exported
    bad = _rewrite(out, tmp_path / "bad.tar.gz", change)
    fresh = tmp_path / "fresh"
    here = manifest_at(fresh)
    before = files_under(fresh / "compile-cache")
    with pytest.raises(CacheBundleError, match=reason):
        bundle.install(str(bad), here, fresh)
    assert files_under(fresh / "compile-cache") == before  # nothing written, no staging folder left
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute-evil.txt").exists()


def test_oversize_and_odd_sources_are_refused(tmp_path, exported, monkeypatch):
    _, out = exported
    here = manifest_at(tmp_path / "fresh")
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 100)
    with pytest.raises(CacheBundleError, match="add up to more than 100 bytes"):
        bundle.install(str(out), here, tmp_path / "fresh")
    (tmp_path / "garbage.tar.gz").write_bytes(b"not a tar at all")
    with pytest.raises(CacheBundleError, match="not a readable tar archive"):
        bundle.install(str(tmp_path / "garbage.tar.gz"), here, tmp_path / "fresh")
    with pytest.raises(CacheBundleError, match="does not exist"):
        bundle.resolve_source(str(tmp_path / "missing.tar.gz"))
    with pytest.raises(CacheBundleError, match="cannot fetch the bundle hf://"):  # HF_HUB_OFFLINE=1 in tests
        bundle.resolve_source("hf://someone/some-cache@main")
    folder = tmp_path / "bundles"
    folder.mkdir()
    (folder / "a.tar.gz").write_bytes(out.read_bytes())
    assert bundle.resolve_source(str(folder)) == folder / "a.tar.gz"


def test_export_needs_a_manifest(tmp_path, capsys):
    assert cache_cli(["export", str(tmp_path / "x.tar.gz"), "--cache-dir", str(tmp_path / "empty")]) == 2
    assert "let warm-up finish" in capsys.readouterr().err


def test_readiness_warns_about_a_failed_bundle_but_not_about_failed_shapes():
    from neuron_backend.metrics import readiness
    from neuron_backend.warmup import Task

    cache = Task("compile cache · install bundle", "cache", "bundle", state="failed")
    shapes = [Task("chat · 32 tokens", "chat", "compile", "32", state="ready"),
              Task("image · 64x64", "image", "compile", "64x64", state="ready")]
    ready, body = readiness([cache, *shapes])
    assert ready and body["ready"] is True and body["failed"] == [] and body["warming"] == []
    assert len(body["warnings"]) == 1 and body["warnings"][0].startswith("compile cache · install bundle: failed")
    shapes[1].state = "failed"  # an engine that does not serve a declared shape is still not ready
    ready, body = readiness([cache, *shapes])
    assert not ready and body["failed"] == ["image · 64x64"] and len(body["warnings"]) == 1
    cache.state, shapes[1].state = "running", "queued"  # and nothing is ready while the bundle installs
    assert readiness([cache, *shapes])[0] is False
    cache.state, shapes[1].state = "ready", "ready"
    assert readiness([cache, *shapes]) == (True, {"ready": True, "done": 3, "total": 3, "warming": [],
                                                   "failed": [], "warnings": []})


@pytest.mark.parametrize("problem", ["corrupt archive", "made for other software"])
def test_a_bundle_that_fails_to_install_leaves_readyz_ready_with_a_warning(tmp_path, request, monkeypatch, problem):
    import httpx
    from app_helpers import start_app

    if problem == "corrupt archive":
        source = tmp_path / "corrupt.tar.gz"
        source.write_bytes(b"\x1f\x8b not really gzip")
    else:
        _, source = request.getfixturevalue("exported")
        real = manifest.software
        monkeypatch.setattr(manifest, "software", lambda: dict(real(), torch="2.14.0"))
    demo, backend, url = start_app(tmp_path / "root", "--cache-bundle", str(source))
    try:
        assert url.startswith("http://127.0.0.1:")
        tasks = backend.status()["tasks"]
        assert next(t for t in tasks if t["kind"] == "bundle")["state"] == "failed"
        assert all(t["state"] == "ready" for t in tasks if t["kind"] != "bundle")  # both engines serve
        answer = httpx.get(url + "readyz", timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["ready"] is True and body["failed"] == []
        assert len(body["warnings"]) == 1 and "install bundle: failed" in body["warnings"][0]
        assert str(tmp_path) not in answer.text  # no paths in the probe's body
    finally:
        demo.close()


WARM_START = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    extra = sys.argv[2:]
    s = parse_settings(["--models", "tiny", "--device", "cpu", "--compile", "on", "--no-image",
                        "--chat-buckets", "32,64", "--context-length", "96", "--cache-dir", sys.argv[1], *extra],
                       env={})
    backend = Backend(s)
    backend.runner.run()
    backend.warm_start.record()
    graphs = [list(backend.stream_chat(ChatRequest(message="demo " * n, max_new_tokens=3, greedy=True)))[-1]
              .stats.compiled_graphs for n in (1, 4)]
    snap = backend.status()
    print(json.dumps({"tasks": snap["tasks"], "graphs": graphs, "since_ready": snap["compiles_since_ready"]}))
""")


@pytest.mark.slow
def test_a_fresh_root_from_a_bundle_starts_warm_and_never_compiles_after(tmp_path):
    def start(root, *extra):
        out = subprocess.run([sys.executable, "-c", WARM_START, str(root), *extra], capture_output=True, text=True,
                             timeout=900, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = start(tmp_path / "cold")
    assert cache_cli(["export", str(tmp_path / "b.tar.gz"), "--cache-dir", str(tmp_path / "cold")]) == 0
    fresh = start(tmp_path / "fresh", "--cache-bundle", str(tmp_path / "b.tar.gz"))
    compiles = lambda run: [t for t in run["tasks"] if t["kind"] == "compile"]  # noqa: E731
    assert [t["cache_hit"] for t in compiles(cold)][0] is False
    assert [t["cache_hit"] for t in compiles(fresh)][0] is True
    assert all(t["from_bundle"] for t in compiles(fresh))
    assert next(t for t in fresh["tasks"] if t["kind"] == "bundle")["state"] == "ready"
    assert fresh["graphs"] == [0, 0] and fresh["since_ready"] == 0

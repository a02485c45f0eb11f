"""The bundles' warm-up hook: install one as the first compile-free warm-up step; record the cache.

The plug-in (``plugin.py``) hands ``WarmStart`` to ``Backend`` as a warm-up hook (``neuron_backend.warmup.WarmupHook``):
``plan`` reorders the warm-up plan (every "obtain weights" step first, then the bundle, then loads and
compiles: the manifest check needs the model folders, and nothing may compile before the bundle is in
place); ``annotate`` marks the shapes the bundle brought; ``after`` waits for the warm-up's end and
``record`` writes the live manifest and torch's portable artifacts.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from neuron_backend.messages import tr
from neuron_backend.warmup import READY, Step, Task, TimingHistory

from . import bundle, manifest

log = logging.getLogger("showcase.cache")


class WarmStart:
    """Bundle install and cache recording for one Backend (duck-typed: settings, placements, folders)."""

    def __init__(self, backend, source: str | None = None, sha256: str | None = None):
        self.backend, self.source, self.sha256 = backend, source, sha256  # --cache-bundle and its pin
        self.report: bundle.InstallReport | None = None

    def here(self, only_ready: bool = False) -> dict:
        """This server's manifest; with ``only_ready`` just the shapes whose warm-up succeeded."""
        b = self.backend
        models = {n: b.model_id(n, with_revision=False) for n in b.placements}
        revisions = {n: b.revision(n) for n in b.placements}
        described = manifest.describe(b.settings, b.placements, b.model_folders(), models, revisions=revisions,
                                      chat_rows=b.chat_rows)
        if only_ready:
            ready = {(t.engine, t.shape) for t in b.runner.tasks if t.kind == "compile" and t.state == READY}
            for name, entry in described["engines"].items():
                entry["shapes"] = [s for s in entry["shapes"] if (name, s) in ready]
        return described

    def plan(self, steps: list[Step]) -> list[Step]:
        """The plan with the bundle step before the first load (unchanged without --cache-bundle)."""
        source = self.source
        if not source:
            return steps
        task = Task(tr("compile cache · install bundle"), "cache", "bundle", detail=source)
        step = Step(task, self._install, TimingHistory.key("cache", "bundle", source))
        weights = [s for s in steps if s.task.kind == "weights"]
        return weights + [step] + [s for s in steps if s.task.kind != "weights"]

    def _install(self, task: Task) -> None:
        report = bundle.install(self.source, self.here(), self.backend.settings.cache_dir, self.sha256)
        if report.artifacts:
            import torch

            torch.compiler.load_cache_artifacts(report.artifacts)
        self.report = report
        task.detail = report.summary()

    def annotate(self, snapshot: dict) -> dict:
        """Mark the compile tasks whose shapes the bundle brought (the panel shows them)."""
        usable = self.report.usable if self.report else {}
        for t in snapshot["tasks"]:
            t["from_bundle"] = t["kind"] == "compile" and t["shape"] in usable.get(t["engine"], [])
        snapshot["bundle"] = None if self.report is None else {
            "source": self.report.source, "usable_graphs": self.report.usable_graphs,
            "total_graphs": self.report.total_graphs, "mismatches": self.report.mismatches}
        return snapshot

    def record(self) -> None:
        """Write ``compile-cache/manifest.json`` (+ torch's artifacts when anything compiles); never raises."""
        try:
            artifacts = None
            if any(p.compile for p in self.backend.placements.values()):
                import torch

                saved = torch.compiler.save_cache_artifacts()
                artifacts = saved[0] if saved else None
            path = bundle.write_live_manifest(self.backend.settings.cache_dir, self.here(only_ready=True), artifacts)
            log.info("compile-cache manifest written: %s (torch artifacts: %s bytes)", path,
                     len(artifacts) if artifacts else 0)
        except Exception as exc:  # noqa: BLE001 - a cache we cannot describe must not take the server down
            log.warning("compile-cache manifest not written: %s: %s", type(exc).__name__, exc)

    def export(self) -> Path:
        """Record the cache now and pack it into the bounded exports folder (the warm-up details' button).

        The file is named by the cache's fingerprint: while the cache is unchanged, a second export returns
        the first one's file instead of packing another copy. An archive past the folder's byte bound is
        refused (CacheBundleError); the CLI ``python -m tools.cache export`` has no such bound.
        """
        self.record()
        root = self.backend.settings.cache_dir
        out = self.backend.exports.write_keyed(bundle.fingerprint(root), ".tar.gz", "compile-cache",
                                               lambda out, limit: bundle.export(root, out, max_bytes=limit))
        log.info("compile-cache bundle %s: sha256 %s (start another host with --cache-bundle-sha256 it)", out,
                 bundle.archive_sha256(out))
        return out

    def after(self, warmup: threading.Thread) -> threading.Thread:
        """Record once the warm-up thread ends (in a thread of its own, so start() returns at once)."""

        def wait_then_record() -> None:
            warmup.join()
            self.record()

        thread = threading.Thread(target=wait_then_record, name="cache-manifest", daemon=True)
        thread.start()
        return thread


def of(backend) -> WarmStart:
    """The Backend's bundle hook (the Export button and tests reach the cache through it)."""
    found = [hook for hook in backend.hooks if isinstance(hook, WarmStart)]
    if not found:
        raise LookupError("this Backend was built without the compile-cache hook (its plug-in's parts)")
    return found[0]

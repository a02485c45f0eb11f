"""Compile-cache bundles from the command line.

    python -m tools.cache export OUT.tar.gz [--cache-dir DIR]   # pack this cache root's compile cache
    python -m tools.cache show BUNDLE                           # print a bundle's manifest summary
    python -m tools.cache push BUNDLE hf://owner/repo            # upload it to a Hub repository

Install a bundle by starting the app with ``--cache-bundle BUNDLE --cache-bundle-sha256 HEX`` (a
file, a folder holding one, or ``hf://owner/repo[@revision]``). A bundle is code (inductor's cache
entries are pickles): it is installed only when the archive's sha256 is the pinned one, the one
``export`` printed where the bundle was made; then its manifest is checked against the running
settings. ``export`` and ``show`` print the archive's sha256.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from neuron_backend.errors import ShowcaseError

from . import bundle


def _cache_root(value: str | None) -> Path:
    from neuron_backend.settings import parse_settings

    argv = ["--models", "tiny"] + (["--cache-dir", value] if value else [])  # tiny: no Hub probe for a path
    return parse_settings(argv).cache_dir


def _show(path: str) -> str:
    """The archive's sha256 and its manifest's summary (reads JSON only: nothing from the bundle runs)."""
    local = bundle.resolve_source(path)
    with tarfile.open(local, "r:*") as tar:
        described, _ = bundle.read_manifest(tar)
    lines = [f"sha256 {bundle.archive_sha256(local)}", f"created {described.get('created_at')}",
             "software: " + json.dumps(described.get("software")),
             "device: " + json.dumps(described.get("device"))]
    for name, engine in described["engines"].items():
        lines.append(f"{name}: {engine.get('model')} on {engine.get('kind')} {engine.get('dtype')}, compile "
                     f"{engine.get('compile')} ({engine.get('backend')}), shapes {', '.join(engine.get('shapes', []))}")
    lines.append(f"{len(described['files'])} files, {sum(f['bytes'] for f in described['files'].values())} bytes")
    return "\n".join(lines)


def _push(path: str, target: str) -> str:
    from huggingface_hub import HfApi

    if not target.startswith("hf://"):
        raise ShowcaseError(f"push: the target must look like hf://owner/repo, not {target!r}")
    repo = target.removeprefix("hf://").partition("@")[0]
    api = HfApi()
    api.create_repo(repo, repo_type="model", exist_ok=True, private=True)
    local = bundle.resolve_source(path)
    api.upload_file(path_or_fileobj=str(local), path_in_repo=local.name, repo_id=repo)
    return (f"uploaded {local.name} to {target}; start other hosts with --cache-bundle {target} "
            f"--cache-bundle-sha256 {bundle.archive_sha256(local)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cache", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="pack the compile cache of a cache root with its manifest")
    p.add_argument("out")
    p.add_argument("--cache-dir", help="cache root (default: the app's, --cache-dir / SHOWCASE_CACHE_DIR)")
    sub.add_parser("show", help="print a bundle's manifest summary").add_argument("bundle")
    p = sub.add_parser("push", help="upload a bundle to a Hub repository (needs a token: hf auth login)")
    p.add_argument("bundle")
    p.add_argument("target")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            described = bundle.export(_cache_root(args.cache_dir), Path(args.out))
            shapes = sum(len(e.get("shapes", [])) for e in described["engines"].values())
            print(f"wrote {args.out}: {len(described['files'])} files, {shapes} shapes")
            print(f"sha256 {bundle.archive_sha256(Path(args.out))}  (install elsewhere with --cache-bundle "
                  f"{args.out} --cache-bundle-sha256 <this sha256>)")
        elif args.command == "show":
            print(_show(args.bundle))
        else:
            print(_push(args.bundle, args.target))
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

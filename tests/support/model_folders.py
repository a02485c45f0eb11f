"""Test stand-ins for real model folders: an HF cache layout, the real FLUX.2-klein file layout, a fake Hub.

Built from the tiny demo models, so everything loads for real; only where files live and how they
are split follows the real repositories (FLUX.2-klein-4B's public configs). Servers bind 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import socket
import threading
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(cache: Path, repo: str, source: Path, only: list[str] | None = None, commit: str = COMMIT) -> Path:
    """Put ``source``'s files (or ``only`` those) into an HF_HUB_CACHE layout; return the snapshot folder.

    models--org--name/blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main.
    """
    storage = Path(cache) / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    files = only if only is not None else [str(p.relative_to(source)) for p in sorted(source.rglob("*"))
                                           if p.is_file() and not p.name.startswith(".")]
    for rel in files:
        data = (source / rel).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(Path("../" * len(Path(rel).parts)) / ".." / "blobs" / blob.name)
    return snapshot


def non_distilled_copy(pipeline: Path, dst: Path) -> Path:
    """A copy of an image pipeline folder as a non-distilled checkpoint (``is_distilled: false`` in its
    model_index.json, as FLUX.2-klein-base-4B runs), not a demo folder any more; returns ``dst``."""
    shutil.copytree(pipeline, dst)
    (dst / ".complete").unlink(missing_ok=True)
    index = json.loads((dst / "model_index.json").read_text())
    (dst / "model_index.json").write_text(json.dumps({**index, "is_distilled": False}))
    return dst


def real_flux_layout(demo_image: Path, dst: Path) -> Path:
    """The demo pipeline in the real FLUX.2-klein-4B repository's layout.

    The text encoder in two safetensors shards with an index (like Qwen3-4B's), the VAE config's
    ``force_upcast: true``, and the root files diffusers never reads: BFL's single-file
    checkpoint, README.md, an image.
    """
    from safetensors.torch import load_file, save_file

    shutil.copytree(demo_image, dst)
    (dst / ".complete").unlink(missing_ok=True)  # not a demo folder any more
    encoder = dst / "text_encoder"
    tensors = load_file(encoder / "model.safetensors")
    (encoder / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: tensors[k].contiguous() for k in keys}, encoder / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (encoder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    vae_config = json.loads((dst / "vae" / "config.json").read_text())
    vae_config["force_upcast"] = True
    (dst / "vae" / "config.json").write_text(json.dumps(vae_config, indent=1))
    (dst / "flux-2-klein-4b.safetensors").write_bytes(b"\0" * 4096)  # stands in for the 7.75 GB file
    (dst / "README.md").write_text("# FLUX.2 [klein] 4B\n")
    (dst / "teaser.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return dst


def with_one_level_vae(demo_image: Path, dst: Path) -> Path:
    """The demo pipeline with a one-level VAE (``vae_scale_factor`` 1: one latent pixel per image pixel).

    No preview table in the folder: loading it fits one for this VAE."""
    import torch
    from diffusers import AutoencoderKLFlux2

    shutil.copytree(demo_image, dst)
    (dst / ".complete").unlink(missing_ok=True)
    (dst / "latent_rgb.json").unlink(missing_ok=True)
    shutil.rmtree(dst / "vae")
    torch.manual_seed(0)
    AutoencoderKLFlux2(block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                       up_block_types=("UpDecoderBlock2D",), layers_per_block=1, latent_channels=4,
                       norm_num_groups=8).save_pretrained(dst / "vae")
    return dst


def with_text_layers(demo_image: Path, dst: Path, layers: int) -> Path:
    """The demo pipeline with a text encoder of ``layers`` layers (the demo's has 28), random weights."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shutil.copytree(demo_image, dst)
    (dst / ".complete").unlink(missing_ok=True)
    config = json.loads((dst / "text_encoder" / "config.json").read_text())
    config.pop("layer_types", None)  # one per layer: rebuilt for the new count
    shutil.rmtree(dst / "text_encoder")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**{**config, "num_hidden_layers": layers})).save_pretrained(dst / "text_encoder")
    return dst


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut a file to a fraction of its length, like an interrupted download."""
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])


class FakeHub:
    """A minimal Hugging Face Hub on 127.0.0.1 serving one folder per repo id.

    Answers model_info (``/api/models/<repo>``) and file HEAD/GET (``/<repo>/resolve/<rev>/<file>``,
    with Range for resumed downloads). ``requests`` records (method, path, range) of each call.
    """

    def __init__(self, repos: dict[str, Path], cut_once: tuple[str, ...] = ()):
        self.repos = {repo: Path(folder) for repo, folder in repos.items()}
        self.cut_once = set(cut_once)  # files whose first GET sends half the body, then drops the connection
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo: str) -> dict[str, Path]:
        folder = self.repos[repo]
        return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*"))
                if p.is_file() and not p.name.startswith(".")}

    def downloads(self) -> list[str]:
        """Files fetched with GET (not model_info)."""
        return [path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path, _ in self.requests
                if method == "GET" and "/resolve/" in path]

    def _serve(self, handler, body: bool) -> None:
        path = handler.path.split("?", 1)[0]
        self.requests.append((handler.command, path, handler.headers.get("Range")))
        if path.startswith("/api/models/"):
            repo = "/".join(path.removeprefix("/api/models/").split("/")[:2])
            if repo not in self.repos:
                return self._send(handler, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)
            info = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                    "siblings": [{"rfilename": rel, "size": p.stat().st_size} for rel, p in self.files(repo).items()]}
            return self._send(handler, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        parts = path.lstrip("/").split("/")
        repo, rel = "/".join(parts[:2]), "/".join(parts[4:])
        file = self.files(repo).get(rel) if repo in self.repos and parts[2:3] == ["resolve"] else None
        if file is None:
            return self._send(handler, 404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, body)
        data = file.read_bytes()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Accept-Ranges": "bytes"}
        start = 0
        wanted = handler.headers.get("Range")
        if wanted and body and wanted.startswith("bytes="):
            start = int(wanted.removeprefix("bytes=").split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._send(handler, 206, data[start:], headers, body)
        if body and rel in self.cut_once:
            self.cut_once.discard(rel)
            handler.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return None
        return self._send(handler, 200, data, headers, body)

    @staticmethod
    def _send(handler, code: int, data: bytes, headers: dict, body: bool) -> None:
        handler.send_response(code)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)


class SilentHub:
    """A server on 127.0.0.1 that accepts every connection and never answers (a stalled Hub)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self._held.append(conn)  # held open, never read from or written to
            except OSError:
                continue

    def __enter__(self) -> SilentHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self._held:
            conn.close()
        self.sock.close()

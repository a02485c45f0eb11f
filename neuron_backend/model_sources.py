"""Where model weights come from: a local folder, the local Hugging Face cache, or the Hub.

Every network call here is bounded by a timeout, and offline use fails fast instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from .errors import EngineUnavailableError

_MARKERS = ("config.json", "model_index.json")


def local_folder(model: str) -> Path | None:
    """The folder ``model`` names, or None when it is a hub id."""
    path = Path(model).expanduser()
    return path if path.is_dir() else None


def check_folder(path: Path) -> None:
    """Raise EngineUnavailableError when a model folder lacks its config."""
    if not any((path / marker).is_file() for marker in _MARKERS):
        raise EngineUnavailableError(
            f"Model folder {path} has no config.json or model_index.json: "
            "point --chat-model/--image-model at a folder saved with save_pretrained()."
        )


def in_local_cache(model: str) -> Path | None:
    """The cached snapshot folder of a hub id, or None when it is not cached."""
    import huggingface_hub

    try:
        return Path(huggingface_hub.snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not usable from the cache"
        return None


def _hub_reachable(model: str, timeout: float) -> tuple[bool, str]:
    """Ask the Hub about ``model``, giving up after ``timeout`` seconds whatever happens."""
    import huggingface_hub

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return False, f"{model} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    result: list[tuple[bool, str]] = []

    def ask() -> None:
        try:
            huggingface_hub.HfApi().model_info(model, timeout=timeout)
            result.append((True, f"{model} can be downloaded from the Hub"))
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            result.append((False, f"{model} is not in the local cache and the Hub is unreachable "
                                  f"({type(exc).__name__})"))

    thread = threading.Thread(target=ask, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    if not result:
        return False, f"{model} is not in the local cache and the Hub did not answer within {timeout:g}s"
    return result[0]


def weights_available(model: str, timeout: float) -> tuple[bool, str]:
    """Whether ``model`` can be loaded now (local folder, cache) or fetched (Hub), and why."""
    folder = local_folder(model)
    if folder is not None:
        try:
            check_folder(folder)
        except EngineUnavailableError as exc:
            return False, str(exc)
        return True, f"local folder {folder}"
    if in_local_cache(model) is not None:
        return True, f"{model} is in the local Hugging Face cache"
    return _hub_reachable(model, timeout)


ProgressFn = Callable[[float, str], None]


def obtain(model: str, progress: ProgressFn | None = None) -> Path:
    """Return a local folder holding ``model``, downloading it from the Hub if needed.

    ``progress(fraction, text)`` is called as bytes arrive (only when downloading).
    """
    folder = local_folder(model)
    if folder is not None:
        check_folder(folder)
        return folder
    cached = in_local_cache(model)
    if cached is not None:
        return cached
    import huggingface_hub

    try:
        path = huggingface_hub.snapshot_download(model, tqdm_class=_progress_tqdm(progress) if progress else None)
    except Exception as exc:
        raise EngineUnavailableError(
            f"Could not download {model} ({type(exc).__name__}: {exc}). Check the network or "
            "HF_TOKEN, pass a local folder, or start with --models tiny."
        ) from exc
    return Path(path)


def _progress_tqdm(progress: ProgressFn):
    """A tqdm subclass that forwards download progress to ``progress``."""
    from tqdm.auto import tqdm

    class _Reporter(tqdm):
        def update(self, n=1):
            out = super().update(n)
            if self.total:
                progress(min(1.0, self.n / self.total), f"{self.n / 1e9:.2f} / {self.total / 1e9:.2f} GB")
            return out

    return _Reporter

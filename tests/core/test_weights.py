"""Where weights come from: partial caches, a fake Hub on 127.0.0.1, a stalled Hub, broken files.

Never a real outside address: the Hub is FakeHub/SilentHub from tests/support/model_folders.py, the cache a
tmp folder in the HF_HUB_CACHE layout.
"""

from __future__ import annotations

import struct
import time

import huggingface_hub
import pytest
from support.model_folders import COMMIT, FakeHub, SilentHub, add_to_cache, real_flux_layout, truncate

from neuron_backend import weights
from neuron_backend.errors import EngineUnavailableError
from neuron_backend.settings import parse_settings
from neuron_backend.weights import BrokenModelFile, missing_in_folder, tensor_shapes, verify_folder

CHAT_REPO, IMAGE_REPO = "test-org/chat-model", "test-org/image-model"
CHAT_TOKENIZER_ONLY = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]
OLD = "fedcba9876543210fedcba9876543210fedcba98"  # an older commit of the repo; refs/main names COMMIT


def online(monkeypatch, url: str) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", url)
    # Fixed from HF_ENDPOINT at import: point it at the stand-in too, so nothing leaves 127.0.0.1.
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        url + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture(scope="module")
def flux_folder(demo_models, tmp_path_factory):
    """The tiny pipeline in the real FLUX.2-klein-4B layout (sharded text encoder, root files)."""
    return real_flux_layout(demo_models.image, tmp_path_factory.mktemp("flux") / "klein")


def test_tokenizer_and_config_alone_count_as_missing(hf_cache, demo_models):
    # What AutoTokenizer.from_pretrained leaves in the cache: no weights.
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    assert weights.missing_files(CHAT_REPO, "chat") == ["model.safetensors"]
    assert weights.in_local_cache(CHAT_REPO) is None
    ok, why = weights.weights_available(CHAT_REPO, 1.0, "chat")
    assert not ok and "model.safetensors" in why and "HF_HUB_OFFLINE" in why


def test_auto_falls_back_naming_the_missing_files(hf_cache, demo_models):
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    s = parse_settings(["--chat-model", CHAT_REPO, "--no-image"], env={})
    assert s.models == "tiny" and "model.safetensors" in s.models_reason and "demo models" in s.models_reason
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat)  # the rest arrives: now it counts as present
    assert parse_settings(["--chat-model", CHAT_REPO, "--no-image"], env={}).models == "full"


def test_full_offline_fails_with_the_list_and_what_to_do(hf_cache, demo_models):
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    with pytest.raises(EngineUnavailableError) as err:
        weights.obtain(CHAT_REPO, kind="chat")
    assert "model.safetensors" in str(err.value) and f"hf download {CHAT_REPO}" in str(err.value)


def test_sharded_index_needs_every_shard(hf_cache, flux_folder):
    snapshot = add_to_cache(hf_cache, IMAGE_REPO, flux_folder)
    assert weights.missing_files(IMAGE_REPO, "image") == []
    (snapshot / "text_encoder" / "model-00002-of-00002.safetensors").unlink()
    assert weights.missing_files(IMAGE_REPO, "image") == ["text_encoder/model-00002-of-00002.safetensors"]


def test_pipeline_cache_filled_like_diffusers_counts_as_present(hf_cache, flux_folder):
    # diffusers' from_pretrained never fetches the root checkpoint, README or images.
    components = [str(p.relative_to(flux_folder)) for p in flux_folder.rglob("*")
                  if p.is_file() and "/" in str(p.relative_to(flux_folder))]
    add_to_cache(hf_cache, IMAGE_REPO, flux_folder, only=["model_index.json", *components])
    assert weights.missing_files(IMAGE_REPO, "image") == []
    assert weights.weights_available(IMAGE_REPO, 1.0, "image")[0]
    assert weights.obtain(IMAGE_REPO, kind="image").name == "0123456789abcdef0123456789abcdef01234567"


def test_a_missing_component_folder_is_named(tmp_path, flux_folder):
    import shutil

    broken = tmp_path / "no-vae"
    shutil.copytree(flux_folder, broken)
    shutil.rmtree(broken / "vae")
    assert missing_in_folder(broken, "image") == ["vae/config.json", "vae/diffusion_pytorch_model.safetensors"]
    problems = verify_folder(broken, "image")
    assert any(p.startswith("vae/config.json: missing") and "vae/ folder is absent" in p for p in problems)


def test_truncated_files_are_named_with_the_cause(tmp_path, flux_folder):
    import shutil

    broken = tmp_path / "truncated"
    shutil.copytree(flux_folder, broken)
    truncate(broken / "text_encoder" / "model-00002-of-00002.safetensors")
    truncate(broken / "transformer" / "diffusion_pytorch_model.safetensors", keep=0.9)
    (broken / "scheduler" / "scheduler_config.json").write_text("{not json")
    problems = verify_folder(broken, "image")
    assert len(problems) == 3, problems  # every component checked, not only the first broken one
    joined = "\n".join(problems)
    assert "text_encoder/model-00002-of-00002.safetensors: truncated" in joined
    assert "transformer/diffusion_pytorch_model.safetensors: truncated" in joined
    assert "scheduler/scheduler_config.json: unreadable JSON" in joined
    assert verify_folder(flux_folder, "image") == []


@pytest.mark.parametrize(("head", "said"), [
    (b"\x05", "truncated (1 bytes; an interrupted download?)"),
    (struct.pack("<Q", 1000) + b"{}", "truncated (10 bytes; an interrupted download?)"),
    (struct.pack("<Q", 4) + b"{{{{", "corrupt safetensors header (invalid JSON in header: key must be a string"),
    (struct.pack("<Q", 2) + b"[]", "corrupt safetensors header (invalid JSON in header: invalid type: sequence"),
], ids=["shorter than a header", "header longer than the file", "not JSON", "not an object"])
def test_a_broken_safetensors_file_is_named_with_what_safetensors_found(tmp_path, head, said):
    path = tmp_path / "model.safetensors"
    path.write_bytes(head)
    with pytest.raises(BrokenModelFile) as raised:
        tensor_shapes(path)
    assert str(raised.value).startswith(f"model.safetensors: {said}"), raised.value


def test_missing_files_are_fetched_from_the_hub_and_only_those(hf_cache, demo_models, monkeypatch, tmp_path):
    import shutil

    repo_files = tmp_path / "hub-chat"
    shutil.copytree(demo_models.chat, repo_files)
    (repo_files / "README.md").write_text("model card")
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    seen = []
    with FakeHub({CHAT_REPO: repo_files}) as hub:
        online(monkeypatch, hub.url)
        assert weights.weights_available(CHAT_REPO, 5.0, "chat")[0]
        folder = weights.obtain(CHAT_REPO, lambda f, text: seen.append((f, text)), kind="chat",
                                      hub_timeout=5.0, stall_timeout=30.0)
    assert missing_in_folder(folder, "chat") == []
    assert sorted(hub.downloads()) == ["chat_template.jinja", "model.safetensors"]  # no README, nothing twice
    assert seen and seen[-1][0] == 1.0 and "MB/s" in seen[-1][1] and " GB" in seen[-1][1]


def test_pipeline_download_skips_root_files(hf_cache, flux_folder, monkeypatch):
    with FakeHub({IMAGE_REPO: flux_folder}) as hub:
        online(monkeypatch, hub.url)
        folder = weights.obtain(IMAGE_REPO, kind="image", hub_timeout=5.0)
    fetched = set(hub.downloads())
    assert "flux-2-klein-4b.safetensors" not in fetched and "README.md" not in fetched
    assert "teaser.png" not in fetched
    assert {"text_encoder/model-00001-of-00002.safetensors", "text_encoder/model-00002-of-00002.safetensors",
            "vae/diffusion_pytorch_model.safetensors", "tokenizer/chat_template.jinja"} <= fetched
    assert verify_folder(folder, "image") == []


@pytest.mark.slow
def test_an_interrupted_download_resumes(hf_cache, demo_models, monkeypatch):
    # The connection drops halfway through the weights: the next request asks only for the rest.
    # (huggingface_hub 2.4 resumes within one download; a partial file of an earlier run is discarded.)
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    data = (demo_models.chat / "model.safetensors").read_bytes()
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)  # 10 MB: the file is 0.4
    with FakeHub({CHAT_REPO: demo_models.chat}, cut_once=("model.safetensors",)) as hub:
        online(monkeypatch, hub.url)
        folder = weights.obtain(CHAT_REPO, kind="chat", hub_timeout=5.0)
    ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith("/model.safetensors")]
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").removesuffix("-"))
    assert len(data) // 4 < resumed_at <= len(data) // 2
    assert (folder / "model.safetensors").read_bytes() == data


@pytest.mark.slow
def test_a_stalled_hub_ends_with_what_to_do(hf_cache, demo_models, monkeypatch):
    add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    with SilentHub() as hub:
        online(monkeypatch, hub.url)
        start = time.monotonic()
        ok, why = weights.weights_available(CHAT_REPO, 0.5, "chat")
        assert not ok and "model.safetensors" in why and time.monotonic() - start < 5
        start = time.monotonic()
        with pytest.raises(EngineUnavailableError) as err:
            weights.obtain(CHAT_REPO, kind="chat", hub_timeout=30.0, stall_timeout=1.0, flag="--chat-model")
        assert time.monotonic() - start < 10
    message = str(err.value)
    assert "stalled" in message and f"hf download {CHAT_REPO}" in message and "--chat-model" in message


def test_a_truncated_cached_shard_is_named_before_loading(hf_cache, demo_models):
    snapshot = add_to_cache(hf_cache, CHAT_REPO, demo_models.chat)
    truncate(snapshot / "model.safetensors")  # the blob behind the link, as an interrupted copy leaves it
    with pytest.raises(EngineUnavailableError) as err:
        weights.obtain(CHAT_REPO, kind="chat")
    assert "model.safetensors: truncated" in str(err.value) and "--chat-model" in str(err.value)


def test_a_xet_download_counts_each_byte_once():
    # huggingface_hub reports a xet download's bytes twice: as written to disk and as received.
    import logging
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

    download = weights._Download(CHAT_REPO, "chat", None, 1.0, 1.0, "--chat-model")
    report = SimpleNamespace(total_bytes=1000, total_bytes_completed=600, total_transfer_bytes_completed=500,
                             total_bytes_completion_rate=1e6, total_transfer_bytes_completion_rate=1e6)
    with XetDownloadProgressReporter(reconstruction_desc="model.safetensors", total=1000, log_level=logging.WARNING,
                                     tqdm_class=weights._counting_bar(download._touch)) as progress:
        progress.update_progress(report)
    assert download.done_bytes == 600


def test_a_partial_snapshot_with_its_listing_cached_still_names_what_is_missing(hf_cache, demo_models):
    # `hf download` caches the repo's listing (trees/<commit>.json); huggingface_hub then calls the
    # partial snapshot incomplete, and the missing files are still named, not "not cached".
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    snapshot = add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, only=CHAT_TOKENIZER_ONLY)
    listing = {p.name: TreeCacheEntry(size=p.stat().st_size, blob_id="0" * 40) for p in demo_models.chat.iterdir()
               if p.is_file() and not p.name.startswith(".")}
    write_tree_cache(str(snapshot.parents[1]), snapshot.name, listing)
    assert (snapshot.parents[1] / "trees").is_dir()
    assert weights.missing_files(CHAT_REPO, "chat") == ["model.safetensors"]
    ok, why = weights.weights_available(CHAT_REPO, 1.0, "chat")
    assert not ok and "lacks 1 needed file(s)" in why


# ----- revisions: org/name@revision ---------------------------------------------------------------

def test_a_revision_picks_its_snapshot_and_main_stays_main(hf_cache, demo_models):
    old = add_to_cache(hf_cache, CHAT_REPO, demo_models.chat, commit=OLD)
    new = add_to_cache(hf_cache, CHAT_REPO, demo_models.chat)  # refs/main: COMMIT
    (old.parents[1] / "refs" / "v1").write_text(OLD)  # a tag, as huggingface_hub records one
    assert weights.obtain(CHAT_REPO, kind="chat") == new and weights.snapshot_revision(new) == COMMIT
    assert weights.obtain(CHAT_REPO, kind="chat", revision=OLD) == old
    assert weights.obtain(CHAT_REPO, kind="chat", revision="v1") == old
    assert weights.snapshot_revision(old) == OLD and weights.snapshot_revision(demo_models.chat) is None
    (old / "model.safetensors").unlink()  # now only the old commit lacks its weights
    assert weights.missing_files(CHAT_REPO, "chat", OLD) == ["model.safetensors"]
    assert weights.missing_files(CHAT_REPO, "chat") == [] and weights.in_local_cache(CHAT_REPO, OLD) is None
    ok, why = weights.weights_available(CHAT_REPO, 1.0, "chat", revision=OLD)
    assert not ok and f"{CHAT_REPO}@{OLD}" in why and "model.safetensors" in why
    with pytest.raises(EngineUnavailableError) as err:
        weights.obtain(CHAT_REPO, kind="chat", revision=OLD, flag="--chat-model")
    assert f"hf download {CHAT_REPO} model.safetensors --revision {OLD} --local-dir <folder>" in str(err.value)


def test_every_hub_call_names_the_revision(hf_cache, demo_models, monkeypatch):
    calls = []

    def recorded(name, real):
        def call(*args, **kwargs):
            calls.append((name, kwargs.get("revision", "<none>")))
            return real(*args, **kwargs)
        return call

    for name in ("snapshot_download", "hf_hub_download", "try_to_load_from_cache"):
        monkeypatch.setattr(huggingface_hub, name, recorded(name, getattr(huggingface_hub, name)))
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                        recorded("model_info", huggingface_hub.HfApi.model_info))
    with FakeHub({CHAT_REPO: demo_models.chat}) as hub:
        online(monkeypatch, hub.url)
        assert weights.weights_available(CHAT_REPO, 5.0, "chat", revision="v1")[0]
        folder = weights.obtain(CHAT_REPO, kind="chat", hub_timeout=5.0, revision="v1")
        fetched = hub.downloads()
        # v2 names the same commit: nothing is fetched again, and v2 too is found offline next time
        assert weights.obtain(CHAT_REPO, kind="chat", hub_timeout=5.0, revision="v2") == folder
        assert hub.downloads() == fetched and weights.cached_snapshot(CHAT_REPO, "v2") == folder
    assert {name for name, _ in calls} == {"snapshot_download", "model_info", "hf_hub_download",
                                           "try_to_load_from_cache"}
    assert all(revision in ("v1", "v2", COMMIT) for _, revision in calls), calls  # as asked, or the commit named
    assert ("model_info", "v1") in calls and ("hf_hub_download", "v1") in calls
    paths = [path for _, path, _ in hub.requests]
    assert f"/api/models/{CHAT_REPO}/revision/v1" in paths and f"/api/models/{CHAT_REPO}/revision/v2" in paths
    assert all(f"{CHAT_REPO}/resolve/v" in path for path in paths if "/resolve/" in path)
    assert "model.safetensors" in fetched and folder.name == COMMIT
    assert weights.cached_snapshot(CHAT_REPO, "v1") == folder  # the next start finds v1 offline

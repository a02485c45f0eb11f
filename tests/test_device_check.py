"""bench/device_check.py --dry-run: the device check's whole code path on CPU, tiniest shapes, as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINIEST = ("--chat-compile", "off", "--buckets", "16,32", "--context", "64", "--window", "32", "--new-tokens", "4",
           "--image-size", "32x32", "--steps", "1", "--repeats", "1")


@pytest.mark.slow
def test_dry_run_writes_the_report(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "device_check.py"), "--dry-run", "--out", str(out),
                           "--root", str(tmp_path / "root"), *TINIEST],
                          cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    assert {"device_name", "machine", "bandwidth", "settings", "chat", "image", "wall_s"} <= set(report)
    chat, image = report["chat"], report["image"]
    assert [t["bucket"] for t in chat["ttft"]] == [16, 32]
    assert {"engine_ttft_s", "raw_ttft_s", "engine_over_raw"} <= set(chat["ttft"][0])
    assert {"engine_tok_s", "raw_tok_s", "engine_over_raw", "ceiling_tok_s", "engine_fraction_of_ceiling",
            "weight_bytes", "kv_bytes", "window"} <= set(chat["decode"])
    assert chat["decode"]["window"] == 32 and chat["decode"]["new_tokens"] == 4
    assert chat["compiles_after_warm_up"]["engine"] == 0
    assert {"engine_s", "raw_s", "engine_over_raw", "target", "same_image", "compiles_after_warm_up"} <= set(image)
    assert image["size"] == "32x32" and image["steps"] == 1 and image["target"] == 1.05
    assert report["bandwidth"]["source"].startswith("measured")  # a CPU is in no bandwidth table
    assert "### Device check (dry run" in done.stdout and "engine / raw" in done.stdout
    assert not list((tmp_path / "root").glob("device-check-*"))  # the saved models are removed

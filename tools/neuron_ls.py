"""``neuron-ls``: its JSON forms, the device list read from either, and its whole output for a report.

Neuron 2.33 and before print JSON with ``-j`` (a list, one object per device); 2.34 removes ``-j`` and
adds ``--output-format json`` (one object: instance-wide fields beside the device list). The doctor
summarises it; the first-device check keeps its output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

NEURON_LS_FORMS = (("--output-format", "json"), ("-j",))  # Neuron 2.34 and later; 2.33 and before


def read_neuron_ls(text: str) -> tuple[list[dict], dict] | None:
    """The device objects and the instance-wide fields of either JSON form; None when ``text`` holds neither.

    2.33 and before (``-j``): a list with one object per device. 2.34 (``--output-format json``): one
    object whose top-level fields describe what spans devices (the instance, the UltraServer) beside the
    device list. The docs do not name the new keys, so the list is found by its shape."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if isinstance(data, list):
        return [d for d in data if isinstance(d, dict)], {}
    if not isinstance(data, dict):
        return None
    lists = {k: v for k, v in data.items() if isinstance(v, list) and all(isinstance(d, dict) for d in v)}
    named = [lists[k] for k in ("neuron_devices", "devices") if k in lists]
    devicelike = [v for v in lists.values() if v and any("nc_count" in d or "neuron_device" in d for d in v)]
    chosen = (named or devicelike or (list(lists.values()) if len(lists) == 1 else []))[:1]
    if not chosen:
        return None
    shared = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
    for part in (v for v in data.values() if isinstance(v, dict)):
        shared.update({k: v for k, v in part.items() if not isinstance(v, (list, dict))})
    return chosen[0], shared


def summarize_neuron_ls(text: str) -> str:
    """'16 devices, 128 NeuronCores, LNC 2, 1 process using them' from either JSON form (keys read defensively)."""
    found = read_neuron_ls(text)
    if found is None:
        return text.strip()[:300]
    devices, shared = found
    cores = sum(int(d.get("nc_count", 0) or len(d.get("neuroncore_ids", []) or [])) for d in devices)
    lnc = {str(d.get("logical_neuroncore_config")) for d in devices if d.get("logical_neuroncore_config") is not None}
    if not lnc and shared.get("logical_neuroncore_config") is not None:
        lnc = {str(shared["logical_neuroncore_config"])}
    lnc = lnc or {os.environ.get("NEURON_LOGICAL_NC_CONFIG", "?")}
    users = sum(len(d.get("neuron_processes", []) or []) for d in devices)
    instance = f"{shared['instance_type']}: " if shared.get("instance_type") else ""
    return (f"{instance}{len(devices)} devices, {cores} NeuronCores, LNC {'/'.join(sorted(lnc))}, {users} process(es) "
            "using them")


RAW_CHARS = 200_000  # of ``--output-format json``'s output kept whole in a report (a trn2.48xlarge's is far less)


def output(timeout: float = 30.0) -> dict:
    """``neuron-ls`` output: the first of its JSON forms that answers (parsed too), else the plain table.

    ``output_format_json`` keeps what ``neuron-ls --output-format json`` printed, read or not (its keys are
    not documented: a report settles them), with its exit status."""
    exe = shutil.which("neuron-ls")
    if exe is None:
        return {"skipped": "neuron-ls is not on PATH (no Neuron SDK tools on this host)"}
    tried, raw = [], None
    for flags in (*NEURON_LS_FORMS, ()):
        command = " ".join(("neuron-ls", *flags))
        try:
            out = subprocess.run([exe, *flags], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append({"command": command, "error": str(exc)})
            continue
        if flags == NEURON_LS_FORMS[0]:
            raw = {"exit": out.returncode, "stdout": out.stdout[:RAW_CHARS], "stderr": out.stderr[-2000:],
                   "cut": len(out.stdout) > RAW_CHARS}
        if out.returncode != 0:
            tried.append({"command": command, "exit": out.returncode, "stderr": out.stderr[-2000:]})
            continue
        parsed = read_neuron_ls(out.stdout) if flags else None
        if flags and parsed is None:
            tried.append({"command": command, "error": "printed no device list", "stdout": out.stdout[-2000:]})
            continue
        return {"command": command, "stdout": out.stdout[-20000:], "json": json.loads(out.stdout) if flags else None,
                "summary": summarize_neuron_ls(out.stdout) if flags else None, "tried": tried,
                "output_format_json": raw}
    return {"error": "no form of neuron-ls answered", "tried": tried, "output_format_json": raw}

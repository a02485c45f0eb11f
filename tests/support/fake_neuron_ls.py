"""A stand-in for the ``neuron-ls`` command: a real executable script, in the forms of two Neuron releases.

What it models (the Neuron docs; docs/trainium.md "Tools"):
- ``"2.33"`` (2.33 and before): ``-j`` / ``--json-output`` print a JSON list, one object per device
  (``neuron_device``, ``nc_count``, ``memory_size``, ``logical_neuroncore_config``, ``neuron_processes``, ...);
  ``--output-format`` is an unknown flag;
- ``"2.34"``: ``--output-format json`` prints one JSON object whose top-level fields hold what applies to
  more than one device (the instance, the UltraServer) beside the device list; ``-j`` / ``--json-output``
  are gone. The docs give neither the new key names nor the text 2.34 prints for ``-j``: the names and
  the usage error below are plausible stand-ins (a Go CLI's "unknown flag"), and the doctor reads the
  new form by its shape, not by these names;
- ``"2.34-unread"``: as ``"2.34"``, but its JSON is keyed in a way this app cannot read by shape (the
  devices in an object keyed by index, beside two other lists): what a 2.34 whose keys differ from our
  guess may print. Neither JSON form then gives a device list; the plain table answers;
- ``"broken"``: the tools are there but the driver is not: every call exits 1 with an error.

Without a JSON flag every form prints a short table, as ``neuron-ls`` does.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

FORMS = ("2.33", "2.34", "2.34-unread", "broken")
DRIVER_ERROR = "neuron-ls: failed to open /dev/neuron0: No such file or directory (is the Neuron driver loaded?)"

SCRIPT = '''#!{python}
import json, sys
FORM, DEVICES, INSTANCE, DRIVER_ERROR = {form!r}, {devices!r}, {instance!r}, {driver_error!r}
args = sys.argv[1:]

def usage(message):
    sys.stderr.write("Error: " + message + "\\nUsage:\\n  neuron-ls [flags]\\n")
    sys.exit(1)

if FORM == "broken":
    sys.stderr.write(DRIVER_ERROR + "\\n")
    sys.exit(1)
if FORM == "2.33":
    if "--output-format" in args or any(a.startswith("--output-format=") for a in args):
        usage("unknown flag: --output-format")
    if "-j" in args or "--json-output" in args:
        lnc = INSTANCE["logical_neuroncore_config"]
        print(json.dumps([dict(d, logical_neuroncore_config=lnc) for d in DEVICES], indent=2))
        sys.exit(0)
else:
    if "-j" in args:
        usage("unknown shorthand flag: 'j' in -j")
    if "--json-output" in args:
        usage("unknown flag: --json-output")
    if "--output-format" in args:
        value = args[args.index("--output-format") + 1] if args.index("--output-format") + 1 < len(args) else ""
        if value != "json":
            usage("invalid argument %r for \\"--output-format\\" flag" % value)
        if FORM == "2.34-unread":
            print(json.dumps({{"instance_info": INSTANCE, "hardware": {{str(d["neuron_device"]): d for d in DEVICES}},
                              "links": [{{"from": 0, "to": 1}}], "processes": [{{"pid": 1000}}]}}, indent=2))
        else:
            print(json.dumps({{"instance": INSTANCE, "ultraserver": None, "neuron_devices": DEVICES}}, indent=2))
        sys.exit(0)
print("instance-type: " + INSTANCE["instance_type"])
print("logical-neuroncore-config: %d" % INSTANCE["logical_neuroncore_config"])
for d in DEVICES:
    print("| %d | %d | %d GB |" % (d["neuron_device"], d["nc_count"], d["memory_size"] >> 30))
'''


def devices_of(count: int, processes: int = 0) -> list[dict]:
    """``count`` Trainium2 devices (8 physical cores, 96 GiB each); the first has ``processes`` users."""
    return [{"neuron_device": i, "bdf": f"{0xcc - i:02x}:00.0", "connected_to": [], "nc_count": 8,
             "memory_size": 96 << 30, "neuron_processes": [{"pid": 1000 + p, "command": "python app.py"}
                                                           for p in range(processes)] if i == 0 else []}
            for i in range(count)]


def write(folder: Path, form: str, devices: int = 1, processes: int = 0, lnc: int = 2) -> Path:
    """Write an executable ``neuron-ls`` of ``form`` into ``folder`` (a trn2.3xlarge by default); return it."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, not {form!r}")
    folder.mkdir(parents=True, exist_ok=True)
    instance = {"instance_type": "trn2.3xlarge" if devices == 1 else "trn2.48xlarge",
                "instance_id": "i-0123456789abcdef0", "logical_neuroncore_config": lnc}
    path = folder / "neuron-ls"
    path.write_text(SCRIPT.format(python=sys.executable, form=form, devices=devices_of(devices, processes),
                                  instance=instance, driver_error=DRIVER_ERROR))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def put_on_path(monkeypatch, folder: Path, form: str, **kwargs) -> Path:
    """Write a ``neuron-ls`` of ``form`` and put its folder first on ``PATH`` (subprocesses inherit it)."""
    path = write(folder, form, **kwargs)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return path


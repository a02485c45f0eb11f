"""First-run checklist for a new host, as a plug-in (``python app.py --doctor``) or alone (``python -m tools.doctor``,
which reads the core's flags and the remote engines'). Each line is ``pass``, ``fail`` or ``skipped`` with its
reason and fix; ``run`` returns 1 when a check the app needs fails. What it checks, in order, and what it does not:
docs/trainium.md ("Start with the doctor"). It downloads nothing; its only subprocesses (``neuron-ls``, one
Python process for the NEFF cache check) have timeouts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from neuron_backend.compile_cache import NEFF_CACHE_ENV, configure_compile_cache
from neuron_backend.neuron_install import COMPILER, WHEELS_OS, WHEELS_OS_NAME, glibc_version, load_failure, os_release
from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings, add_flag, parse_settings
from tools.chat_batch import plugin as chat_batch  # the chat's memory counts --chat-batch rows (imports no torch)
from tools.neuron_ls import NEURON_LS_FORMS, read_neuron_ls, summarize_neuron_ls
from tools.remote import plugin as remote_engines  # the checklist looks at --chat-server, --image-server

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
NEURON_PYTHONS = ((3, 12), (3, 13), (3, 14))  # torch-neuronx 2.13.3.* / 2.14.3.* wheels (Neuron 2.33, 2.34)
TESTED_TORCH = "2.13"  # the torch family requirements.txt pins; torch-neuronx 2.13.3.1.* matches it
MIN_FREE_GIB = 2.0  # below this at the cache root, compiled programs and outputs cannot be kept
INSTALL_FIX = "pip install -r requirements-neuron.txt (docs/trainium.md)"
PROBE_TIMEOUT_S = 600  # a tiny graph compiles in well under a minute; neuronx-cc cold start included


@dataclass
class Check:
    status: str
    name: str
    detail: str
    fix: str | None = None
    needed: bool = True  # a failed check that is not needed is shown but does not fail the doctor
    why_not_needed: str = "not needed to start: the app works around it"

    def line(self) -> str:
        text = f"{self.status:<7} {self.name}: {self.detail}"
        if self.fix:
            text += f"\n        fix: {self.fix}"
        if self.status == FAIL and not self.needed:
            text += f"\n        ({self.why_not_needed})"
        return text


@dataclass(frozen=True)
class Interpreter:
    """The Python the doctor judges: its version, its executable, whether it runs in a venv."""
    version: tuple[int, int, int]
    executable: str
    venv: bool


def this_python() -> Interpreter:
    """The Python this process runs (the doctor's tests give it the interpreter they mean instead)."""
    return Interpreter(tuple(sys.version_info[:3]), sys.executable, sys.prefix != sys.base_prefix)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _family(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


UNREAD_DEVICES = -1  # neuron-ls answered in its plain form only: devices are there, their count unread


def _seen(neuron_devices: int) -> str:
    if neuron_devices == UNREAD_DEVICES:
        return "neuron-ls answers (its device count could not be read)"
    return f"neuron-ls lists {neuron_devices} Neuron device(s)"


def check_python(neuronx: str | None, neuron_devices: int = 0, python: Interpreter | None = None) -> Check:
    version = (python or this_python()).version
    text = f"{'.'.join(map(str, version))} (the app needs >= 3.10; TorchNeuron 2.33 wheels: 3.12, 3.13, 3.14)"
    if (neuronx is not None or neuron_devices) and version[:2] not in NEURON_PYTHONS:
        return Check(FAIL, "python", text, "make the Neuron venv with a Python 3.12-3.14 (python3 -m venv .venv on "
                     f"{WHEELS_OS_NAME})")
    return Check(PASS, "python", text)


def check_versions(neuron_devices: int = 0) -> Check:
    """torch and torch-neuronx installed in matching families; torch-neuronx is needed once neuron-ls lists devices."""
    torch_v, neuronx = _version("torch"), _version("torch-neuronx")
    if torch_v is None:
        return Check(FAIL, "torch / torch-neuronx", "torch is not installed", "pip install -r requirements.txt")
    if neuronx is None and neuron_devices:
        return Check(FAIL, "torch / torch-neuronx", f"torch {torch_v}; torch-neuronx not installed, but "
                     f"{_seen(neuron_devices)}: the app would run on CPU", INSTALL_FIX)
    if neuronx is None:
        return Check(SKIPPED, "torch / torch-neuronx", f"torch {torch_v}; torch-neuronx not installed (no Trainium "
                     f"install here)", f"on a Trn2/Trn3 host: {INSTALL_FIX}", needed=False)
    if neuronx.split(".")[0] == "1":
        return Check(FAIL, "torch / torch-neuronx", f"torch-neuronx {neuronx} is the PyPI placeholder, which fails on "
                     "import", f"pip uninstall -y torch-neuronx && {INSTALL_FIX}")
    if _family(neuronx) != _family(torch_v):
        return Check(FAIL, "torch / torch-neuronx", f"torch {torch_v} with torch-neuronx {neuronx}: families differ "
                     f"(torch-neuronx {_family(torch_v)}.3.0.* goes with torch {_family(torch_v)}.0)", INSTALL_FIX)
    untested = "" if _family(torch_v) == TESTED_TORCH else f"; the app is tested with torch {TESTED_TORCH}.0"
    return Check(PASS, "torch / torch-neuronx", f"torch {torch_v}, torch-neuronx {neuronx}: families match{untested}")


def check_os(neuron_wanted: bool, release: dict | None = None, glibc: str | None = None) -> Check:
    """The OS release and glibc; the Neuron 2.33 standalone wheels support Ubuntu 26.04 only."""
    release = os_release() if release is None else release
    glibc = glibc_version() if glibc is None else glibc
    name = release.get("PRETTY_NAME") or " ".join(filter(None, (release.get("NAME"), release.get("VERSION_ID"))))
    text = f"{name or 'no /etc/os-release'}, {glibc}"
    unchecked = ("its glibc is not compared with a minimum, which is not published: a too old one fails "
                 "`import torch` with 'GLIBC_2.xx not found'")
    if (release.get("ID"), release.get("VERSION_ID")) == WHEELS_OS:
        return Check(PASS, "OS", f"{text}: what the Neuron 2.33 wheels are built for ({unchecked})")
    if not neuron_wanted:
        return Check(PASS, "OS", f"{text} (the CPU install runs here; the Neuron 2.33 wheels need {WHEELS_OS_NAME})")
    return Check(FAIL, "OS", f"{text}: the Neuron 2.33 standalone wheels support {WHEELS_OS_NAME} only ({unchecked})",
                 f"run on {WHEELS_OS_NAME} (the TorchNeuron DLAMI; docs/trainium.md)", needed=False,
                 why_not_needed="not failed outright: the `import torch` check shows whether the wheels load here")


def check_compiler(neuron_wanted: bool, executable: str | None = None, path: str | None = None,
                   venv: bool | None = None) -> Check:
    """``neuronx-cc`` on ``PATH`` and, in a venv, the one beside this python: TorchNeuron runs the one PATH finds.

    ``executable`` and ``venv`` default to ``this_python()``'s, ``path`` to ``$PATH``. Not checked: that the
    compiler runs (on Neuron the tiny-graph check compiles with it)."""
    python = this_python()
    folder = os.path.dirname(os.path.abspath(executable or python.executable))
    venv = python.venv if venv is None else venv
    beside = os.path.join(folder, COMPILER)
    has_beside = venv and os.path.isfile(beside) and os.access(beside, os.X_OK)
    found = shutil.which(COMPILER, path=path)
    activate = f"source {os.path.join(folder, 'activate')}"
    started = f"`python app.py` puts {folder} first on PATH at start; what else runs from this shell does not"
    if found is None and has_beside:
        return Check(FAIL, COMPILER, f"not on PATH, but this venv has {beside}: {started}", activate, needed=False)
    if found is None and not neuron_wanted:
        return Check(SKIPPED, COMPILER, "not on PATH (no Neuron install here)", f"on a Trn2/Trn3 host: {INSTALL_FIX}",
                     needed=False)
    if found is None:
        where = f" nor in this venv ({folder})" if venv else ""
        return Check(FAIL, COMPILER, f"not on PATH{where}: TorchNeuron runs {COMPILER} from PATH, so every compile "
                     "would fail, eager ops included", INSTALL_FIX)
    same = has_beside and os.path.samefile(found, beside)
    if venv and not same and has_beside:
        return Check(FAIL, COMPILER, f"PATH finds {found} before this venv's {beside}: {started}", activate,
                     needed=False)
    if venv and not same:
        return Check(FAIL, COMPILER, f"PATH finds {found}, but this venv ({folder}) has none: TorchNeuron would run "
                     "another install's compiler, whose version need not match torch-neuronx", INSTALL_FIX,
                     needed=neuron_wanted)
    package = _version("neuronx-cc")
    own = " (this venv's own)" if same else ""
    installed = f"package neuronx-cc {package}" if package else "no neuronx-cc package in this python"
    return Check(PASS, COMPILER, f"{found}{own}, {installed}")


def check_import_torch() -> tuple[Check, object | None]:
    try:
        import torch
    except (ImportError, RuntimeError) as exc:
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        failure = load_failure(exc)
        fix = INSTALL_FIX if failure is None or failure.kind == "mismatch" else failure.fix
        return Check(FAIL, "import torch", f"{exc}{cause}", f"{fix}; to run on CPU meanwhile: "
                     "TORCH_DEVICE_BACKEND_AUTOLOAD=0 python app.py --device cpu"), None
    neuron = "torch.neuron registered" if getattr(torch, "neuron", None) is not None else "no torch.neuron"
    return Check(PASS, "import torch", f"{torch.__version__} ({neuron})"), torch


def check_neuron_ls(timeout: float = 30.0) -> tuple[Check, int]:
    """Run ``neuron-ls`` in its JSON form, 2.34's first, then 2.33's; the check and the devices it lists.

    When neither JSON form gives a device list, the plain ``neuron-ls`` decides: it answering passes (the
    devices' count is then ``UNREAD_DEVICES``), so a JSON keyed otherwise than this parser reads never fails
    a healthy host."""
    exe = shutil.which("neuron-ls")
    if exe is None:
        return Check(SKIPPED, "neuron-ls", "not found on PATH (no Neuron SDK tools here)",
                     "on a Trn2/Trn3 host: the Neuron DLAMI ships it (package aws-neuronx-tools)", needed=False), 0
    tried = []
    for flags in NEURON_LS_FORMS:
        command = " ".join(("neuron-ls", *flags))
        try:
            out = subprocess.run([exe, *flags], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"`{command}` did not answer ({exc})")
            continue
        if out.returncode != 0:
            tried.append(f"`{command}` exit {out.returncode}: {_squeeze(out.stderr) or '(no stderr)'}")
            continue
        found = read_neuron_ls(out.stdout)
        if found is None:
            tried.append(f"`{command}` printed no device list: {_squeeze(out.stdout) or '(nothing)'}")
            continue
        return Check(PASS, "neuron-ls", f"{summarize_neuron_ls(out.stdout)} (`{command}`)"), len(found[0])
    try:  # neither JSON form read: the plain table still says the tools and the driver answer
        plain = subprocess.run([exe], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tried.append(f"`neuron-ls` did not answer ({exc})")
    else:
        if plain.returncode == 0:
            return Check(PASS, "neuron-ls", f"plain `neuron-ls` answered ({_squeeze(plain.stdout, 120) or 'no rows'}); "
                         f"its JSON could not be read: {'; '.join(tried)}",
                         "nothing to fix on the host; the device check (python -m tools.doctor --device-check) "
                         "records the JSON output whole, for this doctor to learn its keys"), UNREAD_DEVICES
        tried.append(f"`neuron-ls` exit {plain.returncode}: {_squeeze(plain.stderr) or '(no stderr)'}")
    return Check(FAIL, "neuron-ls", "; ".join(tried), "run neuron-ls by hand: a driver error means reload or "
                 "reinstall the Neuron driver (lsmod | grep neuron; aws-neuronx-dkms), an unknown flag means tools "
                 "newer or older than this doctor knows (docs/trainium.md, Tools)"), 0


def _squeeze(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def check_cores(host, neuron_devices: int = 0) -> Check:
    """NeuronCores this process sees; none while neuron-ls lists devices is a failure, not a skip."""
    import torch

    from neuron_backend import devices

    if host.neuron_problem:
        return Check(FAIL, "cores visible", host.neuron_problem, INSTALL_FIX)
    if not host.neuron_cores:
        registered = getattr(torch, "neuron", None) is not None
        why = "torch.neuron sees 0 NeuronCores" if registered else "no NeuronCores (torch.neuron not registered)"
        if not neuron_devices:
            return Check(SKIPPED, "cores visible", why, needed=False)
        fix = (f"free the cores held by the processes neuron-ls lists, or widen NEURON_RT_VISIBLE_CORES (now "
               f"{host.visible_cores or 'unset'}); the README's run command uses NEURON_RT_VISIBLE_CORES=0-1"
               if registered else INSTALL_FIX)
        return Check(FAIL, "cores visible", f"{why}, but {_seen(neuron_devices)}: the app would run on CPU", fix)
    fix = None if host.visible_cores else "start with NEURON_RT_VISIBLE_CORES=0-1 (the README's Trainium run command)"
    return Check(PASS, "cores visible", devices.core_report(host), fix)


def tiny_graph_on(placement) -> str:
    """Compile and run a tiny graph from a fresh thread inside the placement's device context; raise on a fault."""
    import torch

    from neuron_backend import devices

    box: dict = {}

    def work():
        try:
            with devices.on_device(placement):
                x = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 64
                fn = (lambda a: (a @ a).relu() + 1)  # noqa: E731 - the probe graph
                if placement.compile:
                    fn = torch.compile(fn, backend=placement.compile_backend, fullgraph=True, dynamic=False)
                y = fn(x.to(placement.device))
                devices.synchronize(placement)
                box["ok"] = torch.allclose(y.cpu(), (x @ x).relu() + 1, atol=1e-2) and y.device == torch.device(
                    placement.device)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"doctor-{placement.device}", daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S)
    if thread.is_alive():
        raise TimeoutError(f"no result after {PROBE_TIMEOUT_S} s")
    if "error" in box:
        raise box["error"]
    if not box.get("ok"):
        raise RuntimeError("the result differs from the CPU reference or sits on another device")
    return "compiled and ran" if placement.compile else "ran eager (compile is off here)"


def check_placements(placements: dict, settings: Settings | None = None) -> list[Check]:
    checks = []
    for name, p in placements.items():
        title = f"{name} on {p.device}"
        if p.kind == "remote":
            checks += [check_chat_server(settings)] if name == "chat" else check_image_workers(settings)
            continue
        try:
            checks.append(Check(PASS, title, f"tiny graph {tiny_graph_on(p)} from a fresh thread ({p.label()})"))
        except Exception as exc:  # noqa: BLE001 - a failing placement is the finding
            checks.append(Check(FAIL, title, f"{type(exc).__name__}: {str(exc)[:300]}",
                                "see docs/trainium.md; another process may hold the core (neuron-ls)"))
    return checks


def check_chat_server(settings: Settings) -> Check:
    """--chat-server: one look at the server's model list (reached, the key taken, a chat model listed)."""
    from neuron_backend.errors import ShowcaseError
    from tools.remote.chat import RemoteChatEngine
    from tools.remote.plugin import servers

    there = servers(settings)
    title, engine = f"chat server {there.chat}", RemoteChatEngine(settings, there.chat, there.chat_key)
    try:
        warming = engine.look()
    except ShowcaseError as exc:
        return Check(FAIL, title, str(exc))
    except Exception as exc:  # noqa: BLE001 - the openai SDK's errors: what reaching the server said
        return Check(FAIL, title, str(engine.refusal(exc)))
    if warming is not None:
        return Check(PASS, title, f"reached; it is still warming up ({warming})")
    return Check(PASS, title, f"serves {engine.model} (context {engine.context_length} tokens)")


def check_image_workers(settings: Settings) -> list[Check]:
    """--image-server: one look at each worker's /readyz (reached, an image worker, which sizes are warm)."""
    from neuron_backend.errors import ShowcaseError
    from tools.remote.image import RemoteImageEngine
    from tools.remote.plugin import servers

    engine, checks = RemoteImageEngine(settings, servers(settings).images), []
    for worker in engine.workers.values():
        title = f"image worker {worker.url}"
        try:
            shapes = engine._look(worker)
        except OSError as exc:
            checks.append(Check(FAIL, title, str(engine._unreachable(worker, exc))))
            continue
        except ShowcaseError as exc:
            checks.append(Check(FAIL, title, str(exc)))
            continue
        ready = sorted(label for label, shape in shapes.items() if shape.get("state") == "ready")
        missing = [size.label for size in settings.sizes if size.label not in shapes]
        detail = f"{len(ready)}/{len(shapes)} shapes ready ({', '.join(ready) or 'none yet'})"
        checks.append(Check(PASS, title, detail + (f"; it does not declare {', '.join(missing)}" if missing else "")))
    return checks


CACHE_PROBE = """
import os, sys, torch, torch_neuronx.metrics as m
m.set_enabled(True)
fn = torch.compile(lambda a: (a @ a).relu() + 1, backend="neuron", fullgraph=True, dynamic=False)
fn(torch.arange(64, dtype=torch.float32).reshape(8, 8).div(64).to("neuron:0")); torch.neuron.synchronize(0)
print("HITS", m.get_counter_value("CompilationCache.PersistentHits") or 0)
"""


def check_neff_cache(settings: Settings, neuron: bool) -> list[Check]:
    env: dict = {}
    setup = configure_compile_cache(settings.cache_dir, env)
    folder = env[NEFF_CACHE_ENV]
    if setup.problem:
        first = Check(FAIL, "NEFF cache folder", setup.problem, f"make {settings.cache_dir} writable or pass "
                      "--cache-dir", needed=False)
    else:
        first = Check(PASS, "NEFF cache folder", f"{folder} is writable")
    if not neuron:
        return [first, Check(SKIPPED, "NEFF cache reuse", "needs a NeuronCore (neuronx-cc writes the NEFFs)",
                             needed=False)]
    # Two fresh processes, before this one holds a core: the first writes the NEFF, the second must read it.
    run_env = {**os.environ, **env, "NEURON_RT_VISIBLE_CORES": os.environ.get("NEURON_RT_VISIBLE_CORES", "0")}
    try:
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", CACHE_PROBE], env=run_env, capture_output=True, text=True,
                                 timeout=PROBE_TIMEOUT_S)
            if out.returncode != 0:
                break
    except subprocess.TimeoutExpired:
        return [first, Check(FAIL, "NEFF cache reuse", f"the second process took over {PROBE_TIMEOUT_S} s",
                             needed=False)]
    hits = out.stdout.split("HITS")[-1].strip() if "HITS" in out.stdout else None
    if out.returncode != 0 or hits is None:
        return [first, Check(FAIL, "NEFF cache reuse", f"second process failed: {out.stderr.strip()[-300:]}",
                             needed=False)]
    ok = int(hits) > 0
    return [first, Check(PASS if ok else FAIL, "NEFF cache reuse", f"a second process read {hits} NEFF(s) from "
                         f"{folder}", None if ok else f"check that {folder} is shared and not wiped", needed=False)]


def check_counters_and_memory(placements: dict) -> list[Check]:
    from neuron_backend import devices

    if any(p.kind == "neuron" for p in placements.values()):
        devices.use_neuron_counters()
    counters = devices.device_counters(placements)
    checks = [Check(PASS, "panel counters", counters["compile_counter"])]
    if not counters["memory"]:
        checks.append(Check(SKIPPED, "memory per core", "no accelerator placement", needed=False))
    for device, mem in counters["memory"].items():
        if "error" in mem:
            checks.append(Check(FAIL, f"memory {device}", mem["error"], needed=False))
        else:
            checks.append(Check(PASS, f"memory {device}", f"{mem['allocated_bytes'] / 2**30:.2f} GiB allocated of "
                                f"{mem['total_bytes'] / 2**30:.1f} GiB"))
    return checks


def _missing(model: str, kind: str, revision: str | None = None) -> list[str]:
    """Needed files of ``model`` at ``revision`` (None: main) missing locally (never touches the network)."""
    from neuron_backend.weights import missing_files

    return missing_files(model, kind, revision)


def check_models(settings: Settings) -> list[Check]:
    if settings.models == "tiny":
        return [Check(SKIPPED, "model files", f"demo models, built offline ({settings.models_reason})", needed=False)]
    from tools.remote.plugin import servers

    checks, there = [], servers(settings)
    local_chat = settings.chat and not there.chat  # a --chat-server holds its own weights
    local_image = settings.image and not there.images  # so do --image-server's workers
    for kind, model, revision, enabled in (("chat", settings.chat_model, settings.chat_revision, local_chat),
                                           ("image", settings.image_model, settings.image_revision, local_image)):
        if not enabled:
            continue
        shown = f"{model}@{revision}" if revision else model
        try:
            missing = _missing(model, kind, revision)
        except Exception as exc:  # noqa: BLE001 - an unreadable cache is the finding
            missing = [f"({type(exc).__name__}: {exc})"]
        if not missing:
            checks.append(Check(PASS, f"{kind} model files", f"every file {shown} needs is in the local cache"))
            continue
        listed = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        fix = f"hf download {model}" + (f" --revision {revision}" if revision else "")
        checks.append(Check(FAIL, f"{kind} model files", f"{shown}: missing {listed}", fix,
                            needed=settings.models == "full"))
    return checks


def check_memory_fit(settings: Settings, placements: dict, chat_rows: int = 1) -> list[Check]:
    """Each chosen model's memory estimate against what its device reports free (on Neuron: the runtime's
    total less what is allocated), with the headroom kept beside it: for the image model the plan loading
    makes (weights, the decode at the largest size, the declared reference tokens), made before loading;
    for the chat model its weights, static KV cache and activations; their sum when both share a device."""
    from neuron_backend import memory
    from neuron_backend.errors import EngineUnavailableError
    from neuron_backend.image.loading import plan_memory
    from neuron_backend.weights import in_local_cache, local_folder

    if settings.models == "tiny":
        return []
    checks, needs = [], {}
    for kind, model, revision in (("chat", settings.chat_model, settings.chat_revision),
                                  ("image", settings.image_model, settings.image_revision)):
        placement = placements.get(kind)
        if placement is None or placement.kind == "remote":
            continue
        folder = local_folder(model) or in_local_cache(model, revision)
        if folder is None:
            checks.append(Check(SKIPPED, f"{kind} memory", f"the {kind} weights are not in the local cache yet",
                                needed=False))
            continue
        name = f"{kind} memory ({placement.device})"
        if kind == "image":
            try:
                plan = plan_memory(folder, placement, settings)
            except EngineUnavailableError as exc:  # its message has the numbers and the flags to change
                checks.append(Check(FAIL, name, str(exc)))
                continue
            checks.append(Check(PASS, name, str(plan.note)))
            needs[kind] = plan.needs
            continue
        chunk = settings.prefill_chunk_tokens if placement.compile else 0
        chat = memory.estimate_chat(folder, placement.dtype, settings.context_length, chat_rows,
                                    chunk or settings.buckets[-1], placement.kind == "cpu")
        checks.append(_fits(name, chat.text(), chat.total, placement, "smaller --context-length or --chat-batch, or "
                            "--no-chat"))
        needs[kind] = chat.total
    chat, image = placements.get("chat"), placements.get("image")
    if len(needs) == 2 and None not in needs.values() and chat.device == image.device:
        total = sum(needs.values())
        checks.append(_fits(f"chat + image memory ({chat.device})", f"both engines share {chat.device}: "
                            f"~{total / memory.GIB:.1f} GiB together", total, chat,
                            "put them on two cores (--chat-device / --image-device), or the fixes above"))
    return checks


def _fits(name: str, needs: str, total: int, placement, fix: str) -> Check:
    """``needs`` (an estimate of ``total`` bytes) against what the placement's device has free, with the headroom."""
    from neuron_backend import memory

    free = memory.free_bytes(placement.kind, placement.core, placement.runtime_core)
    if free is None:
        return Check(SKIPPED, name, f"{needs}; free memory on {placement.kind} unknown, not checked", needed=False)
    detail = f"{needs}; {memory.where_text(placement.kind, free)}"
    if total + memory.headroom(placement.kind) <= free:
        return Check(PASS, name, detail)
    return Check(FAIL, name, f"{detail}: it does not fit", fix)


def _free_gib(path: Path) -> tuple[Path, float]:
    path = Path(path).expanduser()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path, shutil.disk_usage(path).free / 2**30


def check_disk(settings: Settings) -> list[Check]:
    checks = []
    hf_home = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub")
    for what, path in (("cache root", settings.cache_dir), ("Hugging Face cache", Path(hf_home))):
        where, free = _free_gib(path)
        ok = free >= MIN_FREE_GIB
        checks.append(Check(PASS if ok else FAIL, f"free disk ({what})", f"{free:.1f} GiB free at {where}",
                            None if ok else "free space or move it (--cache-dir / HF_HOME); FLUX.2-klein-4B and "
                            "Qwen3-0.6B take about 17 GB", needed=what == "cache root"))
    return checks


def run(settings: Settings, out=None, collect: list | None = None, chat_rows: int = 1) -> int:
    """Print the checklist; return the exit status (1 when a needed check failed).

    ``collect``: receives every ``Check`` as it is made (the device check's report); ``chat_rows``: Parts.chat_rows."""
    out = out or sys.stdout
    checks: list[Check] = [] if collect is None else collect

    def emit(*new: Check) -> None:
        for c in new:
            checks.append(c)
            print(c.line(), file=out, flush=True)

    print("Trainium showcase doctor: pass / fail / skipped, with the fix", file=out)
    neuron_ls, neuron_devices = check_neuron_ls()  # first: what the other checks need once devices are there
    neuron_wanted = bool(neuron_devices) or _version("torch-neuronx") is not None
    emit(check_python(_version("torch-neuronx"), neuron_devices), check_versions(neuron_devices))
    emit(check_os(neuron_wanted), check_compiler(neuron_wanted))
    imported, torch = check_import_torch()
    emit(imported)
    emit(neuron_ls)
    if torch is not None:
        from neuron_backend import devices
        from neuron_backend.errors import ShowcaseError

        host = devices.detect()
        emit(check_cores(host, neuron_devices))
        try:
            placements = devices.resolve_placements(settings, host, remote_engines.plug(settings).elsewhere)
        except ShowcaseError as exc:
            emit(Check(FAIL, "placements", str(exc), "change --device / --chat-device / --image-device"))
            placements = {}
        emit(*check_neff_cache(settings, any(p.kind == "neuron" for p in placements.values())))  # before a core is held
        emit(*check_placements(placements, settings))
        emit(*check_counters_and_memory(placements))
    emit(*check_models(settings), *check_disk(settings))
    if torch is not None:
        emit(*check_memory_fit(settings, placements, chat_rows))
    failed = [c for c in checks if c.status == FAIL and c.needed]
    print(f"{len(failed)} needed check(s) failed" if failed else "everything needed is in place", file=out)
    return 1 if failed else 0


def add_flags(parser) -> None:
    add_flag(parser.add_argument_group("first-run checklist (tools/doctor.py)"), "doctor", "bool",
             "print a first-run checklist of this host, each check with its fix, and exit (python -m tools.doctor)")


def plug(settings: Settings) -> Parts:
    """``--doctor``: the checklist runs instead of the app."""
    return Parts(command=lambda s, parts: run(s, chat_rows=parts.chat_rows)) if settings.options.get("doctor") \
        else Parts()


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.doctor [flags]``: the checklist; ``--device-check --out REPORT.json``: the first-device
    check instead (tools/device_check/); ``--report-json PATH``: the checks written there as JSON too."""
    from neuron_backend.errors import ShowcaseError

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--device-check" in argv:
        from tools.device_check.report import main as device_check

        return device_check(argv)
    report = None
    if "--report-json" in argv:  # the checks as JSON too (the device check runs the doctor this way)
        at = argv.index("--report-json")
        report, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    try:
        settings = parse_settings(argv, plugins=(remote_engines, chat_batch))
        rows = chat_batch.plug(settings).chat_rows
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    checks: list[Check] = []
    status = run(settings, collect=checks, chat_rows=rows)
    if report is not None:
        report.write_text(json.dumps({"exit": status, "checks": [
            {"status": c.status, "name": c.name, "detail": c.detail, "fix": c.fix, "needed": c.needed}
            for c in checks]}, indent=1) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())

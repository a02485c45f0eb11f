"""Which project files one ``/chat`` and one ``/generate_image`` call run code in, and how often each is entered.

The app (tiny models, CPU, no ``--auth``, every plug-in of ``app.PLUGINS``) is served in this process with a
profiler on every thread (``threading.setprofile`` before the server starts, so its threads and Gradio's workers
carry it); each call is made once to warm any lazy path, then once measured through ``gradio_client``: a
function entered in a file of the repository (tests excluded) counts for that file. Middleware is included.
Usage: ``python bench/files_per_call.py [--functions]`` (~1 min); ``--functions`` lists under each file the
functions entered in it and how often.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

entered: dict[str, int] = {}
functions: dict[tuple[str, str], int] = {}
measuring = [False]


def _profile(frame, event, arg) -> None:
    if event == "call" and measuring[0]:
        path = frame.f_code.co_filename
        if path.startswith(f"{REPO}/") and f"{os.sep}tests{os.sep}" not in path:
            name = os.path.relpath(path, REPO)
            entered[name] = entered.get(name, 0) + 1
            key = (name, frame.f_code.co_qualname)
            functions[key] = functions.get(key, 0) + 1


def main(by_function: bool = False) -> None:
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    from common import free_port

    import ui
    from app import PLUGINS
    from neuron_backend.plugins import plug_all
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings

    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", tempfile.mkdtemp(),
                               "--sizes", "64x64", "--references", "0", "--port", str(free_port())],
                              env={}, plugins=PLUGINS)
    parts = plug_all(PLUGINS, settings)
    backend = Backend(settings, parts=parts)
    backend.runner.run()
    demo, (_, url, _) = ui.serve(backend, parts, prevent_thread_lock=True, quiet=True)
    from gradio_client import Client

    client = Client(url, verbose=False)
    calls = {"/chat": {"message": "hello", "greedy": True, "max_new_tokens": 8},
             "/generate_image": {"prompt": "a fox", "size": "64x64", "steps": 2, "seed": 1}}
    for name, args in calls.items():
        client.predict(api_name=name, **args)
        entered.clear()
        functions.clear()
        measuring[0] = True
        client.predict(api_name=name, **args)
        measuring[0] = False
        core = [f for f in entered if f.startswith(("neuron_backend/", "ui/")) or f == "app.py"]
        print(f"{name}: {len(entered)} project files ({len(core)} of the core)")
        for path, count in sorted(entered.items()):
            print(f"  {path:40s} {count:5d}")
            if by_function:
                for (file, function), calls in sorted(functions.items()):
                    if file == path:
                        print(f"      {function:56s} {calls:5d}")
    demo.close()
    os._exit(0)  # the warm-up and Gradio's threads would keep the process


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main(by_function="--functions" in sys.argv[1:])

"""The one seam: plug-ins bring their flags (grouped in --help, read from SHOWCASE_* too) and their Parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import PLUGINS
from neuron_backend.errors import ConfigError
from neuron_backend.plugins import ChatBatch, Elsewhere, Parts, Tab, merged, plug_all
from neuron_backend.settings import add_flag, build_parser, parse_settings

ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_each_plug_ins_flags_under_its_own_title():
    text = subprocess.run([sys.executable, "app.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          check=True, env={"COLUMNS": "200", "PATH": ""}).stdout
    sections = dict(part.split(":\n", 1) for part in text.split("\n\n") if ":\n" in part)
    core = sections["options"]
    assert "--models" in core and "--api-key" not in core and "--chat-server" not in core
    for title, flags in {"engines on other servers (tools/remote)": ("--chat-server", "--image-server"),
                         "compile-cache bundles (tools/cache)": ("--cache-bundle", "--cache-bundle-sha256"),
                         "saved compiled forwards (tools/aot)": ("--chat-aot", "--image-aot", "--aot-key-file",
                                                                 "--aot-trust"),
                         "OpenAI-compatible /v1 (tools/openai_api)": ("--api-key",),
                         "MCP (tools/mcp)": ("--mcp",), "QA bench and feedback (tools/qa)": ("--feedback-max-bytes",),
                         "first-run checklist (tools/doctor.py)": ("--doctor",)}.items():
        assert all(flag in sections[title] for flag in flags), (title, sections.get(title))


def test_a_plug_ins_flags_read_the_environment_and_reach_it_as_options():
    env = {"SHOWCASE_API_KEY": "k3y", "SHOWCASE_MCP": "yes", "SHOWCASE_CHAT_SERVER": "http://127.0.0.1:9/v1"}
    settings = parse_settings(["--models", "tiny"], env=env, plugins=PLUGINS)
    assert settings.options == {"api_key": "k3y", "mcp": True, "chat_server": "http://127.0.0.1:9/v1"}
    assert parse_settings(["--models", "tiny", "--api-key", "flag"], env=env, plugins=PLUGINS).options["api_key"] \
        == "flag"  # the flag over its variable, as for the core's
    parts = plug_all(PLUGINS, settings)
    assert parts.launch == {"mcp_server": True} and parts.elsewhere["chat"].servers == ("http://127.0.0.1:9/v1",)
    with pytest.raises(ConfigError, match="SHOWCASE_MCP: 'maybe' is not a boolean"):
        parse_settings(["--models", "tiny"], env={"SHOWCASE_MCP": "maybe"}, plugins=PLUGINS)
    with pytest.raises(SystemExit):  # without the plug-in its flag is unknown, as any other
        parse_settings(["--models", "tiny", "--api-key", "k3y"], env={})


def test_a_plug_ins_flag_is_checked_where_it_is_read():
    settings = parse_settings(["--models", "tiny", "--api-key", "two words"], env={}, plugins=PLUGINS)
    with pytest.raises(ConfigError, match="--api-key: expected one word"):
        plug_all(PLUGINS, settings)


def test_parts_merge_in_the_plug_ins_order():
    one = SimpleNamespace(plug=lambda s: Parts(hooks=("a",), tabs=(Tab("A", "a", print),), launch={"x": 1},
                                               command=None))
    two = SimpleNamespace(plug=lambda s: Parts(hooks=("b",), elsewhere={"chat": Elsewhere(("u",), "a server")},
                                               remote=len, launch={"y": 2}, command=max, demo_models=divmod))
    three = SimpleNamespace(plug=lambda s: Parts(remote=min, command=min, chat_batch=ChatBatch(2, print),
                                                 demo_models=pow))
    parts = plug_all([one, two, three], None)
    assert parts.hooks == ("a", "b") and [t.label for t in parts.tabs] == ["A"]
    assert parts.launch == {"x": 1, "y": 2} and parts.remote is len and parts.command is max
    assert parts.demo_models is divmod and merged([]).demo_models is None  # none: the core refuses the demo models
    assert parts.chat_rows == 2 and merged([]).chat_rows == 1  # no batch: the chat's shapes have one row
    assert merged([]) == Parts()


def test_a_plug_in_adds_flags_with_the_cores_kinds():
    plugin = SimpleNamespace(add_flags=lambda p: [add_flag(p.add_argument_group("t"), "n", "int", "a number"),
                                                  add_flag(p, "on", "bool", "a switch"),
                                                  add_flag(p, "mode", "tri", "auto|on|off")])
    args = build_parser([plugin]).parse_args(["--n", "3", "--on", "--mode"])
    assert (args.n, args.on, args.mode) == ("3", True, "on")


def test_importing_the_app_loads_neither_torch_nor_gradio():
    """The plug-ins' modules are light: the NEFF cache variables are set before torch loads, and the torchrun
    followers never load Gradio."""
    code = "import sys, app; loaded = {'torch', 'gradio'} & set(sys.modules); assert not loaded, loaded"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)

"""--compile-repeated-blocks auto|on|off: on by default where the image engine compiles on Neuron, off elsewhere."""

from __future__ import annotations

import pytest
import torch
from support import fake_neuron

from neuron_backend import devices, warmup
from neuron_backend.compile_cache import CompileCounter
from neuron_backend.errors import ConfigError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize
from tools.demo_models import plugin as demo_builder

NEURON_HOST = devices.HostDevices(neuron_cores=2, cuda_devices=0)


def settings(*argv, env=None):
    return parse_settings(["--models", "tiny", "--sizes", "64x64", *argv], env=env or {})


@pytest.fixture
def neuron(monkeypatch):
    """Two fake NeuronCores whose placements hold CPU tensors (see tests/support/fake_neuron.py)."""
    torch._dynamo.reset()
    fake = fake_neuron.install(monkeypatch, cores=2)
    monkeypatch.setattr(CompileCounter, "mode", "auto")
    fake_neuron.cpu_backed_placements(monkeypatch)
    fake_neuron.place_on_load(monkeypatch, fake)
    yield fake
    torch._dynamo.reset()


@pytest.mark.parametrize(("argv", "env", "mode"), [
    ([], {}, "auto"),
    (["--compile-repeated-blocks"], {}, "on"),  # the old switch spelling
    (["--compile-repeated-blocks", "off"], {}, "off"),
    (["--compile-repeated-blocks", "ON"], {}, "on"),
    ([], {"SHOWCASE_COMPILE_REPEATED_BLOCKS": "1"}, "on"),
    ([], {"SHOWCASE_COMPILE_REPEATED_BLOCKS": "false"}, "off"),
    ([], {"SHOWCASE_COMPILE_REPEATED_BLOCKS": "auto"}, "auto"),
    (["--compile-repeated-blocks", "off"], {"SHOWCASE_COMPILE_REPEATED_BLOCKS": "on"}, "off"),  # flag wins
])
def test_the_setting_parses_auto_on_off(argv, env, mode):
    assert settings(*argv, env=env).compile_repeated_blocks == mode


def test_an_unknown_value_names_the_flag_and_the_choices():
    with pytest.raises(ConfigError) as err:
        settings("--compile-repeated-blocks", "sometimes")
    assert "--compile-repeated-blocks" in str(err.value) and "auto|on|off" in str(err.value)


@pytest.mark.parametrize(("argv", "on_neuron", "on_cpu"), [
    ([], True, False),  # auto: on where the image engine compiles on neuron only
    (["--compile", "on"], True, False),
    (["--compile-repeated-blocks"], True, None),  # explicit on: on wherever it compiles (cpu: refused, eager)
    (["--compile", "on", "--compile-repeated-blocks"], True, True),
    (["--compile-repeated-blocks", "off"], False, False),
    (["--compile", "off"], False, False),  # auto with compile off compiles nothing, and is not refused
])
def test_the_default_resolves_per_placement(neuron, argv, on_neuron, on_cpu):
    s = settings(*argv)
    image = devices.resolve_placements(s, NEURON_HOST)["image"]
    assert image.kind == "neuron" and devices.repeated_blocks(s, image) is on_neuron
    cpu = settings("--device", "cpu", *argv)
    image = devices.resolve_placements(cpu, NEURON_HOST)["image"]
    if on_cpu is None:
        with pytest.raises(ConfigError, match="--compile-repeated-blocks"):
            devices.refuse_idle_compile_flags(cpu, {"image": image})
    else:
        devices.refuse_idle_compile_flags(cpu, {"image": image})  # auto is never refused
        assert devices.repeated_blocks(cpu, image) is on_cpu


@pytest.mark.parametrize(("argv", "graphs", "kind"), [([], 2, "image-block"), (["--compile-repeated-blocks", "off"],
                                                                                 1, "image")])
def test_the_plan_counts_block_graphs_when_the_default_turns_it_on(neuron, argv, graphs, kind):
    s = settings(*argv)
    image = devices.resolve_placements(s, NEURON_HOST)["image"]
    plan = warmup.image_plan(s, image, ImageSize(64, 64), 1)
    per_graph = warmup.SECONDS_PER_GRAPH["neuron", kind]
    assert plan.graphs == graphs and plan.estimate_s == graphs * per_graph + plan.eager_programs * 300.0
    cpu = settings("--device", "cpu", "--compile", "on", *argv)
    assert warmup.image_plan(cpu, devices.resolve_placements(cpu)["image"], ImageSize(64, 64), 1).graphs == 1


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "graphs"), [([], 2), (["--compile-repeated-blocks", "off"], 1)])
def test_the_image_engine_on_neuron_compiles_block_graphs_by_default(neuron, tmp_path, argv, graphs):
    s = settings("--no-chat", "--references", "0", "--cache-dir", str(tmp_path), *argv)
    backend = Backend(s, NEURON_HOST, demo_builder.plug(s))
    assert backend.status()["plan"]["engines"]["image"]["graphs"] == graphs
    backend.runner.run()
    assert [t.state for t in backend.runner.tasks] == ["ready"] * len(backend.runner.tasks), \
        [(t.name, t.error) for t in backend.runner.tasks]
    image = backend.engine("image")
    assert image.warmups["64x64"]["compiled_graphs"] == graphs  # the fake backend counts one per graph
    assert ("repeated blocks" in image.describe()["mode"]) is (graphs == 2)

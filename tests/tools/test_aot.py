"""--chat-aot (tools/aot): the chat's compiled forwards are saved at the first warm-up and loaded by the next
without tracing: no compile, the same replies. The same for the image transformer (--image-aot)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import StaticCache

from neuron_backend.chat.engine import ChatEngine, ChatRequest
from neuron_backend.devices import CompileCounter, HostDevices, resolve_placements
from neuron_backend.settings import parse_settings
from tools.aot import forward as aot
from tools.aot import plugin

# With the chat template: a short prompt, one that fills bucket 32 exactly, one over it, one that fills 64.
MESSAGES = ("hello there", "word " * 2, "word " * 3, "word " * 18)


def engine(settings, folder) -> ChatEngine:
    chat = ChatEngine(settings, resolve_placements(settings, HostDevices(0, None, 0))["chat"], "demo Qwen3",
                      plugin.plug(settings).compiled)
    chat.load(folder)
    return chat


def replies(chat: ChatEngine) -> list[str]:
    return [chat.reply({"message": m, "greedy": True, "max_new_tokens": 12}).answer for m in MESSAGES]


@pytest.mark.slow
@pytest.mark.parity
def test_a_warm_start_loads_every_compiled_forward_compiles_nothing_and_answers_the_same(tiny_settings,
                                                                                        demo_models):
    compiled = tiny_settings.replace(compile="on")
    first = engine(compiled, demo_models.chat)
    assert first.saved_forwards is not None  # auto: on where the chat compiles with inductor
    assert [len(first._prompts.fit(ChatRequest(m))[0]) for m in MESSAGES[1:]] == [32, 34, 64]
    for key in first.shapes.keys():
        first.warm_up(key)
    saved = first.saved_forwards
    assert saved.saved >= 2 and saved.loaded == 0 and not saved._unsaved  # a prefill chunk and decode
    expected = replies(first)

    torch._dynamo.reset()  # nothing left in this process's dynamo caches: a trace would compile
    second = engine(compiled, demo_models.chat)  # a new model object, as after a restart
    before = CompileCounter.graphs()
    for key in second.shapes.keys():
        second.warm_up(key)
    got = replies(second)
    assert CompileCounter.graphs() == before, "the warm start traced a graph"
    assert (second.saved_forwards.loaded, second.saved_forwards.saved) == (first.saved_forwards.saved, 0)
    assert got == expected
    assert got == replies(engine(tiny_settings.replace(compile="off"), demo_models.chat))  # eager: the same


def test_the_call_key_follows_what_a_graph_is_specialised_to(demo_models):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_models.chat, dtype=torch.float32)
    cache = StaticCache(config=model.config, max_cache_len=64)
    mask = {"full_attention": torch.ones(1, 1, 1, 64, dtype=torch.bool)}
    base = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "cache": cache, "attention_mask": mask,
            "use_cache": True, "logits_to_keep": 0}
    key = aot.call_key(base)
    assert key == aot.call_key(dict(base))
    assert key != aot.call_key({**base, "input_ids": torch.zeros(2, 1, dtype=torch.long)})  # batch
    assert key != aot.call_key({**base, "input_ids": torch.zeros(1, 32, dtype=torch.long)})  # a chunk
    assert key != aot.call_key({**base, "attention_mask": {"full_attention": mask["full_attention"][..., :32]}})
    assert key != aot.call_key({**base, "use_cache": False})
    cache.window = 32
    assert key != aot.call_key(base)  # the window the next forward attends over
    with torch.no_grad():
        assert key != aot.call_key(base)
    assert aot.call_key({**base, "extra": object()}) is None  # not keyed: the plain compiled call
    config = {"backend": "inductor", "fullgraph": True}
    assert aot.namespace(model, config) != aot.namespace(model, config, variant="layers once")
    same = aot.namespace(model, config)
    model.config._name_or_path = "/another/cache/root/qwen3-tiny"  # a fresh root with a bundle: the same graphs
    assert aot.namespace(model, config) == same
    assert aot.namespace(model, config) != aot.namespace(model.to(torch.bfloat16), config)


def test_saved_forwards_live_in_the_apps_compile_cache_not_beside_a_foreign_kernel_cache(tiny_settings, tmp_path,
                                                                                         monkeypatch):
    from neuron_backend.compile_cache import configure_compile_cache

    # Someone else's TORCHINDUCTOR_CACHE_DIR (a shared kernel cache, as the test suite keeps): forwards stay home
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "shared-kernels"))
    monkeypatch.delenv("SHOWCASE_COMPILE_CACHE_SET", raising=False)
    assert plugin.folder(tiny_settings) == tiny_settings.cache_dir / "compile-cache" / "aot"
    # The app pointed the caches (a temp folder when its root is not writable): the forwards go with them
    root = tmp_path / "app-root"
    setup = configure_compile_cache(root, mounts="")
    assert plugin.folder(tiny_settings) == root / "compile-cache" / "aot" == setup.folder / "aot"


def test_a_torn_saved_forward_is_compiled_again(demo_models, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_models.chat, dtype=torch.float32)
    forward = aot.AotForward(model, tmp_path, {"backend": "inductor", "fullgraph": True, "dynamic": False})
    torn = tmp_path / "torn.aot"
    torn.write_bytes(b"not a compiled function")
    torn.with_suffix(".modules.json").write_text("{}")
    assert forward._load(torn) is None and forward.loaded == 0


@pytest.mark.parametrize(("mode", "kind", "compile", "on"), [
    ("auto", "cpu", True, True), ("auto", "cuda", True, True), ("auto", "neuron", True, False),
    ("on", "neuron", True, True), ("off", "cpu", True, False), ("on", "cpu", False, False),
])
@pytest.mark.parametrize("engine", ["chat", "image"])
def test_auto_saves_where_the_engine_compiles_with_inductor(mode, kind, compile, on, engine):
    settings = parse_settings(["--models", "tiny", f"--{engine}-aot", mode, "--compile-repeated-blocks", "off"], env={},
                              plugins=(plugin,))
    backend = "neuron" if kind == "neuron" else "inductor"
    placement = SimpleNamespace(compile=compile, compile_backend=backend, kind=kind)
    assert plugin.saves(settings, engine, placement) is on
    other = "image" if engine == "chat" else "chat"  # each engine follows its own flag
    assert plugin.saves(settings, other, placement) is (compile and kind != "neuron")


def test_an_image_transformer_compiled_per_block_is_not_saved():
    settings = parse_settings(["--models", "tiny", "--image-aot", "on", "--compile-repeated-blocks", "on"], env={},
                              plugins=(plugin,))
    placement = SimpleNamespace(compile=True, compile_backend="inductor", kind="cpu")
    assert plugin.saves(settings, "image", placement) is False


# -- the image transformer ----------------------------------------------------------------------------------

def image_engine(settings, folder):
    from neuron_backend.image.engine import ImageEngine

    image = ImageEngine(settings, resolve_placements(settings, HostDevices(0, None, 0))["image"], "demo FLUX.2-klein",
                        plugin.plug(settings).compiled)
    image.load(folder)
    return image


def paint(image) -> list:
    import numpy as np

    from neuron_backend.image.engine import ImageRequest

    return [np.asarray(image.generate(ImageRequest("a red fox", size, steps=2, seed=7)).image)
            for size in image.settings.sizes]


@pytest.mark.slow
@pytest.mark.parity
def test_an_image_warm_start_loads_the_transformers_graphs_and_paints_the_same(tiny_settings, demo_models):
    import numpy as np

    from neuron_backend.shapes import ImageSize

    # 96x64 and 64x96 have the same token count: one graph for both, so two saved forwards for three sizes
    compiled = tiny_settings.replace(sizes=(ImageSize(64, 64), ImageSize(96, 64), ImageSize(64, 96)), compile="on",
                                     compile_repeated_blocks="off", max_steps=2, default_steps=2)
    first = image_engine(compiled, demo_models.image)
    assert first.saved_forwards is not None  # auto: on where the transformer compiles whole with inductor
    for key in first.shapes.keys():
        first.warm_up(key)
    assert (first.saved_forwards.saved, first.saved_forwards.loaded) == (2, 0) and not first.saved_forwards._unsaved
    expected = paint(first)

    torch._dynamo.reset()  # nothing left in this process's dynamo caches: a trace would compile
    second = image_engine(compiled, demo_models.image)  # a new pipeline, as after a restart
    before = CompileCounter.graphs()
    for key in second.shapes.keys():
        second.warm_up(key)
    got = paint(second)
    assert CompileCounter.graphs() == before, "the warm start traced a graph"
    assert (second.saved_forwards.loaded, second.saved_forwards.saved) == (2, 0)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    # the plain pipeline, eager: the same picture up to float rounding of the compiled kernels
    eager = paint(image_engine(compiled.replace(compile="off"), demo_models.image))
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 2 for a, b in zip(got, eager, strict=True))


def test_a_save_that_raises_a_pickling_error_is_refused_once_and_the_compiled_graph_keeps_serving(demo_models,
                                                                                                  tmp_path):
    from support import fake_neuron
    from transformers import AutoModelForCausalLM

    fake = fake_neuron.FakeNeuron(cores=1)
    fake.saveable = "unpicklable"  # aot_compile takes the result; its save raises a pickling error
    model = AutoModelForCausalLM.from_pretrained(demo_models.chat, dtype=torch.float32)
    forward = aot.AotForward(model, tmp_path, {"backend": fake.backend, "fullgraph": True, "dynamic": False})
    ids = torch.tensor([[1, 2, 3, 4]])
    torch._dynamo.reset()
    with torch.no_grad():
        logits = [forward(input_ids=ids, use_cache=False).logits for _ in range(3)]
        expected = model(input_ids=ids, use_cache=False).logits
    assert fake.save_attempts == 1  # refused once, never retried
    assert forward.refused_saves == 1 and forward.saved == 0 and not forward._unsaved  # compiled, not "unsaved"
    assert "cannot pickle" in next(iter(forward.save_errors.values()))
    assert len(fake.compiled_queries) == 3  # every call ran the compiled graph, none the plain call
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.aot"))
    for got in logits:
        torch.testing.assert_close(got, expected)


PLANTED = """
import os
os.system("touch " + {marker!r})
"""


def _planted_forward(path, marker):
    """A saved forward as an attacker writes it into a shared cache: a pickle that runs a command when loaded."""
    import pickle

    class Payload:
        def __reduce__(self):
            return (exec, (PLANTED.format(marker=str(marker)),))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(Payload()))
    path.with_suffix(".modules.json").write_text("{}")


def test_a_saved_forward_this_installation_did_not_sign_is_never_loaded(demo_models, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_models.chat, dtype=torch.float32)
    key = aot.installation_key(tmp_path / "keys" / "aot.key")
    assert len(key) == 32 and aot.installation_key(tmp_path / "keys" / "aot.key") == key  # made once
    assert (tmp_path / "keys" / "aot.key").stat().st_mode & 0o077 == 0  # the owner's only
    forward = aot.AotForward(model, tmp_path / "cache", {"backend": "inductor", "fullgraph": True, "dynamic": False},
                             key=key)
    planted, marker = forward.folder / "planted.aot", tmp_path / "ran"
    _planted_forward(planted, marker)
    assert forward._load(planted) is None and not marker.exists()  # no signature: not loaded, nothing ran
    planted.with_suffix(".sig").write_text(aot.signature(b"another installation's key" * 2, planted.read_bytes(),
                                                         b"{}"))
    assert forward._load(planted) is None and not marker.exists()  # another key's signature: the same
    trusting = aot.AotForward(model, tmp_path / "cache", {"backend": "inductor", "fullgraph": True,
                                                          "dynamic": False}, key=key, trusted=True)
    trusting._load(planted)  # --aot-trust: the operator said the folder is theirs, so it is loaded
    assert marker.exists()


def test_the_key_file_may_not_live_in_the_cache(tmp_path):
    from neuron_backend.errors import ConfigError

    inside = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path),
                             "--aot-key-file", str(tmp_path / "compile-cache" / "aot.key")], env={}, plugins=(plugin,))
    with pytest.raises(ConfigError, match="--aot-key-file: it is inside --cache-dir.*allowed: a path outside"):
        plugin.plug(inside)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path / "cache")],
                              env={"XDG_CONFIG_HOME": str(tmp_path / "config")}, plugins=(plugin,))
    given = plugin.choices(settings)
    assert given.key_file == tmp_path / "config" / "trainium-showcase" / "aot.key" and not given.trust


# -- the plug-in's seam -------------------------------------------------------------------------------------

CORE_ALONE = """
import sys
from neuron_backend.runtime import Backend
from support.app import app_backend, app_settings
from tools.demo_models import plugin as demo_builder

root, config = sys.argv[1:3]
args = ["--models", "tiny", "--device", "cpu", "--compile", "on", "--no-image", "--cache-dir", root,
        "--chat-buckets", "32,64", "--context-length", "256"]


def chat(backend):
    for step in backend.runner._steps:  # weights and load only: nothing compiles
        if step.task.kind in ("weights", "load"):
            backend.runner._run_step(step)
    return backend.engine("chat")


settings = app_settings(args, env={"XDG_CONFIG_HOME": config})
alone = chat(Backend(settings, parts=demo_builder.plug(settings)))  # the plug-in left out: auto would have saved here
assert alone.saved_forwards is None and "get_compiled_call" not in vars(alone.model), "not the plain compile"
off = chat(app_backend(app_settings([*args, "--chat-aot", "off"], env={"XDG_CONFIG_HOME": config})))
assert off.saved_forwards is None and "get_compiled_call" not in vars(off.model), "wrapped though off"
assert "tools.aot.forward" not in sys.modules, "imported without the plug-in's part"
on = chat(app_backend(settings))  # as app.py: auto saves where the chat compiles with inductor
assert type(on.saved_forwards).__module__ == "tools.aot.forward" and "tools.aot.forward" in sys.modules
print("ok")
"""


@pytest.mark.slow
def test_the_core_never_imports_saved_forwards_and_compiles_plainly_without_them(demo_models, tmp_path):
    from support.app import link_demo_models, run_fresh

    link_demo_models(tmp_path / "root", demo_models)
    run_fresh(CORE_ALONE, str(tmp_path / "root"), str(tmp_path / "config"))


def test_the_plug_in_adds_a_wrapper_only_where_a_flag_may_save(tmp_path):
    base = ["--models", "tiny", "--cache-dir", str(tmp_path / "cache")]
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    assert plugin.plug(parse_settings(base, env=env, plugins=(plugin,))).compiled == (plugin.wrap,)
    off = parse_settings([*base, "--chat-aot", "off"], env={**env, "SHOWCASE_IMAGE_AOT": "0"}, plugins=(plugin,))
    assert plugin.plug(off).compiled == ()  # both off: nothing wraps, nothing of forward.py is imported
    assert plugin.choices(off).image == "off"  # the variable, read as the core's tri flags are
    eager = SimpleNamespace(compile=False, compile_backend="inductor", kind="cpu")
    assert plugin.wrap("chat", object(), {}, eager, parse_settings(base, env=env, plugins=(plugin,))) is None

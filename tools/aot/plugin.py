"""Saved compiled forwards as a plug-in: ``--chat-aot``/``--image-aot`` auto|on|off, ``--aot-key-file``,
``--aot-trust``. Its ``compiled`` part makes an engine's compiled forward a ``forward.AotForward`` where
``saves`` says so; the engine keeps the plain ``torch.compile`` call elsewhere, and without this plug-in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from neuron_backend.compile_cache import compile_cache_folder  # imports no torch
from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings, add_flag, as_tri


@dataclass(frozen=True)
class Choices:
    """The flags as given, checked."""

    chat: str  # auto|on|off: save the chat's compiled forwards
    image: str  # auto|on|off: save the image transformer's, compiled whole
    key_file: Path  # this installation's signing key, outside --cache-dir
    trust: bool  # also load forwards this installation did not sign


def add_flags(parser) -> None:
    group = parser.add_argument_group("saved compiled forwards (tools/aot)")
    add_flag(group, "chat-aot", "tri", "auto|on|off: save the chat's compiled forwards; a warm start loads them "
                                       "(auto: not neuron)")
    add_flag(group, "image-aot", "tri", "auto|on|off: the same for the image transformer compiled whole (auto: not "
                                        "neuron)")
    add_flag(group, "aot-key-file", "str", "the key that signs saved compiled forwards, outside --cache-dir "
                                           "(docs/security.md)")
    add_flag(group, "aot-trust", "bool", "also load saved compiled forwards this installation did not sign (a bundle "
                                         "you trust)")


def choices(settings: Settings) -> Choices:
    """The flags, checked: the key file must lie outside the cache root, which a bundle or another host may write."""
    given, default = settings.options, Path(settings.config_dir) / "aot.key"
    key_file = Path(str(given["aot_key_file"])).expanduser() if "aot_key_file" in given else default
    if key_file.resolve().is_relative_to(Path(settings.cache_dir).resolve()):  # whoever writes the cache forges then
        raise ConfigError("--aot-key-file", "it is inside --cache-dir, where a bundle or a host may write",
                          f"a path outside {settings.cache_dir}, e.g. the default {default}")
    return Choices(chat=as_tri("chat-aot", given.get("chat_aot", "auto")),
                   image=as_tri("image-aot", given.get("image_aot", "auto")),
                   key_file=key_file, trust=bool(given.get("aot_trust", False)))


def saves(settings: Settings, engine: str, placement) -> bool:
    """Whether ``engine`` saves its compiled forwards and loads them on a warm start.

    --chat-aot / --image-aot on/off decides; auto turns it on where the engine compiles with inductor (CPU,
    CUDA), whose compiled artifact ``aot_compile`` saves; off on Neuron (docs/bundles.md). The image transformer
    compiled per block (``devices.repeated_blocks``) is not saved: its blocks are compiled, not the module."""
    if not placement.compile:
        return False
    from neuron_backend.devices import repeated_blocks  # imports torch: called once an engine compiles

    if engine == "image" and repeated_blocks(settings, placement):
        return False
    given = choices(settings)
    mode = given.chat if engine == "chat" else given.image
    return mode == "on" or (mode == "auto" and placement.compile_backend == "inductor")


def folder(settings: Settings) -> Path:
    """``<compile-cache>/aot``, which a bundle carries: the folder the app pointed the compile caches into (a
    temp one when the cache root is not writable), else the settings' cache root's. A ``TORCHINDUCTOR_CACHE_DIR``
    set by someone else moves only inductor's kernels: saved forwards stay with this app's cache root."""
    return (compile_cache_folder() or Path(settings.cache_dir) / "compile-cache") / "aot"


def wrap(engine: str, target, compile_config: dict, placement, settings: Settings, variant: str = ""):
    """``Parts.compiled``: ``target``'s compiled forward (the chat model's, the image transformer's) made an
    ``AotForward`` where ``saves`` says so (the key file made on first use), else None."""
    if not saves(settings, engine, placement):
        return None
    from . import forward  # imports torch and transformers: only once an engine compiles

    given = choices(settings)
    attach = forward.attach if engine == "chat" else forward.attach_module
    return attach(target, folder(settings), compile_config, variant, key=forward.installation_key(given.key_file),
                  trusted=given.trust)


def plug(settings: Settings) -> Parts:
    given = choices(settings)  # checked at start: a key file in the cache stops it
    if given.chat == given.image == "off":
        return Parts()
    return Parts(compiled=(wrap,))

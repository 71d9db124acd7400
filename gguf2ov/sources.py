"""Where a command's inputs come from, resolved in one place.

A draft source is a GGUF file, a hub name `org/repo[:QUANT]` as llama.cpp's `-hf` takes it (found
in, or fetched into, huggingface_hub's cache: `gguf/hub.py`), or a draft checkpoint folder
(config.json + safetensors). A target is an OpenVINO folder (optimum-intel's export, or one
`gguf2ov target` built). Every command's arguments come here (`cli/args.py` declares them once),
so a new kind of source is one branch of `open_source`.
"""

from pathlib import Path

from .errors import Gguf2ovError


def resolve(spec):
    """A GGUF path, a checkpoint folder, or a hub name turned into its cached file (`hub.HubFile`)."""
    from .gguf.hub import resolve_gguf

    return resolve_gguf(spec)


def open_source(spec):
    """A draft source opened: a GgufFile (read once, memory-mapped) for a GGUF or hub name, or the
    Path of a checkpoint folder; an opened GgufFile passes through."""
    from .gguf.read import GgufFile, is_gguf_file, open_gguf

    if isinstance(spec, GgufFile):
        return spec
    resolved = resolve(spec)
    path = Path(resolved)
    if path.is_dir():
        return path
    if not path.exists():
        raise Gguf2ovError(f"{path} does not exist")
    if not is_gguf_file(path):
        raise Gguf2ovError(f"{path} is neither a GGUF file nor a checkpoint folder")
    return open_gguf(resolved)


def open_gguf_source(spec):
    """A GGUF (path or hub name) opened; refuses a folder."""
    from .gguf.read import open_gguf

    return open_gguf(resolve(spec))


def target_to_build(spec):
    """What a target argument names when it is not an OpenVINO folder but a model to build one from
    (`gguf2ov target`): the resolved GGUF (or hub name's file) or checkpoint folder; None for a folder
    that is a target already (or that holds nothing: `open_target` says what it lacks)."""
    from .gguf.read import is_gguf_file
    from .names import CONFIG_FILE
    from .runtime.genai import target_kind

    if spec is None:
        return None
    resolved = resolve(spec)
    path = Path(resolved)
    if is_gguf_file(path):
        return resolved
    if path.is_dir() and target_kind(path) is None and (path / CONFIG_FILE).is_file() and \
            any(p.suffix == ".safetensors" for p in path.iterdir()):
        return path
    return None


def open_target(spec):
    """A target folder checked for what GenAI needs (the IR and its tokenizers) and opened."""
    from .runtime.target import Target, require_target_dir

    require_target_dir(spec)
    return Target.open(spec)

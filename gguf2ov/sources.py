"""Where a command's inputs come from, resolved once, at the command line, into typed specs.

A draft is a GGUF file (or a hub name `org/repo[:QUANT]` as llama.cpp's `-hf` takes it, found in or
fetched into huggingface_hub's cache: `gguf/hub.py`) or a draft checkpoint folder (config.json +
safetensors). A target is an OpenVINO folder (optimum-intel's export, or one `gguf2ov target`
built), or a model to build one from: a target GGUF (or hub name) or a Hugging Face checkpoint
folder, with the weight format to build it in. Every command's arguments come here once
(`cli/args.py` declares them once, `job.Job.from_args` resolves them); stages receive what the specs
open, never a path to sort out themselves.
"""

from dataclasses import dataclass
from pathlib import Path

from .errors import Gguf2ovError


@dataclass(frozen=True)
class GgufSpec:
    """A GGUF file; `file` is the path, or the `hub.HubFile` it was taken as (which provenance records)."""

    file: object
    kind = "gguf"

    @property
    def path(self) -> Path:
        return Path(self.file)

    def open(self):
        """The file read once, memory-mapped (`gguf.read.GgufFile`)."""
        from .gguf.read import open_gguf

        return open_gguf(self.file)


@dataclass(frozen=True)
class CheckpointSpec:
    """A Hugging Face checkpoint folder (config.json + safetensors)."""

    path: Path
    kind = "checkpoint"


@dataclass(frozen=True)
class TargetFolder:
    """An OpenVINO target folder: optimum-intel's export, or one `gguf2ov target` built; `kind` as read
    when it was opened (runtime.target.target_kind: "llm" or "vlm")."""

    path: Path
    kind: str


@dataclass(frozen=True)
class TargetBuild:
    """A target to build (`gguf2ov target`, `run`'s target stage) from a GGUF or a checkpoint:
    `variant` is its weight format; `grid` how `gguf` weights carry the file's grid (ir.weights.GRIDS);
    `tokenizer_dir` a tokenizer to use instead of the source's own; `allow_nonfinite`: NaN or Inf weights
    are written (counted) instead of refused."""

    source: GgufSpec | CheckpointSpec
    variant: object  # ir.variants.Variant
    grid: str = "folded"
    tokenizer_dir: Path | None = None
    map_path: Path | None = None
    allow_nonfinite: bool = False
    mmproj: Path | None = None  # a VLM's projector GGUF: the target is then a VLM folder
    image_max_tokens: int | None = None  # soft tokens an image takes at most (None: targets/vision.MAX_SOFT_TOKENS)

    @property
    def path(self) -> Path:
        return self.source.path


def resolve(spec):
    """A GGUF path, a checkpoint folder, or a hub name turned into its cached file (`hub.HubFile`)."""
    from .gguf.hub import resolve_gguf

    return resolve_gguf(spec)


def model_source(spec, what: str = "source") -> GgufSpec | CheckpointSpec:
    """A GGUF (path or hub name) or a checkpoint folder, as a command names it."""
    from .gguf.read import is_gguf_file

    resolved = resolve(spec)
    path = Path(resolved)
    if not path.exists():
        raise Gguf2ovError(f"{path} does not exist")
    if is_gguf_file(path):
        return GgufSpec(resolved)
    if not path.is_dir():
        raise Gguf2ovError(f"{path} is neither a GGUF file nor a checkpoint folder",
                           hint=f"the {what} is a GGUF file or a Hugging Face checkpoint folder (config.json + "
                                "safetensors)")
    return CheckpointSpec(path)  # what the folder lacks, its reader says


def gguf_source(spec) -> GgufSpec:
    """A GGUF (path or hub name); a folder is refused."""
    source = model_source(spec)
    if not isinstance(source, GgufSpec):
        raise Gguf2ovError(f"{source.path} is a folder, not a GGUF file")
    return source


def target_folder(spec) -> TargetFolder:
    """An OpenVINO target folder, checked for what GenAI needs (the IR and its tokenizers)."""
    from .runtime.target import require_target_dir

    target = require_target_dir(spec)
    return TargetFolder(target.path, target.kind)


def target_spec(spec, build=None) -> TargetFolder | TargetBuild:
    """What a target argument names: an OpenVINO folder, or a GGUF, hub name or checkpoint folder to
    build one from. `build(source)` makes the TargetBuild of a model source (its weight format and
    options); without it a folder is required."""
    source = _buildable(spec) if build is not None else None
    return build(source) if source is not None else target_folder(spec)


def _buildable(spec) -> GgufSpec | CheckpointSpec | None:
    """The model a target argument names when it is one to build from: a GGUF, or a checkpoint folder
    that is not an OpenVINO folder (None: it is meant as a folder, and `target_folder` says what it
    lacks)."""
    from .gguf.read import is_gguf_file
    from .names import CONFIG_FILE
    from .runtime.target import target_kind

    resolved = resolve(spec)
    path = Path(resolved)
    if is_gguf_file(path):
        return GgufSpec(resolved)
    if path.is_dir() and target_kind(path) is None and (path / CONFIG_FILE).is_file() and \
            any(p.suffix == ".safetensors" for p in path.iterdir()):
        return CheckpointSpec(path)
    return None

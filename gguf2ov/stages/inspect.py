"""`gguf2ov inspect`: what a GGUF holds, and whether a map converts it."""

from collections import Counter
from dataclasses import dataclass, field

from ..errors import Gguf2ovError
from ..gguf.hub import HubFile, resolve_gguf
from ..draft.config import DFLASH2_ARCHITECTURE, SELECTOR_LEFT_OUT
from ..gguf.read import duplicate_key_warnings, open_gguf, summarise
from ..report import Table, human_bytes


@dataclass(frozen=True)
class TensorRow:
    gguf_name: str
    gguf_type: str
    ne: list[int]
    shape: list[int]          # PyTorch order
    n_bytes: int
    hf_name: str | None       # what the map makes of it (None: unmatched or not written)


@dataclass(frozen=True)
class InspectResult:
    path: str
    arch: str | None
    version: int
    file_bytes: int
    metadata: dict[str, str]  # key -> short text (long arrays summarised)
    tensors: list[TensorRow]
    type_counts: dict[str, int]
    map_path: str | None
    map_fits: bool | None     # does the map consume every tensor and produce every HF tensor?
    map_problems: list[str]
    model: str | None = None  # the HF class the map converts to
    hub: HubFile | None = None  # where a hub name `org/repo[:QUANT]` led
    warnings: list[str] = field(default_factory=list)  # what is wrong with the file itself (duplicate keys)
    # what the file is when its map names it as a kind GenAI does not run (maps/not_run.py), and what to
    # do instead; every other command refuses it with this text
    not_run: str | None = None

    def tables(self) -> list[Table]:
        return [
            Table("Metadata", ["key", "value"], [[k, v] for k, v in self.metadata.items()]),
            Table("Tensors", ["GGUF name", "type", "ne (stored)", "shape (PyTorch)", "bytes", "HF name"],
                  [[t.gguf_name, t.gguf_type, t.ne, t.shape, t.n_bytes, t.hf_name] for t in self.tensors]),
            Table("Tensor types", ["type", "tensors"], [[k, v] for k, v in self.type_counts.items()]),
        ]

    def summary(self) -> list[str]:
        lines = [f"{self.path}: GGUF v{self.version}, arch {self.arch}, {len(self.tensors)} tensors, "
                 f"{human_bytes(self.file_bytes)}"]
        if self.hub is not None:
            lines.append(f"from the hub: {self.hub.describe()}")
        if self.not_run is not None:
            lines.append(f"kind: {self.not_run}")
        elif self.map_path is None:
            lines.append("map: none applies")
        elif self.map_fits:
            lines.append(f"map: {self.map_path} consumes every tensor and produces every HF tensor")
            if self.model == DFLASH2_ARCHITECTURE:
                lines.append(f"model: {self.model}, four dynamic convolutions per layer, all exported. {SELECTOR_LEFT_OUT}")
            elif self.model:
                lines.append(f"model: {self.model}")
        else:
            lines.append(f"map: {self.map_path} does not fit: " + "; ".join(self.map_problems))
        return lines + [f"warning: {w}" for w in self.warnings]


def inspect(gguf_path, map_path=None) -> InspectResult:
    """`gguf_path` is a GGUF file, or a hub name `org/repo[:QUANT]` as llama.cpp's `-hf` takes it."""
    from ..maps.load import map_for
    from ..maps.not_run import NotRunError
    from ..targets.source import target_problems

    source = resolve_gguf(gguf_path)
    gguf = open_gguf(source, duplicate_keys=True)  # shown with a warning: inspect is where a bad file is looked at
    hf_names, problems, map_name, fits, model, not_run = {}, [], None, None, None, None
    try:
        amap = map_for(gguf, map_path)
    except NotRunError as e:  # named, not fitted: no map converts it
        not_run = f"{e.kind.describe()}; {e.kind.instead}"
    except Gguf2ovError as e:
        if map_path is not None:
            raise
        problems = [e.message]
    else:
        map_name = amap.path
        config = None
        try:
            config = amap.metadata.hf_config(gguf, allow_ambiguous=True)
            problems = amap.tensors.problems(gguf, config)
            if not problems and amap.target is not None:  # a target's shapes are its layer kinds'
                problems = target_problems(gguf, amap, config)
            model = (config.get("architectures") or [None])[0]
        except Gguf2ovError as e:
            problems = [e.message]
        fits = not problems
        for name in gguf.tensors:
            found = amap.tensors.match(name, config)  # with a config: the rule of the tensor's layer type
            if len(found) == 1:
                rule, n = found[0]
                hf_names[name] = rule.hf_name(n)
    return InspectResult(
        path=str(gguf.path), arch=gguf.arch, version=gguf.version, file_bytes=gguf.file_bytes,
        metadata={k: summarise(v) for k, v in gguf.metadata.items()},
        tensors=[TensorRow(t.gguf_name, t.type_name, list(t.ne), list(t.shape), t.n_bytes, hf_names.get(name))
                 for name, t in gguf.tensors.items()],
        type_counts=dict(Counter(t.type_name for t in gguf.tensors.values()).most_common()),
        map_path=map_name, map_fits=fits, map_problems=problems, model=model,
        hub=source if isinstance(source, HubFile) else None, warnings=duplicate_key_warnings(gguf), not_run=not_run,
    )

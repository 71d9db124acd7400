"""`gguf2ov inspect`: what a GGUF (or a target's checkpoint folder) holds, whether a map converts it, and
for a target the memory it will take where GenAI runs it (runtime/memory.py), before anything is built."""

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
    kind: str = "gguf"  # "gguf" | "checkpoint" (a Hugging Face folder: its config.json as metadata)
    # a target's run-time memory, planned (runtime.memory.MemoryPlan.record): bytes per form, whether it fits
    run_time_memory: dict | None = None
    memory_line: str = ""
    memory_table: Table | None = None

    def tables(self) -> list[Table]:
        if self.kind == "gguf":
            tensors = Table("Tensors", ["GGUF name", "type", "ne (stored)", "shape (PyTorch)", "bytes", "HF name"],
                            [[t.gguf_name, t.gguf_type, t.ne, t.shape, t.n_bytes, t.hf_name] for t in self.tensors])
        else:
            tensors = Table("Tensors", ["name", "dtype", "shape", "bytes"],
                            [[t.gguf_name, t.gguf_type, t.shape, t.n_bytes] for t in self.tensors])
        return [
            Table("Metadata" if self.kind == "gguf" else "config.json", ["key", "value"],
                  [[k, v] for k, v in self.metadata.items()]),
            tensors,
            Table("Tensor types", ["type", "tensors"], [[k, v] for k, v in self.type_counts.items()]),
        ] + ([self.memory_table] if self.memory_table is not None else [])

    def summary(self) -> list[str]:
        if self.kind == "checkpoint":
            return [f"{self.path}: checkpoint folder, model type {self.arch}, {len(self.tensors)} tensors, "
                    f"{human_bytes(self.file_bytes)}", f"map: {self.map_path} builds it as a target ({self.model})",
                    *([self.memory_line] if self.memory_line else [])]
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
        if self.memory_line:
            lines.append(self.memory_line)
        return lines + [f"warning: {w}" for w in self.warnings]


def _plan(source) -> dict:
    """The target's run-time memory in its default form (the GGUF's grid folded; a checkpoint's fp32) and the
    others its source can take: InspectResult's `run_time_memory`, `memory_line` and `memory_table`."""
    from ..ir.variants import Variant
    from ..runtime.memory import plan_target
    from ..targets.graph import target_forms

    plan = plan_target(target_forms(source, Variant("gguf" if source.kind == "gguf" else "fp32")))
    return {"run_time_memory": plan.record(), "memory_line": plan.line(), "memory_table": plan.table()}


def inspect_checkpoint(path) -> InspectResult:
    """A target's Hugging Face checkpoint folder: its config, its tensors, and its run-time memory planned."""
    from pathlib import Path

    import numpy as np

    from ..hf.checkpoint import Checkpoint, safetensors_files
    from ..targets.source import open_target_checkpoint

    source = open_target_checkpoint(Path(path))
    checkpoint = Checkpoint(path)  # the folder's own names and dtypes, as stored
    dtypes = {name: checkpoint.dtype(name) for name in checkpoint.shapes}
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}
    rows = [TensorRow(name, dtypes[name], list(reversed(shape)), list(shape),
                      int(np.prod(shape, dtype=np.int64)) * sizes.get(dtypes[name], 4), name)
            for name, shape in checkpoint.shapes.items()]
    c = source.config
    return InspectResult(
        path=str(path), arch=c.raw.get("model_type"), version=0,
        file_bytes=sum(f.stat().st_size for f in safetensors_files(path)),
        metadata={k: summarise(v) for k, v in c.raw.items()}, tensors=rows,
        type_counts=dict(Counter(dtypes.values()).most_common()), map_path=str(c.amap.path), map_fits=True,
        map_problems=[], model=(c.raw.get("architectures") or [None])[0], kind="checkpoint", **_plan(source))


def inspect(gguf_path, map_path=None) -> InspectResult:
    """`gguf_path` is a GGUF file, a hub name `org/repo[:QUANT]` as llama.cpp's `-hf` takes it, or a target's
    checkpoint folder."""
    from pathlib import Path

    from ..maps.load import map_for
    from ..maps.not_run import NotRunError
    from ..targets.source import open_target_gguf, target_problems

    if Path(gguf_path).is_dir() and Path(gguf_path).suffix.lower() != ".gguf":  # a checkpoint folder
        if map_path is not None:
            raise Gguf2ovError("--map applies to a GGUF file, not to a checkpoint folder", hint="leave --map out")
        return inspect_checkpoint(gguf_path)
    source = resolve_gguf(gguf_path)
    gguf = open_gguf(source, duplicate_keys=True)  # shown with a warning: inspect is where a bad file is looked at
    hf_names, problems, map_name, fits, model, not_run, planned = {}, [], None, None, None, None, {}
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
        if fits and amap.target is not None:  # a target: what running it will take here
            planned = _plan(open_target_gguf(gguf, map_path))
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
        **planned,
    )

"""`gguf2ov convert`: a GGUF draft -> a Hugging Face checkpoint folder, through the arch's map."""

import time
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType

from ..checks.taps import OffsetDecision
from ..errors import Gguf2ovError
from ..finite import nonfinite_warnings
from ..hf.write import DEFAULT_MAX_SHARD_SIZE, DTYPES, TensorSpec, checkpoint_bytes, write_checkpoint
from ..maps.rules import config_get, plain_value
from ..outputs import require_output_dir, require_space
from ..progress import step
from ..report import Table, human_bytes

_INTEGER_TYPES = {GGMLQuantizationType.I8: "I8", GGMLQuantizationType.I16: "I16",
                  GGMLQuantizationType.I32: "I32", GGMLQuantizationType.I64: "I64"}


@dataclass(frozen=True)
class TensorRow:
    hf_name: str | None
    gguf_name: str
    gguf_type: str
    shape: list[int]
    ops: list[str]


@dataclass(frozen=True)
class ConvertResult:
    gguf_path: str
    out_dir: str
    arch: str
    map_path: str
    dtype: str
    files: list[str]
    n_tensors: int
    n_bytes: int
    config: dict
    target_layer_key: str | None            # GGUF key holding target layer ids (dflash)
    target_layer_ids_declared: list[int] | None
    target_layer_ids_written: list[int] | None
    target_layer_offset: int | None         # the flag, when given
    seconds: float
    warnings: list[str]
    tensors: list[TensorRow]
    nonfinite: dict[str, int]               # tensor -> NaN/Inf values written (--allow-nonfinite)
    offset_decision: OffsetDecision | None = None  # when a target settled an ambiguous offset

    def tables(self) -> list[Table]:
        rows = [[t.hf_name or "(not written)", t.gguf_name, t.gguf_type, t.shape, ", ".join(t.ops) or "-"]
                for t in self.tensors]
        tables = [Table("Tensors", ["HF name", "GGUF name", "GGUF type", "shape", "ops"], rows)]
        return tables + (self.offset_decision.tables() if self.offset_decision is not None else [])

    def summary(self) -> list[str]:
        lines = [f"converted {self.gguf_path} ({self.arch}, map {self.map_path}) -> {self.out_dir}: "
                 f"{self.n_tensors} tensors, {human_bytes(self.n_bytes)} as {self.dtype}, {self.seconds:.1f} s"]
        if self.target_layer_key:
            how = "measured by the tap scan" if self.offset_decision is not None else \
                "from --target-layer-offset" if self.target_layer_offset is not None else "from the map"
            lines.append(f"target layers: the file declares {self.target_layer_key} = "
                         f"{self.target_layer_ids_declared}; written dflash_config.target_layer_ids = {self.target_layer_ids_written} (offset {how})")
        if self.offset_decision is not None:
            lines += self.offset_decision.summary()
        lines += [f"warning: {w}" for w in self.warnings]
        return lines

    def nonfinite_warnings(self) -> list[str]:
        return nonfinite_warnings(self.nonfinite)


def checkpoint_specs(mapped, dtype: str) -> list[TensorSpec]:
    """The tensors `convert` writes for a GGUF read through its map, at `dtype` (integer tensors as they are)."""
    return [TensorSpec(e.hf_name, e.shape, _INTEGER_TYPES.get(e.qtype, DTYPES[dtype][0]),
                       source=f"{e.gguf_name}, {e.qtype.name}") for e in mapped.plan if e.hf_name is not None]


def convert(source, out_dir, dtype: str = "bf16", overwrite: bool = False, progress: bool = True,
            max_shard_size: int = DEFAULT_MAX_SHARD_SIZE, allow_nonfinite: bool = False, offset_decision=None,
            before_commit=None) -> ConvertResult:
    """Convert `source` (a GGUF read through its map: maps.load.MappedGguf) into a Hugging Face
    checkpoint folder, put in place only when complete.

    `offset_decision`: the tap scan that chose the target layer offset, when one did (recorded).
    `before_commit(result)` runs before the folder is put in place (the command writes its reports
    there, so that a report that cannot be written leaves no checkpoint behind)."""
    start = time.perf_counter()
    if dtype not in DTYPES:
        raise Gguf2ovError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if max_shard_size < 1:
        raise Gguf2ovError(f"--max-shard-size must be a positive number of bytes, not {max_shard_size}")
    mapped = source
    gguf, amap, config, plan = mapped.gguf, mapped.amap, mapped.config, mapped.plan
    require_output_dir(Path(out_dir), overwrite, inputs=(gguf.path,))
    target_layer_offset = mapped.target_layer_offset
    flagged = amap.metadata.flag_rule("target_layer_offset")
    dropped = [e.gguf_name for e in plan if e.hf_name is None]
    warnings = [f"not written (the HF model has no such tensor): {', '.join(dropped)}"] if dropped else []
    written = [e for e in plan if e.hf_name is not None]
    specs = checkpoint_specs(mapped, dtype)
    require_space(out_dir, checkpoint_bytes(specs, max_shard_size), f"the {dtype} checkpoint",
                  hint="write to another folder (-o), or convert with a smaller --dtype (bf16 or f16: half of f32)")
    step(f"{gguf.path.name}: {amap.arch}, {len(written)} tensors -> {out_dir}", enabled=progress)
    hf_key, gguf_key = flagged or (None, None)
    done = []

    def finish(result):
        done.append(ConvertResult(
            gguf_path=str(gguf.path), out_dir=str(out_dir), arch=amap.arch, map_path=str(amap.path), dtype=dtype,
            files=result.files, n_tensors=result.n_tensors, n_bytes=result.n_bytes, config=config,
            target_layer_key=gguf_key,
            target_layer_ids_declared=plain_value(gguf.get(gguf_key)) if gguf_key else None,
            target_layer_ids_written=config_get(config, hf_key) if hf_key else None,
            target_layer_offset=target_layer_offset, seconds=time.perf_counter() - start, warnings=warnings,
            tensors=[TensorRow(e.hf_name, e.gguf_name, e.qtype.name, list(e.shape),
                               [f"{name} {arg}" for name, arg in e.ops]) for e in plan],
            nonfinite=dict(result.nonfinite), offset_decision=offset_decision))
        if before_commit is not None:
            before_commit(done[0])

    write_checkpoint(
        out_dir, config, specs,
        ((name, x) for name, x, _, _ in mapped.tensors()),
        provenance=_provenance(gguf, amap.path, dtype, target_layer_offset,
                               {e.hf_name: e.qtype.name for e in written}, offset_decision),
        max_shard_size=max_shard_size, overwrite=overwrite, progress=progress, allow_nonfinite=allow_nonfinite,
        before_commit=finish)
    return done[0]


def _provenance(gguf, map_path, dtype, target_layer_offset, qtypes: dict, offset_decision=None) -> dict:
    from ..provenance import provenance

    options = {"map": str(map_path), "dtype": dtype, "target_layer_offset": target_layer_offset}
    if offset_decision is not None:
        options["target_layer_offset_measured"] = offset_decision.record()
    record = provenance(sources={"gguf": gguf}, options=options)
    return {**record, "qtypes": qtypes}  # lets `check` name the quant type of each tensor of the folder



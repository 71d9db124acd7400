"""`gguf2ov convert`: a GGUF draft -> a Hugging Face checkpoint folder, through the arch's map."""

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType

from .check import add_convert_arguments, check_after_convert
from .errors import Gguf2ovError, printable
from .map_rules import config_get, plain_value
from .maps import open_mapped
from .outputs import require_output_dir, require_output_file
from .progress import step
from .report import Table, add_output_arguments, emit, human_bytes, report_path, stdout_is_report, write_reports
from .taps import OffsetDecision
from .write import DEFAULT_MAX_SHARD_SIZE, DTYPES, TensorSpec, write_checkpoint

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
        return [f"{name} was written with {count} NaN or Inf values (--allow-nonfinite): a model loading it "
                f"computes NaN" for name, count in self.nonfinite.items()]


def convert(gguf_path, out_dir, map_path=None, dtype: str = "bf16", target_layer_offset: int | None = None,
            overwrite: bool = False, progress: bool = True, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
            allow_nonfinite: bool = False, json_path=None, target_dir=None, prompts=None,
            offset_decision=None, markdown_path=None) -> ConvertResult:
    """Convert, and write the JSON and Markdown reports to `json_path` / `markdown_path` (if given)
    before the checkpoint is put in place: a report that cannot be written leaves no checkpoint behind.

    `target_dir` settles an ambiguous target layer offset by measurement (`taps.settle_offset`)
    when no `target_layer_offset` is given; `offset_decision` is one already made by the caller."""
    start = time.perf_counter()
    if dtype not in DTYPES:
        raise Gguf2ovError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if max_shard_size < 1:
        raise Gguf2ovError(f"--max-shard-size must be a positive number of bytes, not {max_shard_size}")
    require_output_dir(Path(out_dir), overwrite, inputs=(getattr(gguf_path, "path", gguf_path), map_path))
    require_output_file(json_path)
    require_output_file(markdown_path)
    if target_layer_offset is None and offset_decision is None and target_dir is not None:
        from .read import GgufFile, open_gguf
        from .taps import settle_offset

        gguf_path = gguf_path if isinstance(gguf_path, GgufFile) else open_gguf(gguf_path)
        offset_decision = settle_offset(gguf_path, target_dir, map_path, prompts, progress)
    if offset_decision is not None:
        target_layer_offset = offset_decision.offset
    mapped = open_mapped(gguf_path, map_path, target_layer_offset)
    gguf, amap, config, plan = mapped.gguf, mapped.amap, mapped.config, mapped.plan
    flagged = amap.flag_rule("target_layer_offset")
    dropped = [e.gguf_name for e in plan if e.hf_name is None]
    warnings = [f"not written (the HF model has no such tensor): {', '.join(dropped)}"] if dropped else []
    written = [e for e in plan if e.hf_name is not None]
    specs = [TensorSpec(e.hf_name, e.shape, _INTEGER_TYPES.get(e.qtype, DTYPES[dtype][0]),
                        source=f"{e.gguf_name}, {e.qtype.name}") for e in written]
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
        write_reports(done[0], json_path=json_path, markdown_path=markdown_path, title="gguf2ov convert")

    write_checkpoint(
        out_dir, config, specs,
        ((name, x) for name, x, _, _ in mapped.tensors()),
        provenance=_provenance(gguf, map_path or amap.path, dtype, target_layer_offset,
                               {e.hf_name: e.qtype.name for e in written}, offset_decision),
        max_shard_size=max_shard_size, overwrite=overwrite, progress=progress, allow_nonfinite=allow_nonfinite,
        before_commit=finish)
    return done[0]


def _provenance(gguf, map_path, dtype, target_layer_offset, qtypes: dict, offset_decision=None) -> dict:
    from .provenance import provenance

    options = {"map": str(map_path), "dtype": dtype, "target_layer_offset": target_layer_offset}
    if offset_decision is not None:
        options["target_layer_offset_measured"] = offset_decision.record()
    record = provenance(sources={"gguf": gguf}, options=options)
    return {**record, "qtypes": qtypes}  # lets `check` name the quant type of each tensor of the folder


def configure_parser(parser) -> None:
    parser.add_argument("gguf", metavar="FILE.gguf", help="the GGUF file to convert")
    parser.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="output checkpoint folder")
    parser.add_argument("--map", metavar="FILE", help="tensor map YAML (default: the shipped map for the file's arch)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="tensor dtype in the checkpoint")
    parser.add_argument("--target-layer-offset", type=int, metavar="N",
                        help="dflash: HF target_layer_ids = GGUF dflash.target_layers + N (current llama.cpp: -1; "
                             "its first DFlash converter: 0); required when the file looks like the old layout")
    parser.add_argument("--max-shard-size", type=int, default=DEFAULT_MAX_SHARD_SIZE, metavar="BYTES",
                        help="split safetensors files above this size (default 5e9, like transformers)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="write tensors that hold NaN or Inf values (with a warning) instead of failing")
    parser.add_argument("--target", metavar="TARGET_DIR",
                        help="dflash: the target's OpenVINO folder; settles an ambiguous target layer offset by "
                             "measuring which layers the draft fits (the tap scan)")
    from .genai import add_prompt_arguments

    add_prompt_arguments(parser)
    add_convert_arguments(parser)  # --reference REF_DIR [--min-corr R]: check the result afterwards
    add_output_arguments(parser, inputs=("gguf", "map", "target", "reference", "prompts", "image"),
                         outputs=("output",))


def cli(args) -> int:
    from .genai import prompts_from_args

    result = convert(args.gguf, args.output, map_path=args.map, dtype=args.dtype,
                     target_layer_offset=args.target_layer_offset, overwrite=args.overwrite,
                     progress=not args.quiet, max_shard_size=args.max_shard_size,
                     allow_nonfinite=args.allow_nonfinite, target_dir=args.target,
                     prompts=prompts_from_args(args, default=None),
                     json_path=report_path(args, "json"), markdown_path=report_path(args, "markdown"))
    # the reports were written before the checkpoint was put in place; stdout shows the summary
    emit(result, args, text=_summary_text(result), files=False)
    for line in result.nonfinite_warnings():  # on stderr even under --quiet: the checkpoint computes NaN
        print(f"warning: {printable(line)}", file=sys.stderr)
    # with --json - / --markdown -, stdout holds that document only: the check's table goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if stdout_is_report(args) else contextlib.nullcontext():
        return check_after_convert(args, result.out_dir)


def _summary_text(result: ConvertResult) -> str:
    return "\n".join(printable(line) for line in result.summary()) + "\n"

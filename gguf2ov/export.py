"""Export a DFlash draft (a dflash GGUF or a checkpoint folder) to a stateful OpenVINO IR draft.

The graph is built directly with OpenVINO's opset (draft_graph.py), the same graph optimum-intel
exports for its `Qwen3DFlashForCausalLM` (the one class whose forward drops the seed row, so that
the emitted hidden states line up with the candidate tokens GenAI scores with the target's
lm_head). Each weight goes once from the opened source into the IR in the form its variant stores,
so exporting a 1 B draft needs no float32 copy of it, and no PyTorch model. What an export from
optimum's trace could get silently wrong is refused here:

- the tensor names and shapes are compared with the draft model exactly before anything is built
  (`load_state_dict(strict=False)` keeps random weights for misnamed keys: a `model.` prefix);
- the graph is always stateful with `beam_idx` (a stateless draft recomputes its context and is
  never accepted);
- the three rt_info keys GenAI reads are always written.

`build_draft_ir()` returns the `ov.Model` before anything is saved.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from .draft_graph import write_draft_ir
from .errors import Gguf2ovError
from .names import PROVENANCE_FILE
from .outputs import atomic_dir, atomic_write_text, require_output_dir
from .progress import step
from .provenance import provenance
from .report import Table, human_bytes
from .source import SELECTOR_LEFT_OUT, SELECTOR_PREFIX, DraftSource, is_gguf, open_draft
from .taps import OffsetDecision
from .verify import VerifyResult


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    source: str
    source_kind: str  # "gguf" | "checkpoint"
    weight_format: str
    hidden_size: int
    num_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    inputs: list[list[str]]  # [name, partial shape, element type]
    outputs: list[list[str]]
    state_variables: int
    rt_info: dict[str, str]
    files: dict[str, int]
    ignored_keys: list[str]
    seconds: float
    verify: VerifyResult | None = field(default=None)
    dflash_version: int = 1
    causal_layers: list[int] = field(default_factory=list)  # layers whose block rows see only earlier rows
    # DFlash 2: what GenAI cannot run and the IR therefore leaves out
    left_out: list[str] = field(default_factory=list)
    offset_decision: OffsetDecision | None = None  # when a target settled an ambiguous offset

    def tables(self) -> list[Table]:
        io_rows = [["input", *row] for row in self.inputs] + [["output", *row] for row in self.outputs]
        tables = [
            Table("Draft IR interface", ["kind", "name", "shape", "type"], io_rows,
                  note=f"{self.state_variables} state variables"),
            Table("Draft rt_info", ["key", "value"], [[k, v] for k, v in self.rt_info.items()]),
            Table("Files", ["file", "size"], [[k, human_bytes(v)] for k, v in self.files.items()]),
        ]
        if self.offset_decision is not None:
            tables += self.offset_decision.tables()
        if self.verify is not None:
            tables += self.verify.tables()
        return tables

    def summary(self) -> list[str]:
        lines = [
            f"exported {self.source} ({self.source_kind}) -> {self.out_dir} as {self.weight_format} "
            f"in {self.seconds:.1f} s",
            f"draft: {self.num_layers} layers, hidden {self.hidden_size}, target layers "
            f"{self.target_layer_ids}, mask token {self.mask_token_id}",
        ]
        borrowed = [k for k in self.ignored_keys if k not in self.left_out]
        if borrowed:
            lines.append(f"not exported (GenAI uses the target's): {', '.join(borrowed)}")
        if self.causal_layers:
            lines.append(f"layers {self.causal_layers} attend causally inside the block: sliding layers of a config "
                         "without is_causal, as z-lab's reference runs them (optimum-intel's export attends both ways)")
        if self.dflash_version == 2:
            lines.append(f"DFlash 2: {4 * self.num_layers} dynamic convolutions exported (4 per layer). "
                         + SELECTOR_LEFT_OUT)
        if self.offset_decision is not None:
            lines += self.offset_decision.summary()
        if self.verify is not None:
            lines += self.verify.summary()
        return lines


# --- the stage ------------------------------------------------------------------------------------


def export_draft(source, out_dir, weight_format: str = "fp32", overwrite: bool = False, progress: bool = True,
                 run_verify: bool = True, target_layer_offset: int | None = None, map_path=None,
                 group_size: int | None = None, sym: bool = False, ratio: float | None = None,
                 all_layers: bool = False, variant=None, observe=None, target_dir=None, prompts=None) -> ExportResult:
    """Export `source` (a path, or a DraftSource opened once by the caller) as one variant.

    `target_dir`: a GGUF whose target layer offset is ambiguous is settled by measurement against it
    (`taps.settle_offset`), and the verification includes the target checks and the tap scan.

    `observe(name, output, values)` sees each weight as it is made (drift measures it there).
    """
    from .variants import variant_from_flags

    out_dir = Path(out_dir)
    decision = None
    variant = variant or variant_from_flags(weight_format, group_size, sym, ratio, all_layers)
    if isinstance(source, DraftSource):
        draft = source
        require_output_dir(out_dir, overwrite, inputs=(draft.path, map_path))
    else:
        source = Path(source)
        if not source.exists():
            raise Gguf2ovError(f"{source} does not exist")
        if variant.weight_format == "gguf" and not is_gguf(source):
            raise Gguf2ovError("--weight-format gguf carries the GGUF's own quantization grid: the source must be a GGUF file")
        require_output_dir(out_dir, overwrite, inputs=(source, map_path, target_dir))  # before the file is read
        if target_layer_offset is None and target_dir is not None and is_gguf(source):
            from .read import open_gguf
            from .taps import settle_offset

            source = open_gguf(source)
            decision = settle_offset(source, target_dir, map_path, prompts, progress)
            if decision is not None:
                target_layer_offset = decision.offset
        draft = open_draft(source, map_path, target_layer_offset)

    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        info, forms = write_draft_ir(draft, tmp, variant, progress, observe)
        options = {"weight_format": variant.weight_format, "variant": variant.name,
                   "target_layer_offset": target_layer_offset, "map": str(map_path) if map_path else None,
                   **({"target_layer_offset_measured": decision.record()} if decision is not None else {}),
                   "source_kind": draft.kind, "transcoded": len(forms.transcoded),
                   "nncf_backup": sorted(n for n, s in forms.plan.items() if s.backup)}
        atomic_write_text(tmp / PROVENANCE_FILE, json.dumps(provenance({"source": draft}, options), indent=2) + "\n")

        verified = None
        if run_verify:
            from .verify import verify_draft

            step("verifying the exported draft against the source, layer by layer", progress)
            verified = verify_draft(tmp, reference=draft, target_dir=target_dir, prompts=prompts)
            if not verified.ok:
                failed = "; ".join(f"{c.name}: {c.reason}" for c in verified.checks if c.status == "fail")
                raise Gguf2ovError(f"the exported draft fails verification: {failed}",
                                   hint="nothing was written; rerun with --debug to inspect")
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    config = draft.config
    return ExportResult(
        out_dir=str(out_dir), source=str(draft.path), source_kind=draft.kind, weight_format=variant.name,
        hidden_size=config.hidden_size, num_layers=config.num_layers, target_layer_ids=config.target_layer_ids,
        mask_token_id=config.mask_token_id, inputs=info["inputs"], outputs=info["outputs"],
        state_variables=info["state_variables"], rt_info=info["rt_info"], files=files, ignored_keys=draft.ignored,
        seconds=time.perf_counter() - start, dflash_version=2 if config.is_dflash2 else 1,
        causal_layers=[i for i, causal in enumerate(config.causal_layers) if causal],
        left_out=[k for k in draft.ignored if k.startswith(SELECTOR_PREFIX)],
        verify=_relocated(verified, out_dir, draft.path), offset_decision=decision,
    )


def _relocated(verified, out_dir, reference):
    """The verify result as seen from the final folder (the temporary paths are gone)."""
    import dataclasses

    if verified is None:
        return None
    return dataclasses.replace(verified, draft_dir=str(out_dir), checkpoint_dir=str(reference))


# --- command line ---------------------------------------------------------------------------------


def configure_parser(parser) -> None:
    parser.add_argument("source", help="a dflash GGUF, or a draft checkpoint folder (config.json + model.safetensors)")
    parser.add_argument("-o", "--output", required=True, help="output folder for the OpenVINO draft")
    parser.add_argument("--weight-format", choices=("fp32", "fp16", "int8", "int4", "gguf"), default="fp32",
                        help="fp32; fp16 (constants stored as fp16); int8 (per channel) or int4 (grouped) with "
                             "NNCF; gguf: the GGUF's own codes and scales carried into the IR")
    parser.add_argument("--group-size", type=int, help="int4 group size (default 16: a Q4_K sub-block holds two)")
    sym = parser.add_mutually_exclusive_group()
    sym.add_argument("--sym", action="store_true", help="symmetric int8/int4 (default asymmetric, as optimum-cli)")
    sym.add_argument("--asym", action="store_true", help="asymmetric int8/int4 (the default)")
    parser.add_argument("--ratio", type=float, help="int4: share of weights in int4, the rest int8 (default 1.0)")
    parser.add_argument("--all-layers", action="store_true",
                        help="int4: also the last MatMul, which NNCF otherwise keeps in int8")
    parser.add_argument("--map", help="tensor map YAML for a GGUF source (default: the shipped map)")
    parser.add_argument("--target-layer-offset", type=int, default=None,
                        help="GGUF only: offset applied to dflash.target_layers (see `gguf2ov convert`)")
    parser.add_argument("--target", metavar="TARGET_DIR",
                        help="the target's OpenVINO folder: settles an ambiguous GGUF's target layer offset by "
                             "measurement (the tap scan), and verify checks the draft against it")
    from .genai import add_prompt_arguments

    add_prompt_arguments(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    from .report import add_output_arguments

    add_output_arguments(parser, inputs=("source", "map", "target", "prompts", "image"), outputs=("output",))


def cli(args) -> int:
    from .genai import prompts_from_args
    from .report import emit

    result = export_draft(args.source, args.output, weight_format=args.weight_format, overwrite=args.overwrite,
                          progress=not args.quiet, target_layer_offset=args.target_layer_offset, map_path=args.map,
                          group_size=args.group_size, sym=args.sym, ratio=args.ratio, all_layers=args.all_layers,
                          target_dir=args.target, prompts=prompts_from_args(args, default=None))
    return emit(result, args, title="Draft export")

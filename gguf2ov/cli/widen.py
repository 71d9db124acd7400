"""`gguf2ov widen-target TARGET_HF -o DIR`: a heavier copy of a target computing the same function.

The widened checkpoint is written in NumPy (tools/widen.py); the target stage builds it, and the
original, as f32 OpenVINO targets (`stages.target.export_target`), and the two are compared on the
logits and on every hidden state a draft can read before the folder is put in place.
"""

import json
import shutil
import time
from pathlib import Path

from ..errors import Gguf2ovError
from ..names import IR_XML, PROVENANCE_FILE
from ..outputs import atomic_dir, atomic_write_text, require_output_dir
from ..progress import step
from ..provenance import provenance
from ..job import Job, Options
from ..sources import CheckpointSpec, TargetBuild
from ..tools.widen import (DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE, MOE_EXTRA_LAYERS, MOE_INTERMEDIATE_SIZE,
                           TOLERANCE, WidenResult, ir_summary, read_widening, same_function, widened_config,
                           write_widened_checkpoint)
from .output import add_output_arguments, emit

HELP = "a heavier copy of a Qwen3, Qwen3.5 (hybrid) or Qwen3-MoE target computing the same function, for speed runs"
WEIGHT_FORMAT = "fp32"  # f32 constants: GenAI's f32 runs of both targets give the same tokens


def configure_parser(parser) -> None:
    parser.add_argument("target_hf", help="the target's Hugging Face folder (qwen3, qwen3_5_text or qwen3_moe: "
                                          "config.json, safetensors, tokenizer)")
    parser.add_argument("-o", "--output", required=True, help="folder for the widened OpenVINO target")
    parser.add_argument("--extra-layers", type=int,
                        help=f"decoder layers appended as exact no-ops (default {DEFAULT_EXTRA_LAYERS}; "
                             f"{MOE_EXTRA_LAYERS} for a mixture of experts)")
    parser.add_argument("--intermediate-size", type=int,
                        help=f"MLP width after zero padding, each expert's in a mixture of experts (default "
                             f"{DEFAULT_INTERMEDIATE_SIZE}; {MOE_INTERMEDIATE_SIZE} for a mixture of experts)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    add_output_arguments(parser, inputs=("target_hf",), outputs=("output",))


def main(args) -> int:
    result = widen_target(args.target_hf, args.output, extra_layers=args.extra_layers,
                          intermediate_size=args.intermediate_size, overwrite=args.overwrite, progress=not args.quiet)
    return emit(result, args)


def widen_target(
    target_hf_dir,
    out_dir,
    extra_layers: int | None = None,
    intermediate_size: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> WidenResult:
    """Widen an HF target (tools.widen.WIDENED_TYPES), build it for OpenVINO GenAI and check it computes the
    original's function. `extra_layers` and `intermediate_size` default to the MLP kind's (tools.widen.MLP_WIDTHS).

    `out_dir` gets what `gguf2ov target` writes for a checkpoint: openvino_model.xml/.bin (f32, with
    hidden_states_decoder_layers), the OpenVINO tokenizer and detokenizer with the Hugging Face
    tokenizer files, config.json (the widened one), generation_config.json and gguf2ov.json.
    """
    target_hf_dir, out_dir = Path(target_hf_dir), Path(out_dir)
    widening = read_widening(target_hf_dir)
    extra_layers = widening.width.extra_layers if extra_layers is None else extra_layers  # the MLP kind's default
    intermediate_size = widening.width.intermediate_size if intermediate_size is None else intermediate_size
    widened_config(widening, extra_layers, intermediate_size)  # a size that cannot pad is refused before any work
    require_output_dir(out_dir, overwrite, inputs=(target_hf_dir,))
    n_layers, inter = widening.layers, widening.intermediate_size

    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite, inputs=(target_hf_dir,)) as tmp:
        scratch = tmp / ".scratch"
        step(f"widening {target_hf_dir}: +{extra_layers} layers, {widening.width.key} {intermediate_size}", progress)
        written = write_widened_checkpoint(target_hf_dir, scratch / "hf", extra_layers, intermediate_size)
        step(f"building the original target ({WEIGHT_FORMAT}) to compare with", progress)
        _build_target(target_hf_dir, scratch / "original")
        step(f"building the widened target ({WEIGHT_FORMAT})", progress)
        built = _build_target(scratch / "hf", scratch / "target")
        step("comparing the widened target with the original", progress)
        diffs = same_function(scratch / "original", scratch / "target", n_layers, widening.target.vocab_size)
        if not max(diffs.values()) < TOLERANCE:
            bad = ", ".join(f"{k} {v:.2e}" for k, v in diffs.items() if not v < TOLERANCE)
            raise Gguf2ovError(f"the widened target does not compute the original's function: {bad}")

        for f in sorted((scratch / "target").iterdir()):
            f.rename(tmp / f.name)
        shutil.rmtree(scratch)
        n_locators, weight_types = ir_summary(tmp / IR_XML)
        if set(weight_types) - {"f32", "i64", "i32"}:
            raise Gguf2ovError(f"the widened target's weights are {weight_types}, not f32",
                               hint="f32 runs would not be exact")
        options = {"extra_layers": extra_layers, "intermediate_size": intermediate_size,
                   "weight_format": built.weight_format, "max_abs_diff": diffs}
        atomic_write_text(tmp / PROVENANCE_FILE,
                          json.dumps(provenance({"target_hf": target_hf_dir}, options), indent=2) + "\n")
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    return WidenResult(
        out_dir=str(out_dir), source=str(target_hf_dir), layers=(n_layers, n_layers + extra_layers),
        intermediate_size=(inter, intermediate_size), parameters=written["parameters"], max_abs_diff=diffs,
        locators=n_locators, weight_types=weight_types, files=files, seconds=time.perf_counter() - start,
        width_key=widening.width.key,
    )


def _build_target(hf_dir: Path, out: Path):
    """The f32 OpenVINO target of a checkpoint folder, as `gguf2ov target` builds it."""
    from ..ir.variants import parse_variant

    build = TargetBuild(CheckpointSpec(hf_dir), parse_variant(WEIGHT_FORMAT))
    return Job(target_spec=build, options=Options(progress=False)).build_target(out)

"""`gguf2ov target SOURCE -o DIR`: a DFlash-ready OpenVINO target built from a GGUF or a Hugging
Face checkpoint, weight by weight."""

import sys

from ..errors import printable
from ..finite import nonfinite_warnings
from ..ir.variants import GROUP_FALLBACKS, TARGET_GROUP_FALLBACK, TARGET_GROUP_SIZE
from ..ir.weights import GRIDS
from ..job import Job, Options
from ..sources import model_source
from . import args as a
from .output import add_output_arguments, emit

HELP = "build a DFlash-ready OpenVINO target from a GGUF or a checkpoint, weight by weight"


def configure_parser(parser) -> None:
    from ..targets.config import target_arches

    parser.add_argument("source", help=f"a target GGUF ({', '.join(target_arches())}), " + a.HUB_NAME + ", or a "
                                       "Hugging Face checkpoint folder")
    parser.add_argument("-o", "--output", required=True, help="output folder for the OpenVINO target")
    a.weight_format_arguments(parser, TARGET_GROUP_SIZE, default=None,
                              default_text="gguf for a GGUF source, fp32 for a checkpoint")
    parser.add_argument("--group-size-fallback", choices=GROUP_FALLBACKS, default=TARGET_GROUP_FALLBACK,
                        help="int4, a weight whose input width the group size does not divide: adjust (the default: "
                             "the largest power of two that divides it, at least 32, else int8, as NNCF's ADJUST) "
                             "or error (refused, optimum-cli's default)")
    parser.add_argument("--tokenizer", metavar="DIR",
                        help="the model's Hugging Face tokenizer folder (default: the checkpoint's own, or the "
                             "GGUF's vocabulary)")
    parser.add_argument("--grid", choices=GRIDS, default="folded",
                        help="how gguf weights carry the file's grid: folded (scales and zero points multiplied out, "
                             "the CPU plugin's f32 path; the default), split (a K-quant's minimum apart: its int8 "
                             "path, a cheaper verify, but a pair's text may part from the target's alone) or compact (the file's own factorisation: IR 1.00x the GGUF's tensor bytes, "
                             "but ~1.5x the memory where it runs)")
    parser.add_argument("--compact-grid", dest="grid", action="store_const", const="compact",
                        help="the same as --grid compact")
    a.mmproj_arguments(parser)
    a.map_arguments(parser, offset=False)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="write weights that hold NaN or Inf values (with a warning) instead of failing")
    add_output_arguments(parser, inputs=("source", "map", "tokenizer", "mmproj"), outputs=("output",))


def main(args) -> int:
    build = a.target_build(args.weight_format, args.group_size, args.sym, args.ratio, args.all_layers,
                           args.grid, args.tokenizer, args.map, args.allow_nonfinite, args.mmproj,
                           args.image_max_tokens, args.group_size_fallback)
    job = Job(target_spec=build(model_source(args.source, "target")), options=Options(progress=not args.quiet))
    result = job.build_target(args.output, overwrite=args.overwrite)
    code = emit(result, args, title="gguf2ov target")
    for line in nonfinite_warnings(result.nonfinite):  # on stderr even under --quiet: the target computes NaN
        print(f"warning: {printable(line)}", file=sys.stderr)
    return code

"""`gguf2ov export SOURCE -o DIR`: the stateful DFlash draft IR of one variant, verified against its
source (and a target) before it is put in place."""

from pathlib import Path

from ..errors import Gguf2ovError
from ..job import Job
from ..ir.variants import DEFAULT_GROUP_SIZE, require_source_for
from ..outputs import require_output_dir
from . import args as a
from .output import add_output_arguments, emit

HELP = "export a stateful DFlash draft IR, weight by weight, and verify it"


def configure_parser(parser) -> None:
    a.source_argument(parser)
    parser.add_argument("-o", "--output", required=True, help="output folder for the OpenVINO draft")
    a.weight_format_arguments(parser, DEFAULT_GROUP_SIZE)
    a.map_arguments(parser)
    a.target_argument(parser, help="settles an ambiguous GGUF's target layer offset by measurement (the tap "
                                   "scan), and verify checks the draft against it")
    a.draft_head_argument(parser)
    a.prompt_arguments(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    add_output_arguments(parser, inputs=("source", "map", "target", "prompts", "image"), outputs=("output",))


def main(args) -> int:
    variant = a.variant_from_args(args, DEFAULT_GROUP_SIZE)
    job = Job.from_args(args)
    if args.draft_head not in ("auto", "graft") and not args.target:
        raise Gguf2ovError(f"--draft-head {args.draft_head} copies the target's embedding and lm_head: it needs --target")
    require_source_for(variant, job.draft_spec.kind)
    # before the source is read
    require_output_dir(Path(args.output), args.overwrite, inputs=(job.draft_spec.path, args.map, args.target))
    result = job.export(args.output, variant, overwrite=args.overwrite)
    return emit(result, args, title="Draft export")

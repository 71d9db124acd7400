"""`gguf2ov drift SOURCE -o DIR`: every variant of the draft, with its size, weight and output drift."""

from pathlib import Path

from ..job import Job
from ..ir.variants import parse_variant
from ..outputs import require_output_dir
from ..report import render
from . import args as a
from .output import add_output_arguments, emit

HELP = "requantize a draft in several variants and report size and drift"


def configure_parser(parser) -> None:
    a.source_argument(parser)
    parser.add_argument("-o", "--output", required=True, help="folder for the variants and drift.json/md/png")
    parser.add_argument("--variants", help="comma-separated, e.g. fp32,int8,int4_sym_g16,gguf (default: all of "
                                           "fp32, int8, int4 sym/asym at group 16/32/128, gguf, less those this draft "
                                           "cannot take, which the table names)")
    a.target_argument(parser, help="contexts from its hidden states, proposals through its lm_head")
    a.prompt_arguments(parser)  # image prompts count for --accept only: contexts come from text
    parser.add_argument("--accept", action="store_true", help="with --target: also run an acceptance run per variant")
    a.acceptance_arguments(parser, device_help="device of the acceptance runs")
    a.map_arguments(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    add_output_arguments(parser, inputs=("source", "target", "map", "prompts", "image"), outputs=("output",))


def main(args) -> int:
    from ..stages.drift import plan_variants

    a.require_target_with(args, "--accept")
    variants = a.parse_list(args.variants)
    for name in variants or ():
        parse_variant(name)  # a bad name fails before any work
    job = Job.from_args(args)
    plan_variants(job.shaped_draft, variants)  # so does a variant named that this draft cannot take
    job.target  # noqa: B018  a target that cannot be used fails before minutes of export
    require_output_dir(Path(args.output), args.overwrite, inputs=(args.source, args.target, args.map))
    result = job.drift(args.output, variants=variants, accept=args.accept, overwrite=args.overwrite)
    return emit(result, args, title="gguf2ov drift", text=render(result, "text", title="gguf2ov drift") + "\n",
                code=0 if all(v.verified is not False for v in result.variants) else 1)

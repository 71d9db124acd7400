"""`gguf2ov check SOURCE --reference REF`: every tensor correlated against reference weights, with a
diagnosis; with a target, the tap scan of the source."""

from pathlib import Path

from ..job import Job
from ..report import render
from ..stages.check import TerminalView
from . import args as a
from .output import add_output_arguments, emit

HELP = "correlate a GGUF or checkpoint against reference weights, with a diagnosis"


def configure_parser(parser) -> None:
    a.source_argument(parser, what="the source to check (a GGUF, or a folder `convert` wrote)")
    parser.add_argument("--reference", type=Path, required=True, metavar="REF_DIR",
                        help="a Hugging Face checkpoint folder (config.json + safetensors) to compare against")
    a.min_corr_argument(parser)
    a.map_arguments(parser)
    a.target_argument(parser, help="also measure which of its layers the draft fits (the tap scan)")
    a.prompt_arguments(parser)
    # the files hold the full report; the terminal shows the worst tensors
    add_output_arguments(parser, inputs=("source", "reference", "map", "target", "prompts", "image"))


def main(args) -> int:
    result = Job.from_args(args).check(args.reference, min_corr=args.min_corr)
    return emit(result, args, title="gguf2ov check", text=render(TerminalView(result), "text", title=result.title),
                code=0 if result.passed else 1)

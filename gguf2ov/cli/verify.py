"""`gguf2ov verify DRAFT_DIR`: an exported draft IR against the DFlash contract, its source and a target."""

from ..errors import Gguf2ovError
from ..job import Job
from . import args as a
from .output import add_output_arguments, emit

HELP = "check an exported draft IR against the DFlash contract"


def configure_parser(parser) -> None:
    parser.add_argument("draft_dir", help="folder with the draft's openvino_model.xml/.bin")
    a.target_argument(parser, help="the draft's geometry is checked against it")
    parser.add_argument("--checkpoint", metavar="SOURCE",
                        help="the checkpoint folder or dflash GGUF the IR came from: checkpoint-match compares their "
                             f"functions (a GGUF may be {a.HUB_NAME})")
    parser.add_argument("--layers", action="append", default=[], metavar="IDS",
                        help="with --target: a further set of target layer ids for the tap scan to score, "
                             "comma-separated (repeatable)")
    parser.add_argument("--no-tap-scan", action="store_true",
                        help="with --target: skip the tap scan (which runs the target and the draft)")
    a.prompt_arguments(parser)
    add_output_arguments(parser, inputs=("draft_dir", "target", "checkpoint", "prompts", "image"))


def parse_layer_sets(values) -> list[list[int]]:
    try:
        return [[int(x) for x in v.split(",") if x.strip()] for v in values]
    except ValueError as e:
        raise Gguf2ovError(f"--layers takes comma-separated integers: {e}") from e


def main(args) -> int:
    named = parse_layer_sets(args.layers)
    job = Job.from_args(args, source="checkpoint" if args.checkpoint else None)
    result = job.verify(args.draft_dir, tap_scan=not args.no_tap_scan, named=named)
    return emit(result, args, title="DFlash draft verification", code=0 if result.ok else 1)

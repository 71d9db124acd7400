"""`gguf2ov inspect FILE.gguf`: what a GGUF holds, and whether a map converts it."""

import sys

from ..errors import printable
from ..stages.inspect import inspect
from . import args as a
from .output import add_output_arguments, emit, stdout_is_report

HELP = "show a GGUF's architecture, metadata, tensors and the map that applies"


def configure_parser(parser) -> None:
    a.source_argument(parser, "gguf", checkpoint=False, what="the GGUF to inspect")
    a.map_arguments(parser, offset=False)
    add_output_arguments(parser, inputs=("gguf", "map"))


def main(args) -> int:
    result = inspect(args.gguf, map_path=args.map)
    code = emit(result, args)
    if args.quiet or stdout_is_report(args):  # the summary's warning lines are not on stdout: stderr has them
        for line in result.warnings:
            print(f"warning: {printable(line)}", file=sys.stderr)
    return code

"""`gguf2ov inspect FILE.gguf`: what a GGUF (or a target's checkpoint folder) holds, whether a map converts it,
and for a target the memory it will take where GenAI runs it."""

import sys

from ..errors import printable
from ..stages.inspect import inspect
from . import args as a
from .output import add_output_arguments, emit, stdout_is_report

HELP = "show a GGUF's architecture, metadata, tensors, the map that applies, and a target's run-time memory"


def configure_parser(parser) -> None:
    a.source_argument(parser, "gguf", what="the GGUF to inspect, or a target's checkpoint folder")
    a.map_arguments(parser, offset=False)
    add_output_arguments(parser, inputs=("gguf", "map"))


def main(args) -> int:
    result = inspect(args.gguf, map_path=args.map)
    code = emit(result, args)
    if args.quiet or stdout_is_report(args):  # the summary's warning lines are not on stdout: stderr has them
        for line in result.warnings:
            print(f"warning: {printable(line)}", file=sys.stderr)
    return code

"""`gguf2ov inspect FILE.gguf`: what a GGUF holds, and whether a map converts it."""

from ..stages.inspect import inspect
from . import args as a
from .output import add_output_arguments, emit

HELP = "show a GGUF's architecture, metadata, tensors and the map that applies"


def configure_parser(parser) -> None:
    a.source_argument(parser, "gguf", checkpoint=False, what="the GGUF to inspect")
    a.map_arguments(parser, offset=False)
    add_output_arguments(parser, inputs=("gguf", "map"))


def main(args) -> int:
    return emit(inspect(args.gguf, map_path=args.map), args)

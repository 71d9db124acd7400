"""`gguf2ov widen-target TARGET_HF -o DIR`: a heavier copy of a Qwen3 target computing the same function."""

from ..tools.widen import DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE, widen_target
from .output import add_output_arguments, emit

HELP = "a heavier copy of a Qwen3 target computing the same function, for speed runs"


def configure_parser(parser) -> None:
    parser.add_argument("target_hf", help="the target's Hugging Face folder (Qwen3: config.json, safetensors, tokenizer)")
    parser.add_argument("-o", "--output", required=True, help="folder for the widened OpenVINO target")
    parser.add_argument("--extra-layers", type=int, default=DEFAULT_EXTRA_LAYERS,
                        help=f"decoder layers appended as exact no-ops (default {DEFAULT_EXTRA_LAYERS})")
    parser.add_argument("--intermediate-size", type=int, default=DEFAULT_INTERMEDIATE_SIZE,
                        help=f"MLP width after zero padding (default {DEFAULT_INTERMEDIATE_SIZE})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    add_output_arguments(parser, inputs=("target_hf",), outputs=("output",))


def main(args) -> int:
    result = widen_target(args.target_hf, args.output, extra_layers=args.extra_layers,
                          intermediate_size=args.intermediate_size, overwrite=args.overwrite, progress=not args.quiet)
    return emit(result, args)

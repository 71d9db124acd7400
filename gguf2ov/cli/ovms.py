"""`gguf2ov ovms --target DIR --draft DIR -o OUT`: a model repository OpenVINO Model Server serves."""

from ..stages.ovms import ovms_repository
from .output import add_output_arguments, emit

HELP = "an OpenVINO Model Server repository: the target with its DFlash draft attached"


def configure_parser(parser) -> None:
    parser.add_argument("--target", required=True, metavar="TARGET_DIR",
                        help="the target's OpenVINO folder (openvino_model.xml, tokenizer and detokenizer IRs)")
    parser.add_argument("--draft", required=True, metavar="DRAFT_DIR",
                        help="the DFlash draft IR folder (`gguf2ov export`)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT_DIR",
                        help="the model repository to write; serve it with ovms --config_path OUT_DIR/config.json")
    parser.add_argument("--name", help="the model's name in OVMS and its folder (default: the target folder's name); "
                                       "may be org/model")
    parser.add_argument("--device", default="CPU", help="device of the target and the draft (default CPU)")
    parser.add_argument("--num-assistant-tokens", type=int, default=7, metavar="K",
                        help="proposals per step, the requests' default (default 7); on a hybrid target also the "
                             "most a request may ask for: GenAI sizes its linear-attention state pool for it at load")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    add_output_arguments(parser, inputs=("target", "draft"), outputs=("output",))


def main(args) -> int:
    result = ovms_repository(args.target, args.draft, args.output, name=args.name, device=args.device,
                             num_assistant_tokens=args.num_assistant_tokens, overwrite=args.overwrite,
                             progress=not args.quiet)
    return emit(result, args)

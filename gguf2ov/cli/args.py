"""The arguments commands share, declared once: sources, targets, maps, prompts, weight formats,
acceptance settings and output folders (as huggingface_hub's CLI shares `RepoIdArg`/`RevisionOpt`).

Each command module calls the groups it takes, and `job.Job.from_args` turns them into one job.
"""

from pathlib import Path

from ..errors import Gguf2ovError
from ..ir.variants import FORMATS, variant_from_flags
from ..runtime.genai import IMAGE_PROMPT_TEXT, PRECISIONS

HUB_NAME = "a hub name org/repo[:QUANT] as llama.cpp's -hf takes it (found in, or fetched into, huggingface_hub's cache)"


def source_argument(parser, dest: str = "source", checkpoint: bool = True, what: str = "the draft") -> None:
    kinds = "a GGUF file, " + HUB_NAME + (", or a checkpoint folder (config.json + safetensors)" if checkpoint else "")
    parser.add_argument(dest, metavar="SOURCE" if checkpoint else "FILE.gguf", help=f"{what}: {kinds}")


TARGET_FOLDER = "the target's OpenVINO folder (IR, tokenizer, config.json)"
BUILDABLE_TARGET = ("the target: its OpenVINO folder (IR, tokenizer, config.json), or a model to build one from first: "
                    f"a GGUF file, {HUB_NAME}, or a Hugging Face checkpoint folder (config.json + safetensors)")


def target_argument(parser, required: bool = False, help: str | None = None, buildable: bool = False) -> None:
    """--target: an OpenVINO folder (TARGET_DIR), or, for a command that builds its target first
    (`buildable`), also a model (TARGET). `help` adds what the command does with it."""
    metavar, what = ("TARGET", BUILDABLE_TARGET) if buildable else ("TARGET_DIR", TARGET_FOLDER)
    parser.add_argument("--target", required=required, metavar=metavar, help=f"{what}: {help}" if help else what)


def map_arguments(parser, offset: bool = True) -> None:
    parser.add_argument("--map", metavar="FILE",
                        help="tensor map YAML for a GGUF source, instead of the shipped one for its architecture")
    if offset:
        parser.add_argument("--target-layer-offset", type=int, metavar="N",
                            help="dflash GGUF: HF target_layer_ids = GGUF dflash.target_layers + N (current llama.cpp: "
                                 "-1, the map's default; its first DFlash converter: 0); required when the file "
                                 "looks like the old layout, unless a target measures it")


def prompt_arguments(parser) -> None:
    parser.add_argument("--prompts", type=Path, help="text file, one prompt per line; `[image=FILE] text` for an "
                                                     "image prompt (VLM targets)")
    parser.add_argument("--image", action="append", default=[], metavar="FILE",
                        help=f"add an image prompt ({IMAGE_PROMPT_TEXT!r}) for a VLM target; repeatable")


def weight_format_arguments(parser, default_group_size: int, default: str | None = "fp32",
                            default_text: str = "fp32") -> None:
    """optimum-cli's weight options, as it names them."""
    parser.add_argument("--weight-format", choices=tuple(FORMATS), default=default,
                        help="; ".join(f"{name}: {fmt.stores}" for name, fmt in FORMATS.items())
                        + f" (default: {default_text})")
    parser.add_argument("--group-size", type=int,
                        help=f"int4 group size (default {default_group_size})")
    sym = parser.add_mutually_exclusive_group()
    sym.add_argument("--sym", action="store_true", help="symmetric int8/int4 (default asymmetric, as optimum-cli)")
    sym.add_argument("--asym", action="store_true", help="asymmetric int8/int4 (the default)")
    parser.add_argument("--ratio", type=float, help="int4: share of weights in int4, the rest int8 (default 1.0)")
    parser.add_argument("--all-layers", action="store_true",
                        help="int4: also the last MatMul, which NNCF otherwise keeps in int8")


def variant_from_args(args, default_group_size: int):
    return variant_from_flags(args.weight_format, args.group_size, args.sym, args.ratio, args.all_layers,
                              default_group_size=default_group_size)


def mmproj_arguments(parser) -> None:
    """A VLM target's projector, as llama.cpp names it."""
    from ..targets.vision import IMAGE_TOKENS, MAX_SOFT_TOKENS

    parser.add_argument("--mmproj", metavar="MMPROJ.gguf",
                        help="the model's mmproj GGUF (llama.cpp's image projector): build a VLM target folder "
                             "(language model, text and vision embeddings) that VLMPipeline runs")
    parser.add_argument("--image-max-tokens", type=int, choices=IMAGE_TOKENS,
                        help=f"soft tokens an image takes at most, with --mmproj (default {MAX_SOFT_TOKENS}, "
                             "transformers' Gemma 4 default)")


def target_build(weight_format: str | None = None, group_size: int | None = None, sym: bool = False,
                 ratio: float | None = None, all_layers: bool = False, grid: str = "folded",
                 tokenizer_dir=None, map_path=None, allow_nonfinite: bool = False, mmproj=None,
                 image_max_tokens: int | None = None, group_fallback: str | None = None):
    """How a command builds a target from the model a target argument names: `build(source)` makes its
    `sources.TargetBuild` (the weight format defaults to `gguf` for a GGUF, `fp32` for a checkpoint; int4's
    group size fallback to TARGET_GROUP_FALLBACK)."""
    from ..ir.variants import TARGET_GROUP_FALLBACK, TARGET_GROUP_SIZE, require_source_for
    from ..sources import TargetBuild

    def build(source):
        variant = variant_from_flags(weight_format or ("gguf" if source.kind == "gguf" else "fp32"), group_size,
                                     sym, ratio, all_layers, default_group_size=TARGET_GROUP_SIZE,
                                     group_fallback=group_fallback or TARGET_GROUP_FALLBACK)
        require_source_for(variant, source.kind)
        if map_path is not None and source.kind != "gguf":
            raise Gguf2ovError("--map applies to a GGUF source only", hint="a checkpoint folder is read by its config.json")
        if image_max_tokens is not None and mmproj is None:
            raise Gguf2ovError("--image-max-tokens applies with --mmproj", hint="give the model's mmproj GGUF too")
        if mmproj is not None and source.kind != "gguf":
            raise Gguf2ovError("--mmproj applies to a GGUF target only",
                               hint="give the text GGUF beside its mmproj, as llama.cpp takes them")
        return TargetBuild(source, variant, grid, Path(tokenizer_dir) if tokenizer_dir else None,
                           Path(map_path) if map_path else None, allow_nonfinite,
                           Path(mmproj) if mmproj is not None else None, image_max_tokens)

    return build


def acceptance_arguments(parser, device_help: str = "device of every GenAI run") -> None:
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--num-assistant-tokens", type=int, default=7, help="tokens the draft proposes per step (K)")
    parser.add_argument("--device", default="CPU", help=f"{device_help} (default CPU; GPU runs with "
                                                        "ATTENTION_BACKEND=PA)")
    parser.add_argument("--precision", choices=PRECISIONS, default="f32",
                        help="f32 (default) makes greedy output comparable byte for byte; auto = device default")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per prompt (median is reported)")


def draft_head_argument(parser) -> None:
    parser.add_argument("--draft-head", default="auto", metavar="FORM",
                        help="how the draft holds the target's token embedding and lm_head: graft (GenAI copies the "
                             "target's when it attaches the draft), stored (the draft's own copy, as the target "
                             "stores them), int4_asym_g32 or another int4/int8 name (its own lm_head requantized, the "
                             "embedding as stored); auto (default): its own int4_asym_g32 head where GenAI's graft "
                             "would hold 64 MiB or more of the pair's memory, else graft")


def min_corr_argument(parser) -> None:
    parser.add_argument("--min-corr", type=float, default=0.99, metavar="R",
                        help="the Pearson correlation every tensor must reach (default 0.99)")




def parse_list(value: str | None) -> list[str] | None:
    """A comma-separated option (`--variants a,b`), or None when not given."""
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def require_target_with(args, *flags: str) -> None:
    """Options that only mean something with --target."""
    for flag in flags:
        if getattr(args, flag.lstrip("-").replace("-", "_"), None) and not getattr(args, "target", None):
            raise Gguf2ovError(f"{flag} needs --target")

"""`gguf2ov convert FILE.gguf -o DIR`: a Hugging Face checkpoint through the architecture's map,
checked against reference weights afterwards when `--reference` is given."""

import sys
from pathlib import Path

from ..errors import Gguf2ovError, printable
from ..hf.write import DEFAULT_MAX_SHARD_SIZE, DTYPES
from ..job import Job, Options
from ..outputs import require_output_dir
from ..report import render, write_reports
from ..sources import CheckpointSpec
from ..stages.check import TerminalView
from . import args as a
from .output import add_output_arguments, emit, report_path, stdout_is_report

HELP = "convert a GGUF into a Hugging Face checkpoint (config.json + safetensors)"


def configure_parser(parser) -> None:
    a.source_argument(parser, "gguf", checkpoint=False, what="the GGUF file to convert")
    parser.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="output checkpoint folder")
    a.map_arguments(parser)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="tensor dtype in the checkpoint")
    parser.add_argument("--max-shard-size", type=int, default=DEFAULT_MAX_SHARD_SIZE, metavar="BYTES",
                        help="split safetensors files above this size (default 5e9, like transformers)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="write tensors that hold NaN or Inf values (with a warning) instead of failing")
    a.target_argument(parser, help="for a dflash GGUF, settles an ambiguous target layer offset by measuring "
                                   "which layers the draft fits (the tap scan)")
    a.prompt_arguments(parser)
    parser.add_argument("--reference", type=Path, default=None, metavar="REF_DIR",
                        help="after writing, check the checkpoint against this Hugging Face checkpoint folder "
                             "and exit 1 if it differs")
    a.min_corr_argument(parser)
    add_output_arguments(parser, inputs=("gguf", "map", "target", "reference", "prompts", "image"),
                         outputs=("output",))


def main(args) -> int:
    if args.dtype not in DTYPES:
        raise Gguf2ovError(f"unknown dtype {args.dtype!r}; choose one of {', '.join(DTYPES)}")
    if args.max_shard_size < 1:
        raise Gguf2ovError(f"--max-shard-size must be a positive number of bytes, not {args.max_shard_size}")
    require_output_dir(Path(args.output), args.overwrite, inputs=(args.gguf, args.map))  # before the file is read
    job = Job.from_args(args, "gguf")

    def write_reports_first(result):  # a report that cannot be written leaves no checkpoint behind
        write_reports(result, report_path(args, "json"), report_path(args, "markdown"), title="gguf2ov convert")

    result = job.convert(args.output, dtype=args.dtype, overwrite=args.overwrite, before_commit=write_reports_first,
                         max_shard_size=args.max_shard_size, allow_nonfinite=args.allow_nonfinite)
    emit(result, args, text="\n".join(printable(line) for line in result.summary()) + "\n", files=False)
    for line in result.nonfinite_warnings():  # on stderr even under --quiet: the checkpoint computes NaN
        print(f"warning: {printable(line)}", file=sys.stderr)
    if args.reference is None:
        return 0
    # the written checkpoint checked, shown under --quiet only when it fails (the exit code alone would
    # not say what is wrong); with --json - / --markdown -, stdout holds that document: the table goes to stderr
    checked = Job(CheckpointSpec(Path(result.out_dir)), options=Options(progress=not args.quiet)).check(
        args.reference, min_corr=args.min_corr)
    if not args.quiet or not checked.passed:
        out = sys.stderr if stdout_is_report(args) else sys.stdout
        out.write(render(TerminalView(checked), "text", title=checked.title))
    return 0 if checked.passed else 1

"""`gguf2ov accept --target DIR --draft DIR`: the target alone against the target with the draft, in GenAI."""

from pathlib import Path

from ..job import Job
from . import args as a
from .output import VERDICT_EPILOG, add_output_arguments, emit, verdict_code

HELP = "acceptance run in OpenVINO GenAI: target alone vs target + draft"
EPILOG = VERDICT_EPILOG


def configure_parser(parser) -> None:
    a.target_argument(parser, required=True)
    parser.add_argument("--draft", required=True, type=Path, help="draft OpenVINO folder")
    a.prompt_arguments(parser)
    a.acceptance_arguments(parser, device_help="device of both pipelines")
    add_output_arguments(parser, inputs=("target", "draft", "prompts", "image"))


def main(args) -> int:
    job = Job.from_args(args, source=None)
    job.options.generation.check()
    result = job.accept(args.draft)
    return emit(result, args, title="Acceptance", code=verdict_code(result.verdict))

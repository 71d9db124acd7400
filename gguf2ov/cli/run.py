"""`gguf2ov run DRAFT.gguf --target TARGET -o OUT`: the whole job, with one report."""

from ..errors import Gguf2ovError
from ..job import Job
from ..ir.variants import FORMATS
from ..report import render
from ..run import DEFAULT_REQUANT, markdown_report, run
from . import args as a
from .output import VERDICT_EPILOG, add_output_arguments, emit, verdict_code

HELP = "the whole job: convert, check, drift (every variant exported), verify, accept, report"
EPILOG = VERDICT_EPILOG


def configure_parser(p) -> None:
    a.source_argument(p, "gguf", checkpoint=False, what="the draft GGUF")
    a.target_argument(p, required=True, buildable=True, help="the target built from a model goes to OUT/target")
    p.add_argument("--target-format", choices=tuple(FORMATS), metavar="FORMAT",
                   help="the weights of a target the run builds: " + ", ".join(FORMATS)
                        + " (default as `gguf2ov target`: gguf for a GGUF, fp32 for a checkpoint; int4: the lean "
                          "form, NNCF's int4 at group 128, about 5 bits a weight at run time, not the file's function)")
    p.add_argument("-o", "--output", required=True, help="output folder: checkpoint/, drafts/, report.md, report.json")
    p.add_argument("--reference", help="reference HF checkpoint of the draft, for the correlation check")
    p.add_argument("--requant", help=f"the requantized draft to accept (default {DEFAULT_REQUANT}, skipped when this "
                                     "draft cannot take it)")
    p.add_argument("--variants", help="comma-separated drift variants (default: the drift command's list, less those "
                                      "this draft cannot take, which the report names)")
    a.mmproj_arguments(p)
    a.draft_head_argument(p)
    a.prompt_arguments(p)
    a.acceptance_arguments(p)
    a.map_arguments(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--ignore-memory-plan", action="store_true",
                   help="build and run a target whose planned run-time memory exceeds what this machine has available "
                        "(by default such a run stops before any work, naming the form that would fit)")
    # OUT/report.json and OUT/report.md are written in any case; --json / --markdown copy them elsewhere
    add_output_arguments(p, inputs=("gguf", "target", "reference", "map", "prompts", "image", "mmproj"), outputs=("output",))


def main(args) -> int:
    job = Job.from_args(args, "gguf", build=a.target_build(args.target_format, mmproj=args.mmproj,
                                                          image_max_tokens=args.image_max_tokens))
    if args.mmproj is not None and not job.builds_target:
        raise Gguf2ovError(f"--mmproj applies to a target the run builds; {args.target} is an OpenVINO folder already",
                           hint="leave --mmproj out, or pass the text GGUF to build the target from")
    if args.target_format is not None and not job.builds_target:
        raise Gguf2ovError(f"--target-format {args.target_format} applies to a target the run builds; "
                           f"{args.target} is an OpenVINO folder already",
                           hint="leave --target-format out, or pass the GGUF or checkpoint to build the target from")
    result = run(job, args.output, reference_dir=args.reference, requant=args.requant,
                 variants=a.parse_list(args.variants), overwrite=args.overwrite,
                 ignore_memory=args.ignore_memory_plan)
    text = render(result.results["drift"], "text") + "\n" if "drift" in result.results else ""
    text += render(result, "text", title="gguf2ov run") + "\n"
    return emit(result, args, title="gguf2ov run", text=text, markdown=markdown_report(result),
                code=verdict_code(result.verdict))

"""`gguf2ov run`: the whole job on one GGUF draft, with one report.

The stages of `run`, in order:
- layer-offset: only for a GGUF that cannot tell how its target layer ids were written (and no
  --target-layer-offset): the offset is measured against the target (the tap scan);
- convert: the HF checkpoint, OUT/checkpoint;
- check: against the reference weights (skipped without --reference);
- drift: fp32, the drift variants and the requantized draft (--requant, int4_asym_g16 by default),
  each exported under OUT/drafts, verified and measured;
- verify:fp32 (with the tap scan) and verify:REQUANT, against the target;
- accept:fp32 and accept:REQUANT, each draft on the target in OpenVINO GenAI;
then OUT/report.md and OUT/report.json, also when a stage failed. The GGUF is opened once and every
stage reads it from there. A stage that fails stops the run: the report says which one and why,
and the exit code is 1.
"""

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Gguf2ovError
from .outputs import require_output_dir
from .progress import step
from .report import Table, add_output_arguments, emit, render, write_reports

DEFAULT_REQUANT = "int4_asym_g16"


@dataclass(frozen=True)
class StageOutcome:
    name: str
    status: str       # pass | fail | skip
    seconds: float
    reason: str = ""


@dataclass(frozen=True)
class RunResult:
    source: str
    target: str
    out_dir: str
    verdict: str                        # PASS, or the verdict/stage that stopped the run
    stages: list[StageOutcome]
    results: dict = field(default_factory=dict)   # stage name -> its result dataclass
    provenance: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def tables(self) -> list[Table]:
        rows = [[s.name, s.status.upper(), f"{s.seconds:.1f} s", s.reason] for s in self.stages]
        tables = [Table("Pipeline stages", ["stage", "status", "time", "result"], rows)]
        runs = {name.split(":", 1)[1]: r for name, r in self.results.items() if name.startswith("accept")}
        accept_rows = [[label, r.verdict, r.overall.identity, f"{r.overall.accepted_tokens}/{r.overall.generated_tokens}",
                        r.overall.acceptance_rate, r.overall.mean_acceptance_length, r.overall.tok_s_target,
                        r.overall.tok_s_draft, r.overall.speedup] for label, r in runs.items()]
        if runs:
            first = next(iter(runs.values()))
            from .numerics import describe_numerics

            note = f"{first.pipeline} on {first.device}, {first.precision}" + (
                f" ({describe_numerics(first.numerics)})" if first.numerics else "")
            tables.append(Table("Drafts on the target", ["draft", "verdict", "identical", "accepted/generated",
                                                         "accepted/drafted", "mean accept len", "tok/s target",
                                                         "tok/s draft", "speedup"], accept_rows, note))
        return tables

    def summary(self) -> list[str]:
        return [f"verdict: {self.verdict}", f"report: {Path(self.out_dir) / 'report.md'}"]


def run(gguf_path, target_dir, out_dir, reference_dir=None, requant: str = DEFAULT_REQUANT, variants=None,
        prompts=None, max_new_tokens: int = 100, num_assistant_tokens: int = 7, precision: str = "f32",
        repeats: int = 1, map_path=None, target_layer_offset=None, overwrite: bool = False,
        progress: bool = True, device: str = "CPU") -> RunResult:
    from .accept import require_options, require_target_dir, run_acceptance, target_alone
    from .check import check
    from .convert import convert
    from .drift import drift
    from .provenance import provenance
    from .genai import DEFAULT_PROMPTS
    from .variants import DEFAULT_DRIFT_VARIANTS, parse_variant
    from .verify import verify_draft

    gguf_path, target_dir, out_dir = Path(gguf_path), Path(target_dir), Path(out_dir)
    requant = parse_variant(requant).name
    variants = list(dict.fromkeys(["fp32", *(variants or DEFAULT_DRIFT_VARIANTS), requant]))
    for v in variants:
        parse_variant(v)
    if not gguf_path.is_file():
        raise Gguf2ovError(f"{gguf_path} does not exist")
    require_target_dir(target_dir)
    require_options(max_new_tokens, num_assistant_tokens, repeats, precision)
    if reference_dir is not None and not Path(reference_dir, "config.json").is_file():
        raise Gguf2ovError(f"reference folder {reference_dir} has no config.json",
                           hint="pass the Hugging Face checkpoint folder the GGUF was made from")
    require_output_dir(out_dir, overwrite, inputs=(gguf_path, target_dir, reference_dir, map_path))
    if out_dir.exists():
        shutil.rmtree(out_dir)  # an old report must not sit beside a new run's outputs
    prompts = list(prompts or DEFAULT_PROMPTS)

    stages, results = [], {}
    options = {"reference": str(reference_dir) if reference_dir else None, "requant": requant, "variants": variants,
               "max_new_tokens": max_new_tokens, "num_assistant_tokens": num_assistant_tokens,
               "precision": precision, "repeats": repeats, "target_layer_offset": target_layer_offset,
               "device": device}

    def finish(verdict: str) -> RunResult:
        result = RunResult(str(gguf_path), str(target_dir), str(out_dir), verdict, stages, results,
                           provenance({"gguf": opened.get("gguf", gguf_path), "target": target_dir}, options))
        out_dir.mkdir(parents=True, exist_ok=True)
        write_reports(result, out_dir / "report.json")
        from .outputs import atomic_write_text

        atomic_write_text(out_dir / "report.md", markdown_report(result))
        return result

    def stage(name: str, fn, ok=lambda r: (True, "")):
        step(f"stage {name}", progress)
        start = time.monotonic()
        try:
            r = fn()
        except Gguf2ovError as e:
            stages.append(StageOutcome(name, "fail", time.monotonic() - start, e.message))
            raise _Stop(f"{name} failed") from e
        passed, reason = ok(r)
        results[name] = r
        stages.append(StageOutcome(name, "pass" if passed else "fail", time.monotonic() - start, reason))
        if not passed:
            raise _Stop(f"{name} failed")
        return r

    opened = {}

    def open_once():
        from .read import open_gguf

        if "gguf" not in opened:
            opened["gguf"] = open_gguf(gguf_path)  # every later stage reads this one opened file
        return opened["gguf"]

    def convert_once():
        return convert(open_once(), out_dir / "checkpoint", map_path=map_path,
                       target_layer_offset=target_layer_offset, progress=progress)

    def ambiguous() -> bool:
        from .maps import map_for

        if target_layer_offset is not None:
            return False
        try:
            return bool(map_for(open_once(), map_path).flag_ambiguity(open_once(), "target_layer_offset"))
        except Gguf2ovError:
            return False  # an unreadable file: the convert stage reports it

    def settle():
        from .taps import settle_offset

        return settle_offset(open_once(), target_dir, map_path, prompts, progress)

    def verify_reason(r):
        scan = r.finding("layer-fit")
        text = "all checks pass" if r.ok else "; ".join(r.summary())
        return text + (f"; layer-fit {scan.status}: {scan.reason}" if scan is not None and scan.status != "fail" else "")

    try:
        # a GGUF that cannot tell how its target layer ids were written: measured against the target
        decision = stage("layer-offset", settle, lambda r: (True, " ".join(r.summary()))) if ambiguous() else None
        if decision is not None:
            target_layer_offset = decision.offset
            options["target_layer_offset"] = decision.offset
            options["target_layer_offset_measured"] = decision.record()
        stage("convert", convert_once,
              lambda r: (True, f"{r.n_tensors} tensors, target layer ids {r.target_layer_ids_written}"))
        if reference_dir:
            stage("check", lambda: check(opened["gguf"], reference_dir, map_path=map_path,
                                         target_layer_offset=target_layer_offset, progress=progress),
                  lambda r: (r.passed, "; ".join(r.summary()[:2])))
        else:
            stages.append(StageOutcome("check", "skip", 0.0, "no --reference given"))
        d = stage("drift", lambda: drift(opened["gguf"], out_dir / "drafts", variants=variants, target_dir=target_dir,
                                         prompts=prompts, map_path=map_path, target_layer_offset=target_layer_offset,
                                         progress=progress),
                  lambda r: (all(v.verified for v in r.variants),
                             f"{len(r.variants)} variants; " + ", ".join(
                                 f"{v.name} {'verified' if v.verified else 'FAILED verify: ' + ', '.join(v.verify_failures)}"
                                 for v in r.variants if v.name in ("fp32", requant))))
        for name in ("fp32", requant):
            draft = Path(next(v.path for v in d.variants if v.name == name))
            # the tap scan once, on the fp32 draft: the variants read the same layers
            stage(f"verify:{name}", lambda: verify_draft(draft, target_dir=target_dir, prompts=prompts,
                                                         tap_scan=name == "fp32"),
                  lambda r: (r.ok, verify_reason(r)))
        baseline = []  # the target alone, generated once for both drafts (the first stage pays for it)

        def accept_draft(draft: Path):
            if not baseline:
                baseline.append(target_alone(target_dir, prompts, max_new_tokens, device, precision, repeats, progress))
            return run_acceptance(target_dir, draft, prompts, max_new_tokens=max_new_tokens,
                                  num_assistant_tokens=num_assistant_tokens, precision=precision, repeats=repeats,
                                  progress=progress, device=device, baseline=baseline[0])

        for name in ("fp32", requant):
            draft = Path(next(v.path for v in d.variants if v.name == name))
            stage(f"accept:{name}", lambda: accept_draft(draft),
                lambda r: (r.verdict == "PASS", f"{r.verdict}: {r.overall.accepted_tokens}/{r.overall.generated_tokens} "
                                                 f"tokens from the draft, {r.overall.speedup:.2f}x" + "".join(f"; {x}" for x in r.reasons)))
        verdict = "PASS"
    except _Stop:
        failed = stages[-1]
        verdict = results[failed.name].verdict if failed.name.startswith("accept") and failed.name in results \
            else f"FAILED at {failed.name}"
    except BaseException:
        # An interrupt or an unexpected error: no half-run folder where a finished report would be.
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return finish(verdict)


class _Stop(Exception):
    pass


def markdown_report(result: RunResult) -> str:
    parts = [render(result, "markdown", title="gguf2ov run")]
    for name, r in result.results.items():
        parts.append(render(r, "markdown", title=name))
        if name == "drift" and r.plot:
            parts.append(f"![size against weight drift]({Path(r.plot).relative_to(result.out_dir)})")
    return "\n\n".join(parts)


def configure_parser(p) -> None:
    from .genai import add_prompt_arguments

    p.add_argument("gguf", help="the draft GGUF")
    p.add_argument("--target", required=True, help="the target's OpenVINO folder (IR, tokenizer, config.json)")
    p.add_argument("-o", "--output", required=True, help="output folder: checkpoint/, drafts/, report.md, report.json")
    p.add_argument("--reference", help="reference HF checkpoint of the draft, for the correlation check")
    p.add_argument("--requant", default=DEFAULT_REQUANT, help=f"the requantized draft to accept (default {DEFAULT_REQUANT})")
    p.add_argument("--variants", help="comma-separated drift variants (default: the drift command's list)")
    add_prompt_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--num-assistant-tokens", type=int, default=7)
    p.add_argument("--precision", choices=("f32", "auto"), default="f32")
    p.add_argument("--device", default="CPU", help="device of every GenAI run (default CPU; GPU runs with "
                                                   "ATTENTION_BACKEND=PA)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--map", help="tensor map YAML to use instead of the shipped one")
    p.add_argument("--target-layer-offset", type=int, help="see gguf2ov convert")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    # OUT/report.json and OUT/report.md are written in any case; --json / --markdown copy them elsewhere
    add_output_arguments(p, inputs=("gguf", "target", "reference", "map", "prompts", "image"), outputs=("output",))


def cli(args) -> int:
    from .genai import prompts_from_args

    result = run(args.gguf, args.target, args.output, reference_dir=args.reference, requant=args.requant,
                 variants=[v for v in args.variants.split(",") if v.strip()] if args.variants else None,
                 prompts=prompts_from_args(args, default=None),
                 max_new_tokens=args.max_new_tokens, num_assistant_tokens=args.num_assistant_tokens,
                 precision=args.precision, repeats=args.repeats, map_path=args.map,
                 target_layer_offset=args.target_layer_offset, overwrite=args.overwrite, progress=not args.quiet,
                 device=args.device)
    text = render(result.results["drift"], "text") + "\n" if "drift" in result.results else ""
    text += render(result, "text", title="gguf2ov run") + "\n"
    return emit(result, args, title="gguf2ov run", text=text, markdown=markdown_report(result),
                code=0 if result.passed else 1)

"""`gguf2ov run`: the whole job on one GGUF draft, with one report.

The job (`job.Job`) opens the GGUF and the target once; the stages of `run`, in order:
- layer-offset: only for a GGUF that cannot tell how its target layer ids were written (and no
  --target-layer-offset): the offset is measured against the target (the tap scan);
- draft-head: whether the accepted drafts bring the target's embedding and lm_head themselves (GenAI
  then attaches them without copying the target's) or leave them to GenAI's graft, and why
  (draft/head.py; `--draft-head`);
- convert: the HF checkpoint, OUT/checkpoint;
- check: against the reference weights (skipped without --reference);
- drift: fp32, the drift variants, the GGUF's own grid and the requantized draft (--requant,
  int4_asym_g16 by default), each exported under OUT/drafts, measured, and verified against the
  GGUF's own function (checkpoint-match) and the target; a default variant this draft cannot take
  (a group size that does not divide a narrow draft's widths) is skipped, and the drift table and
  the report say which and why;
- verify:gguf (those checks, with the tap scan: once, the variants read the same layers) and
  verify:REQUANT;
- accept:gguf and accept:REQUANT, each draft on the target in OpenVINO GenAI, against one
  target-alone baseline. The draft accepted as converted is the `gguf` variant: the file's own
  function as fp32 computes it (checkpoint-match holds both to it), at the file's size rather than
  6-7x that (4.2 GB for a 1 B draft's fp32, held by GenAI beside the target);
then OUT/report.md and OUT/report.json, also when a stage failed. A stage that fails stops the run:
the report says which one and why, and the exit code is 1, or the acceptance verdict's
(cli/output.VERDICT_CODES). An acceptance that says SLOW (the pair is right, but the target is too
light on this device for the draft to pay) stops nothing, and is the run's verdict. The whole
folder is put in place when the report is written: an interrupted run, or one that fails
unexpectedly, leaves the previous output as it was.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Gguf2ovError, WriteError
from .progress import step
from .report import Table, human_bytes, render

DEFAULT_REQUANT = "int4_asym_g16"
LOSSLESS = "gguf"  # the converted draft that is verified with the tap scan and accepted in GenAI
SLOW = "SLOW"  # the acceptance verdict of a pair that is right but does not pay on this device


@dataclass(frozen=True)
class StageOutcome:
    name: str
    status: str       # pass | warn (an acceptance that says SLOW) | fail | skip
    seconds: float
    reason: str = ""
    peak_rss: int = 0  # bytes: the process's peak resident set once the stage ended (the OS's figure)


@dataclass(frozen=True)
class RunResult:
    source: str
    target: str
    out_dir: str
    verdict: str                        # PASS, SLOW, or the verdict/stage that stopped the run
    stages: list[StageOutcome]
    results: dict = field(default_factory=dict)   # stage name -> its result dataclass
    provenance: dict = field(default_factory=dict)
    work: dict = field(default_factory=dict)      # what the run did, counted (work.py): compiles, generations, ...
    run_time_memory: dict | None = None           # the plan of a target it built (runtime.memory.MemoryPlan.record)

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def tables(self) -> list[Table]:
        rows = [[s.name, s.status.upper(), f"{s.seconds:.1f} s", human_bytes(s.peak_rss) if s.peak_rss else "",
                 s.reason] for s in self.stages]
        tables = [Table("Pipeline stages", ["stage", "status", "time", "peak RSS", "result"], rows,
                        note="peak RSS: the process's peak so far, as the OS counts it (mapped files included)")]
        runs = {name.split(":", 1)[1]: r for name, r in self.results.items() if name.startswith("accept")}
        accept_rows = [[label, r.verdict, r.overall.identity, f"{r.overall.accepted_tokens}/{r.overall.generated_tokens}",
                        r.overall.acceptance_rate, r.overall.mean_acceptance_length, r.overall.tok_s_target,
                        r.overall.tok_s_draft, r.overall.speedup, _best_k(r), _int8_share(r, "draft")]
                       for label, r in runs.items()]
        if runs:
            first = next(iter(runs.values()))
            from .numerics import describe_numerics

            note = f"{first.pipeline} on {first.device}, {first.precision}" + (
                f" ({describe_numerics(first.numerics, roles=('target',))})" if first.numerics else "")
            note += f"; K={first.num_assistant_tokens} proposals per step; best K: what pays best on this device " \
                    "(estimated from each K's measured step time and the acceptance per position); int8 MatMuls: " \
                    "the draft's MatMuls whose activations the compiled model quantizes on the fly"
            tables.append(Table("Drafts on the target", ["draft", "verdict", "identical", "accepted/generated",
                                                         "accepted/drafted", "mean accept len", "tok/s target",
                                                         "tok/s draft", "speedup", "best K", "int8 MatMuls"],
                                accept_rows, note))
        return tables

    def summary(self) -> list[str]:
        built = self.results.get("target")  # a target built in a form that trades against its file's grid
        trade = [f"target: {built.weight_format}: {built.trade}"] if getattr(built, "trade", None) else []
        trade += [f"target: {built.alternative}"] if getattr(built, "alternative", None) else []
        return trade + [f"verdict: {self.verdict}", f"report: {Path(self.out_dir) / 'report.md'}"]


def run(job, out_dir, reference_dir=None, requant: str | None = None, variants=None,
        overwrite: bool = False, ignore_memory: bool = False) -> RunResult:
    """The whole job on `job` into `out_dir`: its draft a GGUF, its target an OpenVINO folder, or a
    model (a GGUF or a Hugging Face checkpoint) that the `target` stage builds one from first, into
    OUT/target.

    `variants` (None: drift's defaults) and `requant` (None: DEFAULT_REQUANT): a variant the caller
    names that this draft cannot take is refused before any work; a default one is skipped, and the
    drift table and the report say which and why (the requantized draft's verify and accept stages too).
    A target to build is planned first (runtime/memory.py): a run whose pair would not fit in this machine's
    memory stops before any work, naming the form that would, unless `ignore_memory`."""
    from .ir.variants import DEFAULT_DRIFT_VARIANTS, parse_variant
    from .outputs import atomic_dir, relocated, require_output_dir, require_space
    from .sources import GgufSpec
    from .stages.drift import plan_variants
    from .work import counts

    o = job.options
    asked = [parse_variant(n).name for n in ["fp32", *(variants or DEFAULT_DRIFT_VARIANTS), LOSSLESS,
                                            requant or DEFAULT_REQUANT]]  # a bad name fails first
    named = {parse_variant(n).name for n in [*(variants or ()), *([requant] if requant else [])]}
    defaults = [*(DEFAULT_DRIFT_VARIANTS if variants is None else ()), *(() if requant else (DEFAULT_REQUANT,))]
    optional = [n for n in defaults if n not in named]  # skipped when the draft cannot take them
    asked, requant = list(dict.fromkeys(asked)), asked[-1]
    if not isinstance(job.draft_spec, GgufSpec):
        raise Gguf2ovError(f"{job.draft_spec.path} is a folder; run takes the draft's GGUF file")
    plan = plan_variants(job.shaped_draft, asked, optional)
    names = [v.name for v in plan.build]
    o.generation.check()
    if reference_dir is not None and not Path(reference_dir, "config.json").is_file():
        raise Gguf2ovError(f"reference folder {reference_dir} has no config.json",
                           hint="pass the Hugging Face checkpoint folder the GGUF was made from")
    out_dir = Path(out_dir)
    gguf_path = job.draft_spec.path
    inputs = (gguf_path, job.target_spec.path, reference_dir, o.map_path)
    require_output_dir(out_dir, overwrite, inputs=inputs)
    if job.builds_target:
        job.require_target_build(out_dir / "target", overwrite)  # built in the temporary folder, then moved
    else:
        job.target.require_attach_points()  # a folder GenAI cannot attach to fails before any work
    require_space(out_dir, run_bytes(job, names, (LOSSLESS, requant)), f"the run ({'the target, ' if job.builds_target else ''}the "
                  f"checkpoint, {len(names)} draft variants and the reports)",
                  hint="write to another folder (-o), or build fewer draft variants (--variants)"
                       + (", or the target with --target-format int4" if job.builds_target else ""))
    memory = job.memory_plan((LOSSLESS, requant)) if job.builds_target else None
    if memory is not None:
        step(memory.line(), o.progress)
        if not memory.fits_chosen and not ignore_memory:
            other = memory.alternative()
            raise Gguf2ovError(memory.line(), hint=(f"build the target as {other.form} ({memory.flag(other.form, 'run')})"
                                                    if other else "run on a machine with more memory")
                               + ", or pass --ignore-memory-plan to run anyway")
    before = counts()
    start = time.monotonic()
    with atomic_dir(out_dir, overwrite=overwrite, inputs=inputs) as tmp:
        stages = _Stages(o.progress)
        verdict = _run_stages(job, stages, tmp, reference_dir, requant, asked, optional, plan.skipped)
        options = {**o.record(), "reference": str(reference_dir) if reference_dir else None, "requant": requant,
                   "variants": names, "skipped_variants": plan.skipped, "prompts": len(job.prompts())}
        if "layer-offset" in stages.results:  # only what the stages measured: never measured here
            decision = stages.results["layer-offset"]
            options["target_layer_offset"] = decision.offset
            options["target_layer_offset_measured"] = decision.record()
        from .provenance import provenance, target_record

        # the folder built (or, when building failed, what it was built from)
        target_dir = Path(stages.results["target"].out_dir) if "target" in stages.results else job.target_spec.path
        result = RunResult(str(gguf_path), str(target_dir), str(tmp), verdict, stages.outcomes, stages.results,
                           provenance({"gguf": job.gguf or gguf_path, "target": target_record(target_dir)}, options),
                           _since(before, counts()) | {"wall seconds": round(time.monotonic() - start, 1)},
                           run_time_memory=memory.record() if memory else None)
        result = relocated(result, tmp, out_dir)
        _write_reports(result, tmp)
    return result


REPORT_BYTES = 400_000  # report.md, report.json and drift's reports and plot


def run_bytes(job, names: list[str], accepted=()) -> int:
    """What `run` writes, stage by stage: the target it builds, the checkpoint, every draft variant (the
    `accepted` ones with the head the job plans for them) and the reports. Tensor shapes do not depend on a target layer offset, so an ambiguous GGUF is read
    with the map's default here (the layer-offset stage settles it later)."""
    from .ir.variants import parse_variant
    from .hf.write import checkpoint_bytes
    from .maps.load import open_mapped
    from .stages.convert import checkpoint_specs
    from .stages.drift import drift_bytes

    mapped = open_mapped(job.gguf, target_layer_offset=job.shaped_draft.target_layer_offset, allow_ambiguous=True,
                         amap=job.draft_map)
    total = checkpoint_bytes(checkpoint_specs(mapped, "bf16")) + REPORT_BYTES
    heads = dict.fromkeys(accepted, job.planned_head())
    total += drift_bytes(job.shaped_draft, [parse_variant(n) for n in names], heads)
    return total + (job.target_bytes() if job.builds_target else 0)


def _run_stages(job, stages: "_Stages", out: Path, reference_dir, requant: str, names: list[str], optional,
                skipped: dict[str, str]) -> str:
    """Run the stages in order into `out`; the verdict: PASS, SLOW (an acceptance that does not pay on
    this device, which stops nothing), or the verdict or stage that stopped the run."""
    from .stages.check import check, gguf_source
    from .stages.convert import convert
    from .stages.drift import drift
    from .stages.verify import with_tap_scan

    o = job.options
    try:
        if job.builds_target:  # every later stage takes the folder built
            built = stages.run("target", lambda: job.build_target(out / "target"), _target_judgement)
            job = job.with_target(built.out_dir)
        if job.ambiguous():
            # a GGUF that cannot tell how its target layer ids were written: measured against the target
            stages.run("layer-offset", lambda: job.offset_decision, lambda r: (True, " ".join(r.summary())))
        head = stages.run("draft-head", lambda: job.head, lambda r: (True, r.summary().removeprefix("draft head: ")))
        stages.run("convert", lambda: convert(job.mapped, out / "checkpoint", offset_decision=job.offset_decision,
                                              progress=o.progress),
                   lambda r: (True, f"{r.n_tensors} tensors, target layer ids {r.target_layer_ids_written}"))
        if reference_dir:
            stages.run("check", lambda: check(gguf_source(job.gguf, o.map_path, job.target_layer_offset), reference_dir,
                                              progress=o.progress),
                       lambda r: (r.passed, "; ".join(r.summary()[:2])))
        else:
            stages.skip("check", "no --reference given")
        heads = {name: head for name in (LOSSLESS, requant)}  # the drafts GenAI runs
        d = stages.run("drift", lambda: drift(job.draft, out / "drafts", variants=names, target=job.target,
                                              prompts=job.prompts(), verify=job.verify, progress=o.progress,
                                              optional=optional, heads=heads),
                       lambda r: (all(v.verified for v in r.variants), _drift_reason(r, requant)))
        drafts = {v.name: v for v in d.variants}
        accepted = list(dict.fromkeys((LOSSLESS, requant)))
        if requant in skipped:  # the default requantized draft, which this draft cannot take
            for stage in ("verify", "accept"):
                stages.skip(f"{stage}:{requant}", f"the default {requant} does not apply: {skipped[requant]}")
            accepted.remove(requant)
        # the variants' own verify results (checkpoint-match against the GGUF, the target checks), and
        # the tap scan once, on the GGUF's own grid: the variants read the same layers
        stages.run(f"verify:{LOSSLESS}", lambda: with_tap_scan(drafts[LOSSLESS].verify, job.target, job.prompts()),
                   _verify_judgement)
        if requant in accepted and requant != LOSSLESS:
            stages.run(f"verify:{requant}", lambda: drafts[requant].verify, _verify_judgement)
        job.release_target()  # GenAI compiles its own copy of the target
        for name in accepted:
            verified = stages.results[f"verify:{name}"]
            stages.run(f"accept:{name}", lambda: job.accept(drafts[name].path, verified=verified), _accept_judgement,
                       warns=lambda r: r.verdict == SLOW)
        return SLOW if any(s.status == "warn" for s in stages.outcomes) else "PASS"
    except _Stop:
        failed = stages.outcomes[-1]
        if failed.name.startswith("accept") and failed.name in stages.results:
            return stages.results[failed.name].verdict
        return f"FAILED at {failed.name}"


def _drift_reason(r, requant: str) -> str:
    # a failing target check fails every variant alike: its reason once, for what it says of the target
    target = {c.name: c.reason for v in r.variants if v.verify is not None for c in v.verify.checks
              if c.group == "target" and c.status == "fail"}
    skipped = f" ({', '.join(r.skipped)} skipped: this draft cannot take them)" if r.skipped else ""
    return f"{len(r.variants)} variants{skipped}; " + ", ".join(
        f"{v.name} {'verified' if v.verified else 'FAILED verify: ' + ', '.join(v.verify_failures)}"
        for v in r.variants if v.name in dict.fromkeys(("fp32", LOSSLESS, requant))) + "".join(
        f"; {name}: {reason}" for name, reason in target.items())


def _target_judgement(r) -> tuple[bool, str]:
    passed = sum(c.status == "pass" for c in r.checks)
    kinds = f" ({', '.join(f'{n} {kind}' for kind, n in r.layer_kinds.items())})" if len(r.layer_kinds) > 1 else ""
    return passed == len(r.checks), (f"{Path(r.source).name} ({r.source_kind}, {r.arch}) as {r.weight_format} into "
                                     f"target/: {r.num_layers} layers{kinds}, {passed}/{len(r.checks)} target "
                                     "checks pass")


def _verify_judgement(r) -> tuple[bool, str]:
    scan = r.finding("layer-fit")
    text = "all checks pass" if r.ok else "; ".join(r.summary())
    match = r.finding("checkpoint-match")
    if match is not None and r.ok:
        text += f"; checkpoint-match {match.status}: {match.reason}"
    return r.ok, text + (f"; layer-fit {scan.status}: {scan.reason}" if scan is not None and scan.status != "fail" else "")


def _best_k(r) -> str:
    best = r.best
    return f"{best.k} ({best.speedup:.2f}x)" if best is not None else ""


def _int8_share(result, role: str) -> str:
    """"3/15": the MatMuls of `role` that run int8 activations in an acceptance run, of all of them."""
    forms = (result.numerics.get("models") or {}).get(role)
    if forms is None:
        return ""
    return f"{sum(f['matmuls'] for f in forms if f['int8'])}/{sum(f['matmuls'] for f in forms)}"


def _accept_judgement(r) -> tuple[bool, str]:
    best = f"; best K on this device {_best_k(r)}" if r.best is not None else ""
    o = r.overall
    return (r.verdict in ("PASS", SLOW), f"{r.verdict}: {o.accepted_tokens}/{o.generated_tokens} tokens from the "
                                         f"draft, {o.speedup:.2f}x{best}" + "".join(f"; {x}" for x in r.reasons))


class _Stop(Exception):
    pass


class _Stages:
    """The stages run so far: their outcomes in order, and each one's result."""

    def __init__(self, progress: bool):
        self.progress, self.outcomes, self.results = progress, [], {}

    def run(self, name: str, fn, judge=lambda r: (True, ""), warns=lambda r: False):
        """`judge(result) -> (passed, reason)`; a stage that passes and `warns(result)` is a warning (an
        acceptance that says SLOW): it stops nothing."""
        step(f"stage {name}", self.progress)
        start = time.monotonic()
        try:
            r = fn()
        except WriteError:
            raise  # the disk's doing, not the stage's: the run stops, leaving nothing behind
        except Gguf2ovError as e:
            self.outcomes.append(StageOutcome(name, "fail", time.monotonic() - start, e.message, _peak_rss()))
            raise _Stop(f"{name} failed") from e
        passed, reason = judge(r)
        self.results[name] = r
        status = ("warn" if warns(r) else "pass") if passed else "fail"
        self.outcomes.append(StageOutcome(name, status, time.monotonic() - start, reason, _peak_rss()))
        if not passed:
            raise _Stop(f"{name} failed")
        return r

    def skip(self, name: str, reason: str) -> None:
        self.outcomes.append(StageOutcome(name, "skip", 0.0, reason))


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _since(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _write_reports(result: RunResult, folder: Path) -> None:
    from .outputs import atomic_write_text
    from .report import write_reports

    write_reports(result, folder / "report.json")
    atomic_write_text(folder / "report.md", markdown_report(result))


def markdown_report(result: RunResult) -> str:
    parts = [render(result, "markdown", title="gguf2ov run")]
    for name, r in result.results.items():
        parts.append(render(r, "markdown", title=name))
        if name == "drift" and r.plot:
            parts.append(f"![size against weight drift]({Path(r.plot).relative_to(result.out_dir)})")
    return "\n\n".join(parts)

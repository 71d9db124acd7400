"""The run-time memory plan (`gguf2ov/runtime/memory.py`) held against what GenAI holds, measured.

For each case the plan is made from the source files as `gguf2ov target`, `inspect` and `run` make it,
before anything is built; then the target (and the draft) is built and run in LLMPipeline in a fresh
process, with default properties and one greedy generation of 16 tokens (`bench_pair_memory.pair_phases`),
its private memory sampled every 20 ms and the resident pages of its libraries read at the end; with
`--limits`, the smallest cgroup memory limit it completes under is bisected to 0.5 GiB as well
(`memlimit.py`). The plan is held to the peak private memory plus the libraries (what it estimates) and,
where measured, to the smallest limit.

Cases, SIZE a bench_target_build size (8b, 9b, 20b, 31b, ...; the fixtures as `tinymoe` and the like):
    target-FORM-SIZE        the target alone, FORM folded | int4 | int8 | split
    pair-FORM-HEAD-SIZE     with the size's draft attached (DRAFT_OF), HEAD graft | auto

    python -m benchmarks.memory_plan --cases target-folded-8b,target-int4-8b,pair-folded-auto-8b [--limits]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import memlimit
from benchmarks.bench_pair_memory import K, NEW_TOKENS, PROMPT
from benchmarks.bench_target_build import DRAFT_OF, GGUF2OV, SIZES, WORK
from benchmarks.common import CHECKOUT_ENV, RESULTS, load_average, machine_info, package_versions
from benchmarks.random_target import GEOMETRIES
from benchmarks.scale_gguf import GEOMETRIES as DRAFTS
from benchmarks.scale_gguf import ensure_gguf, ensure_target_gguf

GIB = 2**30
FORMS = {"folded": ["--weight-format", "gguf"], "split": ["--weight-format", "gguf", "--grid", "split"],
         "int4": ["--weight-format", "int4"], "int8": ["--weight-format", "int8"]}
PLAN_CONTEXT = len(PROMPT.encode()) + NEW_TOKENS + K + 1  # as `run` sizes it: a byte a token at most


def _library_bytes() -> int:
    """Resident pages of the shared libraries the process maps (/proc/self/smaps): what the plan's fixed part
    holds beside private memory."""
    total, library = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if len(head) >= 6 and "-" in head[0] and not line.startswith(("Rss", "Size")):
            library = ".so" in head[-1]
        elif line.startswith("Rss:") and library:
            total += int(head[1]) * 1024
    return total


def phases(target: str, draft: str | None) -> dict:
    """In a fresh process: bench_pair_memory's pipeline phases, and the libraries' resident pages after them."""
    from benchmarks.bench_pair_memory import pair_phases

    return pair_phases(target, draft) | {"libraries": _library_bytes()}


def _gguf2ov(*args) -> None:
    subprocess.run([*map(str, GGUF2OV), *map(str, args), "--overwrite", "--quiet"], check=True, env=CHECKOUT_ENV)


def inputs(size: str) -> dict:
    geom = GEOMETRIES[SIZES[size]]
    files = {"target_gguf": Path(ensure_target_gguf(geom)["path"])}
    if size in DRAFT_OF:
        files["draft_gguf"] = Path(ensure_gguf(DRAFTS[DRAFT_OF[size]])["path"])
    return files


def built(size: str, form: str, head: str | None) -> tuple[Path, Path | None]:
    """The target folder of `form` and, with `head`, the draft exported for it, built once."""
    files = inputs(size)
    target = WORK / f"plan-{files['target_gguf'].stem}-{form}"
    if not (target / "openvino_model.xml").is_file():
        _gguf2ov("target", files["target_gguf"], "-o", target, *FORMS[form])
    if head is None:
        return target, None
    draft = WORK / f"plan-{files['draft_gguf'].stem}-for-{form}-{head}"
    if not (draft / "openvino_model.xml").is_file():
        _gguf2ov("export", files["draft_gguf"], "-o", draft, "--weight-format", "gguf", "--target", target,
                 "--draft-head", head)
    return target, draft


def plan(size: str, form: str, head: str | None) -> dict:
    """The plan, made as `run` makes it before building: from the two GGUFs, the draft's head as the job
    plans it."""
    from gguf2ov.job import Job, Options
    from gguf2ov.cli.args import target_build
    from gguf2ov.runtime.genai import GenerationSettings

    files = inputs(size)
    weight_format = "gguf" if form in ("folded", "split") else form
    build = target_build(weight_format, grid="split" if form == "split" else "folded")
    options = Options(progress=False, prompts=(PROMPT,), draft_head=head or "auto",
                      generation=GenerationSettings(max_new_tokens=NEW_TOKENS, num_assistant_tokens=K))
    job = Job.of(files["draft_gguf"] if head else None, files["target_gguf"], options, build=build)
    memory = job.memory_plan(("gguf",) if head else ())
    if not head:  # a target alone: the context `run` would size
        from gguf2ov.runtime.memory import plan_target

        memory = plan_target(job.target_forms, context=PLAN_CONTEXT)
    return memory.record() | {"line": memory.line()}


def measure(name: str, limits: bool, say=print) -> dict:
    parts = name.split("-")
    kind, form, size = parts[0], parts[1], parts[-1]
    head = parts[2] if kind == "pair" else None
    planned = plan(size, form, head)
    say(f"[plan] {name}: {planned['line']}")
    target, draft = built(size, form, head)
    memlimit.evict([target] + ([draft] if draft else []))
    argv = [sys.executable, "-m", __spec__.name, "--child", str(target), str(draft) if draft else "-"]
    p = subprocess.run(argv, capture_output=True, text=True, env=CHECKOUT_ENV)
    if p.returncode:
        return {"case": name, "plan": planned, "error": p.stderr[-800:]}
    got = json.loads(p.stdout.strip().splitlines()[-1])
    total = planned["forms"][planned["chosen"]]["total"]
    measured = got["peak_anon"] + got["libraries"]
    result = {"case": name, "plan": planned, "measured": got, "plan_bytes": total, "measured_bytes": measured,
              "plan_over_measured": round(total / measured, 3), "load": load_average()}
    say(f"[measured] {name}: peak private {got['peak_anon'] / GIB:.2f} GiB + libraries {got['libraries'] / GIB:.2f} GiB "
        f"= {measured / GIB:.2f} GiB; planned {total / GIB:.2f} GiB ({total / measured:.2f}x)")
    if limits:
        lo = max(0.5, round(total / GIB * 0.6 * 2) / 2)
        r = memlimit.smallest_limit(argv, name=name, probes=[round(total / GIB * 1.1 * 4) / 4], lo_gib=lo,
                                    hi_gib=round(total / GIB * 1.5 * 2) / 2 + 0.5, log_dir=RESULTS / "memory-plan-logs",
                                    env=CHECKOUT_ENV, evict_paths=[target] + ([draft] if draft else []), say=say)
        result |= {"smallest_limit_gib": r.get("smallest_limit_gib"), "largest_failing_gib": r.get("largest_failing_gib")}
        if r.get("smallest_limit_gib"):
            result["plan_over_limit"] = round(total / GIB / r["smallest_limit_gib"], 3)
    return result


def markdown(report: dict) -> str:
    lines = ["| case | planned | peak private + libraries | plan / measured | smallest limit | plan / limit |",
             "|---|---|---|---|---|---|"]
    for r in report["cases"]:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['plan']['forms'][r['plan']['chosen']]['total'] / GIB:.2f} GiB | error | | | |")
            continue
        lines.append(f"| {r['case']} | {r['plan_bytes'] / GIB:.2f} GiB | {r['measured_bytes'] / GIB:.2f} GiB | "
                     f"{r['plan_over_measured']:.2f} | {r.get('smallest_limit_gib') or ''} | {r.get('plan_over_limit', '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="target-folded-8b,target-int4-8b,pair-folded-auto-8b,pair-folded-graft-8b")
    p.add_argument("--limits", action="store_true", help="bisect each case's smallest memory limit as well")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        target, draft = args.child
        print(json.dumps(phases(target, None if draft == "-" else draft)))
        return 0
    report = {"machine": machine_info(), "packages": package_versions(),
              "cases": [measure(name, args.limits) for name in args.cases.split(",")]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "memory-plan.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

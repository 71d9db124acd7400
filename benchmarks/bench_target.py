"""The target side at real size: what `verify --target`, `drift --target` and `run` cost against a
target exported as users export it.

The target is a random bf16 checkpoint of a Qwen3 geometry (`random_target.py`) exported by
optimum-intel's own command line (int4, group 128, ratio 1.0: the guide's command); the draft a
random Q4_K_M GGUF of the matching DFlash geometry (`scale_gguf.py`), exported int4 g16 for
`verify`. Random weights give no acceptance, so the verdicts are not PASS: what is measured is what
the target side costs. Each command runs in a fresh process under `/usr/bin/time -f "%e %M"` with
`GGUF2OV_WORK_LOG` set, which gives how often it compiled the target (gguf2ov's own compile, and
GenAI's pipelines) and generated with it.

    python -m benchmarks.bench_target                      # qwen3-4b target, qwen3-4b-dflash draft
    python -m benchmarks.bench_target --target tiny --draft tiny     # a smoke run in a minute
    python -m benchmarks.bench_target --commands verify,run

Writes results/target.json and results/target.md and prints the table.
"""

import argparse
import json
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.bench_scale import GGUF2OV, run_measured
from benchmarks.common import RESULTS, folder_bytes, machine_info, package_versions
from benchmarks.random_target import GEOMETRIES as TARGETS
from benchmarks.random_target import ensure_checkpoint, optimum_export
from benchmarks.scale_gguf import GEOMETRIES as DRAFTS
from benchmarks.scale_gguf import ensure_gguf

GIB = 2**30
PROMPTS = ["The history of the printing press begins", "Water boils at a lower temperature on a mountain because"]
# (argv after `gguf2ov`, the goal on peak RSS from the issue: None, or (factor of the target IR, plus GiB))
COMMANDS = {
    "verify": (["verify", "{draft_ir}", "--target", "{target}", "--prompts", "{prompts}"], (1.5, 1.0)),
    "drift": (["drift", "{gguf}", "-o", "{out}", "--target", "{target}", "--prompts", "{prompts}", "--overwrite"],
              (0, 5.0)),
    "run": (["run", "{gguf}", "--target", "{target}", "-o", "{out}", "--prompts", "{prompts}", "--max-new-tokens",
             "16", "--overwrite"], (0, 6.0)),
}


def prepare(target_name: str, draft_name: str, work: Path) -> dict:
    """The target export, the draft GGUF and its int4 g16 IR (each cached), and a prompts file."""
    hf = ensure_checkpoint(TARGETS[target_name])
    export_time = hf.parent / "optimum-int4.time"
    target = optimum_export(hf, "int4", export_time)
    gguf = Path(ensure_gguf(DRAFTS[draft_name])["path"])
    draft_ir = gguf.parent / f"{gguf.stem}-int4g16"
    if not (draft_ir / "openvino_model.xml").is_file():
        shutil.rmtree(draft_ir, ignore_errors=True)
        run_measured([str(GGUF2OV), "export", str(gguf), "-o", str(draft_ir), "--weight-format", "int4",
                      "--group-size", "16", "--quiet"], work / "logs" / "draft-export", None, None, dict(os.environ))
    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    optimum = export_time.read_text().split() if export_time.is_file() else None
    return {"target": target, "gguf": gguf, "draft_ir": draft_ir, "prompts": prompts,
            "target_ir_bytes": folder_bytes(target / "openvino_model.bin"),
            "optimum_export": {"seconds": float(optimum[0]), "peak_rss_kib": int(optimum[1])} if optimum else None}


def measure(name: str, paths: dict, work: Path) -> dict:
    argv, goal = COMMANDS[name]
    out = work / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    log = work / "logs" / name
    work_log = log.with_suffix(".work.json")
    work_log.unlink(missing_ok=True)
    values = {k: str(v) for k, v in paths.items() if isinstance(v, Path)} | {"out": str(out)}
    env = dict(os.environ, GGUF2OV_WORK_LOG=str(work_log))
    row = run_measured([str(GGUF2OV), *[a.format(**values) for a in argv]], log, None, None, env)
    row["command"] = name
    row["work"] = json.loads(work_log.read_text()) if work_log.is_file() else {}
    if goal is not None:
        row["goal_peak_rss_gib"] = round(goal[0] * paths["target_ir_bytes"] / GIB + goal[1], 2)
    stdout = log.with_suffix(".stdout").read_text(errors="replace").splitlines()
    row["verdict"] = next((line for line in stdout if line.startswith(("verify ", "verdict:"))), None)
    shutil.rmtree(out, ignore_errors=True)
    return row


def table(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        w = r["work"]
        peak = r["peak_rss_kib"] / 2**20 if r["peak_rss_kib"] else None
        out.append([r["command"], f"{r['seconds']:.1f}", f"{peak:.2f}" if peak else "-",
                    f"<= {r['goal_peak_rss_gib']}" if "goal_peak_rss_gib" in r else "",
                    str(w.get("target compiles (gguf2ov)", 0)), str(w.get("target compiles (GenAI pipelines)", 0)),
                    str(w.get("target-alone baselines (GenAI)", 0)), str(r["exit_code"]), r.get("verdict") or ""])
    return out


HEADERS = ["command", "time (s)", "peak RSS (GiB)", "goal (GiB)", "target compiles (gguf2ov)",
           "target compiles (GenAI)", "target-alone baselines", "exit", "verdict"]


def markdown(report: dict) -> str:
    lines = [f"# The target side at real size ({report['target']} target, {report['draft']} draft)", "",
             f"Target IR (optimum-cli int4 g128 r1.0): {report['target_ir_bytes'] / GIB:.2f} GiB. "
             f"Machine: {report['machine']['cpu_model']}, {report['machine']['usable_cores']} cores.", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table(report["rows"])]
    if report.get("optimum_export"):
        e = report["optimum_export"]
        lines += ["", f"optimum-cli's export of the target: {e['seconds']:.0f} s, {e['peak_rss_kib'] / 2**20:.1f} GiB "
                      "peak RSS."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen3-4b", choices=sorted(TARGETS))
    p.add_argument("--draft", default="qwen3-4b-dflash", choices=sorted(DRAFTS))
    p.add_argument("--commands", default=",".join(COMMANDS))
    args = p.parse_args(argv)
    work = RESULTS / "target-work"
    work.mkdir(parents=True, exist_ok=True)
    paths = prepare(args.target, args.draft, work)
    rows = []
    for name in [c for c in args.commands.split(",") if c]:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        rows.append(measure(name, paths, work))
        print("  ".join(table(rows[-1:])[0]), file=sys.stderr, flush=True)
    report = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "target": args.target,
              "draft": args.draft, "target_ir_bytes": paths["target_ir_bytes"], "optimum_export": paths["optimum_export"],
              "machine": machine_info(), "packages": package_versions(), "rows": rows}
    (RESULTS / "target.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "target.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

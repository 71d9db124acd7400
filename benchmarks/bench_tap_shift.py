"""What a one-layer shift of the target layer ids costs each fixture draft, and what the tap scan says.

    python -m benchmarks.bench_tap_shift [--out DIR] [--max-new-tokens 100] [--fixtures tiny-dflash,...]

Each fixture's Q4_K_M GGUF is exported as fp32 three times: with the offset its file needs (the
right ids) and with the ids one layer down and one layer up (`--target-layer-offset` one off).
Each export is then run in OpenVINO GenAI against the fixture's target (tiny-dflash and
tiny-dflash2 also against the widened target of `gguf2ov widen-target`, where a target step costs
enough for speed to show), greedy, K=7, f32, over the fixture's prompts; and scanned with
`verify --target`'s tap scan. Writes DIR/tap_shift.json and .md (default benchmarks/results).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, RESULTS
from gguf2ov.provenance import package_versions
from gguf2ov.report import Table, render, write_reports
from gguf2ov.job import Job, Options
from gguf2ov.runtime.target import TargetIR

FIXTURES = REPO / "fixtures"
# fixture -> the target folder its draft runs on (relative to fixtures/)
TARGETS = {"tiny-dflash": "tiny-dflash/target", "tiny-dflash2": "tiny-dflash/target", "tiny-vlm": "tiny-vlm/target"}
# Both GGUF fixtures store target ids + 1, read back with offset -1.
SHIFTS = {"right ids": -1, "one layer down": -2, "one layer up": 0}


@dataclass(frozen=True)
class Row:
    fixture: str
    target: str
    draft: str
    ids: list[int]
    accepted: int
    generated: int
    mean_acceptance_length: float
    identical: bool
    tok_s_draft: float
    speedup: float
    scan_verdict: str | None
    scan_best: list[int] | None
    scan_margin: float | None


@dataclass(frozen=True)
class TapShiftResult:
    rows: tuple[Row, ...]
    max_new_tokens: int
    packages: dict
    seconds: float

    def tables(self) -> list[Table]:
        rows = [[r.fixture, r.target, r.draft, r.ids, f"{r.accepted}/{r.generated}", r.mean_acceptance_length,
                 "yes" if r.identical else "NO", r.tok_s_draft, r.speedup, r.scan_verdict, r.scan_best, r.scan_margin]
                for r in self.rows]
        right = {(r.fixture, r.target): r.accepted for r in self.rows if r.draft == "right ids"}
        loss = [[r.fixture, r.target, r.draft, f"{100 * (1 - r.accepted / right[r.fixture, r.target]):.0f}%"]
                for r in self.rows if r.draft != "right ids" and right.get((r.fixture, r.target))]
        return [
            Table("Acceptance at the right target layer ids and one layer off",
                  ["fixture", "target", "draft", "ids", "accepted", "mean accept len", "identical", "tok/s",
                   "speedup", "tap scan", "scan best", "margin"], rows,
                  f"GenAI, greedy, K=7, f32, {self.max_new_tokens} new tokens per prompt; the tap scan is "
                  "verify --target's (on the fixture target)"),
            Table("Accepted tokens lost by a one-layer shift", ["fixture", "target", "shift", "lost"], loss),
        ]


def main(argv=None) -> int:
    from gguf2ov.runtime.genai import GenerationSettings
    from gguf2ov.stages.accept import run_acceptance
    from gguf2ov.runtime.genai import read_prompts
    from gguf2ov.stages.export import export_draft
    from gguf2ov.tools.widen import DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE
    from gguf2ov.checks.taps import scan_taps

    from benchmarks.bench_speedup import heavy_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--fixtures", default=",".join(TARGETS), help="comma-separated, of: " + ", ".join(TARGETS))
    args = ap.parse_args(argv)
    start = time.perf_counter()
    heavy = None
    rows = []
    for fixture in args.fixtures.split(","):
        fix = FIXTURES / fixture
        target = FIXTURES / TARGETS[fixture]
        targets = {"fixture": target}
        if fixture != "tiny-vlm":
            heavy = heavy or heavy_target(FIXTURES / "tiny-dflash" / "target-hf", args.out / "heavy-target",
                                          DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE, rebuild=False)
            targets["widened"] = heavy
        prompts = read_prompts(fix / "prompts.txt")
        for draft, offset in SHIFTS.items():
            out = args.out / "tap-shift" / fixture / draft.replace(" ", "-")
            draft = Job.of(fix / "draft-Q4_K_M.gguf", options=Options(target_layer_offset=offset, progress=False)).draft
            exported = export_draft(draft, out, overwrite=True, progress=False)
            scan = scan_taps(out, TargetIR.open(target), prompts=prompts)
            for label, path in targets.items():
                acc = run_acceptance(TargetIR.open(path), out, prompts, GenerationSettings(max_new_tokens=args.max_new_tokens), progress=False).overall
                rows.append(Row(fixture, label, draft, exported.target_layer_ids, acc.accepted_tokens,
                                acc.generated_tokens, acc.mean_acceptance_length, acc.identical, acc.tok_s_draft,
                                acc.speedup, scan.verdict, scan.best_ids, scan.margin))
                print(f"{fixture} on {label}, {draft} {exported.target_layer_ids}: {acc.accepted_tokens}/"
                      f"{acc.generated_tokens}; scan {scan.verdict} best {scan.best_ids}", file=sys.stderr)
    result = TapShiftResult(tuple(rows), args.max_new_tokens, package_versions(), time.perf_counter() - start)
    print(render(result), end="")
    write_reports(result, args.out / "tap_shift.json", args.out / "tap_shift.md")
    print(f"wrote {args.out / 'tap_shift.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

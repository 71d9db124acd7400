"""Tokens/s with and without the fixture's DFlash draft, on the small fixture target and a heavy one.

    python -m benchmarks.bench_speedup [--repeats 3] [--ks 3,5,7] [--max-new-tokens 100] [--rebuild]
        [--drafts fp32,gguf,dflash2-fp32,dflash2-gguf,dflash2-int4-g16,dflash2-identity] [--out DIR]

The fixture target (2.5M parameters) is so light that the speculative pipeline's own overhead
eats most of the gain. The heavy target is the same function widened with zero-padded MLPs and
no-op layers (`gguf2ov widen-target`, gguf2ov.cli.widen.widen_target), so the same draft applies and accepts the same
tokens while a target step costs what a mid-sized model's would. It is built into
benchmarks/results/heavy-target and reused while its source and sizes are unchanged.

Drafts: the fixture's Q4_K_M GGUF exported as fp32, as int4 (NNCF, group 16) and with its own
GGUF grid (weight_format "gguf"); the DFlash 2 fixture's (fixtures/tiny-dflash2, trained against
the same target) the same three ways, and its checkpoint with the convolutions made identity (what
a DFlash 2 draft run as v1 would be); drafts read one layer off are measured by bench_tap_shift.py.
Every run is greedy at f32 inference precision over fixtures/tiny-dflash/prompts.txt. The
configurations are measured round-robin, one repeat of all of them at a time, so that load from
other processes falls on all of them alike; each prompt's time is the median over repeats. Writes benchmarks/results/speedup.json.

On a machine shared with other work, the target-alone runs suffer most: they make one
multi-threaded step per token, and every step waits for a thread the other load has descheduled,
so the speedup comes out inflated. `--threads 1` gives steadier numbers there.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, RESULTS
from gguf2ov.provenance import package_versions, sha256_path
from gguf2ov.report import Table, render, write_reports
from gguf2ov.job import Job, Options
from gguf2ov.ir.variants import variant_from_flags

FIXTURES = REPO / "fixtures" / "tiny-dflash"
FORMATS = {  # export_draft keyword arguments
    "fp32": {"weight_format": "fp32"},
    "int4-g16": {"weight_format": "int4", "group_size": 16},
    "gguf": {"weight_format": "gguf"},
}
# label -> (source, export arguments); sources are resolved by draft_sources()
DRAFTS = {label: ("v1", kwargs) for label, kwargs in FORMATS.items()}
DRAFTS.update({f"dflash2-{label}": ("dflash2", kwargs) for label, kwargs in FORMATS.items()})
DRAFTS["dflash2-identity"] = ("dflash2-identity", FORMATS["fp32"])


@dataclass(frozen=True)
class Row:
    target: str
    draft: str | None  # None: the target alone
    k: int | None
    tok_s: float
    speedup: float  # over the same target alone, in the same round-robin
    generated: int
    accepted: int
    target_steps: int
    mean_acceptance_length: float
    identical: bool


@dataclass(frozen=True)
class SpeedupResult:
    targets: dict  # label -> {"path", "parameters", "layers", "intermediate_size", ...}
    drafts: dict  # label -> path
    prompts: int
    max_new_tokens: int
    repeats: int
    precision: str
    rows: tuple[Row, ...]
    threads: int | None
    machine: dict
    packages: dict
    seconds: float

    def tables(self) -> list[Table]:
        headers = ["target", "draft", "K", "tok/s", "speedup", "accepted", "mean accept len", "identical"]
        rows = []
        for r in self.rows:
            acc = f"{r.accepted}/{r.generated}" if r.draft else "-"
            rows.append([r.target, r.draft or "(alone)", r.k, r.tok_s, r.speedup, acc,
                         r.mean_acceptance_length if r.draft else None, r.identical])
        sizes = "; ".join(f"{k}: {v['parameters'] / 1e6:.1f}M params, {v['layers']} layers" for k, v in self.targets.items())
        note = (f"{self.prompts} prompts x {self.max_new_tokens} new tokens, greedy, {self.precision}; "
                f"median of {self.repeats} round-robin repeats after a warm-up; "
                f"{self.threads or 'default'} CPU threads. {sizes}")
        return [Table("Tokens/s: target alone vs target + DFlash draft", headers, rows, note)]

    def summary(self) -> list[str]:
        lines = []
        for t in self.targets:
            best = max((r for r in self.rows if r.target == t and r.draft), key=lambda r: r.speedup, default=None)
            alone = next(r for r in self.rows if r.target == t and not r.draft)
            if best:
                lines.append(f"{t}: {alone.tok_s:.0f} tok/s alone; best {best.tok_s:.0f} tok/s with the {best.draft} "
                             f"draft at K={best.k} ({best.speedup:.2f}x)")
        if not all(r.identical for r in self.rows):
            lines.append("WARNING: some runs with a draft produced text different from the target alone")
        return lines


def _parameters(target_dir: Path) -> tuple[int, int, int]:
    """(parameters, layers, intermediate size) from the IR's weight constants and config.json."""
    import openvino as ov

    model = ov.Core().read_model(str(target_dir / "openvino_model.xml"))
    n = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant" and op.get_output_partial_shape(0).rank.get_length() == 2:
            shape = op.get_output_shape(0)
            if min(shape) > 1:  # not the [out, 1] scales and zero points of compressed weights
                n += shape[0] * shape[1]
    cfg = json.loads((target_dir / "config.json").read_text())
    return int(n), int(cfg["num_hidden_layers"]), int(cfg["intermediate_size"])


def heavy_target(target_hf: Path, out: Path, extra_layers: int, intermediate_size: int, rebuild: bool) -> Path:
    from gguf2ov.cli.widen import widen_target
    from gguf2ov.names import PROVENANCE_FILE

    prov = out / PROVENANCE_FILE
    if prov.is_file() and not rebuild:
        p = json.loads(prov.read_text())
        same = (p["options"].get("extra_layers") == extra_layers
                and p["options"].get("intermediate_size") == intermediate_size
                and p["sources"]["target_hf"]["sha256"] == sha256_path(target_hf))
        if same:
            print(f"reusing {out}", file=sys.stderr)
            return out
    result = widen_target(target_hf, out, extra_layers=extra_layers, intermediate_size=intermediate_size,
                          overwrite=True)
    print(render(result), file=sys.stderr)
    return out


def draft_sources(fixtures: Path, out: Path, labels: list[str]) -> dict[str, Path]:
    """The source each wanted draft is exported from (the identity copy is written under `out`)."""
    dflash2 = fixtures.parent / "tiny-dflash2"
    sources = {"v1": fixtures / "draft-Q4_K_M.gguf", "dflash2": dflash2 / "draft-Q4_K_M.gguf"}
    if any(DRAFTS[label][0] == "dflash2-identity" for label in labels):
        from tests.dflash_builders import edit_convolutions

        sources["dflash2-identity"] = edit_convolutions(dflash2 / "draft-ref", out / "dflash2-identity-ckpt", "identity")
    return sources


def export_drafts(sources: dict[str, Path], out: Path, labels: list[str]) -> dict[str, Path]:
    from gguf2ov.errors import Gguf2ovError

    drafts = {}
    for label in labels:
        source, kwargs = DRAFTS[label]
        path = out / label
        try:
            Job.of(sources[source], None, Options(progress=False)).export(path, variant_from_flags(**kwargs), overwrite=True)
        except Gguf2ovError as e:  # a variant this GGUF cannot give (e.g. "gguf" on an unsupported grid)
            print(f"skipping the {label} draft: {e}", file=sys.stderr)
            continue
        drafts[label] = path
    return drafts


def measure_target(label: str, target: Path, drafts: dict[str, Path], prompts: list[str], ks: list[int],
                   max_new_tokens: int, repeats: int, precision: str, threads: int | None = None) -> list[Row]:
    from gguf2ov.runtime.genai import as_prompts, generate, generation_config, make_pipeline, properties
    from gguf2ov.runtime.target import TargetIR

    props = properties(precision)
    prompts = as_prompts(prompts)
    if threads:
        props["INFERENCE_NUM_THREADS"] = threads
    # One pipeline per draft, reused for every K (K is a generation setting, not a load setting).
    configs = [(None, None)] + [(d, k) for d in drafts for k in ks]
    opened = TargetIR.open(target)
    pipes = {None: make_pipeline(opened, "CPU", props)}
    pipes.update({d: make_pipeline(opened, "CPU", props, drafts[d]) for d in drafts})
    gen_cfg = {(d, k): generation_config(pipes[d], max_new_tokens, k, False) for d, k in configs}
    runs = {c: [[] for _ in prompts] for c in configs}
    for c in configs:  # warm-up: kernel compilation and cache allocation, per pipeline and K
        generate(pipes[c[0]], prompts[0], gen_cfg[c], c[0] is not None)
    for rep in range(repeats):
        for c in configs:
            for i, p in enumerate(prompts):
                runs[c][i].append(generate(pipes[c[0]], p, gen_cfg[c], c[0] is not None))
        print(f"{label}: repeat {rep + 1}/{repeats} done", file=sys.stderr)
    del pipes

    def tok_s(c):
        seconds = sum(statistics.median(r.seconds for r in per_prompt) for per_prompt in runs[c])
        return sum(per_prompt[-1].generated for per_prompt in runs[c]) / seconds

    alone_texts = [per_prompt[-1].text for per_prompt in runs[(None, None)]]
    base = tok_s((None, None))
    rows = [Row(label, None, None, base, 1.0, sum(p[-1].generated for p in runs[(None, None)]), 0, 0, 1.0, True)]
    for c in configs[1:]:
        last = [per_prompt[-1] for per_prompt in runs[c]]
        acc, steps = sum(r.accepted for r in last), sum(r.steps for r in last)
        rows.append(Row(label, c[0], c[1], tok_s(c), tok_s(c) / base, sum(r.generated for r in last), acc, steps,
                        1 + acc / steps if steps else float("nan"),
                        [r.text for r in last] == alone_texts))
    return rows


def main(argv=None) -> int:
    from gguf2ov.runtime.genai import read_prompts
    from gguf2ov.tools.widen import DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ks", default="3,5,7", help="numbers of assistant tokens, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--extra-layers", type=int, default=DEFAULT_EXTRA_LAYERS)
    ap.add_argument("--intermediate-size", type=int, default=DEFAULT_INTERMEDIATE_SIZE)
    ap.add_argument("--drafts", default=",".join(FORMATS), help=f"drafts, comma-separated, of: {', '.join(DRAFTS)}")
    ap.add_argument("--no-small", action="store_true", help="skip the small fixture target")
    ap.add_argument("--threads", type=int, help="CPU inference threads (default: OpenVINO's choice, all cores)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the heavy target even if it is up to date")
    args = ap.parse_args(argv)

    start = time.perf_counter()
    ks = [int(k) for k in args.ks.split(",")]
    prompts = read_prompts(args.fixtures / "prompts.txt")
    heavy = heavy_target(args.fixtures / "target-hf", args.out / "heavy-target", args.extra_layers,
                         args.intermediate_size, args.rebuild)
    wanted = args.drafts.split(",")
    unknown = set(wanted) - set(DRAFTS)
    if unknown:
        ap.error(f"unknown draft variants {sorted(unknown)}; choose from {', '.join(DRAFTS)}")
    sources = draft_sources(args.fixtures, args.out / "speedup-drafts", wanted)
    drafts = export_drafts(sources, args.out / "speedup-drafts", wanted)

    targets = {"heavy": heavy} if args.no_small else {"fixture": args.fixtures / "target", "heavy": heavy}
    rows, info = [], {}
    for label, path in targets.items():
        params, layers, inter = _parameters(path)
        info[label] = {"path": str(path), "parameters": params, "layers": layers, "intermediate_size": inter}
        rows += measure_target(label, path, drafts, prompts, ks, args.max_new_tokens, args.repeats, "f32",
                               args.threads)

    result = SpeedupResult(
        targets=info, drafts={k: str(v) for k, v in drafts.items()}, prompts=len(prompts),
        max_new_tokens=args.max_new_tokens, repeats=args.repeats, precision="f32", rows=tuple(rows), threads=args.threads,
        machine={"platform": platform.platform(), "processor": platform.processor(), "cpus": _cpus()},
        packages=package_versions(), seconds=time.perf_counter() - start,
    )
    print(render(result), end="")
    write_reports(result, args.out / "speedup.json")
    print(f"wrote {args.out / 'speedup.json'}", file=sys.stderr)
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())

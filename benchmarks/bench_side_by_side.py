"""llama.cpp and OpenVINO GenAI side by side on the same GGUF files, one command per case.

For each case the same target GGUF (and, for a pair, the same draft GGUF) runs in both engines, in
rounds: each round measures every engine and form once, each in a fresh process, so that load from
other work falls on all of them alike; the table gives the median of the rounds and their range, and
the load average before each measurement.

- target decode: `llama-bench -t 2 -n 128` (tg128) against LLMPipeline (greedy, 128 new tokens, EOS
  ignored, one warm-up generation; tokens/s = 1 / TPOT), with GenAI's default properties (what users
  run) and with the f32 hint (what acceptance runs use);
- verify cost, the time of one step of K + 1 tokens over one decode step, K = 1, 3, 7: llama-bench's
  pp(K+1) against tg at a depth of 32 tokens; for OpenVINO one forward of K + 1 tokens against one of a
  single token on the stateful target after a 32-token prompt (`bench_target_build.verify_cost`), f32 hint;
- the pair (a case with a draft): `llama-speculative-simple --spec-type draft-dflash --spec-draft-n-max K`
  over the case's prompts (greedy, `-t 2`) against `gguf2ov accept` (K, f32): tokens/s, the target alone
  beside it, and accepted / drafted tokens;
- memory (`--memory`): peak RSS and the smallest cgroup memory limit (`memlimit.py`) of a 16-token
  generation by each engine's target.

Cases: `fixture-wide`, the trained fixture pair with its target widened to 409 M parameters (no-op layers
and zero-padded MLPs, the same function: `write_widened_checkpoint`) and written as Q4_K_M by llama.cpp's
converter and llama-quantize, the fixture's Q4_K_M draft; `padded-8b` and `padded-1.7b`, the trained fixture
pair, target and draft, padded to Qwen3-8B's and Qwen3-1.7B's geometries with the trained functions (how, and
how that was checked: `padded_pair.py`), both written as Q4_K_M by llama.cpp's tools; random-weight Q4_K_M
targets of real geometries (`scale_gguf.ensure_target_gguf`): `qwen3-1.7b`, `qwen3-8b` (dense), `qwen3.5-2b`,
`qwen3.5-9b` (hybrid), `qwen3-30b-a3b` (MoE), the 8B and 9B with a random draft of their DFlash
geometry (the pair's cost; random weights accept nothing).

    python -m benchmarks.bench_side_by_side fixture-wide [--rounds 3] [--forms split,folded] [--memory]
    python -m benchmarks.bench_side_by_side padded-8b --rounds 3 --forms folded,int4 --lock FILE
    python -m benchmarks.bench_side_by_side qwen3-8b --lock FILE   # heavy: each measurement under a shared flock

Writes results/side-by-side-CASE.json and .md.
"""

import argparse
import fcntl
import json
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import CACHE, CHECKOUT_ENV, REPO, RESULTS, machine_info, package_versions, short_commit
from benchmarks.llamacpp.tools import convert, quantize, tool

GGUF2OV = [sys.executable, "-m", "gguf2ov"]
FIXTURE = REPO / "fixtures" / "tiny-dflash"
KS = (1, 3, 7)
THREADS = 2
GRIDS = {"split": ["--grid", "split"], "folded": ["--grid", "folded"], "compact": ["--grid", "compact"],
         "int4": ["--weight-format", "int4"]}
# the draft each case's pair uses (random weights for the real geometries: the pair's cost, not its gain)
DRAFTS = {"qwen3-8b": "qwen3-8b-dflash", "qwen3.5-9b": "qwen3.5-9b-dflash", "gpt-oss-20b": "gpt-oss-20b-dflash"}
WIDE = {"extra_layers": 28, "intermediate_size": 16384}
PADDED = ("padded-8b", "padded-1.7b")  # the trained fixture pair padded to these geometries (padded_pair.py)
LOCK = {"path": None}


def say(message: str) -> None:
    print(f"[side-by-side] {message}", file=sys.stderr, flush=True)


@contextmanager
def heavy():
    """The shared lock (`--lock`) around one heavy measurement, none without it."""
    if LOCK["path"] is None:
        yield
        return
    with open(LOCK["path"], "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load() -> float:
    return round(os.getloadavg()[0], 2)


# -- inputs ---------------------------------------------------------------------------------------

def case_inputs(case: str) -> dict:
    """{target: GGUF, draft: GGUF or None, prompts: file, tokenizer: folder or None, trained: bool}."""
    if case == "fixture-wide":
        return {"target": fixture_wide(), "draft": FIXTURE / "draft-Q4_K_M.gguf", "prompts": FIXTURE / "prompts.txt",
                "tokenizer": None, "trained": True}
    if case in PADDED:
        from benchmarks.padded_pair import GEOMETRIES as PADDED_GEOMETRIES
        from benchmarks.padded_pair import ensure_pair

        pair = ensure_pair(PADDED_GEOMETRIES[case])
        return {"target": pair["target"], "draft": pair["draft"], "prompts": FIXTURE / "prompts.txt", "tokenizer": None,
                "trained": True}
    from benchmarks.bench_target_build import tokenizer_dir
    from benchmarks.random_target import GEOMETRIES
    from benchmarks.scale_gguf import GEOMETRIES as DRAFT_GEOMETRIES
    from benchmarks.scale_gguf import ensure_gguf, ensure_target_gguf

    if case not in GEOMETRIES:
        raise SystemExit(f"unknown case {case!r}: fixture-wide, {', '.join(PADDED)} or one of {', '.join(GEOMETRIES)}")
    geom = GEOMETRIES[case]
    draft = Path(ensure_gguf(DRAFT_GEOMETRIES[DRAFTS[case]])["path"]) if case in DRAFTS else None
    prompts = CACHE / "side-by-side-prompts.txt"
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("The history of the printing press begins\nWater boils at a lower temperature on a mountain because\n")
    return {"target": Path(ensure_target_gguf(geom)["path"]), "draft": draft, "prompts": prompts,
            "tokenizer": tokenizer_dir(geom.vocab), "trained": False}


def fixture_wide() -> Path:
    """The fixture target widened (the same function) and made Q4_K_M by llama.cpp's own tools, cached."""
    out = CACHE / f"fixture-wide-{WIDE['extra_layers']}-{WIDE['intermediate_size']}"
    gguf = out / "target-Q4_K_M.gguf"
    if gguf.is_file():
        return gguf
    from gguf2ov.tools.widen import write_widened_checkpoint

    say("widening the fixture target and writing it as Q4_K_M with llama.cpp's converter and llama-quantize")
    write_widened_checkpoint(FIXTURE / "target-hf", out / "hf", WIDE["extra_layers"], WIDE["intermediate_size"])
    f32 = convert(out / "hf", out / "target-f32.gguf", "f32")
    quantize(f32, gguf, "Q4_K_M")
    f32.unlink()
    return gguf


def built_target(inputs: dict, form: str) -> Path:
    """`gguf2ov target GGUF --grid FORM` (or --weight-format int4), built once per file and form."""
    gguf = inputs["target"]
    out = CACHE / "side-by-side" / f"{gguf.stem}-{form}"
    if not (out / "openvino_model.xml").is_file():
        tok = ["--tokenizer", str(inputs["tokenizer"])] if inputs["tokenizer"] else []
        say(f"building the {form} target of {gguf.name}")
        with heavy():
            subprocess.run([*GGUF2OV, "target", str(gguf), "-o", str(out), *GRIDS[form], *tok, "--overwrite", "--quiet"],
                           check=True, env=CHECKOUT_ENV)
    return out


def built_draft(gguf: Path) -> Path:
    out = CACHE / "side-by-side" / f"{gguf.stem}-draft"
    if not (out / "openvino_model.xml").is_file():
        subprocess.run([*GGUF2OV, "export", str(gguf), "-o", str(out), "--weight-format", "gguf", "--overwrite",
                        "--quiet"], check=True, env=CHECKOUT_ENV)
    return out


# -- measurements, each in a fresh process ------------------------------------------------------------

def timed(argv: list, **kw) -> tuple[subprocess.CompletedProcess, int | None]:
    """(the run, its peak RSS in KiB from /usr/bin/time)."""
    with heavy():
        p = subprocess.run(["/usr/bin/time", "-f", "%M", *map(str, argv)], capture_output=True, text=True, **kw)
    peak = None
    for line in reversed(p.stderr.strip().splitlines()):
        if line.strip().isdigit():
            peak = int(line.strip())
            break
    return p, peak


def llama_bench(gguf: Path) -> dict:
    """tg128 and pp(K+1) at a depth of 32 tokens: tokens/s and the verify-to-decode ratios."""
    before = load()
    p, peak = timed([tool("llama-bench"), "-m", gguf, "-t", THREADS, "-p", ",".join(str(k + 1) for k in KS), "-n", 128,
                     "-d", 32, "-r", 2, "-o", "json"])
    if p.returncode:
        return {"error": p.stderr[-500:], "load_before": before}
    rows = json.loads(p.stdout)
    tg = next(r for r in rows if r["n_gen"] == 128)
    step = 1 / tg["avg_ts"]
    verify = {str(k): round((k + 1) / next(r for r in rows if r["n_prompt"] == k + 1)["avg_ts"] / step, 3) for k in KS}
    return {"tokens_per_s": round(tg["avg_ts"], 2), "verify": verify, "peak_rss_kib": peak, "load_before": before}


def genai_decode(target: Path, hint: str | None) -> dict:
    before = load()
    argv = [sys.executable, "-m", "benchmarks.bench_target_build", "--genai-speed", target, *(["--hint", hint] if hint else [])]
    p, peak = timed(argv, env=CHECKOUT_ENV)
    if p.returncode:
        return {"error": p.stderr[-500:], "load_before": before}
    row = json.loads(p.stdout.strip().splitlines()[-1])
    return {"tokens_per_s": row["tokens_per_s"], "runs": row["tokens_per_s_runs"], "peak_rss_kib": peak,
            "load_before": before}


def genai_verify(target: Path) -> dict:
    before = load()
    argv = [sys.executable, "-m", __spec__.name, "--verify-cost", target]
    p, _ = timed(argv, env=CHECKOUT_ENV)
    if p.returncode:
        return {"error": p.stderr[-500:], "load_before": before}
    row = json.loads(p.stdout.strip().splitlines()[-1])
    return {"verify": {k: v["ratio"] for k, v in row["verify"].items()}, "decode_ms": row["decode_ms"], "load_before": before}


def verify_cost_f32(target: str) -> dict:
    """bench_target_build.verify_cost with the f32 hint, as the pair runs (this process)."""
    from benchmarks.bench_target_build import verify_cost

    return verify_cost(target, ks=KS, properties={"INFERENCE_PRECISION_HINT": "f32"})


SPEC_SUMMARY = (re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"), re.compile(r"n_drafted\s*=\s*(\d+)"),
                re.compile(r"n_accept\s*=\s*(\d+)"))


def llama_pair(target: Path, draft: Path, prompts: list[str], k: int, tokens: int) -> dict:
    """llama-speculative-simple --spec-type draft-dflash over the prompts: decoded tokens / decode seconds,
    and the drafted and accepted tokens it reports. A run whose summary lines are missing is run again: its log
    thread sometimes loses the last lines at exit (3 of 14 runs of the fixture pair, exit status 0)."""
    before, decoded, seconds, drafted, accepted, peak = load(), 0, 0.0, 0, 0, 0
    for prompt in prompts:
        for _ in range(3):
            p, rss = timed([tool("llama-speculative-simple"), "-m", target, "-md", draft, "--spec-type", "draft-dflash",
                            "--spec-draft-n-max", k, "-p", prompt, "-n", tokens, "--temp", 0, "-t", THREADS, "-c", 2048])
            if p.returncode:
                return {"error": p.stderr[-500:], "load_before": before}
            found = [r.search(p.stdout + p.stderr) for r in SPEC_SUMMARY]
            if all(found):
                break
        else:
            return {"error": f"no summary in three runs: {p.stderr[-300:]}", "load_before": before}
        (n, s), (d,), (a,) = (m.groups() for m in found)
        decoded, seconds, drafted, accepted = decoded + int(n), seconds + float(s), drafted + int(d), accepted + int(a)
        peak = max(peak, rss or 0)
    return {"tokens_per_s": round(decoded / seconds, 2), "accepted": accepted, "drafted": drafted,
            "peak_rss_kib": peak, "load_before": before}


def genai_pair(target: Path, draft: Path, prompts: Path, k: int, tokens: int) -> dict:
    """`gguf2ov accept` (f32, K proposals): the pair's and the target's tokens/s, accepted / drafted."""
    before = load()
    out = CACHE / "side-by-side" / "accept.json"
    p, peak = timed([*GGUF2OV, "accept", "--target", target, "--draft", draft, "--prompts", prompts,
                     "--max-new-tokens", tokens, "--num-assistant-tokens", k, "--json", out, "--quiet"], env=CHECKOUT_ENV)
    if not out.is_file():
        return {"error": p.stderr[-500:], "load_before": before}
    r = json.loads(out.read_text())
    out.unlink()
    return {"tokens_per_s": round(r["tok_s_draft"], 2), "alone_tokens_per_s": round(r["tok_s_target"], 2),
            "accepted": r["accepted_tokens"], "drafted": r["draft_candidates"], "identical": r["identical"],
            "verdict": r["verdict"], "peak_rss_kib": peak, "load_before": before}


def memory(inputs: dict, targets: dict) -> dict:
    """Peak RSS and the smallest memory limit of a 16-token generation: llama.cpp's llama-bench -n 16 and
    llama-completion (a prompt, 16 new tokens, -t 2), and LLMPipeline with default properties on each OpenVINO
    target (bench_target_build's use case)."""
    from benchmarks import memlimit
    from benchmarks.bench_target_build import PROMPT

    runs = {"llama.cpp": [tool("llama-bench"), "-m", inputs["target"], "-t", THREADS, "-p", 0, "-n", 16, "-r", 1],
            "llama-completion": [tool("llama-completion"), "-m", inputs["target"], "-t", THREADS, "-n", 16, "-p", PROMPT,
                                 "-no-cnv", "--no-warmup"]}
    for form, target in targets.items():
        runs[f"GenAI {form}"] = [sys.executable, "-m", "benchmarks.bench_target_build", "--use-target", target]
    found = {}
    for label, argv in runs.items():
        with heavy():
            r = memlimit.smallest_limit([str(a) for a in argv], name=label, resolution_gib=0.25, env=CHECKOUT_ENV,
                                        log_dir=CACHE / "side-by-side" / "memlimit", say=say)
        found[label] = {"smallest_limit_gib": r["smallest_limit_gib"], "largest_failing_gib": r["largest_failing_gib"],
                        "peak_rss_kib": (r["unlimited"] or {}).get("peak_rss_kib")}
    return found


# -- the table -------------------------------------------------------------------------------------

def spread(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return ""
    med = statistics.median(values)
    return f"{med:.2f}" if len(values) == 1 else f"{med:.2f} [{min(values):.2f}-{max(values):.2f}]"


def column(rounds: list[dict], key: str, field: str, sub: str | None = None) -> list:
    out = []
    for r in rounds:
        x = r.get(key, {})
        x = x.get(field) if isinstance(x, dict) else None
        out.append(x.get(sub) if isinstance(x, dict) and sub else x)
    return out


def markdown(report: dict) -> str:
    rounds, forms = report["rounds"], report["forms"]
    engines = [("llama.cpp", "llama")] + [(f"GenAI, `--grid {f}`" if f != "int4" else "GenAI, int4", f) for f in forms]
    lines = [f"# {report['case']}: llama.cpp and OpenVINO GenAI on the same files", "",
             f"{report['machine']}; {report['date']}, commit {report['commit']}; {len(rounds)} rounds, median [range]. "
             f"Target `{report['target']}`" + (f", draft `{report['draft']}`" if report.get("draft") else "") + ".", "",
             "| | " + " | ".join(e for e, _ in engines) + " |", "|---|" + "---|" * len(engines)]

    def row(label, cells):
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("target decode, tokens/s (tg128; GenAI default properties)",
        [spread(column(rounds, "llama_bench", "tokens_per_s"))] +
        [spread(column(rounds, f"decode_default_{f}", "tokens_per_s")) for f in forms])
    row("target decode, tokens/s (GenAI f32 hint)", [""] + [spread(column(rounds, f"decode_f32_{f}", "tokens_per_s")) for f in forms])
    for k in KS:
        row(f"verify K={k}, decode steps", [spread(column(rounds, "llama_bench", "verify", str(k)))] +
            [spread(column(rounds, f"verify_{f}", "verify", str(k))) for f in forms])
    if any("pair_llama" in r for r in rounds):
        row(f"pair, tokens/s (K={report['k']})", [spread(column(rounds, "pair_llama", "tokens_per_s"))] +
            [spread(column(rounds, f"pair_{f}", "tokens_per_s")) for f in forms])
        row("target alone in the same run, tokens/s", [""] + [spread(column(rounds, f"pair_{f}", "alone_tokens_per_s")) for f in forms])
        ratio = lambda f: [g / l if g and l else None for g, l in zip(column(rounds, f"pair_{f}", "tokens_per_s"),  # noqa: E731
                                                                       column(rounds, "pair_llama", "tokens_per_s"))]
        row("pair / llama.cpp's pair (same round)", ["1.00"] + [spread(ratio(f)) for f in forms])
        acc = lambda key: "; ".join(f"{a}/{d}" for a, d in zip(column(rounds, key, "accepted"), column(rounds, key, "drafted")))  # noqa: E731
        row("accepted / drafted", [acc("pair_llama")] + [acc(f"pair_{f}") for f in forms])
        row("greedy text identical to the target alone", [""] + [str(set(column(rounds, f"pair_{f}", "identical"))) for f in forms])
    rss = lambda key: spread([x / 2**20 if x else None for x in column(rounds, key, "peak_rss_kib")])  # noqa: E731
    row("peak RSS of the decode run, GiB", [rss("llama_bench")] + [rss(f"decode_default_{f}") for f in forms])
    if report.get("memory"):
        m = report["memory"]
        row("smallest memory limit of a 16-token generation, GiB (llama.cpp: llama-bench)",
            [str(m.get("llama.cpp", {}).get("smallest_limit_gib"))] + [str(m.get(f"GenAI {f}", {}).get("smallest_limit_gib")) for f in forms])

        def rss(label):
            kib = m.get(label, {}).get("peak_rss_kib")
            return f"{kib / 2**20:.2f}" if kib else ""

        row("peak RSS of a 16-token generation, GiB (llama.cpp: llama-bench)", [rss("llama.cpp")] + [rss(f"GenAI {f}") for f in forms])
        if "llama-completion" in m:
            row("llama-completion (16 tokens): smallest limit, peak RSS, GiB",
                [f"{m['llama-completion'].get('smallest_limit_gib')}, {rss('llama-completion')}"] + [""] * len(forms))
    loads = [x for r in rounds for v in r.values() if isinstance(v, dict) for x in [v.get("load_before")] if x is not None]
    if loads:
        lines += ["", f"Load average (1 min) before the measurements: median {statistics.median(loads):.2f}, range "
                      f"{min(loads):.2f}-{max(loads):.2f} (2 cores).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", nargs="?")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--forms", default="split,folded", help=f"OpenVINO targets to build from the file: {', '.join(GRIDS)}")
    p.add_argument("--k", type=int, default=7, help="the pair's proposals per step")
    p.add_argument("--max-new-tokens", type=int, default=100, help="per prompt, in the pair runs")
    p.add_argument("--no-pair", action="store_true")
    p.add_argument("--no-decode", action="store_true",
                   help="skip GenAI's tg128 decodes (the pair run still times each target alone)")
    p.add_argument("--memory", action="store_true", help="also the smallest memory limit of each engine (bisected)")
    p.add_argument("--lock", help="a lock file taken around each heavy measurement (flock)")
    p.add_argument("--verify-cost", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.verify_cost:
        print(json.dumps(verify_cost_f32(args.verify_cost)))
        return 0
    if not args.case:
        p.error("a case is required")
    LOCK["path"] = args.lock
    inputs = case_inputs(args.case)
    forms = [f for f in args.forms.split(",") if f]
    targets = {f: built_target(inputs, f) for f in forms}
    pair = inputs["draft"] is not None and not args.no_pair
    draft_ir = built_draft(inputs["draft"]) if pair else None
    prompts = [line for line in inputs["prompts"].read_text().splitlines() if line.strip()]
    machine = machine_info()
    commit = short_commit()
    report = {"case": args.case, "target": inputs["target"].name, "draft": inputs["draft"].name if inputs["draft"] else None,
              "trained": inputs["trained"], "forms": forms, "k": args.k, "commit": commit,
              "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
              "machine": f"{machine['cpu_model']}, {machine['usable_cores']} cores", "packages": package_versions(),
              "rounds": []}
    for i in range(args.rounds):
        r = {}
        say(f"round {i + 1}/{args.rounds}: llama-bench")
        r["llama_bench"] = llama_bench(inputs["target"])
        for f, target in targets.items():
            say(f"round {i + 1}: GenAI decode and verify, {f}")
            if not args.no_decode:
                r[f"decode_default_{f}"] = genai_decode(target, None)
                r[f"decode_f32_{f}"] = genai_decode(target, "f32")
            r[f"verify_{f}"] = genai_verify(target)
        if pair:
            say(f"round {i + 1}: the pair in llama.cpp")
            r["pair_llama"] = llama_pair(inputs["target"], inputs["draft"], prompts, args.k, args.max_new_tokens)
            for f, target in targets.items():
                say(f"round {i + 1}: the pair in GenAI, {f}")
                r[f"pair_{f}"] = genai_pair(target, draft_ir, inputs["prompts"], args.k, args.max_new_tokens)
        report["rounds"].append(r)
        write(report)
    if args.memory:
        report["memory"] = memory(inputs, targets)
        write(report)
    print(markdown(report))
    return 0


def write(report: dict) -> None:
    stem = RESULTS / f"side-by-side-{report['case']}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    (stem.parent / f"{stem.name}.json").write_text(json.dumps(report, indent=1) + "\n")  # "padded-1.7b": no suffix
    (stem.parent / f"{stem.name}.md").write_text(markdown(report))


if __name__ == "__main__":
    sys.exit(main())

"""The seeds' biggest pairs on a 24 GB machine: the memory plan before any build, the lean form built, the pair
decoding in LLMPipeline or VLMPipeline with its draft attached, beside llama.cpp's pair on the same two GGUFs.

Random weights in llama.cpp's layout, type mix and metadata (`scale_gguf.ensure_target_gguf`, `ensure_gguf`,
`ensure_mmproj`); the geometries are `random_target.py`'s and `scale_gguf.py`'s, their sources there:

    qwen3.5-27b       Qwen3.5-27B's text model (the DFlash 2 article's Qwen3.8-27B as far as public) and a
                      DFlash 2 draft of incoai/Qwen3.8-27B-DFlash2's geometry
    gemma-4-31b       Gemma 4 31B's text model and a draft of z-lab/gemma-4-31B-it-DFlash's geometry
    gemma-4-31b-vlm   the same, the VLM folder built from the text GGUF and an mmproj of the vision tower's size
    gpt-oss-20b       gpt-oss-20b (MXFP4_MOE) and a draft of z-lab/gpt-oss-20b-DFlash's geometry

Steps, each a fresh process, their records merged into results/big-pairs.json:
    plan      `gguf2ov inspect TARGET.gguf --json` (every form) and the pair's plan as `run` makes it
    build     `gguf2ov target TARGET.gguf --weight-format FORM [--mmproj]` under /usr/bin/time, and the draft's
              `gguf2ov export --weight-format gguf --target` (its head as `run` chooses it)
    decode    the pipeline with the draft attached (K = 7) and without it, one greedy generation of
              NEW_TOKENS each: tokens/s after the first token (which carries the weights' repacking), and the
              pair's peak private memory plus libraries
    limit     the smallest memory limit the pair's decode completes under, bisected to 0.5 GiB
    llamacpp  llama-speculative-simple --spec-type draft-dflash on the two GGUFs (the draft carrying the target's
              vocabulary) and llama-bench's tg of the target alone: tokens/s, peak RSS, and with `limit` its
              smallest limit

    python -m benchmarks.big_pairs --pairs gpt-oss-20b --steps plan,build,decode,limit,llamacpp [--form int4]
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import memlimit
from benchmarks.bench_pair_memory import with_vocab
from benchmarks.bench_target_build import GGUF2OV
from benchmarks.common import CHECKOUT_ENV, RESULTS, load_average, machine_info, package_versions, process_status
from benchmarks.llamacpp.tools import tool
from benchmarks.random_target import GEOMETRIES
from benchmarks.scale_gguf import GEOMETRIES as DRAFTS
from benchmarks.scale_gguf import VISION_GEOMETRIES, ensure_gguf, ensure_mmproj, ensure_target_gguf

GIB = 2**30
K = 7
NEW_TOKENS = 32
PROMPT = "The history of the printing press begins"
WORK = RESULTS / "big-pairs"
PAIRS = {"qwen3.5-27b": ("qwen3.5-27b", "qwen3.8-27b-dflash2", None),
         "gemma-4-31b": ("gemma-4-31b", "gemma-4-31b-dflash", None),
         "gemma-4-31b-vlm": ("gemma-4-31b", "gemma-4-31b-dflash", "gemma-4-31b-vision"),
         "gpt-oss-20b": ("gpt-oss-20b", "gpt-oss-20b-dflash", None)}
FORMS = {"int4": ["--weight-format", "int4"], "folded": ["--weight-format", "gguf"]}


def inputs(pair: str) -> dict:
    target, draft, vision = PAIRS[pair]
    files = {"target_gguf": Path(ensure_target_gguf(GEOMETRIES[target])["path"]),
             "draft_gguf": Path(ensure_gguf(DRAFTS[draft])["path"])}
    if vision:
        files["mmproj"] = Path(ensure_mmproj(VISION_GEOMETRIES[vision])["path"])
    return files


def folders(pair: str, form: str) -> tuple[Path, Path]:
    return WORK / f"{pair}-{form}-target", WORK / f"{pair}-{form}-draft"


# -- the steps -----------------------------------------------------------------------------------------------

def plan(pair: str, form: str) -> dict:
    """The plan of every form (inspect's) and the pair's, as `run` makes them before building."""
    from gguf2ov.cli.args import target_build
    from gguf2ov.job import Job, Options
    from gguf2ov.runtime.genai import GenerationSettings

    files = inputs(pair)
    out = WORK / f"{pair}-inspect.json"
    subprocess.run([*map(str, GGUF2OV), "inspect", str(files["target_gguf"]), "--json", str(out), "--quiet"],
                   check=True, env=CHECKOUT_ENV)
    options = Options(progress=False, prompts=(PROMPT,),
                      generation=GenerationSettings(max_new_tokens=NEW_TOKENS, num_assistant_tokens=K))
    build = target_build("int4" if form == "int4" else "gguf", mmproj=files.get("mmproj"))
    job = Job.of(files["draft_gguf"], files["target_gguf"], options, build=build)
    memory = job.memory_plan(("gguf",))
    return {"inspect": json.loads(out.read_text())["run_time_memory"], "pair": memory.record() | {"line": memory.line()}}


def _timed(argv: list, log: Path) -> dict:
    """`argv` under /usr/bin/time: wall seconds and peak RSS."""
    time_file = log.with_suffix(".time")
    start = time.perf_counter()
    with open(log, "w") as out:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(time_file), *map(str, argv)], stdout=out,
                           stderr=subprocess.STDOUT, env=CHECKOUT_ENV)
    seconds, peak = (time_file.read_text().split() + ["0", "0"])[:2]  # "%e %M": wall seconds, peak KiB
    return {"exit_code": p.returncode, "wall_s": round(time.perf_counter() - start, 1), "peak_rss_gib":
            round(int(peak) / 2**20, 2), "load": load_average(), "log": str(log)}


def build(pair: str, form: str) -> dict:
    files = inputs(pair)
    target, draft = folders(pair, form)
    mmproj = ["--mmproj", files["mmproj"]] if "mmproj" in files else []
    WORK.mkdir(parents=True, exist_ok=True)
    record = {"target": _timed([*GGUF2OV, "target", files["target_gguf"], "-o", target, *FORMS[form], *mmproj,
                                "--overwrite", "--quiet"], WORK / f"{pair}-{form}-target.log")}
    record["draft"] = _timed([*GGUF2OV, "export", files["draft_gguf"], "-o", draft, "--weight-format", "gguf",
                              "--target", target, "--overwrite", "--quiet"], WORK / f"{pair}-{form}-draft.log")
    record["target_ir_gib"] = round(sum(f.stat().st_size for f in target.iterdir()) / GIB, 2)
    return record


def decode_child(target: str, draft: str | None) -> dict:
    """In a fresh process: the pipeline (with the draft), one greedy generation; peak private memory sampled."""
    from benchmarks.bench_pair_memory import _Peak
    from benchmarks.memory_plan import _library_bytes
    from gguf2ov.runtime.genai import make_pipeline
    from gguf2ov.runtime.target import TargetIR

    peak, start = _Peak(), time.perf_counter()
    ir = TargetIR.open(target)
    pipe = make_pipeline(ir, "CPU", {}, draft_dir=draft, num_assistant_tokens=K if draft else None)
    built = time.perf_counter() - start
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = NEW_TOKENS, True, False
    if draft:
        cfg.num_assistant_tokens, cfg.assistant_confidence_threshold = K, 0.0
    t = time.perf_counter()
    result = pipe.generate(PROMPT, generation_config=cfg) if ir.kind == "vlm" else pipe.generate([PROMPT], cfg)
    seconds = time.perf_counter() - t
    metrics = result.perf_metrics
    tokens = int(metrics.get_num_generated_tokens())
    # the first token carries the plugin's repacking of the weights (at the first inference): the decode speed is
    # the tokens after it
    ttft = metrics.get_ttft().mean / 1000
    return {"built_s": round(built, 1), "generate_s": round(seconds, 2), "tokens": tokens,
            "tok_s": round(tokens / seconds, 3), "first_token_s": round(ttft, 2),
            "decode_tok_s": round((tokens - 1) / (seconds - ttft), 3) if tokens > 1 else None, "peak_anon": peak.stop(),
            "libraries": _library_bytes(), "end": process_status()}


def decode(pair: str, form: str, limit: bool) -> dict:
    target, draft = folders(pair, form)
    me = [sys.executable, "-m", __spec__.name, "--child", str(target)]
    record = {}
    for case, argv in (("alone", me + ["-"]), ("pair", me + [str(draft)])):
        memlimit.evict([target, draft])
        start = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, env=CHECKOUT_ENV)
        record[case] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-1500:]}
        record[case]["wall_s"] = round(time.perf_counter() - start, 1)
        record[case]["load"] = load_average()
    if limit and "error" not in record["pair"]:
        got = record["pair"]
        measured = (got["peak_anon"] + got["libraries"]) / GIB
        # below its peak private memory the pair cannot complete (no swap): the bisection starts there; the decode
        # above is its unlimited run, and a try that takes twice its time fails
        unlimited = {"completed": True, "seconds": got["wall_s"], "peak_rss_kib": got["end"]["VmHWM"] // 1024}
        r = memlimit.smallest_limit(me + [str(draft)], name=f"{pair}-{form}", probes=[round(measured * 1.1 * 2) / 2],
                                    lo_gib=math.floor(got["peak_anon"] / GIB * 2) / 2, hi_gib=22.0,
                                    log_dir=WORK / "limit-logs", env=CHECKOUT_ENV, evict_paths=[target, draft],
                                    unlimited=unlimited, timeout_factor=2.0)
        record["smallest_limit_gib"], record["largest_failing_gib"] = r["smallest_limit_gib"], r["largest_failing_gib"]
    return record


def llamacpp(pair: str, limit: bool) -> dict:
    files = inputs(pair)
    draft = with_vocab(files["draft_gguf"], files["target_gguf"])
    spec = [tool("llama-speculative-simple"), "-m", files["target_gguf"], "-md", draft, "--spec-type", "draft-dflash",
            "-p", PROMPT, "-n", str(NEW_TOKENS), "-c", "512", "-t", "2", "--spec-draft-n-max", str(K), "--temp", "0"]
    record = {"pair": _timed(spec, WORK / f"{pair}-llamacpp-pair.log"),
              "alone": _timed([tool("llama-bench"), "-m", files["target_gguf"], "-p", "0", "-n", str(NEW_TOKENS), "-r",
                               "1", "-t", "2", "-o", "json"], WORK / f"{pair}-llamacpp-bench.log")}
    text = Path(record["pair"]["log"]).read_text(errors="replace")
    record["pair"]["summary"] = [line for line in text.splitlines() if "decoded" in line or "accept" in line][-4:]
    if limit:
        r = memlimit.smallest_limit(spec, name=f"{pair}-llamacpp", probes=[record["pair"]["peak_rss_gib"]],
                                    lo_gib=1.0, hi_gib=22.0, log_dir=WORK / "limit-logs",
                                    evict_paths=[files["target_gguf"], draft])
        record["smallest_limit_gib"], record["largest_failing_gib"] = r["smallest_limit_gib"], r["largest_failing_gib"]
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default=",".join(PAIRS))
    p.add_argument("--steps", default="plan,build,decode,llamacpp")
    p.add_argument("--form", default="int4", choices=tuple(FORMS))
    p.add_argument("--limit", action="store_true", help="bisect the smallest memory limits as well")
    p.add_argument("--clean", action="store_true", help="remove each pair's built folders once measured (disk)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        target, draft = args.child
        print(json.dumps(decode_child(target, None if draft == "-" else draft)))
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    report_path = RESULTS / "big-pairs.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {"pairs": {}}
    report |= {"machine": machine_info(), "packages": package_versions()}
    steps = args.steps.split(",")
    for pair in args.pairs.split(","):
        record = report["pairs"].setdefault(f"{pair}/{args.form}", {})
        for step in steps:
            print(f"[big-pairs] {pair} ({args.form}): {step} ...", flush=True)
            try:
                record[step] = {"plan": lambda: plan(pair, args.form), "build": lambda: build(pair, args.form),
                                "decode": lambda: decode(pair, args.form, args.limit),
                                "llamacpp": lambda: llamacpp(pair, args.limit)}[step]()
            except Exception as e:  # a step that fails is recorded, and the next pair still runs
                record[step] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"[big-pairs] {pair} ({args.form}): {step}: {json.dumps(record[step])[:1500]}", flush=True)
            report_path.write_text(json.dumps(report, indent=2) + "\n")
        if args.clean:
            for folder in folders(pair, args.form):
                subprocess.run(["rm", "-rf", str(folder)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

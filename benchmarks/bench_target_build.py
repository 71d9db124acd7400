"""Building targets at real size: wall time, peak RSS, the smallest memory limit and the output size
of each command, each in a fresh process (`memlimit.py`), and the decode speed of the targets.

    gguf-8b        gguf2ov target Q4_K_M.gguf -o OUT --weight-format gguf --tokenizer TOK
                   (a random Q4_K_M file of Qwen3-8B's geometry, `scale_gguf.ensure_target_gguf`)
    gguf-vocab-8b  the same, the tokenizer built from the file's own vocabulary
    int4-4b/-8b    gguf2ov target CKPT -o OUT --weight-format int4   (random bf16, `random_target.py`)
    optimum-4b/-8b optimum-cli export openvino --task text-generation-with-past --weight-format int4
                   --group-size 128 --ratio 1.0 (the same checkpoint)
    gguf-compact-8b  the same with --compact-grid (the GGUF's own factorisation, IR ~1.0x its tensor bytes)
    use-8b         what the target costs where it runs: LLMPipeline(TARGET, "CPU") and a 16-token greedy
                   generation, on the gguf-8b target (built once beforehand, not measured); use-compact-8b
                   on the --compact-grid one
    pair-8b        the same with a qwen3-8b-dflash draft (`gguf2ov export --weight-format gguf`) attached
                   (the acceptance stage's peak)
    run-8b         gguf2ov run DRAFT.gguf --target TARGET.gguf ... (a qwen3-8b-dflash draft against the
                   gguf-8b file, which the run builds a target from); one try under 8 GiB, no bisection
    decode-1.7b    tokens/s (greedy, 128 new tokens, 2 threads) on one Q4_K_M GGUF that llama.cpp made
                   (convert_hf_to_gguf.py bf16 + llama-quantize Q4_K_M of a random Qwen3-1.7B geometry),
                   the median of three generations:
                   `gguf2ov target` as gguf (folded and --compact-grid) and int4 in LLMPipeline
                   (default properties, and f32),
                   GenAI's own GGUF reader on the file, and llama-bench -t 2 (tg128)

Before each try the page cache of the inputs and of the virtualenv is dropped (see memlimit.py;
`--keep-env-cache` leaves the virtualenv's, for smoke runs beside other measurements).
Results merge into results/target-build.json (by case) and results/target-build.md.

    python benchmarks/bench_target_build.py --cases gguf-8b,int4-8b,optimum-8b
    python benchmarks/bench_target_build.py --cases gguf-tiny,int4-tiny,optimum-tiny,decode-tiny   # smoke run
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memlimit  # noqa: E402
from llamacpp import source_dir, tool  # noqa: E402
from random_target import EXPORTS, GEOMETRIES, ensure_checkpoint  # noqa: E402
from scale_gguf import CACHE, ensure_gguf, ensure_target_gguf  # noqa: E402
from scale_gguf import GEOMETRIES as DRAFTS  # noqa: E402

RESULTS = HERE / "results"
WORK = RESULTS / "target-build-work"
BIN = Path(sys.executable).parent
GIB = 2**30
SIZES = {"tiny": "tiny", "1.7b": "qwen3-1.7b", "4b": "qwen3-4b", "8b": "qwen3-8b"}
PROMPT = "The history of the printing press begins"
KEEP_ENV_CACHE = False
WAIT_IDLE = 1800  # s to wait, before each try, for other work on the cores to end
RUN_PROBES = [8.0]  # GiB: the limits a run case is tried under (`--run-probes`)
PROMPTS = [PROMPT, "Water boils at a lower temperature on a mountain because"]


def gguf_tensor_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def tokenizer_dir(vocab: int) -> Path:
    from random_target import write_tokenizer

    path = CACHE / f"tokenizer-padded-{vocab}"
    if not (path / "tokenizer.json").is_file():
        path.mkdir(parents=True, exist_ok=True)
        write_tokenizer(path, vocab)
    return path


def case(name: str) -> dict:
    """argv, output folder, inputs to evict, probes, and what the goal needs, for one case."""
    kind, _, size = name.rpartition("-")
    geom = GEOMETRIES[SIZES[size]]
    out = WORK / name
    if kind in ("gguf", "gguf-vocab", "gguf-compact"):
        gguf = Path(ensure_target_gguf(geom)["path"])
        argv = gguf_target_argv(gguf, out, geom, compact=kind == "gguf-compact", own_vocab=kind == "gguf-vocab")
        return {"argv": argv, "output": out, "inputs": [gguf], "probes": [2.0], "source": gguf,
                "source_tensor_bytes": gguf_tensor_bytes(gguf)}
    if kind in ("use", "use-compact", "pair"):
        gguf = Path(ensure_target_gguf(geom)["path"])
        built = built_target(gguf, geom, compact=kind == "use-compact")
        argv = [sys.executable, __file__, "--use-target", built]
        inputs = [built]
        if kind == "pair":
            draft = built_draft(Path(ensure_gguf(DRAFTS["qwen3-8b-dflash" if size == "8b" else "tiny"])["path"]))
            argv += ["--draft", draft]
            inputs.append(draft)
        return {"argv": argv, "output": None, "inputs": inputs, "probes": [8.0], "source": built}
    if kind == "run":
        gguf = Path(ensure_target_gguf(geom)["path"])
        draft = Path(ensure_gguf(DRAFTS["qwen3-8b-dflash" if size == "8b" else "tiny"])["path"])
        prompts = WORK / "prompts.txt"
        prompts.parent.mkdir(parents=True, exist_ok=True)
        prompts.write_text("\n".join(PROMPTS) + "\n")
        argv = [BIN / "gguf2ov", "run", draft, "--target", gguf, "-o", out, "--prompts", prompts,
                "--max-new-tokens", "16"]
        return {"argv": argv, "output": out, "inputs": [gguf, draft], "probes": RUN_PROBES, "bisect": False,
                "source": gguf}
    hf = ensure_checkpoint(geom)
    if kind == "int4":
        argv = [BIN / "gguf2ov", "target", hf, "-o", out, "--weight-format", "int4"]
        probes = [2.0] if size in ("4b", "8b") else []  # the goal's side of optimum's 4-9 GiB
    elif kind == "optimum":
        argv = [BIN / "optimum-cli", "export", "openvino", "-m", hf, "--task", "text-generation-with-past",
                *EXPORTS["int4"], out]
        probes = [9.0, 6.0] if size == "8b" else []  # measured before: completes at 9 GB, killed at 6 GB
    else:
        raise SystemExit(f"unknown case {name!r}")
    return {"argv": argv, "output": out, "inputs": [hf], "probes": probes, "source": hf}


def gguf_target_argv(gguf: Path, out: Path, geom, compact: bool = False, own_vocab: bool = False) -> list:
    """`gguf2ov target GGUF -o OUT --weight-format gguf`, folded or --compact-grid, the tokenizer from
    the padded fixture tokenizer or (`own_vocab`) the file's vocabulary."""
    return [BIN / "gguf2ov", "target", gguf, "-o", out, "--weight-format", "gguf",
            *(["--compact-grid"] if compact else []), *([] if own_vocab else ["--tokenizer", tokenizer_dir(geom.vocab)])]


def built_target(gguf: Path, geom, compact: bool) -> Path:
    """The gguf target of `gguf` (folded, or --compact-grid), built once for the use cases."""
    out = WORK / f"built-{gguf.stem}-{'compact' if compact else 'folded'}"
    if not (out / "openvino_model.xml").is_file():
        argv = gguf_target_argv(gguf, out, geom, compact)
        subprocess.run([str(a) for a in argv] + ["--overwrite", "--quiet"], check=True)
    return out


def built_draft(gguf: Path) -> Path:
    out = WORK / f"built-{gguf.stem}-gguf"
    if not (out / "openvino_model.xml").is_file():
        subprocess.run([str(BIN / "gguf2ov"), "export", str(gguf), "-o", str(out), "--weight-format", "gguf",
                        "--overwrite", "--quiet"], check=True)
    return out


def use_target(target: str, draft: str | None) -> dict:
    """In a fresh process: the target (and draft) in LLMPipeline with default properties, one 16-token
    greedy generation, as a user's first use of it."""
    import time

    from gguf2ov.runtime.genai import make_pipeline

    start = time.perf_counter()
    pipe = make_pipeline(target, "CPU", {}, draft_dir=draft)
    load = time.perf_counter() - start
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = 16, True, False
    if draft is not None:
        cfg.num_assistant_tokens = 16
    result = pipe.generate([PROMPT], cfg)
    return {"load_s": round(load, 2), "seconds": round(time.perf_counter() - start, 2),
            "tokens": result.perf_metrics.get_num_generated_tokens()}


def run_finished(attempt: dict) -> None:
    """A run that exits 1 has finished with a verdict other than PASS (random weights: MISMATCH or
    BROKEN), not failed for memory: it completed, unless it was killed or timed out."""
    if attempt["exit_code"] == 1 and not attempt["timed_out"] and not attempt["oom_kills"]:
        attempt["completed"] = True


def measure(name: str, say=print) -> dict:
    c = case(name)
    evict = [*c["inputs"], *([] if KEEP_ENV_CACHE else [Path(sys.prefix)])]
    env = dict(os.environ)
    if c.get("bisect", True):
        r = memlimit.smallest_limit(c["argv"], name=name, probes=c["probes"], log_dir=WORK / "logs", env=env,
                                    evict_paths=evict, output=c["output"], wait_idle=WAIT_IDLE, say=say)
    else:  # the probes only (a run costs tens of minutes): wall time and peak RSS come from under the limit
        tries = []
        for p in c["probes"]:
            tries.append(memlimit.run_limited(c["argv"], p, 3600, WORK / "logs" / f"{name}-{p:g}GiB", env=env,
                                              evict_paths=evict, output=c["output"], trace_period=1.0,
                                              wait_idle=WAIT_IDLE))
            run_finished(tries[-1])
            say(f"[bench] {name}: {p:g} GiB {memlimit._describe(tries[-1])}")
        done = [t["limit_gib"] for t in tries if t["completed"]]
        r = {"name": name, "argv": [str(a) for a in c["argv"]], "unlimited": None, "tries": tries,
             "resolution_gib": None, "smallest_limit_gib": min(done) if done else None,
             "largest_failing_gib": max([t["limit_gib"] for t in tries if not t["completed"]], default=None)}
    first = r["unlimited"] or r["tries"][0]
    r["output_bytes"] = first.get("output_bytes")
    r["ir_bin_bytes"] = first.get("output_files", {}).get("openvino_model.bin")
    if "source_tensor_bytes" in c:
        r["source_tensor_bytes"] = c["source_tensor_bytes"]
    r["source"] = str(c["source"])
    shutil.rmtree(c["output"], ignore_errors=True)
    memlimit.write_result(r, RESULTS / f"memlimit-{name}")
    return r


# -- decode speed --------------------------------------------------------------------------------

def convert_with_llamacpp(hf: Path, out: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py (bf16), then llama-quantize Q4_K_M; the bf16 file is deleted.

    The random checkpoint's tokenizer is the fixture's, whose pre-tokenizer hash llama.cpp does not
    know: the converter is told it is qwen2's, as for a real Qwen3 tokenizer. Its sentencepiece
    import (made before it looks for tokenizer.model) is satisfied from a folder beside the build.
    """
    if out.is_file():
        return out
    src, bf16 = source_dir(), out.with_suffix(".bf16.gguf")
    pydeps = src.parent / "pydeps"
    if not (pydeps / "sentencepiece").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(pydeps), "sentencepiece"],
                       check=True)
    shim = ("import runpy, sys\nsrc = sys.argv[1]; sys.path[:0] = [src, src + '/gguf-py']\n"
            "import conversion.base as base\nbase.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
            "sys.argv = [src + '/convert_hf_to_gguf.py', *sys.argv[2:]]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=str(pydeps))
    subprocess.run([sys.executable, "-c", shim, str(src), str(hf), "--outtype", "bf16", "--outfile", str(bf16)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(tool("llama-quantize")), str(bf16), str(out), "Q4_K_M", "2"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bf16.unlink()
    return out


def genai_speed(model: str, hint: str | None) -> dict:
    """Run in a fresh process: LLMPipeline(model, "CPU"), greedy, 128 new tokens (EOS ignored)."""
    import time

    import openvino_genai as g

    props = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
    start = time.perf_counter()
    pipe = g.LLMPipeline(model, "CPU", **props)
    load = time.perf_counter() - start
    cfg = g.GenerationConfig()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = 128, True, False
    pipe.generate(PROMPT, cfg)  # warm-up
    runs = sorted((pipe.generate([PROMPT], cfg).perf_metrics for _ in range(3)), key=lambda m: m.get_throughput().mean)
    m = runs[1]  # the median of three (the cores are shared)
    return {"load_s": round(load, 2), "tokens": m.get_num_generated_tokens(),
            "tokens_per_s": round(m.get_throughput().mean, 2), "ttft_ms": round(m.get_ttft().mean, 1),
            "tpot_ms": round(m.get_tpot().mean, 2), "tokens_per_s_runs": [round(r.get_throughput().mean, 2) for r in runs]}


def decode(size: str, say=print) -> dict:
    geom = GEOMETRIES[SIZES[size]]
    hf = ensure_checkpoint(geom)
    gguf = convert_with_llamacpp(hf, hf.parent / "llamacpp-Q4_K_M.gguf")
    result = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "rows": []}
    targets = {}
    for flags in (["--weight-format", "gguf"], ["--weight-format", "gguf", "--compact-grid"],
                  ["--weight-format", "int4"]):
        label = " ".join(flags)
        out = WORK / f"decode-{size}-{'-'.join(f.strip('-') for f in flags[1:])}"
        if not (out / "openvino_model.xml").is_file():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run([str(BIN / "gguf2ov"), "target", str(gguf), "-o", str(out), *flags, "--quiet"], check=True)
        targets[label] = out
        result[f"target {label} bin_bytes"] = memlimit.folder_bytes(out / "openvino_model.bin")
    runs = [(f"gguf2ov target {label}", str(path), hint) for label, path in targets.items() for hint in (None, "f32")]
    runs += [("GenAI's GGUF reader", str(gguf), None), ("GenAI's GGUF reader", str(gguf), "f32")]
    for label, model, hint in runs:
        memlimit.wait_for_idle(WAIT_IDLE, say=say)
        p = subprocess.run([sys.executable, __file__, "--genai-speed", model, *(["--hint", hint] if hint else [])],
                           capture_output=True, text=True)
        row = {"engine": label, "properties": f"INFERENCE_PRECISION_HINT={hint}" if hint else "default"}
        row |= json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-500:]}
        say(f"[bench] decode {label} {row['properties']}: {row.get('tokens_per_s')} tok/s")
        result["rows"].append(row)
    memlimit.wait_for_idle(WAIT_IDLE, say=say)
    p = subprocess.run([str(tool("llama-bench")), "-m", str(gguf), "-t", "2", "-p", "0", "-n", "128", "-o", "json"],
                       capture_output=True, text=True, check=True)
    bench = json.loads(p.stdout)[0]
    result["rows"].append({"engine": "llama-bench -t 2 (tg128)", "properties": "", "tokens": bench["n_gen"],
                           "tokens_per_s": round(bench["avg_ts"], 2), "stddev": round(bench["stddev_ts"], 2)})
    say(f"[bench] decode llama-bench: {result['rows'][-1]['tokens_per_s']} tok/s")
    for out in targets.values():
        shutil.rmtree(out, ignore_errors=True)
    return result


# -- report --------------------------------------------------------------------------------------

def _gib(n) -> str:
    return "" if n is None else f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def goals(cases: dict) -> dict[str, str]:
    """name -> the goal and whether it was met, for the cases that have one."""
    verdict = {}
    for name, r in cases.items():
        if "unlimited" not in r:
            continue
        kind, _, size = name.rpartition("-")
        limit = r["smallest_limit_gib"]
        secs = min(x["seconds"] for x in [r["unlimited"] or r["tries"][0], *r.get("unlimited_reruns", [])])
        if kind in ("gguf", "gguf-vocab", "gguf-compact"):
            ratio = r["ir_bin_bytes"] / r["source_tensor_bytes"] if r.get("ir_bin_bytes") else None
            if ratio is None:
                verdict[name] = "no IR"
                continue
            compact = kind == "gguf-compact"  # the IR goal is the compact form's; folded costs ~1.38x
            ok = limit is not None and limit <= 2 and secs <= 180 and (ratio <= 1.05 or not compact)
            verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 2 GiB ({limit}), <= 180 s ({secs:.0f}), "
                             + (f"IR <= 1.05x tensor bytes ({ratio:.3f}x)" if compact else
                                f"IR {ratio:.3f}x tensor bytes, folded"))
        elif kind in ("use", "use-compact", "pair"):
            verdict[name] = f"under 8 GiB: {'yes' if limit is not None and limit <= 8 else 'no'}"
        elif kind == "int4" and f"optimum-{size}" in cases:
            o = cases[f"optimum-{size}"]
            olimit = o["smallest_limit_gib"]
            osecs = min(x["seconds"] for x in [o["unlimited"], *o.get("unlimited_reruns", [])])
            ok = None not in (limit, olimit) and limit <= 0.5 * olimit and secs <= osecs
            verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 0.5x optimum's ({limit} vs {olimit} GiB), "
                             f"time <= optimum's ({secs:.0f} vs {osecs:.0f} s)")
        elif kind == "run":
            ok = limit is not None and limit <= 8
            tried = ", ".join(f"{t['limit_gib']:g} GiB {'completes' if t['completed'] else 'fails'}" for t in r["tries"])
            verdict[name] = f"{'met' if ok else 'MISSED'}: completes under 8 GiB ({tried})"
    return verdict


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["# Building targets at real size", "",
             f"{m['cpu_model']}, {m['usable_cores']} cores, {m['ram_gib']} GiB RAM. Each command in a fresh process; "
             "wall time and peak RSS from `/usr/bin/time -f \"%e %M\"` without a limit (a / b: a second unlimited run; "
             "goals use the faster); the smallest cgroup v1 memory "
             "limit (memory + swap, page cache included) under which it completes, bisected to 0.5 GiB "
             "(`benchmarks/memlimit.py`), the inputs' and the virtualenv's page cache dropped before each try.", "",
             "| case | command | wall (s) | peak RSS (GiB) | smallest limit (GiB) | largest failing (GiB) | "
             "s at smallest | output | goal |", "|---|---|---|---|---|---|---|---|---|"]
    verdict = goals(report["cases"])
    for name, r in report["cases"].items():
        if "unlimited" not in r:
            continue
        u = r["unlimited"] or r["tries"][0]  # no unlimited run: the figures of the first try, under its limit
        at = next((t["seconds"] for t in r["tries"] if t["limit_gib"] == r["smallest_limit_gib"]), None)
        cmd = " ".join(Path(a).name if a.startswith("/") else a for a in r["argv"])
        wall = " / ".join(f"{x['seconds']:.1f}" for x in [u, *r.get("unlimited_reruns", [])])
        peak = " / ".join(f"{(x['peak_rss_kib'] or 0) / 2**20:.2f}" for x in [u, *r.get("unlimited_reruns", [])])
        lines.append(f"| {name} | `{cmd}` | {wall} | {peak} | "
                     f"{r['smallest_limit_gib']} | {r['largest_failing_gib']} | {'' if at is None else f'{at:.1f}'} | "
                     f"{_gib(r.get('output_bytes'))} (IR .bin {_gib(r.get('ir_bin_bytes'))}"
                     + (f", {r['ir_bin_bytes'] / r['source_tensor_bytes']:.3f}x the GGUF's tensor bytes"
                        if r.get("source_tensor_bytes") and r.get("ir_bin_bytes") else "")
                     + f") | {verdict.get(name, '')} |")
    for name, d in report["cases"].items():
        if "rows" not in d:
            continue
        lines += ["", f"## Decode speed: {name}", "",
                  f"`{Path(d['gguf']).name}`: {_gib(d['gguf_bytes'])}, made by llama.cpp's convert_hf_to_gguf.py "
                  f"(bf16) and llama-quantize Q4_K_M. Greedy, 128 new tokens after a short prompt (EOS ignored), "
                  "one warm-up generation first; GenAI's tokens/s is `perf_metrics.get_throughput()` (1 / TPOT), the median "
                  "of three generations (all three in brackets); llama-bench's is its mean of 5 with the standard "
                  "deviation.", "",
                  "| engine | properties | tokens/s | TPOT (ms) | TTFT (ms) | load (s) |", "|---|---|---|---|---|---|"]
        for row in d["rows"]:
            spread = row.get("tokens_per_s_runs") or ([f"+-{row['stddev']}"] if "stddev" in row else [])
            lines.append(f"| {row['engine']} | {row['properties']} | {row.get('tokens_per_s', row.get('error', ''))} "
                         f"{'(' + ', '.join(map(str, spread)) + ')' if spread else ''} | "
                         f"{row.get('tpot_ms', '')} | {row.get('ttft_ms', '')} | {row.get('load_s', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="gguf-8b,int4-8b,optimum-8b,decode-1.7b,gguf-vocab-8b,int4-4b,optimum-4b")
    p.add_argument("--rerun-unlimited", action="store_true", help="only run the cases' unlimited run again")
    p.add_argument("--keep-env-cache", action="store_true", help="do not drop the virtualenv's page cache")
    p.add_argument("--genai-speed", metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--hint", help=argparse.SUPPRESS)
    p.add_argument("--run-probes", default="8", help="GiB limits a run case is tried under, comma-separated (default 8)")
    p.add_argument("--use-target", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--draft", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.use_target:
        print(json.dumps(use_target(args.use_target, args.draft)))
        return 0
    if args.genai_speed:
        print(json.dumps(genai_speed(args.genai_speed, args.hint)))
        return 0
    from bench_scale import machine_info, package_versions

    global KEEP_ENV_CACHE
    KEEP_ENV_CACHE = args.keep_env_cache
    RUN_PROBES[:] = [float(x) for x in args.run_probes.split(",")]
    path = RESULTS / "target-build.json"
    report = json.loads(path.read_text()) if path.is_file() else {"cases": {}}
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    for name in [c for c in args.cases.split(",") if c]:
        if name.startswith("decode-"):
            result = decode(name.removeprefix("decode-"), say)
        elif args.rerun_unlimited:  # the unlimited run again (e.g. when the first one shared the disk)
            result = report["cases"][name]
            c = case(name)
            evict = [*c["inputs"], *([] if KEEP_ENV_CACHE else [Path(sys.prefix)])]
            again = memlimit.run_limited(c["argv"], None, None, WORK / "logs" / f"{name}-unlimited-rerun",
                                         evict_paths=evict, output=c["output"], trace_period=1.0,
                                         wait_idle=WAIT_IDLE)
            shutil.rmtree(c["output"], ignore_errors=True)
            say(f"[bench] {name}: unlimited again {memlimit._describe(again)}")
            result.setdefault("unlimited_reruns", []).append(again)
        else:
            result = measure(name, say)
        result["measured"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        report["cases"][name] = result
        report |= {"machine": machine_info(), "packages": package_versions()}
        path.write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "target-build.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

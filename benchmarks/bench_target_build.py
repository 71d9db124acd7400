"""Building targets at real size: wall time, peak RSS, the smallest memory limit and the output size
of each command, each in a fresh process (`memlimit.py`), and the decode speed of the targets.

Dense Qwen3 (Qwen3-8B's geometry, and 4B, 1.7B):

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

Hybrid Qwen3.5 (Qwen3.5-9B's text model: hidden 4096, 32 layers of 3 Gated DeltaNet + 1 gated
attention, 16/4 heads of 256, linear 16 key / 32 value heads of 128, vocab 248320, the MTP block):

    gguf-9b, use-9b  as gguf-8b / use-8b, on a random Q4_K_M `qwen35` file in llama.cpp's layout and
                   type mix (`scale_gguf.llamacpp_layout`: block_count 33, nextn_predict_layers 1)
    int8-9b        gguf2ov target CKPT -o OUT --weight-format int8 (a random bf16 checkpoint, keys under
                   model.language_model. and the MTP block under mtp., as the hub's are)
    optimum-int8-9b  optimum-cli export openvino --task text-generation-with-past --weight-format int8 of
                   it, run by the environment `--optimum-env` names (optimum-intel 2.2.0 exports
                   qwen3_5_text only with transformers 5.2); tried under 14 GiB only (one try)
    run-9b         gguf2ov run DRAFT.gguf --target TARGET.gguf (a qwen3.5-9b-dflash draft, taps
                   [1, 8, 15, 22, 29], against the gguf-9b file); one try (`--run-probes`)
    decode-2b      as decode-1.7b, on a small Qwen3.5 (hidden 2048, 24 layers, 8/2 heads of 256, linear
                   16/16 heads): gguf2ov target as gguf and int8, and optimum's int8 export

Mixture of experts (Qwen3-30B-A3B: hidden 2048, 48 layers, 32/4 heads of 128, 128 experts, top 8,
expert ffn 768, vocab 151936):

    gguf-30b, use-30b  as gguf-8b / use-8b on a random Q4_K_M `qwen3moe` file in llama.cpp's layout
                   and type mix; the time goal is against the time to read the file (`cat FILE >
                   /dev/null`, its page cache dropped first)
    decode-30b     the gguf target's tokens/s in LLMPipeline against llama-bench -t 2 on the same file

Gemma 4 (Gemma 4 31B's text model: hidden 5376, 60 layers of 5 sliding (16 key/value heads of 256, window
1024) + 1 global (4 key/value heads of 512, K as V), 32 query heads, ffn 21504, vocab 262144, tied head):

    gguf-31b       as gguf-30b on a random Q4_K_M `gemma4` file (llama.cpp's metadata keys, rope_freqs,
                   llama-quantize's Q4_K_M types: `scale_gguf.gemma4_types`); gguf-tinygemma4 a smoke run
    gguf-e4b       as gguf-31b on a random Q4_K_M file of Gemma 4 E4B's text model (hidden 2560, 42 layers, the
                   last 18 sharing keys and values, per-layer embeddings of 256: per_layer_token_embd Q6_K,
                   per_layer_model_proj BF16); gguf-tinyple a smoke run

Gemma 4 26B-A4B (hidden 2816, 30 layers of 5 sliding (8 key/value heads of 256) + 1 global (2 of 512, K as
V), 16 query heads, in every layer a dense MLP 2112 wide and beside it 128 experts of 704, top 8):

    gguf-26b-a4b   as gguf-31b, on a random Q4_K_M `gemma4` file with the experts (ffn_gate_inp and its
                   scale, ffn_gate_up_exps, ffn_down_exps and its scale, the branch norms);
                   gguf-tinygemma4moe a smoke run

gpt-oss-20b (24 layers alternating sliding (window 128) and full attention with sinks, hidden 2880, 64/8 heads of
64, 32 experts top 4 of width 2880, vocab 201088, YaRN):

    gguf-20b, gguf-compact-20b, use-20b  as gguf-30b / use-30b on a random MXFP4_MOE `gpt-oss` file in llama.cpp's
                   layout and type mix (experts MXFP4, other weights Q8_0, norms, biases, sinks and routers F32);
                   use-20b is tried once under 21 GiB; gguf-tinygptoss a smoke run
    use-20b2l, use-20b4l, use-compact-20b2l, use-compact-20b4l  the same on 2 and 4 of its layers (the same
                   widths, vocabulary and head): what one layer holds at run time, folded and --compact-grid, from
                   the process's private memory after the first generation (`process_memory`)

Every decode case also measures the verify-to-decode cost of the target (`verify_cost`): one forward
of K + 1 tokens on the stateful target after a prompt, against one decode step, K = 1, 3, 5, 7, 15.
Each gguf2ov command runs this checkout's package (`python -m gguf2ov`, the checkout first on
PYTHONPATH); each target build also records the bytes `gguf2ov target` estimates it will write (the
estimate its disk-space check uses) against the bytes it wrote.

Before each try the page cache of the inputs and of the virtualenv is dropped (see memlimit.py;
`--keep-env-cache` leaves the virtualenv's, for smoke runs beside other measurements). The load
average is recorded with every try. Results merge into results/target-build.json (by case) and
results/target-build.md.

    python -m benchmarks.bench_target_build --cases gguf-8b,int4-8b,optimum-8b
    python -m benchmarks.bench_target_build --cases gguf-tiny,int4-tiny,optimum-tiny,decode-tiny   # smoke run
    python -m benchmarks.bench_target_build --cases gguf-9b,use-9b,int8-9b,optimum-int8-9b,run-9b,decode-2b \
        --optimum-env ENV --run-probes 12
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import memlimit
from benchmarks.common import (CACHE, CHECKOUT_ENV, RESULTS, folder_bytes, load_average, machine_info,
                               package_versions, process_status)
from benchmarks.llamacpp.tools import convert, quantize, tool
from benchmarks.random_target import EXPORTS, GEOMETRIES, ensure_checkpoint
from benchmarks.scale_gguf import GEOMETRIES as DRAFTS
from benchmarks.scale_gguf import ensure_gguf, ensure_target_gguf

WORK = RESULTS / "target-build-work"
GGUF2OV = [sys.executable, "-m", "gguf2ov"]  # this checkout's package (`CHECKOUT_ENV` puts it first on the path)
GIB = 2**30
SIZES = {"tiny": "tiny", "1.7b": "qwen3-1.7b", "4b": "qwen3-4b", "8b": "qwen3-8b", "tiny35": "qwen3.5-tiny",
         "2b": "qwen3.5-2b", "9b": "qwen3.5-9b", "tinymoe": "qwen3moe-tiny", "30b": "qwen3-30b-a3b",
         "tinygemma4": "gemma4-tiny", "31b": "gemma-4-31b", "tinygemma4moe": "gemma4moe-tiny",
         "26b-a4b": "gemma-4-26b-a4b", "tinyple": "gemma4-ple-tiny", "e4b": "gemma-4-e4b",
         "tinygptoss": "gpt-oss-tiny", "20b": "gpt-oss-20b", "20b2l": "gpt-oss-20b-2l", "20b4l": "gpt-oss-20b-4l"}
# the draft a run or pair case uses ("tiny" else)
DRAFT_OF = {"8b": "qwen3-8b-dflash", "9b": "qwen3.5-9b-dflash", "20b": "gpt-oss-20b-dflash"}
PROMPT = "The history of the printing press begins"
KEEP_ENV_CACHE = False
WAIT_IDLE = 1800  # s to wait, before each try, for other work on the cores to end (`--wait-idle`)
RUN_PROBES = [8.0]  # GiB: the limits a run case is tried under (`--run-probes`)
PROBE_TIMEOUT = [3600.0]  # s: how long a try without bisection may take (`--probe-timeout`)
USE_MOE_PROBE = 14.0  # GiB: the one limit use-30b is tried under
USE_GPT_OSS_PROBE = 21.0  # GiB: the one limit use-20b is tried under (23.5 GiB machine, no swap)
PROMPTS = [PROMPT, "Water boils at a lower temperature on a mountain because"]
# The optimum-cli that exports what the project's transformers cannot (`--optimum-env`, `--optimum-pythonpath`)
OPTIMUM = {"env": Path(sys.prefix), "pythonpath": None}
VERIFY_KS = (1, 3, 5, 7, 15)


def gguf_tensor_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def tokenizer_dir(vocab: int) -> Path:
    from benchmarks.random_target import write_tokenizer

    path = CACHE / f"tokenizer-padded-{vocab}"
    if not (path / "tokenizer.json").is_file():
        path.mkdir(parents=True, exist_ok=True)
        write_tokenizer(path, vocab)
    return path


def optimum_run() -> tuple[Path, dict]:
    """The optimum-cli of `--optimum-env`, and the environment it runs in."""
    env = dict(os.environ)
    if OPTIMUM["pythonpath"]:
        env["PYTHONPATH"] = OPTIMUM["pythonpath"]
    return Path(OPTIMUM["env"]) / "bin" / "optimum-cli", env


def case(name: str) -> dict:
    """argv, output folder, inputs to evict, probes, and what the goal needs, for one case."""
    kind, size = kind_and_size(name)
    geom = GEOMETRIES[SIZES[size]]
    out = WORK / name
    draft_geom = DRAFTS[DRAFT_OF.get(size, "tiny")]
    if kind in ("gguf", "gguf-vocab", "gguf-compact"):
        gguf = Path(ensure_target_gguf(geom)["path"])
        argv = gguf_target_argv(gguf, out, geom, compact=kind == "gguf-compact", own_vocab=kind == "gguf-vocab")
        return {"argv": argv, "output": out, "inputs": [gguf], "probes": [2.0], "source": gguf,
                "source_tensor_bytes": gguf_tensor_bytes(gguf), "source_bytes": gguf.stat().st_size,
                "read_file": geom.moe or size in ("31b", "e4b")}
    if kind in ("use", "use-compact", "pair"):
        gguf = Path(ensure_target_gguf(geom)["path"])
        built = built_target(gguf, geom, compact=kind == "use-compact")
        argv = [sys.executable, "-m", __spec__.name, "--use-target", built]
        inputs = [built]
        if kind == "pair":
            draft = built_draft(Path(ensure_gguf(draft_geom)["path"]))
            argv += ["--draft", draft]
            inputs.append(draft)
        if geom.moe and size not in ("tinymoe", "tinygptoss"):  # compiled, its experts take about the IR's size in
            # private memory (more than the machine has): one try under a limit, no unlimited run
            probe = USE_GPT_OSS_PROBE if size.startswith("20b") else USE_MOE_PROBE
            return {"argv": argv, "output": None, "inputs": inputs, "probes": [probe], "source": built,
                    "bisect": False}
        return {"argv": argv, "output": None, "inputs": inputs, "probes": [8.0], "source": built}
    if kind == "run":
        gguf = Path(ensure_target_gguf(geom)["path"])
        draft = Path(ensure_gguf(draft_geom)["path"])
        prompts = WORK / "prompts.txt"
        prompts.parent.mkdir(parents=True, exist_ok=True)
        prompts.write_text("\n".join(PROMPTS) + "\n")
        argv = [*GGUF2OV, "run", draft, "--target", gguf, "-o", out, "--prompts", prompts, "--max-new-tokens", "16"]
        return {"argv": argv, "output": out, "inputs": [gguf, draft], "probes": RUN_PROBES, "bisect": False,
                "source": gguf}
    hf = ensure_checkpoint(geom)
    if kind in ("int4", "int8"):
        argv = [*GGUF2OV, "target", hf, "-o", out, "--weight-format", kind]
        # the goal's side of optimum's limits: int4 4-9 GiB (dense), int8 12-14 GiB (hybrid 9B)
        probes = [2.0] if size in ("4b", "8b") else [3.0] if size == "9b" else []
        return {"argv": argv, "output": out, "inputs": [hf], "probes": probes, "source": hf}
    if kind in ("optimum", "optimum-int8"):
        label = "int4" if kind == "optimum" else "int8"
        cli, env = optimum_run()
        argv = [cli, "export", "openvino", "-m", hf, "--task", "text-generation-with-past", *EXPORTS[label], out]
        # measured before: int4 8B completes at 9 GB, killed at 6 GB; int8 9B hybrid completes at 14, killed at 12
        # (the 9B: 14 only, one try, as its export takes minutes)
        probes = {"8b": [9.0, 6.0], "9b": [14.0]}.get(size, [])
        return {"argv": argv, "output": out, "inputs": [hf], "probes": probes, "source": hf, "env": env,
                "env_prefix": Path(OPTIMUM["env"]), "bisect": size != "9b"}  # the 9B: the probes only (slow)
    raise SystemExit(f"unknown case {name!r}")


def kind_and_size(name: str) -> tuple[str, str]:
    """A case name's kind and size ("gguf-26b-a4b": gguf, 26b-a4b): the longest size it ends with."""
    size = max((s for s in SIZES if name.endswith("-" + s)), key=len, default=name.rpartition("-")[2])
    return name[:-len(size) - 1], size


def gguf_target_argv(gguf: Path, out: Path, geom, compact: bool = False, own_vocab: bool = False) -> list:
    """`gguf2ov target GGUF -o OUT --weight-format gguf`, folded or --compact-grid, the tokenizer from
    the padded fixture tokenizer or (`own_vocab`) the file's vocabulary."""
    return [*GGUF2OV, "target", gguf, "-o", out, "--weight-format", "gguf",
            *(["--compact-grid"] if compact else []), *([] if own_vocab else ["--tokenizer", tokenizer_dir(geom.vocab)])]


def estimate_bytes(argv: list) -> int | None:
    """What `gguf2ov target` estimates the command `argv` writes (the figure its disk-space check
    uses), asked in a fresh process; None for other commands."""
    args = [str(a) for a in argv]
    if args[:len(GGUF2OV) + 1] != [*map(str, GGUF2OV), "target"]:
        return None
    p = subprocess.run([sys.executable, "-m", __spec__.name, "--estimate", *args[len(GGUF2OV):]], capture_output=True,
                       text=True, env=CHECKOUT_ENV)
    return int(p.stdout.split()[-1]) if p.returncode == 0 else None


def target_estimate(argv: list[str]) -> int:
    """`gguf2ov target ARGS`'s own estimate of the bytes it writes, its job made as the command makes it."""
    from gguf2ov.cli import args as a
    from gguf2ov.cli.app import build_parser
    from gguf2ov.job import Job, Options
    from gguf2ov.sources import model_source

    ns = build_parser().parse_args(argv)
    build = a.target_build(ns.weight_format, ns.group_size, ns.sym, ns.ratio, ns.all_layers, ns.grid,
                           ns.tokenizer, ns.map)
    return Job(target_spec=build(model_source(ns.source, "target")), options=Options(progress=False)).target_bytes()


def read_seconds(path: Path, say=print) -> dict:
    """Seconds `cat FILE > /dev/null` takes with the file's page cache dropped first, and the load."""
    import time

    os.sync()
    memlimit.evict([path])
    load = load_average()
    start = time.perf_counter()
    subprocess.run(f"cat '{path}' > /dev/null", shell=True, check=True)
    seconds = time.perf_counter() - start
    say(f"[bench] reading {path.name}: {seconds:.1f} s ({path.stat().st_size / seconds / 2**20:.0f} MiB/s)")
    return {"seconds": round(seconds, 1), "bytes": path.stat().st_size, "load_avg_before": load}


def built_target(gguf: Path, geom, compact: bool) -> Path:
    """The gguf target of `gguf` (folded, or --compact-grid), built once for the use cases."""
    out = WORK / f"built-{gguf.stem}-{'compact' if compact else 'folded'}"
    if not (out / "openvino_model.xml").is_file():
        argv = gguf_target_argv(gguf, out, geom, compact)
        subprocess.run([str(a) for a in argv] + ["--overwrite", "--quiet"], check=True, env=CHECKOUT_ENV)
    return out


def built_draft(gguf: Path) -> Path:
    out = WORK / f"built-{gguf.stem}-gguf"
    if not (out / "openvino_model.xml").is_file():
        subprocess.run([*map(str, GGUF2OV), "export", str(gguf), "-o", str(out), "--weight-format", "gguf",
                        "--overwrite", "--quiet"], check=True, env=CHECKOUT_ENV)
    return out


def use_target(target: str, draft: str | None) -> dict:
    """In a fresh process: the target (and draft) in LLMPipeline with default properties, one 16-token
    greedy generation, as a user's first use of it."""
    import time

    from gguf2ov.runtime.genai import make_pipeline
    from gguf2ov.runtime.target import TargetIR

    start = time.perf_counter()
    pipe = make_pipeline(TargetIR.open(target), "CPU", {}, draft_dir=draft)
    load = time.perf_counter() - start
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = 16, True, False
    if draft is not None:
        cfg.num_assistant_tokens = 16
    result = pipe.generate([PROMPT], cfg)
    return {"load_s": round(load, 2), "seconds": round(time.perf_counter() - start, 2),
            "tokens": result.perf_metrics.get_num_generated_tokens(), **process_memory()}


def process_memory() -> dict:
    """This process's private (RssAnon) and file-backed (RssFile) resident bytes now, and its peak RSS (VmHWM):
    after a first generation, what the compiled model holds as its own and what it reads from the IR's pages."""
    fields = {"RssAnon": "anon_bytes", "RssFile": "file_bytes", "VmHWM": "peak_rss_bytes"}
    return {fields[key]: value for key, value in process_status(tuple(fields)).items()}


def run_finished(attempt: dict) -> None:
    """A run that exits with a verdict's code other than PASS's has finished with that verdict (random
    weights: MISMATCH or BROKEN), not failed for memory: it completed, unless it was killed or timed out."""
    from gguf2ov.cli.output import VERDICT_CODES

    finished = attempt["exit_code"] in set(VERDICT_CODES.values()) - {0}
    if finished and not attempt["timed_out"] and not attempt["oom_kills"]:
        attempt["completed"] = True


def measure(name: str, say=print) -> dict:
    c = case(name)
    evict = [*c["inputs"], *([] if KEEP_ENV_CACHE else [c.get("env_prefix", Path(sys.prefix))])]
    env = c.get("env", CHECKOUT_ENV)
    estimate = estimate_bytes(c["argv"])
    read = read_seconds(c["source"], say) if c.get("read_file") else None
    if c.get("bisect", True):
        r = memlimit.smallest_limit(c["argv"], name=name, probes=c["probes"], log_dir=WORK / "logs", env=env,
                                    evict_paths=evict, output=c["output"], wait_idle=WAIT_IDLE, say=say)
    else:  # the probes only (a run costs tens of minutes): wall time and peak RSS come from under the limit
        tries = []
        for p in c["probes"]:
            tries.append(memlimit.run_limited(c["argv"], p, PROBE_TIMEOUT[0], WORK / "logs" / f"{name}-{p:g}GiB", env=env,
                                              evict_paths=evict, output=c["output"], trace_period=1.0,
                                              wait_idle=WAIT_IDLE))
            if name.startswith("run-"):
                run_finished(tries[-1])
            say(f"[bench] {name}: {p:g} GiB {memlimit._describe(tries[-1])}")
        done = [t["limit_gib"] for t in tries if t["completed"]]
        r = {"name": name, "argv": [str(a) for a in c["argv"]], "unlimited": None, "tries": tries,
             "resolution_gib": None, "smallest_limit_gib": min(done) if done else None,
             "largest_failing_gib": max([t["limit_gib"] for t in tries if not t["completed"]], default=None)}
    first = r["unlimited"] or r["tries"][0]
    r["output_bytes"] = first.get("output_bytes")
    r["ir_bin_bytes"] = first.get("output_files", {}).get("openvino_model.bin")
    for key in ("source_tensor_bytes", "source_bytes"):
        if key in c:
            r[key] = c[key]
    if estimate is not None:
        r["estimated_bytes"] = estimate
    if read is not None:
        r["source_read"] = read
    r["source"] = str(c["source"])
    shutil.rmtree(c["output"], ignore_errors=True)
    memlimit.write_result(r, RESULTS / f"memlimit-{name}")
    return r


# -- decode speed --------------------------------------------------------------------------------

def convert_with_llamacpp(hf: Path, out: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py (bf16, `llamacpp.tools.convert`), then llama-quantize Q4_K_M; the bf16
    file is deleted."""
    if out.is_file():
        return out
    bf16 = convert(hf, out.with_suffix(".bf16.gguf"), "bf16")
    quantize(bf16, out, "Q4_K_M")
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


def verify_cost(model: str, ks=VERIFY_KS, prompt_tokens: int = 32, rounds: int = 5, properties=None) -> dict:
    """Run in a fresh process: what a DFlash verify of K proposals costs the target against a decode step.
    The stateful target, compiled for CPU with `properties` (default: none); after the same prompt each time (the
    state reset, the prompt run again, not timed), the time of one forward of K + 1 tokens against one
    of a single token; a warm-up round, then `rounds` rounds over every K (as accept's probes: a busy core
    slows all of them alike), the median of each."""
    import statistics
    import time

    import numpy as np
    import openvino as ov

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    start = time.perf_counter()
    request = ov.Core().compile_model(str(Path(model) / "openvino_model.xml"), "CPU", properties or {}).create_infer_request()
    load = time.perf_counter() - start
    rng = np.random.default_rng(0)

    def forward(ids, past: int) -> float:
        n = len(ids)
        t = time.perf_counter()
        request.infer({"input_ids": ids[None], "attention_mask": np.ones((1, past + n), np.int64),
                       "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
                       "beam_idx": np.zeros(1, np.int32)})
        return time.perf_counter() - t

    prompt = rng.integers(0, vocab, prompt_tokens).astype(np.int64)
    times = {k: [] for k in (0, *ks)}
    for r in range(rounds + 1):
        for k in times:
            request.reset_state()
            forward(prompt, 0)
            seconds = forward(rng.integers(0, vocab, k + 1).astype(np.int64), prompt_tokens)
            if r:
                times[k].append(seconds)
    decode_s = statistics.median(times[0])
    return {"load_s": round(load, 2), "prompt_tokens": prompt_tokens, "rounds": rounds,
            "decode_ms": round(1e3 * decode_s, 2),
            "verify": {str(k): {"ms": round(1e3 * statistics.median(times[k]), 2),
                                "ratio": round(statistics.median(times[k]) / decode_s, 3),
                                "runs_ms": [round(1e3 * x, 1) for x in times[k]]} for k in ks}}


def decode_formats(geom) -> list[list[str]]:
    """The `gguf2ov target` flags a decode case builds from the GGUF: the file's grid (folded; for a
    dense model --compact-grid too) and the format optimum's export is compared with (int4 dense,
    int8 hybrid); a mixture of experts the file's grid only."""
    if geom.moe:
        return [["--weight-format", "gguf"]]
    if geom.hybrid:
        return [["--weight-format", "gguf"], ["--weight-format", "int8"]]
    return [["--weight-format", "gguf"], ["--weight-format", "gguf", "--compact-grid"], ["--weight-format", "int4"]]


def in_fresh_process(flag: list[str], say=print) -> dict:
    """This script with a hidden flag (`--genai-speed`, `--verify-cost`) in a fresh process: its JSON."""
    memlimit.wait_for_idle(WAIT_IDLE, say=say)
    load = load_average()
    p = subprocess.run([sys.executable, "-m", __spec__.name, *flag], capture_output=True, text=True, env=CHECKOUT_ENV)
    row = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-500:]}
    return row | {"load_avg_before": load}


def decode(size: str, say=print) -> dict:
    """Tokens/s of the targets a GGUF becomes and of llama.cpp on it, and the verify-to-decode cost.
    The GGUF is llama.cpp's own (converter and llama-quantize on a random checkpoint), or for a mixture of
    experts the random Q4_K_M file of `ensure_target_gguf` (its bf16 checkpoint would be 61 GB)."""
    geom = GEOMETRIES[SIZES[size]]
    if geom.moe:
        hf, gguf = None, Path(ensure_target_gguf(geom)["path"])
    else:
        hf = ensure_checkpoint(geom)
        gguf = convert_with_llamacpp(hf, hf.parent / "llamacpp-Q4_K_M.gguf")
    result = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "rows": [], "verify": {}}
    targets = {}
    for flags in decode_formats(geom):
        label = " ".join(flags)
        if geom.moe:  # the file's target, as the use case builds it (one 25 GB build, not two)
            out = built_target(gguf, geom, compact=False)
        else:
            out = WORK / f"decode-{size}-{'-'.join(f.strip('-') for f in flags[1:])}"
            if not (out / "openvino_model.xml").is_file():
                shutil.rmtree(out, ignore_errors=True)
                subprocess.run([*map(str, GGUF2OV), "target", str(gguf), "-o", str(out), *flags, "--quiet"],
                               check=True, env=CHECKOUT_ENV)
        targets[f"gguf2ov target {label}"] = out
        result[f"target {label} bin_bytes"] = folder_bytes(out / "openvino_model.bin")
    if geom.hybrid:  # optimum's export of the same checkpoint, in the environment that can export it
        cli, env = optimum_run()
        out = WORK / f"decode-{size}-optimum-int8"
        if not (out / "openvino_model.xml").is_file():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run([str(cli), "export", "openvino", "-m", str(hf), "--task", "text-generation-with-past",
                            *EXPORTS["int8"], str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
        targets["optimum-cli export openvino --weight-format int8"] = out
        result["optimum int8 bin_bytes"] = folder_bytes(out / "openvino_model.bin")
    runs = [(label, str(path), hint) for label, path in targets.items() for hint in (None, "f32")]
    if not (geom.hybrid or geom.moe):  # GenAI's GGUF reader knows qwen3 (not qwen35, openvino.genai#4138)
        runs += [("GenAI's GGUF reader", str(gguf), None), ("GenAI's GGUF reader", str(gguf), "f32")]
    for label, model, hint in runs:
        row = {"engine": label, "properties": f"INFERENCE_PRECISION_HINT={hint}" if hint else "default"}
        row |= in_fresh_process(["--genai-speed", model, *(["--hint", hint] if hint else [])], say)
        say(f"[bench] decode {label} {row['properties']}: {row.get('tokens_per_s')} tok/s")
        result["rows"].append(row)
    memlimit.wait_for_idle(WAIT_IDLE, say=say)
    load = load_average()
    p = subprocess.run([str(tool("llama-bench")), "-m", str(gguf), "-t", "2", "-p", "0", "-n", "128", "-o", "json"],
                       capture_output=True, text=True, check=True)
    bench = json.loads(p.stdout)[0]
    result["rows"].append({"engine": "llama-bench -t 2 (tg128)", "properties": "", "tokens": bench["n_gen"],
                           "tokens_per_s": round(bench["avg_ts"], 2), "stddev": round(bench["stddev_ts"], 2),
                           "load_avg_before": load})
    say(f"[bench] decode llama-bench: {result['rows'][-1]['tokens_per_s']} tok/s")
    for label, out in targets.items():
        result["verify"][label] = in_fresh_process(["--verify-cost", str(out)], say)
        say(f"[bench] verify cost {label}: {result['verify'][label].get('verify')}")
        if not geom.moe:
            shutil.rmtree(out, ignore_errors=True)
    return result


# -- report --------------------------------------------------------------------------------------

def _gib(n) -> str:
    return "" if n is None else f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def _seconds(r: dict) -> float:
    """The case's time: its fastest run without a limit (or its first try, when it had none)."""
    return min(x["seconds"] for x in [r["unlimited"] or r["tries"][0], *r.get("unlimited_reruns", [])])


def goals(cases: dict) -> dict[str, str]:
    """name -> the goal and whether it was met, for the cases that have one."""
    verdict = {}
    for name, r in cases.items():
        if "unlimited" not in r:
            continue
        kind, size = kind_and_size(name)
        limit = r["smallest_limit_gib"]
        secs = _seconds(r)
        if kind in ("gguf", "gguf-vocab", "gguf-compact"):
            ratio = r["ir_bin_bytes"] / r["source_tensor_bytes"] if r.get("ir_bin_bytes") else None
            if ratio is None:
                verdict[name] = "no IR"
                continue
            if size in ("30b", "31b", "26b-a4b", "20b", "e4b"):  # as fast as reading the file twice (mixtures of experts, Gemma 4)
                read = min(x["seconds"] for x in [r["source_read"], *r.get("source_read_reruns", [])])
                ok = limit is not None and limit <= 2 and secs <= 2 * read
                verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 2 GiB ({limit}), <= 2x reading the file "
                                 f"({secs:.0f} s vs {read:.0f} s: {secs / read:.2f}x)")
                if size == "20b":  # gpt-oss-20b's IR goal: the file's tensor bytes
                    verdict[name] += f"; IR <= 1.05x tensor bytes: {'met' if ratio <= 1.05 else 'MISSED'} ({ratio:.3f}x)"
                continue
            if size == "9b":  # the hybrid's: the IR against the file
                file_ratio = r["ir_bin_bytes"] / r["source_bytes"]
                ok = limit is not None and limit <= 2 and secs <= 180 and file_ratio <= 1.40
                verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 2 GiB ({limit}), <= 180 s ({secs:.0f}), "
                                 f"IR <= 1.40x the file ({file_ratio:.3f}x)")
                continue
            compact = kind == "gguf-compact"  # the IR goal is the compact form's; folded costs ~1.38x
            ok = limit is not None and limit <= 2 and secs <= 180 and (ratio <= 1.05 or not compact)
            verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 2 GiB ({limit}), <= 180 s ({secs:.0f}), "
                             + (f"IR <= 1.05x tensor bytes ({ratio:.3f}x)" if compact else
                                f"IR {ratio:.3f}x tensor bytes, folded"))
        elif kind in ("use", "use-compact", "pair"):
            if size in ("8b", "4b", "1.7b", "tiny"):
                verdict[name] = f"under 8 GiB: {'yes' if limit is not None and limit <= 8 else 'no'}"
        elif kind in ("int4", "int8") and (o := cases.get(f"optimum-{size}" if kind == "int4" else f"optimum-int8-{size}")):
            olimit, osecs = o["smallest_limit_gib"], _seconds(o)
            if kind == "int8":  # the hybrid 9B's goal: 3 GiB, in no more time than optimum
                ok = None not in (limit, olimit) and limit <= 3 and secs <= osecs
                verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 3 GiB ({limit}; optimum's {olimit}), "
                                 f"time <= optimum's ({secs:.0f} vs {osecs:.0f} s)")
                continue
            ok = None not in (limit, olimit) and limit <= 0.5 * olimit and secs <= osecs
            verdict[name] = (f"{'met' if ok else 'MISSED'}: limit <= 0.5x optimum's ({limit} vs {olimit} GiB), "
                             f"time <= optimum's ({secs:.0f} vs {osecs:.0f} s)")
        elif kind == "run":
            goal = 12 if size == "9b" else 8
            ok = limit is not None and limit <= goal
            tried = ", ".join(f"{t['limit_gib']:g} GiB {'completes' if t['completed'] else 'fails'}" for t in r["tries"])
            verdict[name] = f"{'met' if ok else 'MISSED'}: completes under {goal} GiB ({tried})"
    return verdict


def _load(x: dict) -> str:
    load = x.get("load_avg_before")
    return "" if not load else f"{load[0]:.1f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["# Building targets at real size", "",
             f"{m['cpu_model']}, {m['usable_cores']} cores, {m['ram_gib']} GiB RAM. Each command in a fresh process; "
             "wall time and peak RSS from `/usr/bin/time -f \"%e %M\"` without a limit (a / b: a second unlimited run; "
             "goals use the faster; a case without an unlimited run gives its first try's); the smallest cgroup v1 memory "
             "limit (memory + swap, page cache included) under which it completes, bisected to 0.5 GiB "
             "(`benchmarks/memlimit.py`), the inputs' and the virtualenv's page cache dropped before each try. "
             "Load: the 1-minute load average before the run (2 cores; other work shared them). Estimate: the bytes "
             "`gguf2ov target` estimates it writes (its disk-space check) against the bytes written.", "",
             "| case | command | wall (s) | load | peak RSS (GiB) | peak anon (GiB) | smallest limit (GiB) | "
             "largest failing (GiB) | s at smallest | output | written / estimate | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdict = goals(report["cases"])
    for name, r in report["cases"].items():
        if "unlimited" not in r:
            continue
        u = r["unlimited"] or r["tries"][0]  # no unlimited run: the figures of the first try, under its limit
        runs = [u, *r.get("unlimited_reruns", [])]
        at = next((t["seconds"] for t in r["tries"] if t["limit_gib"] == r["smallest_limit_gib"]), None)
        cmd = " ".join(Path(a).name if a.startswith("/") else a for a in r["argv"])
        wall = " / ".join(f"{x['seconds']:.1f}" for x in runs)
        load = " / ".join(_load(x) for x in runs)
        peak = " / ".join(f"{(x['peak_rss_kib'] or 0) / 2**20:.2f}" for x in runs)
        anon = f"{u['sampled_peak_anon_bytes'] / GIB:.2f}" if u.get("sampled_peak_anon_bytes") else ""
        source = ""
        if r.get("source_tensor_bytes") and r.get("ir_bin_bytes"):
            source = f", {r['ir_bin_bytes'] / r['source_tensor_bytes']:.3f}x the GGUF's tensor bytes"
            if r.get("source_bytes"):
                source += f", {r['ir_bin_bytes'] / r['source_bytes']:.3f}x the file"
        if r.get("source_read"):
            source += f"; reading the file: {r['source_read']['seconds']:.0f} s"
        estimate = (f"{r['output_bytes'] / r['estimated_bytes']:.3f} ({_gib(r['estimated_bytes'])} estimated)"
                    if r.get("estimated_bytes") and r.get("output_bytes") else "")
        lines.append(f"| {name} | `{cmd}` | {wall} | {load} | {peak} | {anon} | "
                     f"{r['smallest_limit_gib']} | {r['largest_failing_gib']} | {'' if at is None else f'{at:.1f}'} | "
                     f"{_gib(r.get('output_bytes'))} (IR .bin {_gib(r.get('ir_bin_bytes'))}{source}) | {estimate} | "
                     f"{verdict.get(name, '')} |")
    for name, d in report["cases"].items():
        if "rows" not in d:
            continue
        lines += ["", f"## Decode speed: {name}", "",
                  f"`{Path(d['gguf']).name}`: {_gib(d['gguf_bytes'])}"
                  + (", made by llama.cpp's convert_hf_to_gguf.py (bf16) and llama-quantize Q4_K_M" if "llamacpp" in
                     Path(d["gguf"]).name else ", random Q4_K_M blocks in llama.cpp's layout and type mix")
                  + ". Greedy, 128 new tokens after a short prompt (EOS ignored), "
                  "one warm-up generation first; GenAI's tokens/s is `perf_metrics.get_throughput()` (1 / TPOT), the median "
                  "of three generations (all three in brackets); llama-bench's is its mean of 5 with the standard "
                  "deviation.", "",
                  "| engine | properties | tokens/s | TPOT (ms) | TTFT (ms) | load (s) | load avg |",
                  "|---|---|---|---|---|---|---|"]
        for row in d["rows"]:
            spread = row.get("tokens_per_s_runs") or ([f"+-{row['stddev']}"] if "stddev" in row else [])
            lines.append(f"| {row['engine']} | {row['properties']} | {row.get('tokens_per_s', row.get('error', ''))} "
                         f"{'(' + ', '.join(map(str, spread)) + ')' if spread else ''} | "
                         f"{row.get('tpot_ms', '')} | {row.get('ttft_ms', '')} | {row.get('load_s', '')} | {_load(row)} |")
        if d.get("verify"):
            ks = list(next(iter(d["verify"].values())).get("verify", {}))
            lines += ["", "Verify-to-decode cost (`verify_cost`): one forward of K + 1 tokens on the stateful target "
                      "after a 32-token prompt, over one decode step (CPU, default properties; median of 5 rounds "
                      "after a warm-up round).", "",
                      f"| target | decode step (ms) | {' | '.join(f'K={k}' for k in ks)} | load avg |",
                      f"|---|---|{'---|' * len(ks)}---|"]
            for label, v in d["verify"].items():
                cells = [f"{v['verify'][k]['ratio']:.2f}x" for k in ks] if "verify" in v else [v.get("error", "")[:80]]
                lines.append(f"| {label} | {v.get('decode_ms', '')} | {' | '.join(cells)} | {_load(v)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    global KEEP_ENV_CACHE, WAIT_IDLE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="gguf-8b,int4-8b,optimum-8b,decode-1.7b,gguf-vocab-8b,int4-4b,optimum-4b")
    p.add_argument("--rerun-unlimited", action="store_true", help="only run the cases' unlimited run again")
    p.add_argument("--keep-env-cache", action="store_true", help="do not drop the virtualenv's page cache")
    p.add_argument("--genai-speed", metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--hint", help=argparse.SUPPRESS)
    p.add_argument("--run-probes", default="8", help="GiB limits a run case is tried under, comma-separated (default 8)")
    p.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT[0],
                   help=f"seconds a try without bisection may take (default {PROBE_TIMEOUT[0]:g}; a run beside other work "
                        "takes longer)")
    p.add_argument("--wait-idle", type=float, default=WAIT_IDLE,
                   help=f"seconds to wait, before each try, for the cores to be idle (default {WAIT_IDLE:g}; 0: no wait)")
    p.add_argument("--optimum-env", type=Path, default=OPTIMUM["env"],
                   help="the virtualenv whose optimum-cli exports (default this one; optimum-intel 2.2.0 exports "
                        "qwen3_5_text only with transformers 5.2)")
    p.add_argument("--optimum-pythonpath", help="PYTHONPATH for that optimum-cli")
    p.add_argument("--use-target", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--draft", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--verify-cost", metavar="DIR", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--estimate"]:  # --estimate target ARGS...: gguf2ov target's own estimate
        print(target_estimate(argv[1:]))
        return 0
    args = p.parse_args(argv)
    if args.verify_cost:
        print(json.dumps(verify_cost(args.verify_cost)))
        return 0
    if args.use_target:
        print(json.dumps(use_target(args.use_target, args.draft)))
        return 0
    if args.genai_speed:
        print(json.dumps(genai_speed(args.genai_speed, args.hint)))
        return 0
    KEEP_ENV_CACHE, WAIT_IDLE = args.keep_env_cache, args.wait_idle
    OPTIMUM.update(env=args.optimum_env, pythonpath=args.optimum_pythonpath)
    RUN_PROBES[:] = [float(x) for x in args.run_probes.split(",")]
    PROBE_TIMEOUT[0] = args.probe_timeout
    path = RESULTS / "target-build.json"
    report = json.loads(path.read_text()) if path.is_file() else {"cases": {}}
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    for name in [c for c in args.cases.split(",") if c]:
        if name.startswith("decode-"):
            result = decode(name.removeprefix("decode-"), say)
        elif args.rerun_unlimited:  # the unlimited run again (e.g. when the first one shared the disk)
            result = report["cases"][name]
            c = case(name)
            evict = [*c["inputs"], *([] if KEEP_ENV_CACHE else [c.get("env_prefix", Path(sys.prefix))])]
            if c.get("read_file"):  # the time goal's other side, measured again beside it
                result.setdefault("source_read_reruns", []).append(read_seconds(c["source"], say))
            again = memlimit.run_limited(c["argv"], None, None, WORK / "logs" / f"{name}-unlimited-rerun",
                                         env=c.get("env", CHECKOUT_ENV), evict_paths=evict, output=c["output"],
                                         trace_period=1.0, wait_idle=WAIT_IDLE)
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

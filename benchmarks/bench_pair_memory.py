"""Where a pair's memory goes in GenAI, and what it needs beside llama.cpp's pair on the same two GGUFs.

The pairs are bench_target_build's, random weights in real geometries: the 8B qwen3 pair (a random
Q4_K_M file of Qwen3-8B's geometry built into a folded `gguf` target, and a qwen3-8b-dflash draft),
and the 9B qwen35 hybrid pair (Qwen3.5-9B's text model, and a qwen3.5-9b-dflash draft). Cases,
SIZE 8b or 9b:

    target-SIZE       LLMPipeline(TARGET) alone, one greedy generation of 16 tokens
    pair-HEAD-SIZE    the same with the draft attached (K = 7): HEAD `graft` is the plain draft (GenAI
                      copies the target's embedding table and lm_head into it), `stored`, `int4_asym_g32`
                      ... the draft exported with its own (`gguf2ov export --target T --draft-head HEAD`)
    draft-HEAD-SIZE   that draft compiled alone by OpenVINO and run once on a 16-token block after 32
                      context positions: what the draft itself holds
    llamacpp-SIZE     llama-speculative-simple --spec-type draft-dflash -m TARGET.gguf -md DRAFT.gguf
                      -c 512 -n 16 -t 2 --spec-draft-n-max 7 --temp 0 (`llamacpp-cN-SIZE`: -c N), the
                      draft GGUF carrying the target's vocabulary (`draft_with_vocab`), which llama.cpp
                      needs to load it; phases are GenAI's only, llama.cpp's figures are its limits

Every case runs in a fresh process with default properties (what a user's pipeline runs), twice:
- its phases: RssAnon and RssFile from /proc/self/status once the pipeline is built (compiled, the
  draft attached) and after the generation, and the peak RssAnon sampled every 20 ms;
- the smallest cgroup v1 memory limit (page cache included) under which it completes, bisected to
  0.5 GiB (`memlimit.py`), and its peak RSS.
Results merge into results/pair-memory.json (by case) and results/pair-memory.md.

    python -m benchmarks.bench_pair_memory --cases target-8b,pair-graft-8b,pair-int4_asym_g32-8b,llamacpp-8b
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import memlimit
from benchmarks.bench_target_build import DRAFT_OF, GGUF2OV, PROMPT, SIZES, WORK, built_draft, built_target
from benchmarks.common import CHECKOUT_ENV, RESULTS, load_average, machine_info, package_versions, process_status
from benchmarks.llamacpp.tools import tool
from benchmarks.random_target import GEOMETRIES
from benchmarks.scale_gguf import GEOMETRIES as DRAFTS
from benchmarks.scale_gguf import ensure_gguf, ensure_target_gguf

GIB = 2**30
NEW_TOKENS = 16
K = 7  # gguf2ov's default proposals per step (`accept`, `run`)
LLAMACPP_CONTEXT = 512  # llama.cpp's KV cache for the 16 tokens (its default, the model's 40960, would reserve GiBs)
# (probes, lo, hi) GiB per case kind and size: limits tried first (where the figures were expected), one
# assumed to fail, and the first one expected to complete (the bisection's bounds)
LIMITS = {("target", "8b"): ([6.5], 5.0, 7.5), ("target", "9b"): ([7.0], 6.0, 8.0),
          ("pair", "8b"): ([8.0], 6.0, 10.0), ("pair", "9b"): ([10.0], 7.0, 13.0),
          ("draft", "8b"): ([2.0], 0.5, 3.0), ("draft", "9b"): ([2.0], 0.5, 3.5),
          ("llamacpp", "8b"): ([4.0, 3.5], 3.0, 6.0), ("llamacpp", "9b"): ([7.0], 5.0, 9.0),
          ("draft", "20b"): ([2.0], 0.5, 3.0), ("llamacpp", "20b"): ([13.0], 4.0, 14.0)}


# -- the inputs ----------------------------------------------------------------------------------------

def inputs(size: str) -> dict:
    """The two GGUFs of a pair, its target folder (folded gguf) and its plain draft folder (gguf), built once."""
    geom = GEOMETRIES[SIZES[size]]
    target_gguf = Path(ensure_target_gguf(geom)["path"])
    draft_gguf = Path(ensure_gguf(DRAFTS[DRAFT_OF[size]])["path"])
    return {"target_gguf": target_gguf, "draft_gguf": draft_gguf, "target": built_target(target_gguf, geom, compact=False),
            "draft": built_draft(draft_gguf), "vocab": geom.vocab}


def draft_with_head(size: str, head: str) -> Path:
    """The pair's draft exported with its own embedding and head (`--draft-head HEAD`), once."""
    pair = inputs(size)
    if head == "graft":
        return pair["draft"]
    out = WORK / f"built-{pair['draft_gguf'].stem}-gguf-{head}"
    if not (out / "openvino_model.xml").is_file():
        subprocess.run([*map(str, GGUF2OV), "export", str(pair["draft_gguf"]), "-o", str(out), "--weight-format", "gguf",
                        "--target", str(pair["target"]), "--draft-head", head, "--overwrite", "--quiet"],
                       check=True, env=CHECKOUT_ENV)
    return out


def draft_with_vocab(size: str) -> Path:
    """The pair's draft GGUF with the target's tokenizer metadata (`with_vocab`)."""
    pair = inputs(size)
    return with_vocab(pair["draft_gguf"], pair["target_gguf"])


def with_vocab(draft_gguf: Path, target_gguf: Path) -> Path:
    """A draft GGUF with its target's tokenizer metadata (llama.cpp loads no model without one; a real DFlash
    GGUF carries its target's), written once beside it: every tensor and key of the draft as it is, but its
    tokenizer.ggml.* keys, which are the target's (the draft's own mask token kept)."""
    import gguf

    out = draft_gguf.with_name(draft_gguf.stem + f"-vocab-{target_gguf.stem}.gguf")
    if out.is_file():
        return out
    draft, target = gguf.GGUFReader(str(draft_gguf)), gguf.GGUFReader(str(target_gguf))
    writer = gguf.GGUFWriter(str(out) + ".partial", arch="dflash")
    mask = "tokenizer.ggml.mask_token_id"
    fields = [f for k, f in draft.fields.items() if not k.startswith("tokenizer.ggml.") or k == mask]
    fields += [f for k, f in target.fields.items() if k.startswith("tokenizer.ggml.") and k != mask]
    for field in fields:
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in draft.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in draft.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    os.replace(str(out) + ".partial", out)
    return out


# -- what runs in a fresh process ----------------------------------------------------------------------

class _Peak:
    """RssAnon sampled every 20 ms on a thread: the peak between snapshots."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, process_status()["RssAnon"])
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def pair_phases(target: str, draft: str | None) -> dict:
    """LLMPipeline(target[, draft]) with default properties, one greedy generation of NEW_TOKENS."""
    from gguf2ov.runtime.genai import make_pipeline
    from gguf2ov.runtime.target import TargetIR

    peak, phases, start = _Peak(), {"start": process_status()}, time.perf_counter()
    pipe = make_pipeline(TargetIR.open(target), "CPU", {}, draft_dir=draft, num_assistant_tokens=K if draft else None)
    phases["built"] = process_status() | {"seconds": round(time.perf_counter() - start, 1)}
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = NEW_TOKENS, True, False
    if draft is not None:
        cfg.num_assistant_tokens, cfg.assistant_confidence_threshold = K, 0.0
    result = pipe.generate([PROMPT], cfg)
    phases["generated"] = process_status() | {"seconds": round(time.perf_counter() - start, 1),
                                              "tokens": result.perf_metrics.get_num_generated_tokens()}
    return {"phases": phases, "peak_anon": peak.stop()}


def draft_phases(draft: str, block: int = 16, context: int = 32) -> dict:
    """The draft folder compiled alone (default properties) and run on one block after `context` positions."""
    import numpy as np
    import openvino as ov

    from gguf2ov.draft.config import read_draft_config
    from gguf2ov.runtime.draft_ir import block_feeds

    config = read_draft_config(Path(draft))
    peak, phases = _Peak(), {"start": process_status()}
    model = ov.Core().read_model(str(Path(draft) / "openvino_model.xml"))
    names = {n for p in model.inputs for n in p.get_names()}
    compiled = ov.Core().compile_model(model, "CPU")
    del model
    phases["built"] = process_status()
    rng = np.random.default_rng(0)
    feeds = block_feeds(rng.standard_normal((block, config.hidden_size), dtype=np.float32),
                        rng.standard_normal((context, len(config.target_layer_ids) * config.hidden_size),
                                            dtype=np.float32))
    if "input_ids" in names:
        feeds["input_ids"] = np.full((1, block), config.mask_token_id, np.int64)
    request = compiled.create_infer_request()
    request.infer({k: v for k, v in feeds.items() if k in names})
    phases["generated"] = process_status()
    return {"phases": phases, "peak_anon": peak.stop()}


def child(kind: str, args: list[str]) -> dict:
    """Run this script's hidden `--child KIND ARGS` in a fresh process: its JSON."""
    p = subprocess.run([sys.executable, "-m", __spec__.name, "--child", kind, *args], capture_output=True, text=True,
                       env=CHECKOUT_ENV)
    if p.returncode:
        return {"error": p.stderr[-800:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- the cases -----------------------------------------------------------------------------------------

def case(name: str) -> dict:
    """argv of the measured command, the inputs whose page cache is dropped, and the phases child."""
    kind, _, size = name.rpartition("-")
    pair = inputs(size)
    me = [sys.executable, "-m", __spec__.name, "--child"]
    if kind == "target":
        args = ["pair", str(pair["target"]), "-"]
        return {"argv": me + args, "child": args, "inputs": [pair["target"]], "limits": LIMITS[("target", size)]}
    if kind.startswith(("pair-", "draft-")):
        what, _, head = kind.partition("-")
        draft = draft_with_head(size, head)
        args = ["pair", str(pair["target"]), str(draft)] if what == "pair" else ["draft", str(draft)]
        paths = [pair["target"], draft] if what == "pair" else [draft]
        return {"argv": me + args, "child": args, "inputs": paths, "limits": LIMITS[(what, size)]}
    if kind.startswith("llamacpp"):
        ctx = int(kind.partition("-c")[2] or LLAMACPP_CONTEXT)
        draft = draft_with_vocab(size)
        argv = [tool("llama-speculative-simple"), "-m", pair["target_gguf"], "-md", draft, "--spec-type", "draft-dflash",
                "-p", PROMPT, "-n", str(NEW_TOKENS), "-c", str(ctx), "-t", "2", "--spec-draft-n-max", str(K), "--temp", "0"]
        return {"argv": argv, "child": None, "inputs": [pair["target_gguf"], draft], "limits": LIMITS[("llamacpp", size)]}
    raise SystemExit(f"unknown case {name!r}")


def measure(name: str, say=print) -> dict:
    c = case(name)
    result = {"argv": [str(a) for a in c["argv"]]}
    if c["child"] is not None:
        memlimit.evict(c["inputs"])
        result["phases"] = child(c["child"][0], c["child"][1:])
        say(f"[bench] {name}: phases {json.dumps(result['phases'])[:400]}")
    probes, lo, hi = c["limits"]
    r = memlimit.smallest_limit(c["argv"], name=name, probes=probes, lo_gib=lo, hi_gib=hi,
                                log_dir=RESULTS / "pair-memory-logs", env=CHECKOUT_ENV, evict_paths=c["inputs"], say=say)
    result |= {k: r[k] for k in ("unlimited", "tries", "smallest_limit_gib", "largest_failing_gib", "timeout_s")
               if k in r}
    return result


# -- report --------------------------------------------------------------------------------------------

def _gib(n) -> str:
    return "" if n is None else f"{n / GIB:.2f}"


def markdown(report: dict) -> str:
    lines = ["# Pair memory", "",
             "Each case in a fresh process, default properties, one greedy generation of 16 tokens (K = 7 with a "
             "draft). Phases from /proc/self/status: anonymous (private) and file-backed (mapped) resident memory "
             "once the pipeline is built and after the generation, the peak anonymous memory sampled every 20 ms. "
             "Smallest limit: the smallest cgroup v1 memory limit (page cache included) under which the command "
             "completes, bisected to 0.5 GiB; peak RSS from `/usr/bin/time` without a limit. GiB throughout.", "",
             "| case | built: anon / file | generated: anon / file | peak anon | peak RSS | smallest limit | "
             "largest failing | measured |", "|---|---|---|---|---|---|---|---|"]
    for name, r in report["cases"].items():
        p = (r.get("phases") or {}).get("phases", {})
        built, gen = p.get("built", {}), p.get("generated", {})
        peak_rss = (r.get("unlimited") or {}).get("peak_rss_kib")
        lines.append(f"| {name} | {_gib(built.get('RssAnon'))} / {_gib(built.get('RssFile'))} | "
                     f"{_gib(gen.get('RssAnon'))} / {_gib(gen.get('RssFile'))} | "
                     f"{_gib((r.get('phases') or {}).get('peak_anon'))} | "
                     f"{'' if peak_rss is None else f'{peak_rss / 2**20:.2f}'} | {r.get('smallest_limit_gib')} | "
                     f"{r.get('largest_failing_gib')} | {r.get('measured', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="target-8b,pair-graft-8b,pair-int4_asym_g32-8b,llamacpp-8b")
    p.add_argument("--phases-only", action="store_true", help="only the phases, no memory-limit bisection")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "pair":
            print(json.dumps(pair_phases(rest[0], None if rest[1] == "-" else rest[1])))
        else:
            print(json.dumps(draft_phases(rest[0])))
        return 0
    path = RESULTS / "pair-memory.json"
    report = json.loads(path.read_text()) if path.is_file() else {"cases": {}}
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    for name in [c for c in args.cases.split(",") if c]:
        if args.phases_only:
            c = case(name)
            result = report["cases"].get(name, {}) | {"phases": child(c["child"][0], c["child"][1:])}
        else:
            result = measure(name, say)
        result["measured"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        result["load_avg"] = load_average()
        report["cases"][name] = result
        report |= {"machine": machine_info(), "packages": package_versions()}
        path.write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "pair-memory.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a target's token goes: the CPU plugin's per-node performance counters of a stateful target,
split into the big MatMuls, a split weight's offsets, attention, norms, the head and the rest, for a
decode step and for a verify step of K + 1 tokens; beside it the wall time of a step and, with
`--genai`, the time per output token of GenAI's LLMPipeline on the same folder (its continuous-batching,
paged-attention path), in the same process.

    python -m benchmarks.profile_target TARGET_DIR [TARGET_DIR ...] [--props '{"INFERENCE_PRECISION_HINT": "f32"}']
        [--threads 1] [--steps 24] [--k 7] [--genai] [--json FILE]

Counters are `get_profiling_info()` after each step (`PERF_COUNT`), summed by category, the median over
steps; a node's category comes from its type and, for the fully connected layers, from its name (the
lm_head's MatMul; a split weight's `/offset/` MatMul and the ReduceSum of its group sums). `--threads 1`
with CPU time (`--clock thread`) gives figures that hold up while other work shares the cores: with one
inference thread the calling thread runs the whole graph.

The plugin reports each node's mean over the request's inferences so far; a step's own counters are the
differences of the running totals. What the wall time of a step holds beyond its counters is the infer
request's own work (inputs, state, shape inference).
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import load_average

CATEGORIES = ("matmul", "offset", "head", "attention", "norm", "embedding", "other")


def category(node_type: str, name: str) -> str:
    """The share a counter goes to, from its node type and name."""
    if node_type.startswith("FullyConnected") or node_type == "MatMul":
        if "lm_head" in name:
            return "head"
        return "offset" if "/offset/" in name else "matmul"
    if node_type.startswith("ReduceSum") or (node_type == "Reshape" and "offset" in name):
        return "offset"
    if node_type.startswith(("ScaledDotProductAttention", "PagedAttention", "RoPE", "ReadValue", "Assign",
                             "MemoryInput", "MemoryOutput")):
        return "attention"
    if node_type == "RMS":
        return "norm"
    if node_type.startswith("Gather") and "embed" in name:
        return "embedding"
    return "other"


def profile(model_dir: str, props: dict, threads: int | None, steps: int, k: int, clock: str, genai: bool) -> dict:
    import numpy as np
    import openvino as ov

    config = dict(props, PERF_COUNT="YES", **({"INFERENCE_NUM_THREADS": threads} if threads else {}))
    core = ov.Core()
    model = core.read_model(str(Path(model_dir) / "openvino_model.xml"))
    vocab = model.output("logits").get_partial_shape()[2].get_length()
    request = core.compile_model(model, "CPU", config).create_infer_request()
    tick = time.thread_time if clock == "thread" else time.perf_counter
    rng = np.random.default_rng(0)

    def forward(n: int, past: int) -> float:
        start = tick()
        request.infer({"input_ids": rng.integers(0, vocab, (1, n)), "attention_mask": np.ones((1, past + n), np.int64),
                       "position_ids": np.arange(past, past + n, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)})
        return tick() - start

    done = {"infers": 0, "totals": {}}

    def counters() -> dict:
        """This step's seconds by category. The plugin reports each node's mean over every inference of
        the request so far (measured: a node's figure shrinks step by step from the first inference's), so
        a step's own time is the difference of the running totals."""
        done["infers"] += 1
        n, step = done["infers"], defaultdict(float)
        for info in request.get_profiling_info():
            if info.status != ov.ProfilingInfo.Status.EXECUTED:
                continue
            total = n * info.real_time.total_seconds()
            step[category(info.node_type, info.node_name)] += total - done["totals"].get(info.node_name, 0.0)
            done["totals"][info.node_name] = total
        return step

    runs = {"decode": defaultdict(list), f"verify K={k}": defaultdict(list)}
    request.reset_state()
    past = 32
    forward(past, 0)
    counters()
    for step in range(2 * steps + 4):
        kind = "decode" if step % 2 == 0 else f"verify K={k}"
        n = 1 if kind == "decode" else k + 1
        seconds = forward(n, past)
        past += n
        shares = counters()
        if step < 4:  # warm-up
            continue
        runs[kind]["wall"].append(seconds)
        for name, value in shares.items():
            runs[kind][name].append(value)
    result = {"model": str(model_dir), "props": props, "threads": threads, "clock": clock, "steps": steps,
              "load_avg": load_average()}
    for kind, values in runs.items():
        row = {name: 1e3 * statistics.median(values[name]) if values[name] else 0.0 for name in ("wall", *CATEGORIES)}
        row["counters"] = sum(row[c] for c in CATEGORIES)
        result[kind] = {name: round(v, 3) for name, v in row.items()}
    if genai:
        result["genai_tpot_ms"] = genai_tpot(model_dir, props, threads)
    return result


def genai_tpot(model_dir: str, props: dict, threads: int | None, tokens: int = 64) -> float:
    """LLMPipeline's time per output token on the folder (greedy, EOS ignored), the median of 3 after a warm-up."""
    import openvino_genai as g

    config = dict(props, **({"INFERENCE_NUM_THREADS": threads} if threads else {}))
    scheduler = g.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    pipe = g.LLMPipeline(str(model_dir), "CPU", scheduler_config=scheduler, **config)
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = tokens, True, False
    pipe.generate(["The history of the printing press begins"], cfg)
    tpots = [pipe.generate(["The history of the printing press begins"], cfg).perf_metrics.get_tpot().mean for _ in range(3)]
    return round(statistics.median(tpots), 3)


def markdown(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines += [f"### {Path(r['model']).name}: {json.dumps(r['props'])}, threads {r['threads'] or 'default'}, "
                  f"clock {r['clock']}, load {r['load_avg'][0]}", "",
                  "| step | wall (ms) | counters (ms) | " + " | ".join(CATEGORIES) + " |",
                  "|---|---|---|" + "---|" * len(CATEGORIES)]
        for kind in (k for k in r if k == "decode" or k.startswith("verify")):
            row = r[kind]
            shares = " | ".join(f"{row[c]:.2f} ({100 * row[c] / row['counters']:.0f}%)" if row["counters"] else "" for c in CATEGORIES)
            lines.append(f"| {kind} | {row['wall']:.2f} | {row['counters']:.2f} | {shares} |")
        if "genai_tpot_ms" in r:
            lines.append(f"\nLLMPipeline, the same folder and properties: {r['genai_tpot_ms']:.2f} ms per output token "
                         f"(wall), against {r['decode']['wall']:.2f} ms for a stateful decode step ({r['clock']} clock).")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--props", default='{"INFERENCE_PRECISION_HINT": "f32"}', help="compile properties (JSON)")
    p.add_argument("--threads", type=int, help="INFERENCE_NUM_THREADS (1: CPU time is the calling thread's)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--k", type=int, default=7)
    p.add_argument("--genai", action="store_true", help="also LLMPipeline's time per output token")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    results = [profile(m, json.loads(args.props), args.threads, args.steps, args.k, args.clock, args.genai)
               for m in args.models]
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

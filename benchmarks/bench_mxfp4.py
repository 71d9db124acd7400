"""MXFP4 weights in OpenVINO's CPU plugin beside the u4 forms: what stays compressed, memory, time per token.

Two workloads, each form saved as an IR and compiled from disk with the f32 hint in a fresh process:
- `fc`: 8 chained MatMuls of 4096 x 4096 (134 M weights, FACTS §18's method), at M = 1 and M = 8 rows;
- `experts`: one mixture-of-experts block as gguf2ov builds it (targets/layers/moe.py: the tiled pattern the
  plugin rewrites into GatherMatmul), 16 experts of 2048 x 2048, top 4 (201 M expert weights), at 1 and 8 tokens.
For each form it records:
- the runtime precision and weight type of the FullyConnected / GatherMatmul nodes (compressed or not);
- the IR's .bin size; the process's peak RSS while compiling and its anonymous (private) memory after compile
  and after the first inference, each less what the process held before reading the model;
- the median ms per inference, forms interleaved run by run (a shared machine's load falls on all alike);
- the arithmetic (FACTS §12): `fc` the relative error against x @ W^T in float64 (W as gguf-py dequantizes
  it) with the plugin's default dynamic quantization and with it off; `experts` the relative difference of the
  output with the default and with it off.

Forms (the GGUF ones built by gguf2ov.gguf.transcode from random blocks; bits a weight as stored):
  q4_k-folded      u4 codes, f32 scale and zero point per 32 (a target's Q4_K today)          6
  u4-f16-u4zp      u4 codes, f16 scale and u4 zero point per 32 (fc only, hand-built)          4.625
  mxfp4            f4e2m1 codes, f8e8m0 scale per 32: the file's bytes (compact)              4.25
  mxfp4-folded     fc: f4e2m1 codes, f32 scale per 32; experts: i8 codes, f32 scale per 32   5 / 9
  mxfp4-f4-experts experts as f4e2m1 / f8e8m0 without the i8 step (what GatherMatmul refuses) 4.25

    python -m benchmarks.bench_mxfp4 [--workloads fc experts] [--repeat 3] [--iters 30]
    python -m benchmarks.bench_mxfp4 --gpt-oss-20b      # one expert block of gpt-oss-20b (below)

Writes benchmarks/results/mxfp4.json and prints Markdown tables. Needs ~3 GB: run it under the shared
machine's lock.

`--gpt-oss-20b`: the `experts` workload at gpt-oss-20b's size, one layer's block (32 experts of 2880 x 2880,
top 4: 796 M expert weights, a 24th of the model's), in the two forms a gpt-oss target stores its MXFP4
experts in (`mxfp4`: --compact-grid, `mxfp4-folded`: the default), at 1, 2, 4 and 8 tokens (a verify of
K = 1, 3, 7 against a decode step: more tokens pick more experts). Writes results/mxfp4-gpt-oss-20b.json.
Needs ~3 GB.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, load_average, short_commit

OUT = RESULTS / "mxfp4.json"
FC_SIZE, FC_LAYERS = 4096, 8
EXPERTS, TOP_K, EXPERT_SIZE = 16, 4, 2048
FORMS = {"fc": ("q4_k-folded", "u4-f16-u4zp", "mxfp4", "mxfp4-folded"),
         "experts": ("q4_k-folded", "mxfp4", "mxfp4-folded", "mxfp4-f4-experts")}
BITS = {"fc": {"q4_k-folded": 6, "u4-f16-u4zp": 4.625, "mxfp4": 4.25, "mxfp4-folded": 5},
        "experts": {"q4_k-folded": 6, "mxfp4": 4.25, "mxfp4-folded": 9, "mxfp4-f4-experts": 4.25}}
NODE = {"fc": "FullyConnected", "experts": "GatherMatmul"}
TOKENS = (1, 8)  # rows (fc) or tokens (experts) timed
# --gpt-oss-20b: one layer of gpt-oss-20b's experts (benchmarks/random_target.py's geometry)
GPT_OSS_20B = {"experts": 32, "top_k": 4, "size": 2880, "forms": ("mxfp4", "mxfp4-folded"), "tokens": (1, 2, 4, 8)}


def use_gpt_oss_20b(experts: int | None = None, forms=None) -> None:
    """The experts workload at gpt-oss-20b's size (module constants, so that the child sees them too);
    `experts`: fewer experts of the same width (what one weight costs, in less memory)."""
    global EXPERTS, TOP_K, EXPERT_SIZE, TOKENS, OUT
    g = GPT_OSS_20B
    EXPERTS, TOP_K, EXPERT_SIZE, TOKENS = experts or g["experts"], g["top_k"], g["size"], g["tokens"]
    FORMS["experts"] = tuple(forms or g["forms"])
    OUT = OUT.with_name(f"mxfp4-gpt-oss-20b-{EXPERTS}x.json")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _raw(qtype, rows: int, cols: int, rng) -> np.ndarray:
    """Random GGUF blocks of a rows x cols weight: finite, a trained model's range of scales."""
    from gguf.constants import GGML_QUANT_SIZES

    from gguf2ov.gguf.quants import QType

    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    if qtype == QType.MXFP4:
        raw[:, 0] = rng.integers(118, 124, raw.shape[0])  # 2^-9 .. 2^-4
    else:  # Q4_K: d and dmin small positive f16
        raw[:, 0:4] = rng.uniform(1e-4, 2e-3, (raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def _u4_f16_u4zp(rng):
    """u4 codes, f16 scale and u4 zero point per 32 (FACTS §18's hand-built form), and its values."""
    import openvino as ov
    from openvino import opset13 as ops

    groups = FC_SIZE // 32
    codes = rng.integers(0, 16, (FC_SIZE, groups, 32), dtype=np.uint8)
    scale = rng.uniform(1e-3, 2e-2, (FC_SIZE, groups, 1)).astype(np.float16)
    zero = rng.integers(0, 16, (FC_SIZE, groups, 1), dtype=np.uint8)

    def u4(values):
        t = ov.Tensor(ov.Type.u4, ov.Shape(list(values.shape)))
        flat = values.reshape(-1)
        t.data[...] = (flat[0::2] | (flat[1::2] << 4)).reshape(t.data.shape)
        return ov.op.Constant(t)

    w = ops.multiply(ops.subtract(ops.convert(u4(codes), "f32"), ops.convert(u4(zero), "f32")),
                     ops.convert(ops.constant(scale), "f32"))
    values = (codes.astype(np.float32) - zero.astype(np.float32)) * scale.astype(np.float32)
    return (ops.reshape(w, ops.constant(np.array([FC_SIZE, FC_SIZE], np.int64)), False).output(0),
            values.reshape(FC_SIZE, FC_SIZE))


def _grid(form: str, shape, rng):
    """(a weight of `shape` on a GGUF grid in `form`, its values as gguf-py dequantizes them)."""
    from openvino import opset13 as ops

    from gguf2ov.gguf import transcode
    from gguf2ov.gguf.quants import QType, dequantize

    qtype = QType.Q4_K if form == "q4_k-folded" else QType.MXFP4
    raw = _raw(qtype, int(np.prod(shape[:-1])), shape[-1], rng).reshape(*shape[:-1], -1)
    # the values only where a reference needs them (fc): an expert block's would be GBs of float32
    values = dequantize(raw, qtype) if len(shape) == 2 else None
    if form == "mxfp4-f4-experts":  # the compact 2-D form, reshaped to [E, N, K]: no i8 step
        flat = transcode.grid_weight(raw.reshape(-1, raw.shape[-1]), qtype, (int(np.prod(shape[:-1])), shape[-1]))
        return ops.reshape(flat, ops.constant(np.array(shape, np.int64)), False).output(0), values
    folded = form in ("q4_k-folded", "mxfp4-folded")
    return transcode.grid_weight(raw, qtype, shape, folded=folded), values


def build_fc(form: str, out: Path) -> None:
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(1)
    x = ops.parameter([-1, FC_SIZE], np.float32, name="x")
    h, values = x, []
    for _ in range(FC_LAYERS):
        w, v = _u4_f16_u4zp(rng) if form == "u4-f16-u4zp" else _grid(form, (FC_SIZE, FC_SIZE), rng)
        h = ops.matmul(h, w, False, True)
        values.append(v.astype(np.float32))
    ov.save_model(ov.Model([ops.result(h)], [x], form), str(out / f"fc-{form}.xml"), compress_to_fp16=False)
    np.save(out / f"fc-{form}.npy", np.stack(values))


def build_experts(form: str, out: Path) -> None:
    """gguf2ov's mixture-of-experts block (layer 0 alone) over this form's expert weights: the `moe` layer kind
    (Qwen3-MoE's), or with --gpt-oss-20b gpt-oss's own (`clamped_moe`: gate and up in one [E, 2I, H] weight,
    biases, the clamped SwiGLU)."""
    import types

    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.targets.layers.clamped_moe import ClampedSwigluExperts
    from gguf2ov.targets.layers.moe import MixtureOfExperts

    rng = np.random.default_rng(2)
    h = EXPERT_SIZE
    gpt_oss = EXPERT_SIZE == GPT_OSS_20B["size"]
    hf = types.SimpleNamespace(num_experts=EXPERTS, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
                               moe_intermediate_size=h, intermediate_size=h, norm_topk_prob=True,
                               shared_expert_intermediate_size=0, mlp_only_layers=[], decoder_sparse_step=1)
    router = rng.standard_normal((EXPERTS, h)).astype(np.float32)
    shapes = {"gate_up_nk": (EXPERTS, 2 * h, h), "down_nk": (EXPERTS, h, h)}

    class Block:  # what a layer kind sees of the graph under construction
        config = types.SimpleNamespace(hf=hf, hidden_size=h, num_layers=1, activation="silu", mlp_bias=False,
                                       options=dict(ClampedSwigluExperts.OPTIONS))

        def weight(self, name):
            if name.endswith(("gate.weight", "router.weight")):
                return ops.constant(router).output(0)
            return _grid(form, shapes.get(name.rsplit(".", 1)[-1], (EXPERTS, h, h)), rng)[0]

        def vector(self, name):  # gpt-oss's biases
            return rng.standard_normal(EXPERTS * 2 * h if "gate_up" in name else EXPERTS * h if "experts" in name
                                       else EXPERTS).astype(np.float32) * np.float32(0.01)

    kind = ClampedSwigluExperts() if gpt_oss else MixtureOfExperts()
    x = ops.parameter([-1, -1, h], np.float32, name="x")
    model = ov.Model([ops.result(kind.build(Block(), x, 0))], [x], form)
    ov.save_model(model, str(out / f"experts-{form}.xml"), compress_to_fp16=False)


def child(workload: str, xml: str, iters: int) -> dict:
    """One compiled form, measured in this fresh process (printed as JSON)."""
    import openvino as ov

    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's peak (the builder's, here)
    base_anon, base_rss = _status_kib("RssAnon:"), _status_kib("VmRSS:")
    core = ov.Core()
    out = {"dq_default": int(core.get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE"))}
    t = time.perf_counter()
    compiled = core.compile_model(xml, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    out["compile_s"] = time.perf_counter() - t
    out["compile_peak_mib"] = (_status_kib("VmHWM:") - base_rss) / 1024
    out["anon_compile_mib"] = (_status_kib("RssAnon:") - base_anon) / 1024
    width = FC_SIZE if workload == "fc" else EXPERT_SIZE
    rng = np.random.default_rng(0)
    shape = (lambda m: (m, width)) if workload == "fc" else (lambda m: (1, m, width))
    xs = {m: rng.standard_normal(shape(m)).astype(np.float32) for m in TOKENS}
    request = compiled.create_infer_request()
    first = request.infer({0: xs[max(TOKENS)]})[0].copy()
    out["anon_first_mib"] = (_status_kib("RssAnon:") - base_anon) / 1024
    out["nodes"] = sorted({(op.get_rt_info()["runtimePrecision"].astype(str), op.input(1).get_element_type().get_type_name())
                           for op in compiled.get_runtime_model().get_ordered_ops()
                           if op.get_rt_info()["layerType"].astype(str) == NODE[workload]})
    for m, x in xs.items():
        request.infer({0: x})
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            request.infer({0: x})
            times.append((time.perf_counter() - t) * 1e3)
        out[f"ms_m{m}"] = statistics.median(times)
    del request, compiled
    exact = core.compile_model(xml, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    off = exact({0: xs[max(TOKENS)]})[0]
    if workload == "fc":
        ref = xs[8].astype(np.float64)
        for w in np.load(Path(xml).with_suffix(".npy")):
            ref = ref @ w.astype(np.float64).T
        out["dq_default"], out["dq_off"] = (float(np.abs(got - ref).max() / np.abs(ref).max()) for got in (first, off))
    else:
        out["dq_default"], out["dq_off"] = float(np.abs(first - off).max() / np.abs(off).max()), 0.0
    return out


def _summary(measured: list[dict], bits: float, ir_mib: float) -> dict:
    def med(key):
        return statistics.median(r[key] for r in measured)

    def spread(key):
        return [min(r[key] for r in measured), max(r[key] for r in measured)]

    keys = ("compile_s", "compile_peak_mib", "anon_compile_mib", "anon_first_mib")
    times = {k: v for m in TOKENS for k, v in ((f"ms_m{m}", med(f"ms_m{m}")), (f"ms_m{m}_range", spread(f"ms_m{m}")))}
    return {"bits": bits, "ir_mib": ir_mib, "nodes": measured[0]["nodes"], **{k: med(k) for k in keys}, **times,
            "dq_default": measured[0]["dq_default"], "dq_off": measured[0]["dq_off"]}


def _table(workload: str, rows: dict) -> str:
    error = "rel. error, default DQ / off" if workload == "fc" else "rel. change with default DQ"
    rows_ms = " | ".join(f"{m} {'row' if m == 1 else 'rows'} ms" for m in TOKENS)
    lines = [f"| {workload} form | bits a weight | IR MiB | {NODE[workload]} (precision/weight) | compile peak MiB | "
             f"anon after compile, first inference MiB | {rows_ms} | {error} |",
             "|---|---|---|---|---|---|" + "---|" * len(TOKENS) + "---|"]
    for form, r in rows.items():
        nodes = ", ".join(f"{p}/{w}" for p, w in r["nodes"])
        err = f"{r['dq_default']:.1e} / {r['dq_off']:.1e}" if workload == "fc" else f"{r['dq_default']:.1e}"
        lines.append(f"| {form} | {r['bits']:g} | {r['ir_mib']:.0f} | {nodes} | {r['compile_peak_mib']:.0f} | "
                     f"{r['anon_compile_mib']:.0f}, {r['anon_first_mib']:.0f} | "
                     + "".join(f"{r[f'ms_m{m}']:.1f} ({r[f'ms_m{m}_range'][0]:.1f}-{r[f'ms_m{m}_range'][1]:.1f}) | "
                               for m in TOKENS) + f"{err} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(FORMS), choices=list(FORMS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--gpt-oss-20b", action="store_true", help="one expert block of gpt-oss-20b (see above)")
    parser.add_argument("--experts", type=int, help="with --gpt-oss-20b: this many experts (default 32)")
    parser.add_argument("--forms", nargs="+", help="with --gpt-oss-20b: only these forms")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gpt_oss_20b:
        use_gpt_oss_20b(args.experts, args.forms)
        args.workloads = ["experts"]
    if args.child:
        print(json.dumps(child(*args.child, args.iters)))
        return 0
    import openvino as ov

    builders = {"fc": build_fc, "experts": build_experts}
    load_before = load_average()
    results = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        folder = Path(tmp)
        for workload in args.workloads:
            runs = {form: [] for form in FORMS[workload]}
            sizes = {}
            for form in runs:
                builders[workload](form, folder)
                sizes[form] = (folder / f"{workload}-{form}.bin").stat().st_size / 2**20
            for rep in range(args.repeat):
                for form in runs:  # interleaved
                    done = subprocess.run([sys.executable, "-m", __spec__.name, "--child", workload,
                                           str(folder / f"{workload}-{form}.xml"), "--iters", str(args.iters),
                                           *(["--gpt-oss-20b"] if args.gpt_oss_20b else []),
                                           *(["--experts", str(args.experts)] if args.experts else []),
                                           *(["--forms", *args.forms] if args.forms else [])],
                                          capture_output=True, text=True)
                    if done.returncode:
                        raise SystemExit(f"{workload} {form} failed:\n{done.stderr[-3000:]}")
                    runs[form].append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(f"{workload} run {rep + 1} {form}: {runs[form][-1]}", file=sys.stderr)
            results[workload] = {form: _summary(m, BITS[workload][form], sizes[form]) for form, m in runs.items()}
            for path in folder.iterdir():
                path.unlink()
    commit = short_commit()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit, "openvino": ov.__version__,
              "cpu": ov.Core().get_property("CPU", "FULL_DEVICE_NAME"), "machine": platform.machine(),
              "load_before": load_before, "load_after": load_average(),
              "repeat": args.repeat, "iters": args.iters, "fc": f"{FC_LAYERS} x {FC_SIZE}x{FC_SIZE}",
              "experts": f"{EXPERTS} x 3 x {EXPERT_SIZE}x{EXPERT_SIZE}, top {TOP_K}", "results": results}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    for workload, rows in results.items():
        print(_table(workload, rows) + "\n")
    print(f"{result['date']}, {commit}, {result['cpu']}, load {result['load_before']} -> {result['load_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

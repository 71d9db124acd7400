"""What each weight form costs at run time in OpenVINO's CPU plugin: private (anonymous) memory after
the first inference, in bits a weight, per form and kernel. The memory plan (`gguf2ov/runtime/memory.py`)
takes its rules from these figures.

Each case is one model of weights in one form, the way gguf2ov's targets hold them, saved as an IR,
then read (memory-mapped, the default), compiled with the f32 hint and run once in a fresh process;
RssAnon (/proc/self/status) after the read and after the first inference give the weights' run-time
bytes. Kernels:
- FullyConnected: 8 MatMuls of 4096 x 4096 (134 M weights);
- GatherMatmul: one mixture-of-experts block of 16 experts of 2048 x 2048 (gate, up, down: 201 M weights),
  built by gguf2ov's own `moe` kind so that the plugin fuses it;
- Gather: an embedding table of 65536 x 2048 (134 M weights), looked up for 8 tokens.
Forms: the GGUF grid folded (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, MXFP4), compact and split (Q4_K, Q6_K); NNCF's
int4 (asym, sym) at groups 128 and 32, int8 per channel (asym, sym); f16 and f32 weights.

    python -m benchmarks.runtime_bytes                    # every case (~9 min); writes results/runtime-bytes.json
    python -m benchmarks.runtime_bytes --cases fc:q4_k-folded,gather:int4_asym_g128

Measured 2026-12-07 on an AMD EPYC (AVX512-VNNI, 2 cores), openvino 2026.4.1, load 3-6 (memory does not
depend on it): FullyConnected Q4_K folded 6.54, Q5_K/Q6_K/Q8_0/Q5_0 folded 10.43, MXFP4 5.42, Q4_K compact
8.55, Q6_K compact 20.67, Q4_K split 5.74, int4_asym g128 4.93, int4_sym g128 4.87, int4_asym g32 6.70, int8
8.43, f16 (its Converts marked decompression, as the fp16 format writes them) 32.41, f32 32.41; GatherMatmul
Q4_K 6.62, Q6_K 10.29, Q8_0 10.30, MXFP4 (i8) 9.29, int4_asym g128 5.06, int4_sym g128 4.80, int8 8.33, f32
32.29; Gather 0.40-0.43 (Q8_0 1.40, int4 g128 0.90). Each figure holds a fixed ~7 MiB a model (0.43 bits a
weight at these sizes) beside the weights.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, machine_info, process_status

FC_SHAPE, FC_COUNT = (4096, 4096), 8
EXPERTS, EXPERT_WIDTH = 16, 2048
TABLE_SHAPE = (65536, 2048)

GRID_FORMS = ("q4_k-folded", "q5_k-folded", "q6_k-folded", "q8_0-folded", "q5_0-folded", "mxfp4-folded",
              "q4_k-compact", "q6_k-compact", "q4_k-split", "q6_k-split")
NNCF_FORMS = ("int4_asym_g128", "int4_sym_g128", "int4_asym_g32", "int8_asym", "int8_sym")
FLOAT_FORMS = ("f16", "f32")
CASES = ([f"fc:{f}" for f in GRID_FORMS + NNCF_FORMS + FLOAT_FORMS]
         + [f"experts:{f}" for f in ("q4_k-folded", "q6_k-folded", "q8_0-folded", "mxfp4-folded", "int4_asym_g128",
                                     "int4_sym_g128", "int8_asym", "int8_sym")]
         + [f"gather:{f}" for f in ("q4_k-folded", "q6_k-folded", "q8_0-folded", "int4_asym_g128", "int8_asym",
                                    "int8_sym", "f16", "f32")])


def _weight(form: str, shape, rng, gather: bool = False):
    """The decompression subgraph's output of a random weight of `shape` in `form`."""
    from openvino import opset13 as ops

    from gguf2ov.gguf import quants, transcode
    from gguf2ov.gguf.quants import QType
    from gguf2ov.ir.nncf_weights import WeightSpec, compress_weight

    w = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
    if form in FLOAT_FORMS:
        return ops.convert(ops.constant(w.astype(np.float16)), "f32").output(0) if form == "f16" else ops.constant(w).output(0)
    if form in NNCF_FORMS:
        mode, _, group = form.partition("_g")
        return compress_weight(w, WeightSpec(mode, int(group) if group else -1), gather=gather)
    qtype, layout = form.split("-")
    qtype = QType[qtype.upper()]
    raw = quants.quantize(w.reshape(-1, shape[-1]), qtype).reshape(*shape[:-1], -1)
    return transcode.grid_weight(raw, qtype, shape, folded=layout == "folded" or gather, split=layout == "split",
                                 gather=gather)


def build(case: str, xml: Path) -> int:
    """Writes the case's model to `xml`; returns its weights' count."""
    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.ir.graph_ops import linear

    kernel, form = case.split(":")
    rng = np.random.default_rng(0)
    if kernel == "fc":
        x = ops.parameter([-1, -1, FC_SHAPE[1]], np.float32, name="x")
        y = x
        for i in range(FC_COUNT):
            y = linear(y, _weight(form, FC_SHAPE, rng), f"model.layers.{i}.mlp.up_proj")
        model, n = ov.Model([ops.result(y)], [x]), FC_COUNT * FC_SHAPE[0] * FC_SHAPE[1]
    elif kernel == "gather":
        ids = ops.parameter([-1, -1], np.int64, name="input_ids")
        table = _weight(form, TABLE_SHAPE, rng, gather=True)
        model = ov.Model([ops.result(ops.gather(table, ids, ops.constant(np.int64(0))))], [ids])
        n = TABLE_SHAPE[0] * TABLE_SHAPE[1]
    else:
        from gguf2ov.targets.layers.kind import REGISTRY

        e, h = EXPERTS, EXPERT_WIDTH
        hf = types.SimpleNamespace(num_experts=e, num_experts_per_tok=2, moe_intermediate_size=h,
                                   norm_topk_prob=True, shared_expert_intermediate_size=0)
        config = types.SimpleNamespace(hf=hf, hidden_size=h, num_layers=1, activation="silu")
        router = rng.standard_normal((e, h), dtype=np.float32)

        class Block:
            def __init__(self):
                self.config = config

            def weight(self, name):
                if name.endswith("gate.weight"):
                    return ops.constant(router).output(0)
                return _weight(form, (e, h, h), rng)

        x = ops.parameter([1, -1, h], np.float32, name="x")
        model, n = ov.Model([ops.result(REGISTRY["moe"].build(Block(), x, 0))], [x]), 3 * e * h * h
    ov.save_model(model, str(xml), compress_to_fp16=False)
    if form == "f16":  # as gguf2ov's fp16 format marks its Converts: the plugin keeps the weights in f16
        from gguf2ov.ir.variants import mark_decompression

        mark_decompression(xml)
    return n


def child(xml: str) -> dict:
    """In a fresh process: read (mmap), compile with the f32 hint, run once; RssAnon after each."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(xml)
    read = process_status()["RssAnon"]
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    compiled_anon = process_status()["RssAnon"]
    port = compiled.input(0)
    if port.get_element_type().get_type_name() == "i64":
        inputs = np.arange(8, dtype=np.int64).reshape(1, 8)
    else:
        width = port.get_partial_shape()[2].get_length()
        inputs = np.ones((1, 8, width), dtype=np.float32)
    compiled(inputs)
    layers = sorted({op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()}
                    & {"FullyConnected", "GatherMatmul", "Gather", "MatMul"})
    return {"compiled": compiled_anon - read, "inferred": process_status()["RssAnon"] - read, "layers": layers}


def measure(case: str, folder: Path) -> dict:
    xml = folder / (case.replace(":", "-") + ".xml")
    start = time.perf_counter()
    n = build(case, xml)
    out = subprocess.run([sys.executable, "-m", __spec__.name, "--child", str(xml)], capture_output=True, text=True,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    kernel, form = case.split(":")
    record = {"case": case, "kernel": kernel, "form": form, "weights": n, "bin_bytes": xml.with_suffix(".bin").stat().st_size,
              "anon_after_compile": got["compiled"], "anon_after_infer": got["inferred"], "layers": got["layers"],
              "stored_bits": 8 * xml.with_suffix(".bin").stat().st_size / n, "runtime_bits": 8 * got["inferred"] / n,
              "seconds": round(time.perf_counter() - start, 1)}
    xml.unlink()
    xml.with_suffix(".bin").unlink()
    return record


def markdown(records: list[dict]) -> str:
    lines = ["| kernel | form | compiled to | stored bits/weight | run-time bits/weight (private, after the first inference) |",
             "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['kernel']} | {r['form']} | {', '.join(r['layers'])} | {r['stored_bits']:.2f} | "
                     f"{r['runtime_bits']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated kernel:form cases")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    import openvino as ov

    records = []
    with tempfile.TemporaryDirectory() as folder:
        for case in args.cases.split(","):
            records.append(measure(case, Path(folder)))
            r = records[-1]
            print(f"{case}: {r['runtime_bits']:.2f} bits/weight at run time, {r['stored_bits']:.2f} stored "
                  f"({', '.join(r['layers'])}, {r['seconds']} s)", flush=True)
    RESULTS.mkdir(exist_ok=True)
    report = {"openvino": ov.get_version(), "machine": machine_info(), "records": records}
    (RESULTS / "runtime-bytes.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())

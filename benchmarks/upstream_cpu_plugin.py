"""Two behaviours of OpenVINO's CPU plugin that bound a GGUF target's speed and memory, shown with
OpenVINO alone (no gguf2ov, no GenAI), for an upstream report.

1. Rows: a speculative decoder's verify step runs K + 1 rows through the weights that a decode step
   runs one row through. Where the greedy text of target + draft must equal the target's alone, a
   row's result must not move with the rows beside it beyond rounding. Forms compared
   (one 1024 x 2048 weight, u4 codes, group 32):
     - u4 codes, f32 scale and f32 zero point per group (gguf2ov's folded grid: the f32 path);
     - u4 codes, f16 scale, u4 zero point per group (NNCF's int4_asym: the int8 path);
     - u4 codes, f16 scale, no zero point (a split grid's codes: the int8 path).
   For each: the largest difference between each row computed alone (M = 1) and the same row inside a
   block of 8 (M = 8), and the output change a 1e-6 relative change of the input makes, under the
   plugin's defaults and with DYNAMIC_QUANTIZATION_GROUP_SIZE=0. Measured: the int8 path computes a
   row the same alone or in a block; it is the f32 path whose rows differ, at rounding level (1e-6).
   But the int8 path turns a 1e-6 change of its input into a ~5e-4 change of its output, because
   the activations' int8 rounding jumps: rounding-level differences elsewhere in the step (attention
   over K + 1 query rows, f32-path MatMuls) become visible ones, and a close argmax can flip.

2. Memory: compiled, every compressed weight is copied into private memory, though the IR's weights
   are memory-mapped. One model of 16 MatMuls of 4096 x 4096 weights in each form is saved, read
   (mmap, the default) and compiled in a fresh process; RssAnon and RssFile (/proc/self/status)
   are read after compile and after the first inference, against the weights' bytes in the .bin.

    python benchmarks/upstream_cpu_plugin.py          # writes results/upstream-cpu-plugin.json, prints Markdown
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
GROUP = 32
FORMS = ("f32-scale-f32-zp", "f16-scale-u4-zp", "f16-scale-no-zp")


def _weight(form: str, rows: int, cols: int, rng, group: int = GROUP):
    """A decompression subgraph of `form` for a rows x cols weight, and its float values."""
    import openvino as ov
    from openvino import opset13 as ops

    groups = cols // group
    codes = rng.integers(0, 16, size=(rows, groups, group), dtype=np.uint8)
    scale = (rng.random((rows, groups, 1), dtype=np.float32) * 0.02 + 0.001)
    w = ops.convert(ops.constant(codes, dtype=ov.Type.u4), ov.Type.f32)
    if form == "f32-scale-f32-zp":
        zp = rng.random((rows, groups, 1), dtype=np.float32) * 15
        w = ops.subtract(w, ops.constant(zp, dtype=ov.Type.f32))
        value = (codes - zp) * scale
        scale_node = ops.constant(scale, dtype=ov.Type.f32)
    elif form == "f16-scale-u4-zp":
        zp = rng.integers(0, 16, size=(rows, groups, 1), dtype=np.uint8)
        w = ops.subtract(w, ops.convert(ops.constant(zp, dtype=ov.Type.u4), ov.Type.f32))
        scale = scale.astype(np.float16).astype(np.float32)
        value = (codes.astype(np.float32) - zp) * scale
        scale_node = ops.convert(ops.constant(scale.astype(np.float16), dtype=ov.Type.f16), ov.Type.f32)
    else:
        scale = scale.astype(np.float16).astype(np.float32)
        value = codes.astype(np.float32) * scale
        scale_node = ops.convert(ops.constant(scale.astype(np.float16), dtype=ov.Type.f16), ov.Type.f32)
    w = ops.multiply(w, scale_node)
    w = ops.reshape(w, ops.constant(np.array([rows, cols], dtype=np.int64)), special_zero=False)
    return w, value.reshape(rows, cols)


def _model(form: str, rows: int, cols: int, layers: int, seed: int = 0, group: int = GROUP):
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(seed)
    x = ops.parameter([-1, cols], ov.Type.f32, name="x")
    h, values = x, []
    for _ in range(layers):
        w, value = _weight(form, rows, cols, rng, group)
        h = ops.matmul(h, w, transpose_a=False, transpose_b=True)
        values.append(value)
    return ov.Model([h], [x], form), values


def rows_case(form: str, dq_group: int | None) -> dict:
    """Each of 8 rows alone against the same rows in one block of 8, through one compressed MatMul."""
    import openvino as ov

    model, (value,) = _model(form, 1024, 2048, 1)
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    if dq_group is not None:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = dq_group
    compiled = ov.Core().compile_model(model, "CPU", config)
    x = np.random.default_rng(1).standard_normal((8, 2048)).astype(np.float32)
    block = compiled(x)[0]
    alone = np.concatenate([compiled(x[i:i + 1])[0] for i in range(8)])
    exact = x.astype(np.float64) @ value.T.astype(np.float64)
    scale = np.abs(exact).max()
    # what a rounding-level change of the input (as attention over 8 query rows against 1 makes) becomes
    nudged = x * (1 + 1e-6 * np.random.default_rng(2).standard_normal(x.shape)).astype(np.float32)
    return {"perturbed_1e-6": float(np.abs(compiled(nudged)[0] - block).max() / scale), "form": form, "dynamic_quantization_group": dq_group if dq_group is not None else "default",
            "alone_vs_block": float(np.abs(alone - block).max() / scale),
            "block_vs_exact": float(np.abs(block - exact).max() / scale),
            "alone_vs_exact": float(np.abs(alone - exact).max() / scale)}


def _status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def memory_child(xml: str) -> dict:
    """In a fresh process: read (mmap), compile, infer once; RssAnon / RssFile after each."""
    import openvino as ov

    core = ov.Core()
    before = _status()
    model = core.read_model(xml)
    read = _status()
    compiled = core.compile_model(model, "CPU")
    after_compile = _status()
    cols = model.inputs[0].get_partial_shape()[1].get_length()
    compiled(np.ones((1, cols), dtype=np.float32))
    after_infer = _status()
    return {"before": before, "read": read, "compiled": after_compile, "inferred": after_infer}


def memory_case(form: str, folder: Path, size: int = 4096, group: int = GROUP) -> dict:
    import openvino as ov

    xml = folder / f"{form}-{size}-g{group}.xml"
    model, _ = _model(form, size, size, 16, group=group)
    ov.save_model(model, xml, compress_to_fp16=False)
    del model
    out = subprocess.run([sys.executable, __file__, "--memory-child", str(xml)], capture_output=True, text=True,
                         check=True)
    phases = json.loads(out.stdout.strip().splitlines()[-1])
    base = phases["read"]["RssAnon"]
    return {"form": form, "size": size, "group": group, "bin_bytes": xml.with_suffix(".bin").stat().st_size,
            "anon_after_compile": phases["compiled"]["RssAnon"] - base,
            "anon_after_infer": phases["inferred"]["RssAnon"] - base,
            "file_after_infer": phases["inferred"]["RssFile"], "phases": phases}


def markdown(report: dict) -> str:
    mib = lambda n: f"{n / 2**20:.0f}"  # noqa: E731
    lines = [f"OpenVINO {report['openvino']}, {report['cpu']}, default CPU properties unless stated; "
             f"DYNAMIC_QUANTIZATION_GROUP_SIZE default here: {report['default_dq_group']}.", "",
             "Rows: largest |difference| / largest |exact output|, one 1024 x 2048 weight, 8 rows, f32 hint.", "",
             "| weight form | dynamic quantization group | row alone vs in a block of 8 | input changed by 1e-6 | block vs exact | alone vs exact |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['form']} | {r['dynamic_quantization_group']} | {r['alone_vs_block']:.2e} | {r['perturbed_1e-6']:.2e} | "
                     f"{r['block_vs_exact']:.2e} | {r['alone_vs_exact']:.2e} |")
    lines += ["", "Memory: 16 MatMuls, the IR read memory-mapped, compiled and run once in a fresh "
              "process; private (anonymous) memory added after compile and after the first inference, in MiB.", "",
              "| weight form | .bin (MiB) | anon after compile | anon after first inference | mapped file after inference |",
              "|---|---|---|---|---|"]
    for r in report["memory"]:
        lines.append(f"| {r['form']}, group {r['group']}, {r['size']} x {r['size']} | {mib(r['bin_bytes'])} | {mib(r['anon_after_compile'])} | "
                     f"{mib(r['anon_after_infer'])} | {mib(r['file_after_infer'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child)))
        return 0
    import platform

    import openvino as ov

    core = ov.Core()
    cpu = core.get_property("CPU", "FULL_DEVICE_NAME")
    report = {"openvino": ov.get_version(), "cpu": cpu, "machine": platform.machine(), "load_avg": os.getloadavg(),
              "default_dq_group": core.get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE"),
              "rows": [rows_case(form, dq) for form in FORMS for dq in (None, 0)]}
    with tempfile.TemporaryDirectory() as tmp:
        # the 64 x 64 model: what compiling and running costs without weights to speak of
        report["memory"] = [memory_case(FORMS[0], Path(tmp), 64),
                            *(memory_case(form, Path(tmp), group=g) for g in (32, 128) for form in FORMS)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "upstream-cpu-plugin.json").write_text(json.dumps(report, indent=1))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a target holds at run time in each form: the lean form (`--weight-format int4`) against the file's
exact grid (`gguf`, folded), from one GGUF.

Each form is built by `gguf2ov target` in a fresh process, then read (memory-mapped), compiled with the f32
hint and run once in another fresh process, as benchmarks/runtime_bytes.py measures a weight form:
RssAnon (/proc/self/status) after the read, after the compile and after the first inference (a prompt of 8
tokens and one decode step), and what the compiled model runs its weights as (FullyConnected, GatherMatmul
and the tables' Gathers, by element type of the weight input).

    python -m benchmarks.lean_memory TARGET.gguf [--forms gguf,int4] [--work DIR] [--json FILE]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.common import CHECKOUT_ENV, REPO, process_status


def child(xml: str) -> dict:
    """In a fresh process: read, compile with the f32 hint, a prompt of 8 tokens and one decode step."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(xml)
    read = process_status()["RssAnon"]
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    after_compile = process_status()["RssAnon"]
    request = compiled.create_infer_request()
    for start, n in ((0, 8), (8, 1)):
        request.infer({"input_ids": np.arange(start + 1, start + n + 1, dtype=np.int64)[None],
                       "attention_mask": np.ones((1, start + n), np.int64),
                       "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
                       "beam_idx": np.zeros(1, np.int32)})
    weights = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        kind = op.get_rt_info()["layerType"].astype(str)
        port = {"FullyConnected": 1, "GatherMatmul": 1, "Gather": 0}.get(kind)
        if port is not None and (kind != "Gather" or op.input_value(0).get_element_type().get_type_name() != "i32"):
            weights[f"{kind} {op.input_value(port).get_element_type().get_type_name()}"] += 1
    return {"read": read, "compiled": after_compile - read, "inferred": process_status()["RssAnon"] - read, "weights": dict(weights)}


def _build(argv: list[str]) -> int:
    """Runs `argv`; its peak RssAnon, sampled from /proc every 0.2 s."""
    proc, peak = subprocess.Popen(argv, cwd=REPO, env=CHECKOUT_ENV), 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            peak = max([peak, *(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))])
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return peak


def measure(gguf: Path, form: str, work: Path, extra=()) -> dict:
    out = work / f"target-{form}"
    start = time.perf_counter()
    build_anon = _build([sys.executable, "-m", "gguf2ov", "target", str(gguf), "-o", str(out), "--weight-format", form,
                         "--overwrite", "--quiet", *extra])
    built = time.perf_counter() - start
    run = subprocess.run([sys.executable, "-m", __spec__.name, "--child", str(out / "openvino_model.xml")],
                         capture_output=True, text=True, check=True, env=CHECKOUT_ENV)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    record = json.loads((out / "gguf2ov.json").read_text())
    return {"form": form, "variant": record.get("options", {}).get("variant", form), "build_seconds": round(built, 1),
            "build_peak_anon": build_anon, "bin_bytes": (out / "openvino_model.bin").stat().st_size, **got}


def markdown(gguf: Path, records: list[dict]) -> str:
    lines = [f"`{gguf.name}` ({gguf.stat().st_size / 2**30:.2f} GiB)", "",
             "| form | build: wall, peak anonymous | IR .bin | private after compile | private after the first "
             "inference | weights as the plugin runs them |", "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['variant']} | {r['build_seconds']:.0f} s, {r['build_peak_anon'] / 2**30:.2f} GiB | "
                     f"{r['bin_bytes'] / 2**20:.1f} MiB | {r['compiled'] / 2**20:.1f} MiB | "
                     f"{r['inferred'] / 2**20:.1f} MiB | "
                     + ", ".join(f"{n} {k}" for k, n in sorted(r["weights"].items())) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path, nargs="?")
    p.add_argument("--forms", default="gguf,int4")
    p.add_argument("--work", type=Path, help="where the targets are built (default: a temporary folder)")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    if args.gguf is None:
        p.error("give the target GGUF")
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        records = [measure(args.gguf, form, Path(work)) for form in args.forms.split(",")]
    for r in records:
        print(json.dumps(r), flush=True)
    text = markdown(args.gguf, records)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"gguf": str(args.gguf), "records": records, "markdown": text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

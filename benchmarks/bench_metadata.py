"""Memory of a GGUF's metadata once opened: compact arrays (numpy, StringArray) against lists.

Writes a metadata-only GGUF with a Gemma-3-sized tokenizer (262,144 tokens, scores and token
types, 150,000 merges), opens it with `gguf2ov.gguf.read.open_gguf` twice (arrays kept compact, and as
Python lists as before), and reports for each the bytes still allocated once the file is open
(tracemalloc), the peak while parsing, and the time to open it. No test depends on it.

    python -m benchmarks.bench_metadata [--out benchmarks/results/metadata-memory.md]

Measured on 2 shared CPU cores (11.2 MiB of metadata in the file):
  arrays as              retained   x file   peak while parsing   open time
  compact arrays (now)   12.8 MiB   1.1x     14.0 MiB             0.56 s
  Python lists (before)  42.7 MiB   3.8x     42.7 MiB             0.56 s
Short tokens cost less as lists than numbers do: an array of 16-bit integers above 256 costs 18x
its size as a list (a 28-byte int object and an 8-byte pointer for 2 bytes).
"""

import argparse
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS
from gguf2ov.gguf import read
from tests.ggufs import write_gguf

N_TOKENS, N_MERGES = 262_144, 150_000


def _write(path: Path) -> int:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzĠ"))
    lengths = rng.integers(2, 10, N_TOKENS)
    tokens = ["".join(rng.choice(letters, n)) + str(i) for i, n in enumerate(lengths)]
    merges = [f"{tokens[i]} {tokens[i + 1]}" for i in range(N_MERGES)]
    scores = [float(v) for v in rng.standard_normal(N_TOKENS).astype(np.float32)]
    types = [int(v) for v in rng.integers(1, 6, N_TOKENS)]
    kv = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.merges": merges}
    write_gguf(path, "llama", kv, {"w": np.zeros(32, np.float32)})
    return path.stat().st_size


def _measure(path: Path, compact: int) -> dict:
    read.COMPACT_ARRAY = compact
    gc.collect()
    start = time.perf_counter()
    read.open_gguf(path)
    seconds = time.perf_counter() - start  # timed without tracemalloc, which slows every allocation
    gc.collect()
    tracemalloc.start()
    gguf = read.open_gguf(path)
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(gguf.metadata["tokenizer.ggml.tokens"]) == N_TOKENS
    del gguf
    return {"retained": retained, "peak": peak, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "metadata-memory.md")
    args = parser.parse_args()
    default = read.COMPACT_ARRAY
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.gguf"
        size = _write(path)
        rows = [("compact arrays (now)", _measure(path, default)), ("Python lists (before)", _measure(path, 2**62))]
    mib = 1024 * 1024
    lines = [f"# Metadata memory of an opened GGUF ({N_TOKENS:,} tokens, scores, types; {N_MERGES:,} merges)", "",
             f"File: {size / mib:.1f} MiB of metadata. Measured with tracemalloc (`benchmarks/bench_metadata.py`).",
             "", "| arrays as | retained | x file | peak while parsing | open time |", "|---|---|---|---|---|"]
    for name, m in rows:
        lines.append(f"| {name} | {m['retained'] / mib:.1f} MiB | {m['retained'] / size:.1f}x | "
                     f"{m['peak'] / mib:.1f} MiB | {m['seconds']:.2f} s |")
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()

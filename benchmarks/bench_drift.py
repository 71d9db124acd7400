"""`gguf2ov drift` on a draft far larger than the fixture: time and the drift table per variant.

Builds a random dflash draft (the same builder as bench_check.py: hidden 2048, 2 layers, 5
target layers, ~120M parameters, weights N(0, 0.02)), writes it as a Q4_K_M GGUF with
gguf2ov.tools.gguf_writer, and runs the drift stage on it with synthetic contexts (no target: there is
no lm_head, so top-1 agreement and KLD are left out and the output drift is the cosine of the
draft's hidden states). The drift against the GGUF grid is what this benchmark is for: whether a
variant keeps the values the file held.

    python -m benchmarks.bench_drift                       # hidden 2048, 2 layers
    python -m benchmarks.bench_drift --hidden 1024 --keep /tmp/drift-bench
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_check import build_reference
from benchmarks.common import RESULTS
from gguf2ov.job import Job, Options


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = ap.parse_args()

    from gguf2ov.tools.gguf_writer import write_dflash_gguf
    from gguf2ov.report import render

    work = args.keep or Path(tempfile.mkdtemp(prefix="gguf2ov-drift-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ref, gguf = work / "reference", work / "draft-Q4_K_M.gguf"
    t = time.perf_counter()
    if not (ref / "config.json").is_file():
        build_reference(ref, args.hidden, args.layers, args.hidden // 128, max(1, args.hidden // 512), args.ffn, 5)
    if not gguf.is_file():
        write_dflash_gguf(ref, gguf)
    setup = time.perf_counter() - t
    t = time.perf_counter()
    result = Job.of(gguf, None, Options(progress=True)).drift(work / "variants", overwrite=True)
    seconds = time.perf_counter() - t
    print(render(result, "text", title=f"drift: hidden {args.hidden}, {args.layers} layers, GGUF "
                                        f"{gguf.stat().st_size / 2**20:.0f} MiB (setup {setup:.0f} s, drift {seconds:.0f} s)"))
    out = RESULTS / "drift.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"hidden": args.hidden, "layers": args.layers, "setup_s": setup, "drift_s": seconds,
                               "variants": [{k: getattr(v, k) for k in ("name", "size_bytes", "rel_err", "cosine",
                                                                        "rel_err_gguf", "cosine_gguf", "output_cosine")}
                                            for v in result.variants]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

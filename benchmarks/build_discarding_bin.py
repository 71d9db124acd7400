"""A GGUF's `gguf` target IR built as `gguf2ov target` builds it, with its .bin discarded as it is written
(openvino_model.bin a symlink to /dev/null): the build's memory and time without the disk's, for a file
whose IR the disk cannot hold beside the shared cache (the 31B Gemma 4's 24 GiB). Everything else is the
command's build: the graph, the weights decoded while the IR is written, a big table's scratch file
(written to disk, in the output folder). Not timed: the tokenizer, the target checks, the disk.

Each try runs in a fresh process under `memlimit.run_limited` (a cgroup v1 limit, page cache dropped):

    python -m benchmarks.build_discarding_bin FILE.gguf --limits 2,1.5,1    # unlimited, then each limit
"""

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks import memlimit
from benchmarks.common import CHECKOUT_ENV, RESULTS

WORK = RESULTS / "discarding-bin"


def build(gguf: Path, out: Path) -> None:
    """In this process: the target's IR into `out`, its .bin discarded."""
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.ir.weights import save_ir
    from gguf2ov.job import Job
    from gguf2ov.sources import TargetBuild, model_source
    from gguf2ov.targets.graph import build_target_ir, target_forms

    out.mkdir(parents=True)
    (out / "openvino_model.bin").symlink_to(os.devnull)
    variant = parse_variant("gguf")
    source = Job(target_spec=TargetBuild(model_source(gguf, "target"), variant)).target_source
    forms = target_forms(source, variant)
    save_ir(build_target_ir(forms), out, forms)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--limits", default="", help="GiB limits to try after the unlimited run, comma-separated")
    p.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child: build into this folder
    args = p.parse_args(argv)
    if args.one:
        build(args.gguf, args.one)
        return 0
    out = WORK / "ir"
    results = []
    for limit in [None, *(float(x) for x in args.limits.split(",") if x)]:
        argv = [sys.executable, "-m", __spec__.name, str(args.gguf), "--one", str(out)]
        r = memlimit.run_limited(argv, limit, 1800, WORK / "logs" / f"{args.gguf.stem}-{limit or 'unlimited'}",
                                 env=CHECKOUT_ENV, evict_paths=[args.gguf], output=out, trace_period=1.0)
        results.append(r)
        print(f"[discarding-bin] {limit or 'no'} GiB limit: {memlimit._describe(r)}, load "
              f"{r['load_avg_before'][0]} -> {r['load_avg_after'][0]}", file=sys.stderr, flush=True)
    (WORK / f"{args.gguf.stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a command did, counted: target compiles, generations, dequantized tensors, map loads.

On a real target each of these costs seconds to minutes, so a job should do each once; the counts
say whether it did. `run` puts them in its report (`RunResult.work`); with `GGUF2OV_WORK_LOG=FILE`
any command writes them to FILE as JSON when it exits (the benchmarks read them there).
"""

import atexit
import json
import os
from collections import Counter

WORK_LOG = "GGUF2OV_WORK_LOG"
_counts: Counter = Counter()


def count(kind: str, n: int = 1) -> None:
    _counts[kind] += n


def counts() -> dict[str, int]:
    return dict(sorted(_counts.items()))


def _write_log() -> None:
    path = os.environ.get(WORK_LOG)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(counts(), f, indent=2)


atexit.register(_write_log)

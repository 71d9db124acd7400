"""Commands run again and again in one process (gguf2ov used as a library) hold their memory flat.

Each build of a target once kept its whole job alive: OpenVINO's Python PostponedConstant keeps
itself alive from C++, with its maker, the weight forms, the opened source and the GGUF's memory
map (ir/postponed.py), ~2.2 MB a build of a 1.5 MB GGUF. Each compile of a target for `verify` kept
a CPU plugin thread and its runtime cache (numerics.NO_RUNTIME_CACHE). After the first runs, further
runs must leave no more mappings of their input, live gguf2ov objects or threads, and RSS within
noise of where it was.
"""

import gc
import os
from pathlib import Path

import pytest

from gguf2ov.cli import main

# The first runs fill the process's caches (maps, the tokenizer extension, the allocator's pools):
# RSS rose 4.7 MB over the first 3 target builds in a test session, then 0.4 MB over the next 8.
WARM_UP = 3
RUNS = 4
# RSS is the coarse check, for what no counter sees (the runtime cache's ~5 MB a run): in a long test
# session on a busy machine the allocator's noise reached 0.8 MB a run
RSS_GROWTH_MB = 1.5  # per run, at most


def _state(watched: Path) -> dict:
    from gguf2ov.gguf.read import GgufFile
    from gguf2ov.ir.tensors import TensorSource
    from gguf2ov.ir.weights import WeightForms

    gc.collect()
    kinds = (GgufFile, TensorSource, WeightForms)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    with open("/proc/self/maps") as f:
        mapped = sum(line.rstrip().endswith(str(watched)) for line in f)
    # type(o), not isinstance: isinstance asks some of torch's module proxies for __class__, which warns
    live = {k.__name__: sum(issubclass(type(o), k) for o in gc.get_objects()) for k in kinds}
    return {"mappings of the input": mapped, "threads": len(os.listdir("/proc/self/task")), "live objects": live,
            "rss": rss}


def _assert_flat(argv, watched: Path, capsys) -> None:
    for _ in range(WARM_UP):
        assert main(argv) == 0, capsys.readouterr().err
    before = _state(watched)
    for _ in range(RUNS):
        assert main(argv) == 0, capsys.readouterr().err
    after = _state(watched)
    grown = after.pop("rss") - before.pop("rss")
    assert after == before
    assert grown < RUNS * RSS_GROWTH_MB, f"RSS grew {grown:.1f} MB over {RUNS} runs"


def test_target_builds_hold_memory_flat(tmp_path, q4_k_m, capsys):
    _assert_flat(["target", str(q4_k_m), "-o", str(tmp_path / "t"), "--overwrite", "--quiet"], q4_k_m, capsys)


def test_exports_hold_memory_flat(tmp_path, fixtures_dir, capsys):
    draft = fixtures_dir / "draft-Q4_K_M.gguf"
    _assert_flat(["export", str(draft), "-o", str(tmp_path / "d"), "--overwrite", "--quiet"], draft, capsys)


@pytest.mark.slow
def test_verify_with_a_target_holds_memory_flat(tmp_path, fixtures_dir, fixture_draft, capsys):
    """The tap scan compiles the target: once a CPU plugin thread and ~5 MB a run."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\n")
    draft = fixtures_dir / "draft-Q4_K_M.gguf"
    _assert_flat(["verify", str(fixture_draft), "--target", str(fixtures_dir / "target"), "--checkpoint", str(draft),
                  "--prompts", str(prompts), "--quiet"], draft, capsys)

"""What the benchmarks share: the repository's folders, the machine and package facts a result records,
and the small measurements several scripts take.

The benchmarks run as modules from the repository root (`python -m benchmarks.NAME`), so that they
import this one (`from benchmarks.common import RESULTS`), each other and the tests' helpers
(`from tests.ggufs import write_gguf`) without editing sys.path. A script that measures in a fresh
process runs itself the same way: `[sys.executable, "-m", __spec__.name, ...]`.
"""

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"  # git-ignored: every script writes here unless told otherwise
CACHE = RESULTS / "cache"  # the real-size random GGUFs and checkpoints, reused between runs
TEST_DATA = REPO / "tests" / "data"  # what the llama.cpp recorders write for the tests
# A fresh process's environment with this checkout first on the path: its `python -m gguf2ov` runs this
# checkout's package, and its `python -m benchmarks.NAME` these benchmarks, whatever the working folder.
CHECKOUT_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))


def meminfo_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def process_status(fields=("RssAnon", "RssFile", "VmRSS", "VmHWM")) -> dict:
    """This process's resident memory from /proc/self/status, in bytes: private (RssAnon), file-backed (RssFile),
    now (VmRSS) and at its peak (VmHWM)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            out[key] = int(value.split()[0]) * 1024
    return out


def machine_info() -> dict:
    """The CPU, cores, memory and load a result was measured with."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    total = meminfo_kib("MemTotal")
    info = {
        "cpu_model": model or platform.processor() or None,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": round(total / 2**20, 1) if total else None,
        "ram_available_gib_at_start": round((meminfo_kib("MemAvailable") or 0) / 2**20, 1),
        "load_average_at_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    for var in ("OMP_NUM_THREADS", "OV_CPU_THREADS_NUM"):
        if var in os.environ:
            info[var] = os.environ[var]
    return info


def package_versions() -> dict:
    """The versions of the packages a result depends on (gguf2ov.provenance's list), imported only when asked."""
    from gguf2ov.provenance import package_versions as versions

    return versions()


def short_commit() -> str:
    """The checkout's commit, short (empty outside a git checkout)."""
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip()


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, to 2 places: other work on the cores moves every time figure."""
    return [round(x, 2) for x in os.getloadavg()]


def folder_bytes(path: Path) -> int | None:
    """The bytes of a file, or of the files in a folder (symlinks not followed); None when it is not there."""
    path = Path(path)
    if not path.exists():
        return None
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())

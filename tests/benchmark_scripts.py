"""The benchmark scripts that tests run, loaded one way: as `python -m benchmarks.NAME` loads them from the
repository root (tests/conftest.py puts the repository on the path). A test that uses one depends on it: a
change to benchmarks/fuzz_gguf.py, target_fidelity.py or optimum_qwen35_rope.py can fail `make test`."""

import importlib
from types import ModuleType


def benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as the module benchmarks.NAME (`llamacpp.tools` for one in a sub-folder)."""
    return importlib.import_module(f"benchmarks.{name}")

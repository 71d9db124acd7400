"""Targets as users have them: the fixture target exported by optimum-intel's own command line in
each weight format it offers (`optimum-cli export openvino --task text-generation-with-past
--weight-format ...`), made once per test session (seconds each for these sizes).

`widened_hf` is the fixture target widened into a 31M-parameter Qwen3 checkpoint computing the same
function (`tools.widen.write_widened_checkpoint`): heavy enough on a CPU for speculation to pay off, so that a
whole `run` can reach PASS on it.
"""

import sys
from pathlib import Path

import dflash_builders as b

FIXTURE_TARGET_HF = b.FIXTURES / "target-hf"
# label -> optimum-cli flags; "fp32" is optimum's default export (what fixtures/*/target holds)
FORMATS = {
    "fp32": ["--weight-format", "fp32"],
    "fp16": ["--weight-format", "fp16"],
    "int8": ["--weight-format", "int8"],
    "int4": ["--weight-format", "int4"],
    "int4-all-layers": ["--weight-format", "int4", "--all-layers"],
}


def optimum_cli_export(hf_dir: Path, out: Path, flags: list[str]) -> Path:
    """`optimum-cli export openvino` run in this process (its import costs more than the export)."""
    from optimum.commands.optimum_cli import main

    argv = sys.argv
    sys.argv = ["optimum-cli", "export", "openvino", "-m", str(hf_dir), "--task", "text-generation-with-past",
                *flags, str(out)]
    try:
        main()
    finally:
        sys.argv = argv
    return out


def optimum_target(factory, label: str, hf_dir: Path = FIXTURE_TARGET_HF, name: str = "fixture") -> Path:
    return b.once(f"optimum-{name}-{label}", factory,
                  lambda path: optimum_cli_export(hf_dir, path / "target", FORMATS[label])) / "target"


def widened_hf(factory) -> Path:
    """The fixture target widened (more layers, wider MLPs, the same function) as an HF checkpoint."""
    def build(path: Path):
        from gguf2ov.tools.widen import DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE, write_widened_checkpoint

        write_widened_checkpoint(FIXTURE_TARGET_HF, path / "hf", DEFAULT_EXTRA_LAYERS, DEFAULT_INTERMEDIATE_SIZE)

    return b.once("widened-hf", factory, build) / "hf"

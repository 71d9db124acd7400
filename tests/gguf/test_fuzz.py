"""The GGUF fuzzer (benchmarks/fuzz_gguf.py) on a few hundred cases: every mutant gets one clean
error line or a valid output; no traceback, memory blow-up, timeout, crash or invalid output."""

import json

import pytest
from benchmark_scripts import benchmark

from conftest import REPO

CASES_PER_ENTRY = 100  # 300 cases, about 40 s on 2 busy cores
TARGET_CASES = 40  # a target build is ~20x a draft command: 40 cases, about 40 s


@pytest.mark.parametrize("entries, cases", [(("inspect", "convert", "check"), CASES_PER_ENTRY),
                                            (("target",), TARGET_CASES)])
def test_fuzzer_finds_nothing_on_a_few_hundred_cases(tmp_path, entries, cases):
    """Run as the command, in a fresh process: the fuzzer forks a child per case, and a fork of a
    process whose OpenVINO/torch thread pools are already running (this test session's) can hang."""
    import subprocess
    import sys

    entry_args = [arg for entry in entries for arg in ("--entry", entry)]
    done = subprocess.run([sys.executable, "-m", "benchmarks.fuzz_gguf", "--cases", str(cases),
                           *entry_args, "--seed", "1", "--name", "ci", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    summary = json.loads((tmp_path / "fuzz-ci.json").read_text())
    assert done.returncode == (1 if summary["failures"] else 0), done.stderr[-2000:]
    problems = {entry: {cls: n for cls, n in counts.items() if cls not in ("clean", "clean_error") and n}
                for entry, counts in summary["counts"].items()}
    assert summary["failures"] == 0, json.dumps({"counts": problems, "examples": summary["examples"]}, indent=1)
    assert list(summary["counts"]) == list(entries)
    for entry, counts in summary["counts"].items():
        assert sum(counts.values()) == cases
        assert counts["clean"] and counts["clean_error"], (entry, counts)  # mutants reach past the reader too
    assert len(summary["by_operator"]) >= 10
    assert (tmp_path / "fuzz-ci.md").read_text().startswith(f"# GGUF fuzzing: {cases} cases per entry point")


def test_the_fuzzer_is_deterministic_and_sees_a_broken_output(tmp_path):
    fuzz = benchmark("fuzz_gguf")
    seeds, keys = fuzz.load_seeds(("convert",))
    assert seeds == fuzz.load_seeds(("convert",))[0] and len(seeds) == 3  # the MXFP4 seed is written the same each time
    first = fuzz.build_case("convert", 17, 3, seeds, keys, tmp_path)
    data = (tmp_path / "mutant.gguf").read_bytes()
    second = fuzz.build_case("convert", 17, 3, seeds, keys, tmp_path)
    assert first[1].description == second[1].description and (tmp_path / "mutant.gguf").read_bytes() == data
    # the output check is independent of the converter: a NaN weight or a string token id is caught
    out = tmp_path / "ckpt"
    from gguf2ov.cli import main

    assert main(["convert", str(fuzz.FIXTURES / fuzz.SEEDS[0]), "-o", str(out), "--quiet"]) == 0
    assert fuzz.validate_checkpoint(out) == []
    config = json.loads((out / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = "../../x"
    config["rms_norm_eps"] = float("nan")
    (out / "config.json").write_text(json.dumps(config))
    raw = bytearray((out / "model.safetensors").read_bytes())
    raw[-2:] = b"\xc0\x7f"  # the last bf16 value: NaN
    (out / "model.safetensors").write_bytes(bytes(raw))
    problems = fuzz.validate_checkpoint(out)
    assert problems == ["config.json: NaN in JSON"]
    config["rms_norm_eps"] = 1e-6
    (out / "config.json").write_text(json.dumps(config))
    problems = fuzz.validate_checkpoint(out)
    assert any("mask_token_id = '../../x'" in p for p in problems)
    assert any("holds 1 NaN/Inf values" in p for p in problems)

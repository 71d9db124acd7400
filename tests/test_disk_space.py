"""A full, read-only or vanished output file system: every command that writes a folder refuses before any
work when its estimate does not fit, and a write that fails anyway is one error line naming the file and
the reason, with nothing left behind. The file systems are real: small tmpfs mounts (skipped, with the
reason, where this process cannot mount one)."""

import contextlib
import shutil
import subprocess
from pathlib import Path

import pytest

import gguf2ov.outputs as outputs
from gguf2ov.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-dflash"
GGUF, TARGET, TARGET_HF = FIXTURES / "draft-Q4_K_M.gguf", FIXTURES / "target", FIXTURES / "target-hf"

# Each writing command on the fixtures, its output named OUT.
COMMANDS = {
    "convert": ["convert", str(GGUF), "-o", "OUT", "--dtype", "f32"],
    "export": ["export", str(GGUF), "-o", "OUT", "--weight-format", "fp32"],
    "drift": ["drift", str(GGUF), "-o", "OUT", "--variants", "fp32,gguf"],
    "target": ["target", str(TARGET_HF), "-o", "OUT"],
    "run": ["run", str(GGUF), "--target", str(TARGET), "-o", "OUT", "--variants", "fp32", "--max-new-tokens", "8",
            "--prompts", str(FIXTURES / "prompts.txt")],
}


@contextlib.contextmanager
def tmpfs(where: Path, size: str, read_only: bool = False):
    where.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): the disk-space "
                    "behaviour needs a small real file system")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def one_error(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def nothing_left(fs: Path) -> bool:
    return not any(fs.iterdir())


def argv_for(name: str, out: Path) -> list[str]:
    return [str(out) if a == "OUT" else a for a in COMMANDS[name]] + ["--quiet"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [*COMMANDS, "ovms"])
def test_a_command_refuses_before_any_work_when_its_output_does_not_fit(name, tmp_path, capsys, fixture_draft):
    with tmpfs(tmp_path / "fs", "1m") as fs:
        out = fs / "out"
        argv = ["ovms", "--target", str(TARGET), "--draft", str(fixture_draft), "-o", str(out), "--quiet"] \
            if name == "ovms" else argv_for(name, out)
        line = one_error(argv, capsys)
        assert line.startswith(f"error: not enough disk space for {out}: ") and " is free on the file system of " \
            in line, line
        assert nothing_left(fs)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*COMMANDS, "ovms"])
def test_a_write_that_fills_the_disk_is_one_error_naming_the_file(name, tmp_path, capsys, monkeypatch,
                                                                 fixture_draft):
    monkeypatch.setattr(outputs, "SPACE_MARGIN", 0.0)  # every estimate forced below what is free
    monkeypatch.setattr(outputs, "SPACE_SLACK", 0)
    with tmpfs(tmp_path / "fs", "600k") as fs:
        out = fs / "out"
        argv = ["ovms", "--target", str(TARGET), "--draft", str(fixture_draft), "-o", str(out), "--quiet"] \
            if name == "ovms" else argv_for(name, out)
        line = one_error(argv, capsys)
        assert f"{out}/" in line and "No space left on device" in line, line
        assert ".partial-" not in line  # named where the file would have been
        assert nothing_left(fs)


@pytest.mark.slow
def test_a_read_only_file_system_is_one_error_before_any_work(tmp_path, capsys):
    with tmpfs(tmp_path / "fs", "16m", read_only=True) as fs:
        line = one_error(argv_for("export", fs / "out"), capsys)
        assert line == f"error: cannot write {fs / 'out'}: the file system of {fs} is read-only"


def test_an_output_folder_that_vanishes_mid_write_is_one_error(tmp_path, capsys, monkeypatch):
    """Another process removes the folder while the checkpoint is written: the next file cannot be."""
    import gguf2ov.hf.write as write

    write_json = write._write_json

    def remove_then_write(path, obj):
        shutil.rmtree(path.parent, ignore_errors=True)
        write_json(path, obj)

    monkeypatch.setattr(write, "_write_json", remove_then_write)
    line = one_error(argv_for("convert", tmp_path / "out"), capsys)
    assert line == f"error: cannot write {tmp_path / 'out'}/config.json: No such file or directory (ENOENT)"
    assert not any(tmp_path.iterdir())


def test_a_folder_made_again_after_it_vanished_is_not_put_in_place(tmp_path):
    """A later write that makes the removed folder again (atomic_write_text makes missing folders) would
    put a folder without the earlier files in place."""
    from gguf2ov.errors import WriteError

    with pytest.raises(WriteError, match="its folder was removed while it was written"):
        with outputs.atomic_dir(tmp_path / "out") as tmp:
            (tmp / "weights.bin").write_bytes(b"1")
            shutil.rmtree(tmp)
            outputs.atomic_write_text(tmp / "config.json", "{}")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_the_estimates_are_within_a_tenth_of_what_is_written(tmp_path):
    """Each estimate against the bytes the same command then wrote, on the fixtures."""
    from opened import build_target, open_draft

    from gguf2ov.cli.args import target_build
    from gguf2ov.draft.graph import draft_ir_bytes
    from gguf2ov.hf.write import checkpoint_bytes
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job, Options
    from gguf2ov.stages.convert import checkpoint_specs

    def written(folder: Path) -> int:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    pairs = {}
    draft = open_draft(GGUF)
    for name, flags in (("fp32", ["fp32"]), ("fp16", ["fp16"]), ("int8", ["int8"]),
                        ("int4_asym_g16", ["int4", "--group-size", "16"]), ("gguf", ["gguf"])):
        out = tmp_path / name
        assert main(["export", str(GGUF), "-o", str(out), "--weight-format", *flags, "--quiet"]) == 0
        pairs[f"draft {name}"] = (draft_ir_bytes(draft, parse_variant(name)), written(out))
    job = Job.of(GGUF, options=Options(progress=False))
    assert main(["convert", str(GGUF), "-o", str(tmp_path / "ckpt"), "--quiet"]) == 0
    pairs["checkpoint bf16"] = (checkpoint_bytes(checkpoint_specs(job.mapped, "bf16")), written(tmp_path / "ckpt"))
    for fmt in ("fp32", "int8", "int4"):
        estimate = Job.of(None, TARGET_HF, Options(progress=False), build=target_build(fmt)).target_bytes()
        build_target(TARGET_HF, tmp_path / f"target-{fmt}", weight_format=fmt)
        pairs[f"target {fmt}"] = (estimate, written(tmp_path / f"target-{fmt}"))
    for label, (estimate, real) in pairs.items():
        assert abs(estimate - real) <= 0.1 * real, (label, estimate, real)


GEMMA4_GGUF = FIXTURES.parent / "tiny-gemma4" / "target-Q4_K_M.gguf"  # llama.cpp's file: Q4_K, Q6_K and Q8_0 grids


def _target_folder_bytes(monkeypatch, spill: str | None) -> int:
    """What the disk check of `gguf2ov target GEMMA4_GGUF` asks for (its estimate, margin and slack), with the
    scratch threshold `spill` (ir/spill.py; None: the default, which nothing of this file passes)."""
    from gguf2ov.cli.args import target_build
    from gguf2ov.ir.spill import SPILL_ENV
    from gguf2ov.job import Job, Options

    if spill is None:
        monkeypatch.delenv(SPILL_ENV, raising=False)
    else:
        monkeypatch.setenv(SPILL_ENV, spill)
    estimate = Job.of(None, GEMMA4_GGUF, Options(progress=False), build=target_build()).target_bytes()
    return int(estimate * outputs.SPACE_MARGIN + outputs.SPACE_SLACK)


def test_the_target_check_counts_the_scratch_files_of_its_biggest_weights(tmp_path, capsys, monkeypatch):
    """A weight whose constants pass the threshold is decoded into a scratch file beside the IR, whose blocks
    stay allocated until the IR is written (a 31B Gemma 4's table: 1.64 GiB, more than the 5% margin). Every
    weight spilled (threshold 0), a disk with room for the folder but not for the scratch files is refused
    before any work, naming them; with nothing spilled the same disk takes the build."""
    from gguf2ov.ir.spill import SPILL_ENV

    room = _target_folder_bytes(monkeypatch, None) + 4096  # the folder's own check, and a page
    with tmpfs(tmp_path / "fs", f"{room // 1024}k") as fs:
        out = fs / "out"
        monkeypatch.setenv(SPILL_ENV, "0")
        line = one_error(["target", str(GEMMA4_GGUF), "-o", str(out), "--quiet"], capsys)
        assert line.startswith(f"error: not enough disk space for {out}: the gguf target (with ") and \
            " KiB of scratch files while its IR is written) takes about " in line, line
        assert nothing_left(fs)
        monkeypatch.delenv(SPILL_ENV)
        assert main(["target", str(GEMMA4_GGUF), "-o", str(out), "--quiet"]) == 0


@pytest.mark.slow
def test_a_target_whose_every_weight_spills_fits_where_the_check_lets_it_build(tmp_path, monkeypatch):
    """The disk the check asks for with every weight spilled is enough: the folder and the scratch files fit."""
    room = _target_folder_bytes(monkeypatch, "0") + 4096
    with tmpfs(tmp_path / "fs", f"{room // 1024}k") as fs:
        assert main(["target", str(GEMMA4_GGUF), "-o", str(fs / "out"), "--quiet"]) == 0
        assert [p.name for p in fs.iterdir()] == ["out"] and not list((fs / "out").glob(".spill-*"))

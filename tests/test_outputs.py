"""Outputs never take inputs with them, and bad output paths are one error line."""

import json
import shutil

from gguf2ov import cli


def test_overwrite_never_replaces_a_folder_holding_an_input(fixtures_dir, tmp_path, capsys):
    work = tmp_path / "m"
    work.mkdir()
    gguf = shutil.copy(fixtures_dir / "draft-Q4_K_M.gguf", work / "draft.gguf")
    assert cli.main(["convert", str(gguf), "-o", str(work), "--overwrite"]) == 1
    assert "would replace the input" in capsys.readouterr().err
    assert (work / "draft.gguf").is_file()
    assert cli.main(["run", str(gguf), "--target", str(fixtures_dir / "target"), "-o", str(fixtures_dir),
                     "--overwrite"]) == 1
    assert "would replace the input" in capsys.readouterr().err and (fixtures_dir / "target").is_dir()


def test_output_paths_through_a_file_are_refused(fixtures_dir, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        assert cli.main(["convert", str(fixtures_dir / "draft-Q4_K_M.gguf"), "-o", str(out), "--overwrite"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error:") and "Traceback" not in err and "not a folder" in err
    assert afile.read_text() == "x"


def test_a_config_that_is_not_an_object_is_one_error_line(fixtures_dir, tmp_path, capsys):
    ref = tmp_path / "ref"
    shutil.copytree(fixtures_dir / "draft-ref", ref)
    (ref / "config.json").write_text(json.dumps([1, 2]))
    assert cli.main(["check", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--reference", str(ref)]) == 1
    assert cli.main(["export", str(ref), "-o", str(tmp_path / "out")]) == 1
    errs = capsys.readouterr().err.strip().splitlines()
    assert [line for line in errs if line.startswith("error:")] == [f"error: {ref / 'config.json'} holds a JSON list, not an object"] * 2


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporary_siblings_of_dead_runs_on_this_machine_are_cleared(tmp_path):
    import os

    from gguf2ov import outputs

    dead, host = _dead_pid(), outputs._HOST
    stale = [tmp_path / f".out.partial-{dead}-{host}-0123abcd", tmp_path / f".out.old-{dead}-{host}-89abcdef",
             tmp_path / f".report.json.partial-{dead}-{host}-00000000"]
    kept = [tmp_path / f".out.partial-{os.getpid()}-{host}-0123abcd",      # a run still going
            tmp_path / f".out.partial-{dead}-{host}x-0123abcd",            # another machine
            tmp_path / f".outx.partial-{dead}-{host}-0123abcd",            # another output
            tmp_path / f".out.partial-{dead}-{host}-0123abcd.txt"]         # not a name we make
    for path in stale[:2] + kept[:3]:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x")
    stale[2].write_text("{")
    kept[3].write_text("")
    assert sorted(outputs.clear_stale(tmp_path / "out")) == sorted(stale[:2])
    assert outputs.clear_stale(tmp_path / "report.json") == [stale[2]]
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_a_report_write_leaves_no_temporary_file(tmp_path):
    from gguf2ov import outputs

    outputs.atomic_write_text(tmp_path / "r.json", "{}")
    outputs.atomic_write_text(tmp_path / "r.json", "[]")
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and (tmp_path / "r.json").read_text() == "[]"

"""Every command has the same output contract: --json FILE, --markdown FILE, --quiet.

Each command runs once through `gguf2ov.cli.main` on the committed fixtures with both reports and
--quiet (`run` in its whole run on a target folder, tests/test_run.py; the checks are in
tests/contract.py): both files exist, the JSON holds the result's key figures, the Markdown has its
table, no progress line reaches stderr, and nothing reaches stdout unless the result fails (an exit
code other than 0: then the result is shown, the exit code alone would not say what failed). Bad
report paths are refused before any work, with the usual one error line. An acceptance verdict has
an exit code of its own, which `--help` states.
"""

import json

import pytest
from contract import quiet_run, reports, run_cli

from gguf2ov.cli import app
from gguf2ov.cli.output import verdict_code
from gguf2ov.report import render

OUTPUT_OPTIONS = {"--json", "--markdown", "--quiet"}


@pytest.fixture(scope="module")
def prompts(fixtures_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join((fixtures_dir / "prompts.txt").read_text().splitlines()[:2]) + "\n")
    return path


def test_every_command_has_the_output_options():
    parser = app.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {name for name, _ in app.COMMANDS}
    for name, command in sub.choices.items():
        options = {s for a in command._actions for s in a.option_strings}
        assert OUTPUT_OPTIONS <= options, name


def test_inspect(fixtures_dir, tmp_path):
    json_path, md_path = reports(tmp_path, "inspect")
    code, data, md, _ = quiet_run(["inspect", fixtures_dir / "draft-Q4_K_M.gguf"], json_path, md_path)
    assert code == 0
    assert data["arch"] == "dflash" and len(data["tensors"]) == 25 and data["map_fits"] is True
    assert data["type_counts"] == {"Q4_K": 13, "F32": 10, "Q6_K": 2}
    assert md.startswith("## gguf2ov inspect")
    assert "| GGUF name | type | ne (stored) | shape (PyTorch) | bytes | HF name |" in md
    assert "| fc.weight | Q4_K | [512, 256] | [256, 512] | 73728 | fc.weight |" in md


def test_inspect_shows_its_tables_without_quiet_and_json_on_stdout_with_a_dash(fixtures_dir, tmp_path):
    from gguf2ov.stages.inspect import inspect

    gguf = fixtures_dir / "draft-Q4_K_M.gguf"
    code, out, _ = run_cli(["inspect", gguf])
    assert code == 0 and out == render(inspect(gguf), "text")
    code, out, _ = run_cli(["inspect", gguf, "--json", "-"])
    assert code == 0 and json.loads(out)["arch"] == "dflash"
    code, out, _ = run_cli(["inspect", gguf, "--markdown", "-", "--json", tmp_path / "i.json"])
    assert code == 0 and out.startswith("## gguf2ov inspect") and "| Q4_K | 13 |" in out
    assert json.loads((tmp_path / "i.json").read_text())["arch"] == "dflash"


def test_convert(fixtures_dir, tmp_path):
    json_path, md_path = reports(tmp_path, "convert")
    code, data, md, _ = quiet_run(["convert", fixtures_dir / "draft-Q4_K_M.gguf", "-o", tmp_path / "hf",
                                   "--reference", fixtures_dir / "draft-ref"], json_path, md_path)
    assert code == 0  # the check against the reference passed, and said nothing under --quiet
    assert data["n_tensors"] == 25 and data["target_layer_ids_written"] == [1, 2]
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert md.startswith("## gguf2ov convert") and "- converted " in md
    assert "| HF name | GGUF name | GGUF type | shape | ops |" in md and "| fc.weight | fc.weight | Q4_K |" in md


def test_convert_with_json_on_stdout_keeps_stdout_json(fixtures_dir, tmp_path):
    code, out, err = run_cli(["convert", fixtures_dir / "draft-Q4_K_M.gguf", "-o", tmp_path / "hf",
                              "--reference", fixtures_dir / "draft-ref", "--json", "-"])
    assert code == 0 and json.loads(out)["n_tensors"] == 25
    assert "[gguf2ov]" in err  # progress still shows: only --quiet silences it


def test_check(fixtures_dir, tmp_path):
    json_path, md_path = reports(tmp_path, "check")
    code, data, md, _ = quiet_run(["check", fixtures_dir / "draft-Q4_K_M.gguf", "--reference",
                                   fixtures_dir / "draft-ref"], json_path, md_path)
    assert code == 0
    assert data["passed"] is True and len(data["tensors"]) == 25  # the file lists every tensor
    assert data["overall"]["count"] == 25 and data["overall"]["min_pearson"] > 0.99
    assert md.startswith("## gguf2ov check") and "- PASS: 25 tensors correlate >= 0.99" in md
    assert md.count("\n| layers.") + md.count("\n| fc.") + md.count("\n| hidden_norm.") + md.count("\n| norm.") >= 25


def test_check_shows_its_worst_tensors_without_quiet(fixtures_dir):
    code, out, _ = run_cli(["check", fixtures_dir / "draft-Q4_K_M.gguf", "--reference", fixtures_dir / "draft-ref"])
    assert code == 0
    assert out.startswith(f"check {fixtures_dir / 'draft-Q4_K_M.gguf'} against {fixtures_dir / 'draft-ref'}")
    assert "Tensors, worst first" in out and "... 5 more (the JSON and Markdown reports list every tensor)" in out


@pytest.mark.slow
def test_export(fixtures_dir, tmp_path):
    code, data, md, _ = quiet_run(["export", fixtures_dir / "draft-Q4_K_M.gguf", "-o", tmp_path / "draft"],
                                  *reports(tmp_path, "export"))
    assert code == 0
    assert data["verify"]["ok"] is True and data["weight_format"] == "fp32"
    assert data["rt_info"]["dflash/target_layer_ids"] == "1,2"
    assert {"openvino_model.xml", "openvino_model.bin"} <= set(data["files"])
    assert md.startswith("## Draft export") and "| dflash/target_layer_ids | 1,2 |" in md
    assert "| interface | stateful | pass |" in md


@pytest.mark.slow
def test_verify(fixture_draft, tmp_path):
    json_path, md_path = reports(tmp_path, "verify")
    code, data, md, _ = quiet_run(["verify", fixture_draft], json_path, md_path)
    assert code == 0
    assert data["ok"] is True and {c["name"] for c in data["checks"]} >= {"stateful", "rt-info", "block-rows"}
    assert data["figures"]["rows"] == data["figures"]["block"] - 1
    assert md.startswith("## DFlash draft verification") and "| behaviour | block-rows | pass |" in md
    # without --quiet: the same checks on stdout
    code, out, _ = run_cli(["verify", fixture_draft])
    assert code == 0 and "DFlash draft checks" in out and "verify PASS" in out


@pytest.mark.slow
def test_drift(fixtures_dir, tmp_path):
    json_path, md_path = reports(tmp_path, "drift")
    out = tmp_path / "variants"
    code, data, md, _ = quiet_run(["drift", fixtures_dir / "draft-Q4_K_M.gguf", "-o", out, "--variants", "fp32"],
                                  json_path, md_path)
    assert code == 0
    assert [v["name"] for v in data["variants"]] == ["fp32"] and data["variants"][0]["verified"] is True
    assert data["variants"][0]["rel_err"] == 0 and data["n_rows"] > 0
    assert md.startswith("## gguf2ov drift") and "| variant | size | rel err |" in md and "\n| fp32 |" in md
    assert json.loads((out / "drift.json").read_text())["variants"][0]["name"] == "fp32"  # still written


@pytest.mark.slow
def test_accept(fixtures_dir, fixture_draft, prompts, tmp_path):
    json_path, md_path = reports(tmp_path, "accept")
    code, data, md, out = quiet_run(["accept", "--target", fixtures_dir / "target", "--draft", fixture_draft,
                                   "--prompts", prompts, "--max-new-tokens", "8"], json_path, md_path)
    assert data["verdict"] in ("PASS", "SLOW")  # the trained draft, identical text (below)
    assert code == verdict_code(data["verdict"])
    assert code == 0 or f"verdict: {data['verdict']}" in out  # SLOW on the light fixture target: shown
    assert data["identical"] is True and data["overall"]["generated_tokens"] == 16 and len(data["prompts"]) == 2
    assert {"accepted_tokens", "acceptance_rate", "speedup"} <= set(data)
    assert md.startswith("## Acceptance") and f"- verdict: {data['verdict']}" in md
    assert f"\n| all | yes | 16 | {data['accepted_tokens']} |" in md


def test_target(fixtures_dir, tmp_path):
    code, data, md, _ = quiet_run(["target", fixtures_dir / "target-hf", "-o", tmp_path / "t"], *reports(tmp_path, "t"))
    assert code == 0 and data["state_variables"] == 8 and data["arch"] == "qwen3"
    assert md.startswith("## gguf2ov target") and "| target-paged | pass |" in md


@pytest.mark.slow
def test_widen_target(fixtures_dir, tmp_path):
    hf = fixtures_dir / "target-hf"
    config = json.loads((hf / "config.json").read_text())
    n, inter = config["num_hidden_layers"], config["intermediate_size"]
    json_path, md_path = reports(tmp_path, "widen")
    code, data, md, _ = quiet_run(["widen-target", hf, "-o", tmp_path / "wide", "--extra-layers", "1",
                                   "--intermediate-size", inter], json_path, md_path)
    assert code == 0
    assert data["layers"] == [n, n + 1] and data["intermediate_size"] == [inter, inter]
    assert max(data["max_abs_diff"].values()) < 1e-4
    assert md.startswith("## gguf2ov widen-target") and f"| decoder layers | {n} | {n + 1} |" in md


def test_ovms(fixtures_dir, tmp_path):
    from dflash_builders import rt_info_ir

    json_path, md_path = reports(tmp_path, "ovms")
    draft = rt_info_ir(tmp_path / "draft")
    code, data, md, _ = quiet_run(["ovms", "--target", fixtures_dir / "target", "--draft", draft,
                                   "-o", tmp_path / "models"], json_path, md_path)
    assert code == 0
    assert data["name"] == "target" and data["options"]["draft_models_path"] == "./draft"
    assert (tmp_path / "models" / "target" / "graph.pbtxt").is_file()
    assert md.startswith("## gguf2ov ovms") and "| pipeline_type | LM_CB |" in md


# --- bad report paths: one error line, before any work -----------------------------------------------

def _commands(fx, tmp):
    """Each command with its inputs, writing under `tmp`, and one input a report may not replace."""
    gguf, ref, target = fx / "draft-Q4_K_M.gguf", fx / "draft-ref", fx / "target"
    return {
        "inspect": (["inspect", gguf], gguf),
        "convert": (["convert", gguf, "-o", tmp / "out"], gguf),
        "check": (["check", gguf, "--reference", ref], ref / "config.json"),
        "export": (["export", gguf, "-o", tmp / "out"], gguf),
        "verify": (["verify", target], target / "openvino_model.xml"),
        "drift": (["drift", gguf, "-o", tmp / "out", "--variants", "fp32"], gguf),
        "accept": (["accept", "--target", target, "--draft", target], target / "config.json"),
        "run": (["run", gguf, "--target", target, "-o", tmp / "out"], target / "config.json"),
        "widen-target": (["widen-target", fx / "target-hf", "-o", tmp / "out"], fx / "target-hf" / "config.json"),
        "ovms": (["ovms", "--target", target, "--draft", target, "-o", tmp / "out"], target / "config.json"),
        "target": (["target", fx / "target-hf", "-o", tmp / "out"], fx / "target-hf" / "config.json"),
    }


@pytest.fixture(scope="module")
def fixture_copy(fixtures_dir, tmp_path_factory):
    """The fixtures copied: a refusal that failed would overwrite a copy, not a committed file."""
    import shutil

    return shutil.copytree(fixtures_dir, tmp_path_factory.mktemp("copy") / "tiny-dflash")


@pytest.mark.parametrize("command", [name for name, _ in app.COMMANDS])
def test_bad_report_paths_are_refused_before_the_work(fixture_copy, tmp_path, command):
    argv, an_input = _commands(fixture_copy, tmp_path)[command]
    before = an_input.read_bytes()
    (tmp_path / "folder").mkdir()
    cases = [
        ("--json", tmp_path / "missing" / "r.json", f"the folder {tmp_path / 'missing'} does not exist"),
        ("--markdown", tmp_path / "folder", "it is a folder, not a regular file"),
        ("--json", an_input, "it is the input" if an_input == argv[1] else "it is inside the input folder"),
    ]
    if "-o" in argv:
        cases.append(("--markdown", tmp_path / "out" / "r.md", "it is inside the output folder"))
    for option, path, needle in cases:
        code, out, err = run_cli([*argv, option, path])
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
        assert f"error: cannot write {path}: {needle}" in errors[0], errors[0]
        assert "[gguf2ov]" not in err and out == ""  # refused before any work
    assert an_input.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_both_reports_on_one_path_or_both_on_stdout_are_refused(fixtures_dir, tmp_path):
    gguf = fixtures_dir / "draft-Q4_K_M.gguf"
    for paths, needle in (((tmp_path / "r", tmp_path / "r"), "--json and --markdown both name"),
                          (("-", "-"), "--json - and --markdown - both ask for stdout")):
        code, out, err = run_cli(["inspect", gguf, "--json", paths[0], "--markdown", paths[1]])
        assert code == 1 and out == "" and err.startswith(f"error: {needle}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["accept", "run"])
def test_each_verdict_has_its_own_exit_code_and_the_help_says_which(command):
    """A script tells a broken conversion (MISMATCH, BROKEN, 1) from a pair that is right but does
    not pay on this device (SLOW), neither taken for argparse's usage error or a signal's code."""
    from gguf2ov.cli.output import VERDICT_CODES

    codes = set(VERDICT_CODES.values())
    assert VERDICT_CODES["PASS"] == 0 and len(codes) == len(VERDICT_CODES)
    assert not codes & {1, 2, 129, 130, 143}
    assert verdict_code("FAILED at drift") == 1
    code, out = _help(command)
    flat = " ".join(out.split())
    assert code == 0 and all(f"{c} {verdict}" in flat for verdict, c in VERDICT_CODES.items()), flat


def _help(command):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        app.main([command, "--help"])
    return exit_.value.code, out.getvalue()

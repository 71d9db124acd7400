"""`gguf2ov run`: the whole job on the fixtures, as the README's demo runs it."""

import json

import dflash_builders as b
import pytest

from gguf2ov import cli
from gguf2ov.runtime.genai import GenerationSettings
from gguf2ov.job import Job, Options
from gguf2ov.maps.load import shipped_maps
from gguf2ov.run import run
from gguf2ov.runtime.genai import read_prompts

VARIANTS = ["fp32", "int4_asym_g16", "gguf"]


@pytest.mark.slow
def test_run_on_the_fixtures_passes_for_both_drafts(fixtures_dir, heavy_target, tmp_path):
    out = tmp_path / "run"
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(heavy_target),
                     "--reference", str(fixtures_dir / "draft-ref"), "--prompts", str(fixtures_dir / "prompts.txt"),
                     "--variants", ",".join(VARIANTS), "-o", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    assert code == 0, report["stages"]
    assert report["verdict"] == "PASS"
    stages = {s["name"]: s["status"] for s in report["stages"]}
    assert stages == {"convert": "pass", "check": "pass", "drift": "pass", "verify:gguf": "pass",
                      "verify:int4_asym_g16": "pass", "accept:gguf": "pass", "accept:int4_asym_g16": "pass"}
    for name in ("accept:gguf", "accept:int4_asym_g16"):
        acc = report["results"][name]
        assert acc["verdict"] == "PASS" and acc["identical"] and acc["speedup"] > 1
        assert acc["accepted_tokens"] >= 0.6 * acc["overall"]["generated_tokens"]
    md = (out / "report.md").read_text()
    assert "verdict: PASS" in md and "![size against weight drift](drafts/drift.png)" in md
    assert (out / "drafts" / "drift.png").is_file() and (out / "checkpoint" / "model.safetensors").is_file()
    assert report["provenance"]["sources"]["gguf"]["sha256"]
    # every draft the run reports was compared with the GGUF's own function
    for name in ("verify:gguf", "verify:int4_asym_g16"):
        match = next(c for c in report["results"][name]["checks"] if c["name"] == "checkpoint-match")
        assert match["status"] == "pass", match
    # each piece of work once: the target compiled by gguf2ov for drift's contexts and again for the tap
    # scan (released before any draft compiles: never both at once), by GenAI once for the baseline and
    # once per draft; one baseline; one verify per variant
    work = report["work"]
    assert work["target compiles (gguf2ov)"] == 2 and work["target-alone baselines (GenAI)"] == 1
    assert work["target compiles (GenAI pipelines)"] == 3 and work["verify runs"] == len(VARIANTS)
    assert work.get("map loads", 0) <= len(shipped_maps())  # none when an earlier run in this process read them
    # acceptance as users run it, drift's output figures exact: both name the CPU and the setting
    accept, drift = report["results"]["accept:gguf"]["numerics"], report["results"]["drift"]["numerics"]
    assert accept["device_name"] == drift["device_name"] and accept["device_name"] in md
    assert accept["dynamic_quantization_group_size"] == accept["dynamic_quantization_default"]
    assert drift["dynamic_quantization_group_size"] == 0
    assert report["provenance"]["packages"]["openvino-genai"]


@pytest.mark.slow
def test_run_calls_a_random_draft_broken(fixtures_dir, heavy_target, tmp_path):
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    cfg = json.loads((fixtures_dir / "draft-ref" / "config.json").read_text())
    write_dflash_gguf(b.random_checkpoint(cfg, tmp_path / "random"), tmp_path / "random-Q4_K_M.gguf",
                      tokenizer_dir=fixtures_dir / "target-hf")
    options = Options(prompts=tuple(read_prompts(fixtures_dir / "prompts.txt")[:2]), progress=False, generation=GenerationSettings(max_new_tokens=40))
    result = run(Job.of(tmp_path / "random-Q4_K_M.gguf", heavy_target, options), tmp_path / "run", variants=["fp32"])
    assert result.verdict == "BROKEN"
    assert [s.status for s in result.stages][-1] == "fail"
    # the tap scan does not blame the layers of a draft that predicts nothing at any of them
    assert result.results["verify:gguf"].finding("layer-fit").status == "warn"
    assert result.results["verify:gguf"].taps.verdict == "no-fit"
    assert json.loads((tmp_path / "run" / "report.json").read_text())["verdict"] == "BROKEN"


@pytest.mark.slow
def test_a_failing_stage_stops_the_run_with_its_name(fixtures_dir, tmp_path, capsys):
    # the older converter's file read with the current converter's offset: the draft reads layers
    # [0, 1] instead of [1, 2]; convert and export succeed, verify's tap scan stops the run
    code = cli.main(["run", str(fixtures_dir / "draft-legacy-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "--target-layer-offset", "-1", "--variants", "fp32", "--prompts", str(fixtures_dir / "prompts.txt"),
                     "-o", str(tmp_path / "run"), "--quiet"])
    assert code == 1
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["verdict"] == "FAILED at verify:gguf"
    assert [s["name"] for s in report["stages"]] == ["convert", "check", "drift", "verify:gguf"]
    assert "layer-fit" in report["stages"][-1]["reason"]
    scan = report["results"]["verify:gguf"]["taps"]
    assert scan["verdict"] == "misfit" and scan["best_ids"] == [1, 2]
    assert "FAILED at verify:gguf" in capsys.readouterr().out


@pytest.mark.slow
def test_an_ambiguous_file_is_settled_by_the_tap_scan(fixtures_dir, tmp_path):
    """No flag: the first converter's file is measured against the target, and the decision is reported."""
    code = cli.main(["run", str(fixtures_dir / "draft-legacy-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "--variants", "fp32", "--prompts", str(fixtures_dir / "prompts.txt"), "--max-new-tokens", "40",
                     "-o", str(tmp_path / "run"), "--quiet"])
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages)[:2] == ["layer-offset", "convert"], list(stages)
    assert stages["layer-offset"]["status"] == "pass"
    assert "--target-layer-offset 0 -> target_layer_ids [1, 2]" in stages["layer-offset"]["reason"]
    assert "[1, 2]" in stages["convert"]["reason"]
    assert stages["verify:gguf"]["status"] == "pass" and "layer-fit pass" in stages["verify:gguf"]["reason"]
    measured = report["provenance"]["options"]["target_layer_offset_measured"]
    assert measured["offset"] == 0 and measured["sets"]["offset 0"]["lowest_share"] >= 0.65
    assert "Target layer offset, measured" in (tmp_path / "run" / "report.md").read_text()
    assert code in (0, 1) and "accept:gguf" in stages  # the tiny target may be faster alone (SLOW)


def test_bad_input_is_one_error_line_and_no_output(fixtures_dir, tmp_path, capsys):
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(tmp_path / "nope"),
                     "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: target folder") and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "-o", str(tmp_path / "run"), "--requant", "int5"])
    assert code == 1 and "unknown variant" in capsys.readouterr().err


def test_an_interrupted_run_leaves_no_output(fixtures_dir, tmp_path, monkeypatch, capsys):
    import gguf2ov.stages.drift as drift

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(drift, "drift", interrupted)
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "-o", str(tmp_path / "run"), "--quiet"])
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # the converted checkpoint went with it


def test_an_interrupted_run_with_overwrite_keeps_the_previous_output(fixtures_dir, tmp_path, monkeypatch, capsys):
    """--overwrite replaces the old output only once the new run has written its report."""
    import gguf2ov.stages.drift as drift

    old = tmp_path / "run"
    old.mkdir()
    (old / "report.json").write_text('{"verdict": "the previous run"}')

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(drift, "drift", interrupted)
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "-o", str(old), "--overwrite", "--quiet"])
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert json.loads((old / "report.json").read_text()) == {"verdict": "the previous run"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary folder left beside it


@pytest.mark.slow
def test_a_graph_that_computes_another_function_fails_run_at_drift_naming_checkpoint_match(fixtures_dir, tmp_path,
                                                                                            monkeypatch):
    """A graph-builder defect (layer 1's RoPE turned the other way) exports, runs and attaches; only
    the comparison with the GGUF's own function catches it, and the run stops there."""
    import gguf2ov.draft.graph as draft_graph

    layers = json.loads((fixtures_dir / "draft-ref" / "config.json").read_text())["num_hidden_layers"]
    rope, calls = draft_graph.apply_rope, []

    def rope_of_layer_1_reversed(x, cos, sin, half):
        calls.append(1)
        if (len(calls) - 1) % (2 * layers) in (2, 3):  # q and k of layer 1, in every graph built
            return rope(x, cos, draft_graph._ops().negative(sin), half)
        return rope(x, cos, sin, half)

    monkeypatch.setattr(draft_graph, "apply_rope", rope_of_layer_1_reversed)
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "--variants", "fp32", "--requant", "fp32", "--prompts", str(fixtures_dir / "prompts.txt"),
                     "-o", str(tmp_path / "run"), "--quiet"])
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert code == 1 and report["verdict"] == "FAILED at drift"
    assert "fp32 FAILED verify: checkpoint-match" in report["stages"][-1]["reason"]
    match = next(c for c in report["results"]["drift"]["variants"][0]["verify"]["checks"]
                 if c["name"] == "checkpoint-match")
    assert match["status"] == "fail" and "does not compute the checkpoint's function" in match["reason"]

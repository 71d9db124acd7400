"""`gguf2ov run`: the whole job, once per kind of target, and its other cases stage by stage on the job.

One whole run per kind of target the job takes (`sources.py`), each through GenAI:
- an OpenVINO folder as optimum exports it: the demo's widened target in fp32, run as the README's
  demo runs it (its work counted, with both reports and --quiet: the output contract);
- a target the run builds from a GGUF (the fixture target as Q4_K_M);
- one it builds from a Hugging Face checkpoint (the fixture target's), with the first converter's
  file, whose layer offset the run measures first;
- a VLM folder (fixtures/tiny-vlm).
The other cases run the stages on a `Job` as `run` composes them, with the work counts as the
assertion: a random draft, an ambiguous file on the folder target, optimum's other formats
(tests/runtime/test_real_targets.py). The runs that stop before GenAI (bad input, a failing stage,
an interruption) stay whole: where a run stops is what they test.
"""

import json
from pathlib import Path

import dflash_builders as b
import pytest
from contract import quiet_run, reports

from gguf2ov import cli, work
from gguf2ov.checks.taps import CLEAR_MARGIN, FITS
from gguf2ov.cli.output import verdict_code
from gguf2ov.ir.variants import parse_variant
from gguf2ov.job import Job, Options
from gguf2ov.maps.load import shipped_maps
from gguf2ov.run import run
from gguf2ov.runtime.genai import GenerationSettings, read_prompts

VARIANTS = ["fp32", "int4_asym_g16", "gguf"]
VLM = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-vlm"


def _done_since(before: dict) -> dict:
    """The work counted since `before` (work.counts())."""
    return {k: v - before.get(k, 0) for k, v in work.counts().items() if v - before.get(k, 0)}


# --- the whole job, once per kind of target -----------------------------------------------------------

@pytest.mark.slow
def test_run_on_an_optimum_folder_passes_for_both_drafts(fixtures_dir, optimum_target, tmp_path):
    """A target folder as optimum-cli exports it: the fixture target widened into one heavy enough for
    the draft to pay off (the same function; the demo's target), in fp32. optimum's other formats go
    through the same stages on the job: tests/runtime/test_real_targets.py."""
    out = tmp_path / "run"
    json_path, md_path = reports(tmp_path, "run")
    code, data, md_out, stdout = quiet_run(
        ["run", fixtures_dir / "draft-Q4_K_M.gguf", "--target", optimum_target("fp32", widened=True), "--reference",
         fixtures_dir / "draft-ref", "--prompts", fixtures_dir / "prompts.txt", "--variants", ",".join(VARIANTS),
         "-o", out], json_path, md_path)
    report = json.loads((out / "report.json").read_text())
    assert code == 0, report["stages"]
    assert report["verdict"] == "PASS"
    stages = {s["name"]: s["status"] for s in report["stages"]}
    assert stages == {"draft-head": "pass", "convert": "pass", "check": "pass", "drift": "pass", "verify:gguf": "pass",
                      "verify:int4_asym_g16": "pass", "accept:gguf": "pass", "accept:int4_asym_g16": "pass"}
    # the fixture target's table and head are KiB: the plain draft is kept, and the report says why
    assert "graft" in report["stages"][0]["reason"] and "plain draft is kept" in report["stages"][0]["reason"]
    for name in ("accept:gguf", "accept:int4_asym_g16"):
        acc = report["results"][name]
        assert acc["verdict"] == "PASS" and acc["identical"] and acc["speedup"] > 1
        assert acc["accepted_tokens"] >= 0.6 * acc["overall"]["generated_tokens"]
        assert acc["acceptance_rate"] > 0.5, acc  # 0.64-0.80 measured on optimum's formats
    scan = report["results"]["verify:gguf"]["taps"]
    assert scan["verdict"] == FITS and scan["margin"] >= CLEAR_MARGIN
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
    assert set(accept["models"]) == {"target", "draft"} and accept["kv_cache_precision"]
    assert drift["dynamic_quantization_group_size"] == 0 and drift["int8_matmuls"] == 0
    assert set(drift["models"]) == {v["name"] for v in report["results"]["drift"]["variants"]}
    assert report["provenance"]["packages"]["openvino-genai"]
    # the output contract (tests/contract.py): --json and --markdown hold what the run writes beside its outputs
    assert code == verdict_code(data["verdict"])
    assert code == 0 or f"verdict: {data['verdict']}" in stdout
    assert [s["name"] for s in data["stages"]][:4] == ["draft-head", "convert", "check", "drift"]
    assert json_path.read_text() == (out / "report.json").read_text()
    assert md_path.read_text() == md
    assert md_out.startswith("## gguf2ov run") and "| stage | status | time | peak RSS | result |" in md_out
    assert f"- verdict: {data['verdict']}" in md_out and "## drift" in md_out


@pytest.mark.slow
def test_run_builds_its_target_from_a_gguf_first(tmp_path, q4_k_m, fixtures_dir):
    """`run --target X.gguf`: the target stage builds OUT/target, and every later stage runs on it."""
    out = tmp_path / "run"
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(q4_k_m), "-o", str(out),
                     "--variants", "int8", "--prompts", str(fixtures_dir / "prompts.txt"), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert report["verdict"] in ("PASS", "SLOW") and code == verdict_code(report["verdict"])  # speed: the device's
    assert list(stages)[0] == "target" and stages["target"]["status"] == "pass"
    assert "target-Q4_K_M.gguf (gguf, qwen3) as gguf into target/" in stages["target"]["reason"]
    assert json.loads((out / "target" / "gguf2ov.json").read_text())["options"]["variant"] == "gguf"
    assert report["target"] == str(out / "target")  # where it is once the run has finished, not its partial folder
    assert report["provenance"]["sources"]["target"]["path"] == str(out / "target")
    accept = report["results"]["accept:gguf"]["overall"]
    assert accept["identical"] and accept["accepted_tokens"] > 0


@pytest.mark.slow
def test_run_builds_its_target_from_a_checkpoint_and_settles_an_ambiguous_file(fixtures_dir, tmp_path):
    """`run --target HF_DIR` with the first converter's file and no flag: the target stage builds
    OUT/target from the checkpoint, the file is measured against it, and the decision is reported.
    The same decision on the fixture's own target folder, stage by stage:
    test_an_ambiguous_file_is_settled_by_the_tap_scan."""
    out = tmp_path / "run"
    code = cli.main(["run", str(fixtures_dir / "draft-legacy-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target-hf"),
                     "--variants", "fp32", "--requant", "fp16", "--prompts", str(fixtures_dir / "prompts.txt"),
                     "--max-new-tokens", "40", "-o", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages)[:4] == ["target", "layer-offset", "draft-head", "convert"], list(stages)
    assert stages["target"]["status"] == "pass" and "target-hf (checkpoint, qwen3) as fp32 into target/" in \
        stages["target"]["reason"]
    assert json.loads((out / "target" / "gguf2ov.json").read_text())["options"]["variant"] == "fp32"
    assert stages["layer-offset"]["status"] == "pass"
    assert "--target-layer-offset 0 -> target_layer_ids [1, 2]" in stages["layer-offset"]["reason"]
    assert "[1, 2]" in stages["convert"]["reason"]
    assert stages["verify:gguf"]["status"] == "pass" and "layer-fit pass" in stages["verify:gguf"]["reason"]
    assert "verify:fp16" in stages  # --requant names the second draft
    measured = report["provenance"]["options"]["target_layer_offset_measured"]
    assert measured["offset"] == 0 and measured["sets"]["offset 0"]["lowest_share"] >= 0.65
    assert "Target layer offset, measured" in (out / "report.md").read_text()
    assert code == verdict_code(report["verdict"]) and report["verdict"] in ("PASS", "SLOW")  # the tiny target: SLOW
    assert stages["accept:gguf"]["status"] in ("pass", "warn") and "accept:fp16" in stages  # SLOW stops nothing


@pytest.mark.slow
def test_run_on_a_vlm_target_names_the_pipeline(tmp_path):
    if not VLM.exists():
        pytest.fail(f"fixtures missing at {VLM}: run python fixtures/make_fixtures.py --vlm")
    prompts = read_prompts(VLM / "prompts.txt", images=[VLM / "image.png"])
    job = Job.of(VLM / "draft-Q4_K_M.gguf", VLM / "target", Options(prompts=tuple(prompts), progress=False))
    result = run(job, tmp_path / "run", reference_dir=VLM / "draft-ref", variants=["fp32", "int4_asym_g16"])
    stages = {s.name: s.status for s in result.stages}
    assert all(stages[s] == "pass" for s in ("convert", "check", "drift", "verify:gguf")), result.stages
    accepted = result.results["accept:gguf"]
    assert accepted.overall.identical and accepted.by_kind["text"].accepted_share >= 0.5
    # the tiny target is too light for a speed-up on a CPU
    assert accepted.verdict in ("PASS", "SLOW") and result.verdict in ("PASS", "SLOW")
    report = (tmp_path / "run" / "report.md").read_text()
    assert "VLMPipeline on CPU" in report


# --- run's other cases, stage by stage on the job ------------------------------------------------------

@pytest.mark.slow
def test_a_random_draft_is_called_broken(fixtures_dir, heavy_target, tmp_path):
    """run's verify:gguf and accept:gguf on the job, for a draft that predicts nothing: the tap scan
    does not blame the layers, and acceptance calls it BROKEN (what the run's verdict then is:
    test_a_draft_called_broken_is_the_runs_verdict)."""
    from gguf2ov.stages.export import export_draft
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    cfg = json.loads((fixtures_dir / "draft-ref" / "config.json").read_text())
    write_dflash_gguf(b.random_checkpoint(cfg, tmp_path / "random"), tmp_path / "random-Q4_K_M.gguf",
                      tokenizer_dir=fixtures_dir / "target-hf")
    options = Options(prompts=tuple(read_prompts(fixtures_dir / "prompts.txt")[:2]), progress=False,
                      generation=GenerationSettings(max_new_tokens=40))
    job = Job.of(tmp_path / "random-Q4_K_M.gguf", heavy_target, options)
    before = work.counts()
    draft = export_draft(job.draft, tmp_path / "gguf", parse_variant("gguf"), progress=False).out_dir
    verified = job.verify(draft, tap_scan=True)
    assert verified.ok, verified.summary()  # run goes on to acceptance
    # the tap scan does not blame the layers of a draft that predicts nothing at any of them
    assert verified.finding("layer-fit").status == "warn"
    assert verified.taps.verdict == "no-fit"
    accepted = job.accept(draft, verified=verified)
    assert accepted.verdict == "BROKEN"
    done = _done_since(before)
    assert done["target compiles (gguf2ov)"] == 1 and done["target-alone baselines (GenAI)"] == 1, done
    assert done["target compiles (GenAI pipelines)"] == 2 and done["verify runs"] == 1, done


@pytest.mark.slow
@pytest.mark.parametrize("verdict", ["BROKEN", "SLOW"])
def test_the_acceptance_verdict_is_the_runs_and_its_exit_code(fixtures_dir, tmp_path, monkeypatch, verdict):
    """A BROKEN acceptance stops the run at its stage; a SLOW one (the pair is right, the target too
    light on this device) stops nothing, and the requantized draft is still accepted. Either is the
    run's verdict, with its own exit code (GenAI's part is test_a_random_draft_is_called_broken's;
    here acceptance answers at once)."""
    from gguf2ov.cli.output import VERDICT_CODES
    from gguf2ov.stages.accept import AcceptResult, PromptAcceptance

    seen = []
    never = PromptAcceptance(None, True, 40, 0, 80, 40, 0.0, 0.0, 1.0, 100.0, 50.0, 0.5)
    answer = AcceptResult(str(fixtures_dir / "target"), "draft", "CPU", "f32", 40, 7, 1, (never,), never, verdict,
                          ("what acceptance found",), (0.0,) * 7)
    monkeypatch.setattr(Job, "accept",
                        lambda self, draft_dir, verified=None: seen.append(Path(draft_dir).name) or answer)
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "--variants", "fp32", "--prompts", str(fixtures_dir / "prompts.txt"), "-o", str(tmp_path / "run"),
                     "--quiet"])
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["verdict"] == verdict and code == VERDICT_CODES[verdict] not in (0, 1, 2)
    stages = {s["name"]: s["status"] for s in report["stages"]}
    if verdict == "BROKEN":
        assert seen == ["gguf"] and list(stages)[-1] == "accept:gguf" and stages["accept:gguf"] == "fail"
    else:
        assert seen == ["gguf", "int4_asym_g16"]
        assert stages["accept:gguf"] == stages["accept:int4_asym_g16"] == "warn"
        assert "| accept:gguf | WARN |" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.slow
def test_an_ambiguous_file_is_settled_by_the_tap_scan(fixtures_dir, tmp_path):
    """No flag: the first converter's file is measured against the target folder, as run's
    layer-offset stage measures it, and convert and verify go on with the decision (the whole run:
    test_run_builds_its_target_from_a_checkpoint_and_settles_an_ambiguous_file)."""
    from gguf2ov.report import render
    from gguf2ov.stages.export import export_draft

    options = Options(prompts=tuple(read_prompts(fixtures_dir / "prompts.txt")), progress=False,
                      generation=GenerationSettings(max_new_tokens=40))
    job = Job.of(fixtures_dir / "draft-legacy-Q4_K_M.gguf", fixtures_dir / "target", options)
    assert job.ambiguous()  # run's first stage is layer-offset
    before = work.counts()
    decision = job.offset_decision
    assert "--target-layer-offset 0 -> target_layer_ids [1, 2]" in " ".join(decision.summary())
    measured = decision.record()
    assert measured["offset"] == 0 and measured["sets"]["offset 0"]["lowest_share"] >= 0.65
    assert "Target layer offset, measured" in render(decision, "markdown", title="layer-offset")
    assert job.convert(tmp_path / "checkpoint").target_layer_ids_written == [1, 2]
    draft = export_draft(job.draft, tmp_path / "gguf", parse_variant("gguf"), progress=False).out_dir
    verified = job.verify(draft, tap_scan=True)
    assert verified.ok and verified.finding("layer-fit").status == "pass", verified.summary()
    # the target compiled once per tap scan (each releases it before the draft compiles): the one that
    # settled the offset and verify's; one verify
    done = _done_since(before)
    assert done["target compiles (gguf2ov)"] == 2 and done["verify runs"] == 1, done


# --- runs that stop before GenAI ------------------------------------------------------------------------

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
    assert [s["name"] for s in report["stages"]] == ["draft-head", "convert", "check", "drift", "verify:gguf"]
    assert "layer-fit" in report["stages"][-1]["reason"]
    scan = report["results"]["verify:gguf"]["taps"]
    assert scan["verdict"] == "misfit" and scan["best_ids"] == [1, 2]
    assert "FAILED at verify:gguf" in capsys.readouterr().out


def test_bad_input_is_one_error_line_and_no_output(fixtures_dir, tmp_path, capsys):
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(tmp_path / "nope"),
                     "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: target folder") and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code = cli.main(["run", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--target", str(fixtures_dir / "target"),
                     "-o", str(tmp_path / "run"), "--requant", "int5"])
    assert code == 1 and "unknown variant" in capsys.readouterr().err


@pytest.mark.parametrize("named", [["--variants", "int8,int4_asym_g128"], ["--requant", "int4_sym_g128"]])
def test_a_variant_named_that_the_draft_cannot_take_is_one_error_line_before_any_work(tmp_path, capsys, named):
    """The hybrid fixture's draft is 32 wide: group 128 cannot apply. Its defaults are skipped (the
    whole run: tests/test_target_fixtures.py); a variant the user names is refused before the target
    is built, and nothing is written."""
    d = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-hybrid"
    code = cli.main(["run", str(d / "draft-Q4_K_M.gguf"), "--target", str(d / "target-Q4_K_M.gguf"), *named,
                     "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and err[0].startswith("error: NNCF cannot compress the model as int4_") and len(err) == 2, err
    assert "group size 128 does not divide the input width of" in err[0] and err[1].startswith("hint: group sizes")
    assert not (tmp_path / "run").exists()


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


def test_overwrite_replaces_an_output_that_holds_a_built_target(tmp_path, monkeypatch, capsys):
    """A run that builds its target (`--target FILE.gguf`) goes past an old output holding target/ with
    --overwrite: the new target is built in the run's temporary folder, not over the old one."""
    import gguf2ov.stages.drift as drift

    gemma4 = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-gemma4"
    old = tmp_path / "run"
    (old / "target").mkdir(parents=True)
    (old / "target" / "config.json").write_text("{}")  # a previous run's target

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(drift, "drift", interrupted)
    code = cli.main(["run", str(gemma4 / "draft-Q4_K_M.gguf"), "--target", str(gemma4 / "target-Q4_K_M.gguf"),
                     "-o", str(old), "--overwrite", "--quiet"])
    assert code == 130 and "interrupted" in capsys.readouterr().err  # drift reached: the target was built


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

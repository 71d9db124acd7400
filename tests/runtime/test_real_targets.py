"""The target side on targets as users export them: optimum-cli's fp32, fp16, int8, int4 and
`--all-layers` int4 IRs of the fixture target. The embedding, the head and the taps are found by
the graph's structure whatever names and weight forms optimum wrote, the weights are never held in
float32, and every command that takes a target works on each form."""

import json

import numpy as np
import optimum_targets as ot
import pytest

from gguf2ov import cli, work
from gguf2ov.checks.taps import CLEAR_MARGIN, FITS
from gguf2ov.errors import Gguf2ovError
from gguf2ov.job import Job, Options
from gguf2ov.runtime.genai import read_prompts
from gguf2ov.runtime.target import TargetIR

LABELS = list(ot.FORMATS)


@pytest.mark.slow
@pytest.mark.parametrize("label", LABELS)
def test_embedding_head_and_taps_are_found_by_structure_in_every_form(optimum_target, label):
    reference, target = TargetIR.open(optimum_target("fp32")), TargetIR.open(optimum_target(label))
    names = {"fp32": "aten::", "fp16": "ov_ext::"}
    if label in names:  # the two spellings optimum writes, which no name lookup here depends on
        assert names[label] in target.embedding.get_friendly_name() + target.head.get_friendly_name() \
            or names[label] in target.head.get_friendly_name()
    assert target.tied and target.vocab_size == 512 and target.hidden_size == 256  # the fixture ties its head
    tokens = reference.tokenize("The wise owl lives in the old oak tree.")
    rows = reference.embed(tokens)
    embedded = target.embed(tokens)
    # the stored table's rows as the runtime decompresses them: exact for fp32, close for the rest
    tolerance = {"fp32": 0, "fp16": 1e-3, "int8": 2e-2, "int4": 2e-2, "int4-all-layers": 0.3}[label]
    assert np.abs(embedded - rows).max() <= tolerance * np.abs(rows).max() + 1e-7
    states, want = target.layer_states(tokens, target.tap_layers), reference.layer_states(tokens, target.tap_layers)
    assert target.tap_layers == [0, 1, 2, 3] and states.shape == want.shape
    assert np.corrcoef(states.ravel(), want.ravel())[0, 1] > (0.999 if label in ("fp32", "fp16") else 0.98)
    logits, want = target.head_logits(states[-1]), reference.head_logits(want[-1])
    assert logits.shape == (len(tokens), 512)
    assert np.mean(logits.argmax(-1) == want.argmax(-1)) > (0.99 if label in ("fp32", "fp16") else 0.8)


@pytest.mark.slow
@pytest.mark.parametrize("label", LABELS)
def test_verify_measures_the_layer_fit_on_every_form(optimum_target, fixture_draft, label, tmp_path):
    report = tmp_path / "verify.json"
    code = cli.main(["verify", str(fixture_draft), "--target", str(optimum_target(label)), "--json", str(report),
                     "--quiet"])
    result = json.loads(report.read_text())
    checks = {c["name"]: c for c in result["checks"]}
    assert code == 0, checks
    assert checks["target-embedding"]["status"] == checks["target-head"]["status"] == "pass"
    assert checks["layer-fit"]["status"] == "pass", checks["layer-fit"]
    assert result["taps"]["verdict"] == FITS and result["taps"]["margin"] >= CLEAR_MARGIN


@pytest.mark.slow
@pytest.mark.parametrize("label", LABELS)
def test_check_and_drift_read_every_form(optimum_target, fixtures_dir, label, tmp_path):
    gguf = str(fixtures_dir / "draft-Q4_K_M.gguf")
    check = tmp_path / "check.json"
    assert cli.main(["check", gguf, "--reference", str(fixtures_dir / "draft-ref"), "--target",
                     str(optimum_target(label)), "--json", str(check), "--quiet"]) == 0
    assert json.loads(check.read_text())["taps"]["verdict"] == FITS
    out = tmp_path / "drift"
    assert cli.main(["drift", gguf, "-o", str(out), "--target", str(optimum_target(label)), "--variants",
                     "fp32,int4_asym_g16", "--quiet"]) == 0
    drift = json.loads((out / "drift.json").read_text())
    assert drift["contexts"] == "target"
    int4 = next(v for v in drift["variants"] if v["name"] == "int4_asym_g16")
    assert int4["verified"] and int4["top1_agreement"] > 0.8


@pytest.mark.slow
@pytest.mark.parametrize("label", [label for label in LABELS if label != "fp32"])  # fp32: the whole run
def test_the_drafts_are_accepted_on_every_form(optimum_target, fixture_draft_as, fixtures_dir, label):
    """What `run` does with a target folder, stage by stage on the job, against the widened fixture
    target as optimum exports it in each format: every draft of the run verifies against the GGUF
    and the target, the tap scan fits, the text with the draft is the target's own, and most of it
    comes from the draft. Whether that pays off in tokens/s is the device's (SLOW when other work
    shares the cores). The whole run on the fp32 export: tests/test_run.py."""
    job = Job.of(fixtures_dir / "draft-Q4_K_M.gguf", optimum_target(label, widened=True),
                 Options(prompts=tuple(read_prompts(fixtures_dir / "prompts.txt")), progress=False))
    drafts = {name: fixture_draft_as(name).out_dir for name in ("fp32", "gguf", "int4_asym_g16")}
    before = work.counts()
    verified = {name: job.verify(draft, tap_scan=name == "gguf") for name, draft in drafts.items()}
    assert all(v.ok for v in verified.values()), {n: v.summary() for n, v in verified.items() if not v.ok}
    scan = verified["gguf"].taps
    assert scan.verdict == FITS and scan.margin >= CLEAR_MARGIN
    # run's order: the GGUF's own grid first; a verdict other than PASS stops the run there
    accepts = [job.accept(drafts["gguf"], verified=verified["gguf"])]
    if accepts[0].verdict == "PASS":
        accepts.append(job.accept(drafts["int4_asym_g16"], verified=verified["int4_asym_g16"]))
    for acc in accepts:
        assert acc.verdict in ("PASS", "SLOW"), acc.summary()
        assert acc.overall.acceptance_rate > 0.5, acc.summary()  # 0.64-0.80 measured
        # identical, or parted only where the CPU plugin quantizes activations on the fly, and identical
        # once rerun with that off (measured on an AMX CPU with the int4 export: 1 of 5 prompts)
        exact = acc.overall.identical_exact and acc.numerics["dynamic_quantization_group_size"]
        assert acc.overall.identical or exact, acc.summary()
    # each piece of work once: the target compiled by gguf2ov for the tap scan, one baseline for every
    # draft, one GenAI compile for it and one per draft (more only for a rerun in exact arithmetic),
    # one verify per draft
    done = {k: v - before.get(k, 0) for k, v in work.counts().items() if v - before.get(k, 0)}
    assert done["target compiles (gguf2ov)"] == 1 and done["target-alone baselines (GenAI)"] == 1, done
    assert done["verify runs"] == 3, done
    rechecked = any(acc.overall.identical_exact is not None for acc in accepts)
    assert done["target compiles (GenAI pipelines)"] == 1 + len(accepts) or rechecked, done


@pytest.mark.slow
def test_an_ambiguous_file_is_settled_on_an_int4_target(optimum_target, fixtures_dir):
    """run's layer-offset stage, on the job: the file cannot tell its layout, and the tap scan on the
    int4 target settles it."""
    job = Job.of(fixtures_dir / "draft-legacy-Q4_K_M.gguf", optimum_target("int4"),
                 Options(prompts=tuple(read_prompts(fixtures_dir / "prompts.txt")), progress=False))
    assert job.ambiguous()  # run measures the offset first (its layer-offset stage)
    decision = job.offset_decision  # a stage that passes: no error
    assert "--target-layer-offset 0" in " ".join(decision.summary())
    assert decision.offset == 0


def headless_target(target, out):
    """A copy of `target` whose lm_head multiplies by a Parameter instead of a stored weight."""
    import shutil

    import openvino as ov
    from openvino import opset13 as ops

    shutil.copytree(target, out)
    model = ov.Core().read_model(str(target / "openvino_model.xml"))
    head = TargetIR.open(target).head
    nodes = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    weight = ops.parameter(head.input_value(1).get_partial_shape(), np.float32, name="head_weight")
    nodes[head.get_friendly_name()].input(1).replace_source_output(weight.output(0))
    model.add_parameters([weight])
    ov.save_model(model, str(out / "openvino_model.xml"))
    return out


@pytest.mark.slow
def test_a_target_without_a_locatable_head_fails_and_says_what_was_looked_for(optimum_target, fixture_draft,
                                                                              fixtures_dir, tmp_path, capsys):
    broken = headless_target(optimum_target("int8"), tmp_path / "headless")
    with pytest.raises(Gguf2ovError, match="looked for the MatMul of a constant weight that makes the logits"):
        TargetIR.open(broken).head
    report = tmp_path / "verify.json"
    assert cli.main(["verify", str(fixture_draft), "--target", str(broken), "--json", str(report), "--quiet"]) == 1
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["target-head"]["status"] == "fail" and "GenAI cannot score" in checks["target-head"]["reason"]
    assert checks["layer-fit"]["status"] == "skip"  # never a PASS with the scan quietly left out
    capsys.readouterr()
    assert cli.main(["drift", str(fixtures_dir / "draft-Q4_K_M.gguf"), "-o", str(tmp_path / "d"), "--target",
                     str(broken), "--variants", "fp32", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: ") and "no lm_head found" in err[0] and not (tmp_path / "d").exists()

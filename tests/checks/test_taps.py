"""The tap scan: which target layers the draft fits, measured on the fixture pair.

The fixture draft was trained on target layers [1, 2]. llama.cpp's current converter stores them + 1
([2, 3], draft-Q4_K_M.gguf), its first DFlash converter unshifted ([1, 2], draft-legacy-Q4_K_M.gguf,
which also carries the old mask-token key). Read with the wrong offset, the draft taps [0, 1].
"""

import json

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from gguf2ov import cli
from gguf2ov.checks.taps import CLEAR_MARGIN, FITS, MISFIT, candidate_sets, scan_taps
from gguf2ov.errors import Gguf2ovError
from gguf2ov.job import Job, Options
from opened import open_draft
from gguf2ov.runtime.genai import read_prompts
from gguf2ov.runtime.target import TargetIR
from gguf2ov.stages.export import export_draft
from gguf2ov.stages.verify import verify_draft


@pytest.fixture(scope="module")
def prompts(fixtures_dir):
    return read_prompts(fixtures_dir / "prompts.txt")


@pytest.fixture(scope="module")
def drafts(fixtures_dir, fixture_draft, tmp_path_factory):
    """The fixture draft exported right ([1, 2]) and the legacy file read with the current offset ([0, 1])."""
    root = tmp_path_factory.mktemp("taps")
    export_draft(open_draft(fixtures_dir / "draft-legacy-Q4_K_M.gguf", target_layer_offset=-1), root / "wrong", progress=False)
    return {"right": fixture_draft, "wrong": root / "wrong"}


def test_the_trained_layers_win_with_a_clear_margin(fixtures_dir, drafts, prompts):
    scan = scan_taps(drafts["right"], TargetIR.open(fixtures_dir / "target"), prompts=prompts)
    assert scan.verdict == FITS and scan.best == "configured" and scan.best_ids == [1, 2]
    assert scan.margin >= CLEAR_MARGIN
    assert [s.label for s in scan.sets] == ["configured", "shift -1", "shift +1"]
    assert scan.skipped == ["shift -2", "shift +2"]  # [-1, 0] and [3, 4] are outside the 4-layer target
    assert scan.blocks == 60 and scan.proposals == 7 and scan.prompts == 5
    conf = scan.set("configured")
    assert all(s.beats_configured < 0.5 for s in scan.sets if s is not conf)
    assert conf.top1 > 0.85


def test_wrong_layers_are_named_with_the_shift_that_fits(fixtures_dir, drafts, prompts):
    scan = scan_taps(drafts["wrong"], TargetIR.open(fixtures_dir / "target"), prompts=prompts)
    assert scan.configured == [0, 1]
    assert scan.verdict == MISFIT and scan.best_ids == [1, 2] and scan.best_shift == 1
    assert scan.lag >= CLEAR_MARGIN


@pytest.mark.slow
def test_genai_accepts_far_less_from_a_draft_one_layer_off(fixtures_dir, drafts, tmp_path, prompts):
    """What the fixture exists to show: a one-layer shift costs accepted tokens in GenAI (the
    fixture draft was trained against shifted taps; see fixtures/make_fixtures.py TAP_SHIFTS),
    while the text stays identical, so only the speed tells."""
    from gguf2ov.stages.accept import run_acceptance

    up = export_draft(open_draft(fixtures_dir / "draft-Q4_K_M.gguf", target_layer_offset=0), tmp_path / "up", progress=False)
    assert up.target_layer_ids == [2, 3]
    accepted = {}
    for label, draft in (("right", drafts["right"]), ("down", drafts["wrong"]), ("up", up.out_dir)):
        result = run_acceptance(TargetIR.open(fixtures_dir / "target"), draft, prompts, progress=False)
        assert result.overall.identical, label
        accepted[label] = result.overall.accepted_tokens
    assert accepted["right"] >= 380
    assert max(accepted["down"], accepted["up"]) <= 0.75 * accepted["right"], accepted


def test_named_sets_are_scored_beside_the_shifts(fixtures_dir, drafts, prompts):
    scan = scan_taps(drafts["right"], TargetIR.open(fixtures_dir / "target"), prompts=prompts[:2], shifts=(), named=[[0, 3]])
    assert [(s.label, s.ids) for s in scan.sets] == [("configured", [1, 2]), ("named 1", [0, 3])]
    with pytest.raises(Gguf2ovError, match="outside the target's layers"):
        candidate_sets([1, 2], range(4), named=[[3, 4]])


def test_one_target_pass_gives_every_tap(fixtures_dir):
    target = TargetIR.open(fixtures_dir / "target")
    tokens = target.tokenize("The wise owl lives in the old oak tree.")
    every = target.layer_states(tokens, target.tap_layers)
    assert target.tap_layers == [0, 1, 2, 3] and every.shape == (4, len(tokens), 256)
    np.testing.assert_allclose(target.hidden_states(tokens, [1, 2]), np.concatenate([every[1], every[2]], -1),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_verify_fails_the_wrong_offset_and_names_the_right_one(fixtures_dir, drafts, prompts):
    wrong = verify_draft(drafts["wrong"], target=TargetIR.open(fixtures_dir / "target"), prompts=prompts)
    fit = wrong.finding("layer-fit")
    assert not wrong.ok and fit.status == "fail"
    assert "made with --target-layer-offset -1, the GGUF fits --target-layer-offset 0" in fit.reason
    assert wrong.taps.best_ids == [1, 2]
    right = verify_draft(drafts["right"], target=TargetIR.open(fixtures_dir / "target"), prompts=prompts)
    assert right.ok and right.finding("layer-fit").status == "pass"
    assert "Target layer tap scan" in [t.title for t in right.tables()]


def test_verify_cli_reports_the_scan(fixtures_dir, drafts, capsys):
    code = cli.main(["verify", str(drafts["wrong"]), "--target", str(fixtures_dir / "target"),
                     "--prompts", str(fixtures_dir / "prompts.txt")])
    out = capsys.readouterr().out
    assert code == 1 and "layer-fit" in out and "Target layer tap scan" in out
    assert "--target-layer-offset 0" in out


# -- the kinds of file whose layout is ambiguous ---------------------------------------------------

def _copy_gguf(src, dst, drop=(), put=None):
    """`src` with metadata keys `drop`ped and `put` ({key: (value, GGUFValueType, item type)}) set."""
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop or name in (put or {}):
            continue
        kind = f.types[0]
        sub = f.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, f.contents(), kind, sub_type=sub)
    for name, (value, kind, sub) in (put or {}).items():
        writer.add_key_value(name, value, kind, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _current_without_mask_key(fixtures_dir, tmp_path):
    """A current-converter file (ids + 1) that lacks tokenizer.ggml.mask_token_id: ambiguous, right offset -1."""
    src = fixtures_dir / "draft-Q4_K_M.gguf"
    mask = GGUFReader(src).fields["tokenizer.ggml.mask_token_id"].contents()
    return _copy_gguf(src, tmp_path / "no-mask-key.gguf", drop=("tokenizer.ggml.mask_token_id",),
                      put={"dflash.mask_token_id": (mask, GGUFValueType.UINT32, None)})


@pytest.mark.slow
@pytest.mark.parametrize("kind, offset, ids", [("first converter", 0, [1, 2]), ("no mask key", -1, [1, 2])])
def test_an_ambiguous_file_resolves_to_the_right_offset(fixtures_dir, tmp_path, prompts, kind, offset, ids):
    path = fixtures_dir / "draft-legacy-Q4_K_M.gguf" if kind == "first converter" else \
        _current_without_mask_key(fixtures_dir, tmp_path)
    with pytest.raises(Gguf2ovError) as refused:
        Job.of(path, None, Options(progress=False)).convert(tmp_path / "refused")
    assert "--target" in refused.value.hint
    result = Job.of(path, fixtures_dir / "target", Options(progress=False, prompts=tuple(prompts) if prompts else None)).convert(tmp_path / "ckpt")
    decision = result.offset_decision
    assert decision.offset == offset and result.target_layer_ids_written == ids
    assert decision.scan.margin >= CLEAR_MARGIN
    assert any("settled by measurement" in line for line in result.summary())
    options = json.loads((tmp_path / "ckpt" / "gguf2ov.json").read_text())["options"]
    assert options["target_layer_offset"] == offset
    assert options["target_layer_offset_measured"]["ids"] == ids
    # the other offset, forced, is what verify --target fails
    draft = export_draft(open_draft(path, target_layer_offset=-1 if offset == 0 else 0), tmp_path / "forced", progress=False)
    verified = verify_draft(draft.out_dir, target=TargetIR.open(fixtures_dir / "target"), prompts=prompts)
    assert verified.finding("layer-fit").status == "fail"
    assert f"fits --target-layer-offset {offset}" in verified.finding("layer-fit").reason


@pytest.mark.slow
def test_a_file_listing_layer_zero_has_one_choice_and_the_scan_checks_it(fixtures_dir, tmp_path, prompts):
    """Layer 0 in the ids rules out the current converter (id + 1 >= 1): offset 0 is the only choice.
    Here the file claims [0, 1] for a draft trained on [1, 2], and the scan refuses the claim."""
    path = _copy_gguf(fixtures_dir / "draft-Q4_K_M.gguf", tmp_path / "zero.gguf", drop=("dflash.target_layers",),
                      put={"dflash.target_layers": ([0, 1], GGUFValueType.ARRAY, GGUFValueType.INT32)})
    with pytest.raises(Gguf2ovError, match="only choice inside the target") as refused:
        Job.of(path, fixtures_dir / "target", Options(prompts=tuple(prompts) if prompts else None, progress=False)).offset_decision
    assert "[1, 2]" in refused.value.message


@pytest.mark.slow
def test_export_settles_the_offset_and_verifies_against_the_target(fixtures_dir, tmp_path, prompts):
    result = Job.of(fixtures_dir / "draft-legacy-Q4_K_M.gguf", fixtures_dir / "target", Options(progress=False, prompts=tuple(prompts) if prompts else None)).export(tmp_path / "ir")
    assert result.target_layer_ids == [1, 2] and result.offset_decision.offset == 0
    assert result.verify.finding("layer-fit").status == "pass"
    options = json.loads((tmp_path / "ir" / "gguf2ov.json").read_text())["options"]
    assert options["target_layer_offset_measured"]["offset"] == 0


@pytest.mark.slow
def test_check_with_a_target_reports_the_layer_fit(fixtures_dir, prompts):

    result = Job.of(fixtures_dir / "draft-legacy-Q4_K_M.gguf", fixtures_dir / "target", Options(progress=False, prompts=tuple(prompts) if prompts else None)).check(fixtures_dir / "draft-ref")
    assert not result.passed
    assert any(d.code == "layer_fit" and "--target-layer-offset 0" in d.message for d in result.diagnoses)
    right = Job.of(fixtures_dir / "draft-Q4_K_M.gguf", fixtures_dir / "target", Options(progress=False, prompts=tuple(prompts) if prompts else None)).check(fixtures_dir / "draft-ref")
    assert right.passed and right.taps.verdict == FITS

"""A draft that brings the target's token embedding and lm_head itself (draft/head.py).

GenAI 2026.4.1 copies the target's table and head into a draft that takes `inputs_embeds` and
returns `last_hidden_state`; a draft that takes `input_ids` and returns `logits` is attached as it
is. What a user would notice: the pair gives the target's text and, with the head as the target
stores it, the same acceptance as GenAI's graft; and the table and head GenAI runs are the draft's own
(a wrong one is not replaced by the target's: its proposals are rejected, the text stays the target's).
"""

import shutil
from pathlib import Path

import numpy as np
import pytest

from gguf2ov.draft.head import (HEAD_NODE, INPUT_IDS, LOGITS, choose_head, decide, own_head, own_pieces, plain_draft)
from gguf2ov.ir.irweights import evaluate
from gguf2ov.job import Job, Options
from gguf2ov.ir.variants import parse_variant
from gguf2ov.runtime.target import TargetIR

VLM = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-vlm"


def _export(fixtures_dir, path, head, target=None, draft="draft-Q4_K_M.gguf"):
    target = target or fixtures_dir / "target"
    job = Job.of(fixtures_dir / draft, target, Options(progress=False, draft_head=head))
    return job.export(path, parse_variant("gguf"))


@pytest.fixture(scope="module")
def drafts(fixtures_dir, tmp_path_factory):
    """The fixture draft as `gguf`, exported plain (auto keeps GenAI's graft on this tiny target), with
    its own head as stored and requantized, and two copies of the stored one from another model, as far
    as GenAI can tell: one whose head scores every token with the next token's row, one whose table is
    noise (a table shifted by a row is not enough: this draft's proposals rest mostly on the target's
    hidden states, and accepted 92 of the stored table's 94)."""
    root = tmp_path_factory.mktemp("draft-heads")
    made = {name: Path(_export(fixtures_dir, root / name, head).out_dir)
            for name, head in (("plain", "auto"), ("stored", "stored"), ("int4", "int4_asym_g32"))}
    for name, piece, change in (("wrong", "head", lambda w: np.roll(w, 1, axis=0)), ("wrong_table", "table", _noise)):
        made[name] = root / name
        made[name].mkdir()
        for file in ("config.json", "gguf2ov.json"):
            shutil.copy(made["stored"] / file, made[name] / file)
        _save_with(made["stored"] / "openvino_model.xml", made[name] / "openvino_model.xml", piece, change)
    return made


def _noise(weight):
    return np.random.default_rng(0).standard_normal(weight.shape).astype(np.float32) * 3 * np.abs(weight).max()


def _save_with(xml, out, piece, change):
    """The draft IR `xml` saved to `out` with its own `piece` (`head`: the head's weight, `table`: the
    embedding table) replaced by `change(weight)` in float32."""
    import openvino as ov
    from openvino import opset13 as ops

    model = ov.Core().read_model(str(xml))
    pieces = own_pieces(model)
    if piece == "head":
        port = pieces.head.input(1)
    else:  # the Gather that reads the table
        port = next(t for t in pieces.table.get_target_inputs() if t.get_node().get_type_name() == "Gather")
    port.replace_source_output(ops.constant(change(evaluate(port.get_source_output()))).output(0))
    ov.save_model(model, str(out), compress_to_fp16=False)


def _model(folder):
    import openvino as ov

    return ov.Core().read_model(str(Path(folder) / "openvino_model.xml"))


def _names(ports) -> set:
    return {n for p in ports for n in p.get_names()}


# --- the IR -----------------------------------------------------------------------------------------


def test_own_head_interface_and_the_draft_inside(drafts):
    """The interface GenAI reads: input_ids in, logits out over the target's vocabulary, no inputs_embeds
    or last_hidden_state left for it to graft onto; taken off again, the draft as exported, computing
    exactly what the plain draft computes."""
    from gguf2ov.runtime.draft_ir import run_draft, synthetic_steps

    plain = _model(drafts["plain"])
    assert own_head(plain) is None and "inputs_embeds" in _names(plain.inputs)
    for name, head in (("stored", "stored"), ("int4", "int4_asym_g32")):
        model = _model(drafts[name])
        assert INPUT_IDS in _names(model.inputs) and "inputs_embeds" not in _names(model.inputs)
        assert _names(model.outputs) == {LOGITS}
        assert model.output(0).get_partial_shape()[2].get_length() == 512  # the fixture target's vocabulary
        assert own_head(model) == {"form": head, "embedding": "stored", "head": head}
        assert any(op.get_friendly_name() == HEAD_NODE for op in model.get_ops())
        inside = plain_draft(model)
        assert _names(inside.inputs) == _names(plain.inputs) and _names(inside.outputs) == {"last_hidden_state"}
    steps = synthetic_steps(256, 512, 8, stateful=True)
    ours = run_draft(drafts["stored"] / "openvino_model.xml", steps).outputs
    theirs = run_draft(drafts["plain"] / "openvino_model.xml", steps).outputs
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_the_heads_weights(drafts, fixtures_dir):
    """As stored, the draft's table and head read exactly the target's values; requantized to int4, the
    head's logits stay close and pick the target's token on nearly every row that points at one."""
    from gguf2ov.draft.head import agreement

    target = TargetIR.open(fixtures_dir / "target")
    stored = agreement(own_pieces(_model(drafts["stored"])), target)
    assert stored["embedding_max_rel_diff"] == 0 and stored["head_max_rel_diff"] == 0
    int4 = agreement(own_pieces(_model(drafts["int4"])), target)
    assert int4["embedding_max_rel_diff"] == 0 and 0 < int4["head_max_rel_diff"] < 0.05
    assert int4["head_top1_agreement"] >= 0.9


def test_verify_reads_an_own_head_and_catches_another_targets(drafts, fixtures_dir):
    """`verify --target` runs every check of the draft inside, says the draft brings its own pieces, and
    fails a head that is not this target's (such a draft attaches without a message and is never accepted)."""
    from gguf2ov.stages.verify import verify_draft

    target = TargetIR.open(fixtures_dir / "target")
    good = verify_draft(drafts["int4"], target=target, tap_scan=False)
    assert good.ok and good.finding("own-head").status == "pass" and good.finding("head-match").status == "pass"
    assert good.finding("block-rows").status == "pass" and good.finding("inputs").status == "pass"
    bad = verify_draft(drafts["wrong"], target=target, tap_scan=False)
    assert not bad.ok and bad.finding("head-match").status == "fail"
    assert "another target" in bad.finding("head-match").reason
    plain = verify_draft(drafts["plain"], target=target, tap_scan=False)
    assert plain.ok and plain.finding("own-head") is None and plain.finding("head-match") is None


def test_a_requantized_head_of_a_narrow_target_passes(tmp_path):
    """On a target whose hidden size is 32 (tiny-hybrid), a token's own head row barely points at it, so
    int4 flips the top-1 token on most of those rows (31% agreement) while its logits stay 3% from the
    target's: the draft was made from this target and must export; a head from another target is ~1.3
    off. (The target is gguf2ov's, from the fixture's GGUF: optimum's export of it fails target-positions.)"""
    from gguf2ov.cli import main
    from gguf2ov.stages.verify import verify_draft

    hybrid = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-hybrid"
    assert main(["target", str(hybrid / "target-Q4_K_M.gguf"), "-o", str(tmp_path / "target"), "--quiet"]) == 0
    target = TargetIR.open(tmp_path / "target")
    out = Path(_export(hybrid, tmp_path / "draft-int4-head", "int4_asym_g32", target=tmp_path / "target").out_dir)
    finding = verify_draft(out, target=target, tap_scan=False).finding("head-match")
    assert finding.status == "pass", finding.reason


def test_auto_weighs_what_the_graft_holds(fixtures_dir):
    """`auto` keeps GenAI's graft where what it copies is small (the fixture target: KiB), and gives a
    draft its own int4 head where the graft would hold hundreds of MiB (an 8B target's figures)."""
    tiny = choose_head(TargetIR.open(fixtures_dir / "target"))
    assert tiny.form == "graft" and tiny.own is None and tiny.added_bytes == 0
    assert "plain draft is kept" in tiny.reason
    # Qwen3-8B: a folded Q4_K table (0.47 GB) and Q6_K head (0.78 GB), 151936 x 4096
    big = decide("auto", 466_747_392, 777_912_320, [151936, 4096])
    assert big.form == "int4_asym_g32" and big.graft_bytes == 466_747_392 + 2 * 777_912_320
    assert big.own_bytes < big.graft_bytes / 5 and big.added_bytes > big.own_bytes
    assert decide("graft", 466_747_392, 777_912_320, [151936, 4096]).form == "graft"
    # a VLM draft keeps GenAI's embedding: only its head is its own
    assert decide("stored", None, 1000, [10, 100]).added_bytes < decide("stored", 1000, 1000, [10, 100]).added_bytes


# --- in GenAI ---------------------------------------------------------------------------------------


def _generate(target, draft, prompts, tokens=40):
    from gguf2ov.runtime.genai import Prompt, generate, generation_config, make_pipeline
    from gguf2ov.numerics import F32_HINT

    pipe = make_pipeline(TargetIR.open(target), "CPU", dict(F32_HINT), draft_dir=draft, num_assistant_tokens=7 if draft else None)
    cfg = generation_config(pipe, tokens, 7 if draft else None)
    return [generate(pipe, Prompt(p), cfg, speculative=draft is not None) for p in prompts]


@pytest.mark.slow
def test_genai_attaches_an_own_head_without_grafting(drafts, fixtures_dir):
    """In LLMPipeline: the draft with its own table and head as stored gives the target's text and accepts
    the same tokens as GenAI's graft of the plain draft; with its head or its table wrong, GenAI still
    runs the draft's own (no graft of the target's replaces either): the proposals are rejected and the
    text stays the target's."""
    target = fixtures_dir / "target"
    prompts = (fixtures_dir / "prompts.txt").read_text().splitlines()[:3]
    alone = [g.text for g in _generate(target, None, prompts)]
    runs = {name: _generate(target, drafts[name], prompts)
            for name in ("plain", "stored", "int4", "wrong", "wrong_table")}
    for name, gens in runs.items():
        assert [g.text for g in gens] == alone, name
    accepted = {name: sum(g.accepted for g in gens) for name, gens in runs.items()}
    assert accepted["stored"] == accepted["plain"] > 60, accepted
    assert [g.emitted_per_step for g in runs["stored"]] == [g.emitted_per_step for g in runs["plain"]]
    assert abs(accepted["int4"] - accepted["plain"]) <= 0.05 * accepted["plain"], accepted
    assert accepted["wrong"] < 0.1 * accepted["plain"], accepted
    assert accepted["wrong_table"] < 0.5 * accepted["plain"], accepted  # measured: 11 of 94


@pytest.mark.slow
def test_vlm_draft_brings_its_head_only(tmp_path):
    """A VLM target's draft keeps inputs_embeds (GenAI embeds its block with the target's text-embeddings
    model and refuses input_ids there) and brings its own head: VLMPipeline gives the target's text and
    the graft's acceptance."""
    made = {head: Path(_export(VLM, tmp_path / head, head, target=VLM / "target").out_dir)
            for head in ("auto", "stored")}
    model = _model(made["stored"])
    assert "inputs_embeds" in _names(model.inputs) and INPUT_IDS not in _names(model.inputs)
    assert _names(model.outputs) == {LOGITS} and own_head(model)["head"] == "stored"
    assert own_head(_model(made["auto"])) is None  # a 512-token head: the graft is kept
    prompts = (VLM / "prompts.txt").read_text().splitlines()[:2]
    alone = [g.text for g in _generate(VLM / "target", None, prompts)]
    runs = {head: _generate(VLM / "target", made[head], prompts) for head in made}
    assert all([g.text for g in gens] == alone for gens in runs.values())
    assert sum(g.accepted for g in runs["stored"]) == sum(g.accepted for g in runs["auto"]) > 20

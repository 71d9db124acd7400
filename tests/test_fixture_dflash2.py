"""The DFlash 2 fixture: a trained DFlash 2 draft for the tiny-dflash target, stored as the HF
checkpoint and as a Q4_K_M GGUF in llama.cpp's layout, whose convolutions carry its acceptance."""

import json
from pathlib import Path

import dflash_builders as b
import pytest

from gguf2ov.job import Job, Options
from gguf2ov.runtime.target import TargetIR
from gguf2ov.ir.variants import variant_from_flags
from gguf2ov.runtime.genai import read_prompts
from gguf2ov.runtime.genai import GenerationSettings
from gguf2ov.stages.accept import run_acceptance

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "tiny-dflash2"


@pytest.fixture(scope="module")
def fix2() -> Path:
    if not FIXTURE.exists():
        pytest.fail(f"fixture missing at {FIXTURE}: run python fixtures/make_fixtures.py --dflash2")
    return FIXTURE


def test_files_config_and_keys(fix2, fixtures_dir):
    from safetensors import safe_open

    from gguf2ov.tools.dflash2_torch import DFlash2ForCausalLM, dflash2_config

    for name in ("prompts.txt", "fixture.json", "draft-Q4_K_M.gguf", "draft-ref/config.json",
                 "draft-ref/model.safetensors"):
        assert (fix2 / name).is_file(), name
    assert (fix2 / "prompts.txt").read_text() == (fixtures_dir / "prompts.txt").read_text()
    info = json.loads((fix2 / "fixture.json").read_text())
    assert (fix2 / info["target"]).resolve() == (fixtures_dir / "target").resolve()

    cfg = json.loads((fix2 / "draft-ref/config.json").read_text())
    v1 = json.loads((fixtures_dir / "draft-ref/config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["is_causal"] is False
    dc = cfg["dflash_config"]
    assert {k: dc[k] for k in ("target_layer_ids", "mask_token_id", "block_size")} == v1["dflash_config"]
    assert dc["conv_kernel_size"] == 2 and dc["conv_group_size"] == 16 and dc["selector_rank"] == 16
    assert dc["selector_top_k"] in (4, 8)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size"):
        assert cfg[key] == v1[key], key

    with safe_open(str(fix2 / "draft-ref/model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    assert keys == set(DFlash2ForCausalLM(dflash2_config(fix2 / "draft-ref")).state_dict())
    assert "candidate_selector.predecessor_codebook" in keys and "layers.1.mlp_conv.base_kernel" in keys


def test_gguf_is_in_llama_cpp_layout(fix2):
    from gguf2ov.gguf.read import open_gguf

    g = open_gguf(fix2 / "draft-Q4_K_M.gguf")
    cfg = json.loads((fix2 / "draft-ref/config.json").read_text())
    dc, hidden, vocab = cfg["dflash_config"], cfg["hidden_size"], cfg["vocab_size"]
    proj_rows = 2 * dc["conv_kernel_size"] * hidden // dc["conv_group_size"]
    assert len(g.tensors) == 15 * cfg["num_hidden_layers"] + 3 + 3
    for n in range(cfg["num_hidden_layers"]):
        for part in ("attn", "ffn"):
            base = g.tensors[f"blk.{n}.{part}_conv_base"]
            assert (base.type_name, base.ne) == ("F32", (hidden, dc["conv_kernel_size"], 2))
            proj = g.tensors[f"blk.{n}.{part}_conv_proj.weight"]
            assert (proj.type_name, proj.ne) == ("Q4_K", (hidden, proj_rows))
    assert g.tensors["selector_hidden.weight"].ne == (hidden, dc["selector_rank"])
    for name in ("selector_predecessor.weight", "selector_successor.weight"):
        assert g.tensors[name].ne == (dc["selector_rank"], vocab)
    m = g.metadata
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "block_size"):
        assert m[f"dflash.{key}"] == dc[key], key
    assert m["dflash.target_layers"] == [i + 1 for i in dc["target_layer_ids"]]
    assert m["tokenizer.ggml.mask_token_id"] == dc["mask_token_id"]
    assert len(m["tokenizer.ggml.tokens"]) == vocab
    assert m["dflash.attention.causal"] is cfg["is_causal"] is False  # as llama.cpp's converter writes it


def test_convert_and_check(fix2, tmp_path, capsys):
    from safetensors import safe_open

    from gguf2ov.cli import main

    gguf = str(fix2 / "draft-Q4_K_M.gguf")
    assert main(["convert", gguf, "-o", str(tmp_path / "hf")]) == 0
    written = json.loads((tmp_path / "hf/config.json").read_text())
    reference = json.loads((fix2 / "draft-ref/config.json").read_text())
    assert written["architectures"] == ["DFlash2DraftModel"] and written["is_causal"] is False
    assert written["dflash_config"] == reference["dflash_config"]
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
        assert {"candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
                "candidate_selector.successor_codebook"} <= set(f.keys())  # the checkpoint keeps the selector
    assert main(["check", gguf, "--reference", str(fix2 / "draft-ref"), "--json", str(tmp_path / "check.json")]) == 0
    checked = {t["name"] for t in json.loads((tmp_path / "check.json").read_text())["tensors"]}
    assert {"layers.0.attention_conv.kernel_projection.weight", "layers.1.mlp_conv.base_kernel",
            "candidate_selector.successor_codebook"} <= checked
    assert main(["check", str(tmp_path / "hf"), "--reference", str(fix2 / "draft-ref")]) == 0
    assert "PASS" in capsys.readouterr().out


def test_recorded_acceptance(fix2, fixtures_dir):
    info = json.loads((fix2 / "fixture.json").read_text())
    v1 = json.loads((fixtures_dir / "fixture.json").read_text())["acceptance"]
    ours, identity = info["acceptance"], info["acceptance_identity_convs"]
    assert ours["identical"] and identity["identical"] and ours["generated"] == v1["generated"]
    assert ours["accepted"] >= v1["accepted"]
    assert identity["accepted"] < ours["accepted"] - 50
    assert info["acceptance_v1_draft"] == v1


@pytest.mark.slow
def test_the_draft_is_accepted_in_genai_and_its_convolutions_matter(fix2, fixtures_dir, tmp_path, v1_accepted):
    """The PyTorch reference traced by optimum, attached in GenAI to the v1 fixture's target; then
    the same weights with identity convolutions. The bar is the v1 draft's acceptance measured here, on
    the same kernels: counts recorded on one CPU differ by a token or two on another."""
    from gguf2ov.tools.dflash2_torch import export_with_optimum, load_dflash2

    model = load_dflash2(fix2 / "draft-ref")
    export_with_optimum(model, tmp_path / "d2")
    full = _accept(fixtures_dir, fix2, tmp_path / "d2").overall
    for conv in model.convs():
        conv.reset_to_identity()
    export_with_optimum(model, tmp_path / "identity")
    identity = _accept(fixtures_dir, fix2, tmp_path / "identity").overall
    assert full.identical and identity.identical
    assert full.accepted_tokens >= v1_accepted, (full.accepted_tokens, v1_accepted)
    assert identity.accepted_tokens < full.accepted_tokens - 50


# --- the exported IR in GenAI ------------------------------------------------------------------------
# GenAI 2026.4.1 runs the draft as the stateful SDPA graph, block rows on dim 1, so the rows' shift
# inside the convolutions is computed as exported; these runs are what would notice if a later
# GenAI flattened the draft for paged attention (the shift would then read zeros: text still
# identical, acceptance lower, different steps).

MAX_NEW_TOKENS, K = 100, 7


def _accept(fixtures_dir, prompts_dir, draft_dir):
    return run_acceptance(TargetIR.open(fixtures_dir / "target"), draft_dir, read_prompts(prompts_dir / "prompts.txt"), GenerationSettings(max_new_tokens=MAX_NEW_TOKENS, num_assistant_tokens=K, precision="f32"), progress=False)


@pytest.fixture(scope="module")
def v1_accepted(fixtures_dir, fix2, fixture_draft):
    """The v1 fixture draft's acceptance on the same target and prompts: the bar DFlash 2 must reach."""
    r = _accept(fixtures_dir, fix2, fixture_draft)
    assert r.overall.identical
    return r.overall.accepted_tokens


@pytest.mark.slow
@pytest.mark.parametrize("weight_format,options", [("fp32", {}), ("gguf", {}), ("int4", {"group_size": 16})])
def test_every_export_is_accepted_at_least_as_the_v1_draft(fixtures_dir, fix2, v1_accepted, tmp_path,
                                                           weight_format, options):
    out = tmp_path / "draft"
    result = Job.of(fix2 / "draft-Q4_K_M.gguf", None, Options(progress=False)).export(
        out, variant_from_flags(weight_format, **options))
    assert result.dflash_version == 2 and result.verify.ok
    r = _accept(fixtures_dir, fix2, out)
    o = r.overall
    assert o.identical, [p.first_difference for p in r.prompts]
    assert o.accepted_tokens >= v1_accepted, (o.accepted_tokens, v1_accepted, r.summary())


@pytest.mark.slow
def test_identity_convolutions_are_accepted_clearly_less_and_verify_flags_them(fixtures_dir, fix2,
                                                                               tmp_path):
    from gguf2ov.stages.verify import verify_draft

    runs = {}
    for mode in ("real", "identity", "no-shift"):
        ckpt = fix2 / "draft-ref" if mode == "real" else \
            b.edit_convolutions(fix2 / "draft-ref", tmp_path / mode / "ckpt", mode)
        Job.of(ckpt, None, Options(progress=False)).export(tmp_path / mode / "draft")
        runs[mode] = _accept(fixtures_dir, fix2, tmp_path / mode / "draft")
        assert runs[mode].overall.identical
    real, identity, no_shift = (runs[m].overall for m in ("real", "identity", "no-shift"))
    assert identity.accepted_tokens < 0.85 * real.accepted_tokens, (identity.accepted_tokens, real.accepted_tokens)
    # the shifted tap is live in GenAI: without it the draft proposes, and is accepted, differently
    assert no_shift.accepted_tokens < real.accepted_tokens
    assert [p.accepted_tokens for p in runs["no-shift"].prompts] != [p.accepted_tokens for p in runs["real"].prompts]
    # the identity IR runs and attaches without a word; given the real checkpoint, verify says it is wrong
    from opened import open_draft

    checked = verify_draft(tmp_path / "identity" / "draft", reference=open_draft(fix2 / "draft-ref"))
    assert not checked.ok and checked.finding("checkpoint-match").status == "fail"


@pytest.mark.slow
def test_drift_measures_the_selector_against_the_top1_path(fixtures_dir, fix2, tmp_path):

    prompts = read_prompts(fix2 / "prompts.txt")
    result = Job.of(fix2 / "draft-Q4_K_M.gguf", fixtures_dir / "target", Options(prompts=tuple(prompts) if prompts else None, progress=False)).drift(tmp_path / "drift", variants=["fp32"])
    s = result.selector
    assert s is not None and s.blocks >= len(prompts) and s.proposals == 7
    assert 0 < s.top1_accepted <= s.proposals and 0 <= s.selector_accepted <= s.proposals
    assert any(t.title == "DFlash 2 selector, offline" for t in result.tables())
    # a selector whose pairwise term is zero walks the top-1 path exactly
    from safetensors.torch import load_file, save_file

    zeroed = tmp_path / "zeroed"
    zeroed.mkdir()
    state = load_file(str(fix2 / "draft-ref" / "model.safetensors"))
    state["candidate_selector.successor_codebook"] = state["candidate_selector.successor_codebook"] * 0
    save_file(state, str(zeroed / "model.safetensors"))
    (zeroed / "config.json").write_text((fix2 / "draft-ref" / "config.json").read_text())
    flat = Job.of(zeroed, fixtures_dir / "target", Options(prompts=tuple(prompts) if prompts else None, progress=False)).drift(tmp_path / "drift-zeroed", variants=["fp32"]).selector
    assert flat.selector_accepted == flat.top1_accepted
    assert flat.selector_by_position == flat.top1_by_position


def test_verifys_numpy_reference_is_the_pytorch_reference(fix2):
    """checkpoint-match runs the draft layer by layer in NumPy (bounded memory at 1-3 B); on the
    fixture it computes what the PyTorch reference computes, over two stateful calls."""
    import numpy as np
    import torch

    from gguf2ov.draft.reference import reference_outputs
    from opened import open_draft
    from gguf2ov.runtime.draft_ir import synthetic_steps
    from gguf2ov.tools.dflash2_torch import load_dflash2

    draft = open_draft(fix2 / "draft-ref")
    model = load_dflash2(fix2 / "draft-ref").eval()
    steps = synthetic_steps(draft.config.hidden_size, 2 * draft.config.hidden_size, 8, stateful=True)
    ours = reference_outputs(draft, steps)
    cache = None
    with torch.no_grad():
        for feeds, mine in zip(steps, ours):
            out = model(inputs_embeds=torch.from_numpy(feeds["inputs_embeds"]),
                        hidden_states=torch.from_numpy(feeds["hidden_states"]),
                        position_ids=torch.from_numpy(feeds["position_ids"]),
                        attention_mask=torch.from_numpy(feeds["attention_mask"]),
                        past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            np.testing.assert_allclose(mine, out.last_hidden_state.numpy(), atol=2e-5)

"""The DFlash 2 fixture (fixtures/tiny-dflash2, trained against tiny-dflash's target) end to end:
its GGUF in llama.cpp's layout, convert and check, the export in GenAI, and what the
convolutions and the selector are worth there.

GenAI 2026.4.1 runs the draft as the stateful SDPA graph, block rows on dim 1, so the rows'
shift inside the convolutions is computed as exported; these runs are what would notice if a
later GenAI flattened the draft for paged attention (the shift would then read zeros: text
still identical, acceptance lower, different steps).
"""

import json

import pytest

import dflash_builders as b
from gguf2ov.accept import read_prompts, run_acceptance
from gguf2ov.export import export_draft

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS, K = 100, 7


@pytest.fixture(scope="module")
def dflash2_dir(fixtures_dir):
    path = fixtures_dir.parent / "tiny-dflash2"
    if not path.exists():
        pytest.fail(f"fixtures missing at {path}: run python fixtures/make_fixtures.py --dflash2")
    return path


def _accept(fixtures_dir, prompts_dir, draft_dir):
    return run_acceptance(fixtures_dir / "target", draft_dir, read_prompts(prompts_dir / "prompts.txt"),
                          max_new_tokens=MAX_NEW_TOKENS, num_assistant_tokens=K, precision="f32", progress=False)


@pytest.fixture(scope="module")
def v1_accepted(fixtures_dir, dflash2_dir, tmp_path_factory):
    """The v1 fixture draft's acceptance on the same target and prompts: the bar DFlash 2 must reach."""
    out = tmp_path_factory.mktemp("v1") / "draft"
    export_draft(fixtures_dir / "draft-Q4_K_M.gguf", out, progress=False)
    r = _accept(fixtures_dir, dflash2_dir, out)
    assert r.overall.identical
    return r.overall.accepted_tokens


def test_the_gguf_is_in_llama_cpps_dflash2_layout(dflash2_dir):
    from gguf2ov.read import open_gguf

    gguf = open_gguf(dflash2_dir / "draft-Q4_K_M.gguf")
    config = json.loads((dflash2_dir / "draft-ref" / "config.json").read_text())
    d = config["dflash_config"]
    layers = config["num_hidden_layers"]
    for i in range(layers):
        for part in ("attn", "ffn"):
            base = gguf.tensors[f"blk.{i}.{part}_conv_base"]  # no .weight suffix
            assert base.qtype.name == "F32" and base.ne == (config["hidden_size"], d["conv_kernel_size"], 2)
            assert gguf.tensors[f"blk.{i}.{part}_conv_proj.weight"].qtype.name in ("Q4_K", "Q6_K")
    assert {"selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight"} <= set(gguf.tensors)
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        assert gguf.metadata[f"dflash.{key}"] == d[key]
    assert list(gguf.metadata["dflash.target_layers"]) == [i + 1 for i in d["target_layer_ids"]]


def test_check_against_the_reference_includes_the_dflash2_tensors(dflash2_dir):
    from gguf2ov.check import check

    result = check(dflash2_dir / "draft-Q4_K_M.gguf", dflash2_dir / "draft-ref", progress=False)
    assert result.passed, result.summary()
    names = {t.name for t in result.tensors}
    assert "layers.0.attention_conv.kernel_projection.weight" in names
    assert "layers.1.mlp_conv.base_kernel" in names
    assert "candidate_selector.successor_codebook" in names


def test_convert_keeps_the_selector_and_names_the_dflash2_class(dflash2_dir, tmp_path):
    from safetensors import safe_open

    from gguf2ov.convert import convert

    convert(dflash2_dir / "draft-Q4_K_M.gguf", tmp_path / "ckpt", progress=False)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    assert {"candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
            "candidate_selector.successor_codebook"} <= keys


@pytest.mark.parametrize("weight_format,options", [("fp32", {}), ("gguf", {}), ("int4", {"group_size": 16})])
def test_every_export_is_accepted_at_least_as_the_v1_draft(fixtures_dir, dflash2_dir, v1_accepted, tmp_path,
                                                           weight_format, options):
    out = tmp_path / "draft"
    result = export_draft(dflash2_dir / "draft-Q4_K_M.gguf", out, weight_format=weight_format, progress=False, **options)
    assert result.dflash_version == 2 and result.verify.ok
    r = _accept(fixtures_dir, dflash2_dir, out)
    o = r.overall
    assert o.identical, [p.first_difference for p in r.prompts]
    assert o.accepted_tokens >= v1_accepted, (o.accepted_tokens, v1_accepted, r.summary())


def test_identity_convolutions_are_accepted_clearly_less_and_verify_flags_them(fixtures_dir, dflash2_dir,
                                                                               tmp_path):
    from gguf2ov.verify import verify_draft

    runs = {}
    for mode in ("real", "identity", "no-shift"):
        ckpt = dflash2_dir / "draft-ref" if mode == "real" else \
            b.edit_convolutions(dflash2_dir / "draft-ref", tmp_path / mode / "ckpt", mode)
        export_draft(ckpt, tmp_path / mode / "draft", progress=False)
        runs[mode] = _accept(fixtures_dir, dflash2_dir, tmp_path / mode / "draft")
        assert runs[mode].overall.identical
    real, identity, no_shift = (runs[m].overall for m in ("real", "identity", "no-shift"))
    assert identity.accepted_tokens < 0.85 * real.accepted_tokens, (identity.accepted_tokens, real.accepted_tokens)
    # the shifted tap is live in GenAI: without it the draft proposes, and is accepted, differently
    assert no_shift.accepted_tokens < real.accepted_tokens
    assert [p.accepted_tokens for p in runs["no-shift"].prompts] != [p.accepted_tokens for p in runs["real"].prompts]
    # the identity IR runs and attaches without a word; given the real checkpoint, verify says it is wrong
    checked = verify_draft(tmp_path / "identity" / "draft", checkpoint_dir=dflash2_dir / "draft-ref")
    assert not checked.ok and checked.check("checkpoint-match").status == "fail"


def test_drift_measures_the_selector_against_the_top1_path(fixtures_dir, dflash2_dir, tmp_path):
    from gguf2ov.drift import drift

    prompts = read_prompts(dflash2_dir / "prompts.txt")
    result = drift(dflash2_dir / "draft-Q4_K_M.gguf", tmp_path / "drift", variants=["fp32"],
                   target_dir=fixtures_dir / "target", prompts=prompts, progress=False)
    s = result.selector
    assert s is not None and s.blocks >= len(prompts) and s.proposals == 7
    assert 0 < s.top1_accepted <= s.proposals and 0 <= s.selector_accepted <= s.proposals
    assert any(t.title == "DFlash 2 selector, offline" for t in result.tables())
    # a selector whose pairwise term is zero walks the top-1 path exactly
    from safetensors.torch import load_file, save_file

    zeroed = tmp_path / "zeroed"
    zeroed.mkdir()
    state = load_file(str(dflash2_dir / "draft-ref" / "model.safetensors"))
    state["candidate_selector.successor_codebook"] = state["candidate_selector.successor_codebook"] * 0
    save_file(state, str(zeroed / "model.safetensors"))
    (zeroed / "config.json").write_text((dflash2_dir / "draft-ref" / "config.json").read_text())
    flat = drift(zeroed, tmp_path / "drift-zeroed", variants=["fp32"], target_dir=fixtures_dir / "target",
                 prompts=prompts, progress=False).selector
    assert flat.selector_accepted == flat.top1_accepted
    assert flat.selector_by_position == flat.top1_by_position

"""fixtures/tiny-gptoss: a trained gpt-oss target (sinks, sliding and full layers, MXFP4 experts in
llama.cpp's own file) with its DFlash draft, built by fixtures/make_gptoss_fixture.py.

The fast tests check what the fixture is: the checkpoint's config and trained sinks, the GGUFs as
gguf-py reads them (the experts MXFP4), and the figures the builder recorded (GenAI greedy text on
gguf2ov's target of the file with and without the draft, acceptance, llama.cpp's greedy text, expert
use). The slow test runs what a user runs: `gguf2ov run draft-Q4_K_M.gguf --target
target-MXFP4_MOE.gguf` with its defaults, as tests/test_target_fixtures.py does for tiny-moe.
"""

import json

import numpy as np
import pytest
from dflash_builders import draft_model
from test_target_fixtures import DEFAULT_PROMPTS_ACCEPTANCE, FIXTURES_ROOT, MIN_ACCEPTANCE, _dir, _field, _greedy
from test_target_fixtures import _assert_files_as_built, _json, _run, _size

NAME = "tiny-gptoss"
TARGET_GGUF = "target-MXFP4_MOE.gguf"
MAX_BYTES = 1_000_000
NEED = ["prompts.txt", "fixture.json", "draft-Q4_K_M.gguf", TARGET_GGUF, "draft-ref/config.json",
        "draft-ref/model.safetensors", "target-hf/config.json", "target-hf/model.safetensors",
        "target-hf/tokenizer.json"]


def _counts(reader) -> dict:
    counts = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def test_files_budget_tokenizer_and_prompts():
    d = _dir(NAME)
    missing = [n for n in NEED if not (d / n).is_file()]
    assert not missing, f"fixture files missing: {missing}"
    assert _size(d) <= MAX_BYTES, _size(d)
    source = FIXTURES_ROOT / "tiny-dflash"
    assert (d / "prompts.txt").read_text() == (source / "prompts.txt").read_text()
    assert (d / "target-hf/tokenizer.json").read_bytes() == (source / "target-hf/tokenizer.json").read_bytes()
    _assert_files_as_built(NAME)


def test_config_has_both_window_kinds_a_window_shorter_than_the_prompts_and_trained_sinks():
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    d = _dir(NAME)
    cfg = _json(NAME, "target-hf/config.json")
    assert cfg["model_type"] == "gpt_oss" and cfg["architectures"] == ["GptOssForCausalLM"]
    assert set(cfg["layer_types"]) == {"sliding_attention", "full_attention"}
    assert cfg["rope_parameters"]["rope_type"] == "yarn"
    tok = AutoTokenizer.from_pretrained(d / "target-hf")
    shortest = min(len(tok(p, add_special_tokens=False).input_ids)
                   for p in (d / "prompts.txt").read_text().splitlines())
    assert cfg["sliding_window"] < shortest, (cfg["sliding_window"], shortest)
    weights = load_file(str(d / "target-hf/model.safetensors"))
    for i in range(cfg["num_hidden_layers"]):  # initialised at zero: trained, they are not
        sinks = weights[f"model.layers.{i}.self_attn.sinks"].float().numpy()
        assert sinks.shape == (cfg["num_attention_heads"],) and np.abs(sinks).min() > 0, (i, sinks)


def test_draft_matches_its_target():
    from safetensors import safe_open

    d = _dir(NAME)
    cfg, target = _json(NAME, "draft-ref/config.json"), _json(NAME, "target-hf/config.json")
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["hidden_size"] == target["hidden_size"] and cfg["vocab_size"] == target["vocab_size"]
    dc = cfg["dflash_config"]
    assert cfg["num_target_layers"] == target["num_hidden_layers"]
    # taps on both window kinds
    assert {target["layer_types"][i] for i in dc["target_layer_ids"]} == {"sliding_attention", "full_attention"}
    tok = json.loads((d / "target-hf/tokenizer.json").read_text())
    assert {t["content"]: t["id"] for t in tok["added_tokens"]}["<|mask|>"] == dc["mask_token_id"]
    with safe_open(str(d / "draft-ref/model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    assert keys == set(draft_model(cfg).state_dict())


def test_ggufs_read_with_gguf_py():
    """llama.cpp's file of the target: arch gpt-oss, the experts MXFP4 (llama-quantize MXFP4_MOE), the
    sinks and the router F32 as the checkpoint has them, the window in the metadata."""
    from gguf import GGUFReader
    from safetensors.torch import load_file

    d = _dir(NAME)
    cfg, dcfg = _json(NAME, "target-hf/config.json"), _json(NAME, "draft-ref/config.json")
    draft = GGUFReader(d / "draft-Q4_K_M.gguf")
    assert _field(draft, "general.architecture") == "dflash"
    assert _field(draft, "dflash.target_layers") == [i + 1 for i in dcfg["dflash_config"]["target_layer_ids"]]

    r = GGUFReader(d / TARGET_GGUF)
    arch = "gpt-oss"
    assert _field(r, "general.architecture") == arch and _field(r, "tokenizer.ggml.pre") == "gpt-2"
    assert _field(r, f"{arch}.block_count") == cfg["num_hidden_layers"]
    assert _field(r, f"{arch}.attention.sliding_window") == cfg["sliding_window"]
    assert _field(r, f"{arch}.expert_count") == cfg["num_local_experts"]
    assert _counts(r) == _json(NAME, "fixture.json")["target_gguf"]["types_MXFP4_MOE"]
    tensors = {t.name: t for t in r.tensors}
    for i in range(cfg["num_hidden_layers"]):
        for kind in ("gate", "up", "down"):
            assert tensors[f"blk.{i}.ffn_{kind}_exps.weight"].tensor_type.name == "MXFP4", (i, kind)
    hf = load_file(str(d / "target-hf/model.safetensors"))
    sinks = tensors["blk.0.attn_sinks.weight"]
    assert sinks.tensor_type.name == "F32"
    np.testing.assert_array_equal(np.asarray(sinks.data), hf["model.layers.0.self_attn.sinks"].float().numpy())
    router = tensors["blk.0.ffn_gate_inp.weight"]
    assert router.tensor_type.name == "F32"


def test_recorded_figures():
    """The builder's closing check ran GenAI on gguf2ov's target of the MXFP4 file: with either draft
    attached the text is the target's alone and most tokens come from the draft; a random draft of
    the same config gets almost nothing accepted. llama.cpp read the prompts as the tokenizer does,
    and its F32 file gave transformers' text; the trained router uses every expert."""
    info = _json(NAME, "fixture.json")
    acc = info["acceptance"]
    assert info["closing_check_target"] == f"gguf2ov target {TARGET_GGUF}"
    assert info["target_ir"]["export"] is None and "no hidden_states_decoder_layers" in info["target_ir"]["why"]
    for draft in ("draft-ref", "draft-Q4_K_M.gguf"):
        r = acc[draft]
        assert r["identical"] and r["accepted"] >= MIN_ACCEPTANCE * r["generated"], (draft, r)
    assert acc["random"]["identical"] and acc["random"]["accepted"] < 0.05 * acc["random"]["generated"]
    greedy = info["greedy_llamacpp_vs_transformers"]
    for gguf in ("target-F32.gguf", TARGET_GGUF):
        assert all(greedy["prompt_ids_equal"][gguf])
    assert sum(greedy["target-F32.gguf"]["equal_to_transformers"]) > len(greedy["transformers"]) / 2, greedy
    use = info["expert_use"]["per_layer"]
    assert len(use) == _json(NAME, "target-hf/config.json")["num_hidden_layers"]
    assert all(layer["min_share"] > 0 for layer in use.values()), use


@pytest.mark.slow
def test_run_builds_the_lean_form_of_the_target_and_says_what_it_trades(tmp_path):
    """`run --target target-MXFP4_MOE.gguf --target-format int4`: the lean form (NNCF int4, its experts u4 codes
    on GatherMatmul at the groups the 32-wide fixture takes) built into OUT/target, the draft's tokens accepted
    with the target's own text, and one line of the output saying what the form trades against the file's grid.
    Before, group 128 made the target stage fail ("group size 128 does not divide the input width")."""
    d = _dir(NAME)
    out = tmp_path / "run"
    report = _run(out, d / "draft-Q4_K_M.gguf", "--target", d / TARGET_GGUF, "--target-format", "int4",
                  "--variants", "int8", "--max-new-tokens", "40", min_acceptance=0.3)
    stages = {s["name"]: s for s in report["stages"]}
    assert "as int4_asym_g128 into target/" in stages["target"]["reason"] and stages["target"]["status"] == "pass"
    assert json.loads((out / "target" / "gguf2ov.json").read_text())["options"]["nncf_groups"] == {"32": 24, "64": 8}
    compiled = {c["name"]: c for c in report["results"]["target"]["checks"]}["target-compiled"]
    assert compiled["status"] == "pass" and "(fused weights: 8 u4)" in compiled["reason"], compiled
    assert "- target: int4_asym_g128: NNCF's int4, the lean form at group 128: about 5 bits a weight at run time" \
        in (out / "report.md").read_text()


@pytest.mark.slow
def test_run_with_its_defaults_builds_the_target_from_llama_cpps_mxfp4_file_and_passes(tmp_path):
    """`gguf2ov run draft-Q4_K_M.gguf --target target-MXFP4_MOE.gguf` and nothing else: the target built
    from llama.cpp's file on its own grid (MXFP4 experts) generates llama-simple's greedy text (recorded
    by the builder) on most prompts, and the draft attached to it gives the same text with its tokens
    accepted; the report names the number of proposals that pays best on this device."""
    d = _dir(NAME)
    out = tmp_path / "run"
    report = _run(out, d / "draft-Q4_K_M.gguf", "--target", d / TARGET_GGUF, min_acceptance=DEFAULT_PROMPTS_ACCEPTANCE)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["target"]["status"] == "pass"
    accepts = {stage: r for stage, r in report["results"].items() if stage.startswith("accept:")}
    assert "accept:gguf" in accepts
    for stage, r in accepts.items():  # most proposals accepted (62.5% and 59.2% measured)
        assert r["identical"] and r["accepted_tokens"] > 0.5 * r["draft_candidates"], (stage, r["reasons"])
    llama = _json(NAME, "fixture.json")["greedy_llamacpp_vs_transformers"]
    prompts = (d / "prompts.txt").read_text().splitlines()
    ours = _greedy(out / "target", prompts, llama["new_tokens"])
    same = [a == b for a, b in zip(ours, llama[TARGET_GGUF]["texts"])]
    assert sum(same) > len(prompts) / 2, (same, ours)

"""fixtures/tiny-vlm: a tiny gemma4 VLM target for OpenVINO GenAI's VLMPipeline and its trained DFlash draft.

The fast test checks the files, the DFlash contract between draft and target (text width, layer
ids of one layer type, mask token, hidden-state locators on the language model) and the size
budget. The slow test runs the closing check of fixtures/make_vlm_fixture.py on the text prompts:
VLMPipeline greedy (gguf2ov.stages.accept.run_acceptance), target alone vs target + the reference draft
exported by gguf2ov.
"""

import json
import sys
from pathlib import Path

import pytest
from dflash_builders import draft_model

from opened import open_draft

REPO = Path(__file__).resolve().parents[1]
FIXTURES_ROOT = REPO / "fixtures"
VLM_DIR = FIXTURES_ROOT / "tiny-vlm"
MAX_VLM_BYTES = 8 * 10**6
MIN_TEXT_ACCEPTANCE = 0.5  # accepted / generated on the text prompts


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def vlm_dir() -> Path:
    if not VLM_DIR.exists():
        pytest.fail(f"fixtures missing at {VLM_DIR}: run python fixtures/make_fixtures.py --vlm")
    return VLM_DIR


@pytest.fixture(scope="module")
def vlm_builder():
    """fixtures/make_vlm_fixture.py, whose summary of an acceptance run the slow test reuses."""
    if str(FIXTURES_ROOT) not in sys.path:
        sys.path.insert(0, str(FIXTURES_ROOT))
    import make_vlm_fixture

    return make_vlm_fixture


def test_vlm_fixture_files_and_budget(vlm_dir):
    import openvino as ov
    from gguf import GGUFReader
    from PIL import Image
    from safetensors import safe_open

    need = [
        "prompts.txt", "image.png", "fixture.json", "draft-Q4_K_M.gguf",
        "draft-ref/config.json", "draft-ref/model.safetensors",
        "target/config.json", "target/preprocessor_config.json",
        "target/openvino_language_model.xml", "target/openvino_language_model.bin",
        "target/openvino_text_embeddings_model.xml", "target/openvino_text_embeddings_model.bin",
        "target/openvino_vision_embeddings_model.xml", "target/openvino_vision_embeddings_model.bin",
        "target/openvino_tokenizer.xml", "target/openvino_detokenizer.xml",
        "target-hf/config.json", "target-hf/model.safetensors", "target-hf/tokenizer.json",
        "target-hf/preprocessor_config.json",
    ]
    missing = [n for n in need if not (vlm_dir / n).is_file()]
    assert not missing, f"fixture files missing: {missing}"
    assert _size(vlm_dir) <= MAX_VLM_BYTES, _size(vlm_dir)

    prompts = [p for p in (vlm_dir / "prompts.txt").read_text().splitlines() if p.strip()]
    assert 3 <= len(prompts) <= 8
    assert (vlm_dir / "image.png").stat().st_size < 8 * 1024
    with Image.open(vlm_dir / "image.png") as img:
        assert img.format == "PNG" and img.mode == "RGB"

    # target: a gemma4 VLM whose language model carries the hidden-state locators GenAI reads
    cfg = json.loads((vlm_dir / "target/config.json").read_text())
    assert cfg["model_type"] == "gemma4"
    text = cfg["text_config"]
    assert 64 <= text["hidden_size"] <= 128 and text["num_hidden_layers"] == 4
    assert cfg["vision_config"]["num_hidden_layers"] == 1
    lm = ov.Core().read_model(vlm_dir / "target/openvino_language_model.xml")
    assert lm.has_rt_info("hidden_states_decoder_layers")
    layers = json.loads(lm.get_rt_info("hidden_states_decoder_layers").astype(str))["layers"]
    assert sorted(map(int, layers)) == list(range(text["num_hidden_layers"]))
    assert {i.get_any_name() for i in lm.inputs} >= {"inputs_embeds", "attention_mask", "position_ids", "beam_idx"}

    # draft: Qwen3 DFlash v1 of the target's text width, taps of one layer type
    dcfg = json.loads((vlm_dir / "draft-ref/config.json").read_text())
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["model_type"] == "qwen3"
    assert dcfg["hidden_size"] == text["hidden_size"]
    assert dcfg["vocab_size"] == text["vocab_size"]
    ids = dcfg["dflash_config"]["target_layer_ids"]
    assert all(0 <= i < text["num_hidden_layers"] - 1 for i in ids)
    assert len({text["layer_types"][i] for i in ids}) == 1, [text["layer_types"][i] for i in ids]
    tok = json.loads((vlm_dir / "target-hf/tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert added["<|mask|>"] == dcfg["dflash_config"]["mask_token_id"]
    assert {"<|image>", "<|image|>", "<image|>"} <= set(added)
    assert added["<|image|>"] == cfg["image_token_id"]

    with safe_open(str(vlm_dir / "draft-ref/model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    assert keys == set(draft_model(dcfg).state_dict())

    reader = GGUFReader(vlm_dir / "draft-Q4_K_M.gguf")
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "dflash"
    assert "Q4_K" in {t.tensor_type.name for t in reader.tensors}

    # what the closing check recorded when the fixture was built
    acc = json.loads((vlm_dir / "fixture.json").read_text())["acceptance"]
    assert acc["settings"]["pipeline"] == "VLMPipeline"
    for name in ("draft-ref", "draft-Q4_K_M.gguf"):
        t, i = acc[name]["text_prompts"], acc[name]["image_prompt"]
        assert t["identical"] and i["identical"]
        assert t["accepted"] >= MIN_TEXT_ACCEPTANCE * t["generated"], (name, t)
    r = acc["random"]["text_prompts"]
    assert r["identical"] and r["accepted"] < 0.05 * r["generated"]


@pytest.mark.slow
def test_vlm_reference_draft_is_accepted_on_text_prompts(vlm_dir, vlm_builder, tmp_path):
    from gguf2ov.runtime.genai import GenerationSettings
    from gguf2ov.stages.accept import run_acceptance
    from gguf2ov.runtime.target import TargetIR
    from gguf2ov.stages.export import export_draft

    export_draft(open_draft(vlm_dir / "draft-ref"), tmp_path / "draft", progress=False)
    prompts = [p for p in (vlm_dir / "prompts.txt").read_text().splitlines() if p.strip()]
    r = run_acceptance(TargetIR.open(vlm_dir / "target"), tmp_path / "draft", prompts, GenerationSettings(max_new_tokens=vlm_builder.MAX_NEW_TOKENS, num_assistant_tokens=vlm_builder.K, precision="f32"), progress=False)
    assert r.pipeline == "VLMPipeline"
    s = vlm_builder.summarize(r, "text")
    assert s["identical"], [(p.text_target, p.text_draft) for p in r.prompts if not p.identical]
    assert s["generated"] == vlm_builder.MAX_NEW_TOKENS * len(prompts)
    assert s["accepted"] >= MIN_TEXT_ACCEPTANCE * s["generated"], s
    assert s["target_steps"] > 0 and s["drafted"] > 0
    assert len(s["accepted_per_prompt"]) == len(prompts)

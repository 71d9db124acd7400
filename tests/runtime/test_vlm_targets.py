"""VLM targets (fixtures/tiny-vlm, a gemma4 VLM exported with optimum-intel's image-text-to-text
task) through gguf2ov's stages: the target's taps and embeddings as GenAI feeds them, verify's
target checks, acceptance in VLMPipeline with text and image prompts (the whole run on a VLM target:
tests/test_run.py)."""

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import dflash_builders as b
import numpy as np
import pytest

from opened import open_draft
from gguf2ov.job import Job, Options
from gguf2ov.runtime.genai import read_prompts
from gguf2ov.runtime.target import TargetIR
from gguf2ov.runtime.genai import GenerationSettings
from gguf2ov.stages.accept import run_acceptance
from gguf2ov.stages.verify import verify_draft

VLM = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-vlm"


@pytest.fixture(scope="module")
def vlm(fixtures_dir) -> Path:
    if not VLM.exists():
        pytest.fail(f"fixtures missing at {VLM}: run python fixtures/make_fixtures.py --vlm")
    return VLM


@pytest.fixture(scope="module")
def draft(vlm, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vlm") / "draft"
    Job.of(vlm / "draft-Q4_K_M.gguf", None, Options(progress=False)).export(out)
    return out


def _prompts(vlm):
    return read_prompts(vlm / "prompts.txt", images=[vlm / "image.png"])


def test_the_targets_taps_and_embeddings_are_the_hf_models(vlm):
    """The language model takes embeddings: Target embeds with the text-embeddings model (Gemma's
    sqrt(hidden) scale included) and feeds its per-layer inputs, so its taps equal HF's hidden states."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    target = TargetIR.open(vlm / "target")
    assert target.kind == "vlm" and target.config["num_hidden_layers"] == 4
    ids = json.loads((vlm / "draft-ref" / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    tokens = target.tokenize("The red fox lives in the forest.")
    taps = target.hidden_states(tokens, ids)
    model = Gemma4ForConditionalGeneration.from_pretrained(vlm / "target-hf", dtype=torch.float32).eval()
    with torch.no_grad():
        hf = model(input_ids=torch.from_numpy(tokens)[None], output_hidden_states=True).hidden_states
    expected = torch.cat([hf[i + 1][0] for i in ids], dim=-1).numpy()
    # the target IR's weights are int8: the taps agree with HF's to the compression's error
    assert np.corrcoef(taps.ravel(), expected.ravel())[0, 1] > 0.99
    embed = model.model.language_model.embed_tokens(torch.from_numpy(tokens)).detach().numpy()
    assert np.corrcoef(target.embed(tokens).ravel(), embed.ravel())[0, 1] > 0.999
    assert abs(np.linalg.norm(target.embed(tokens)) / np.linalg.norm(embed) - 1) < 0.02  # the scale is there


def test_verify_reads_the_language_model_and_text_config(vlm, draft):
    result = verify_draft(draft, target=TargetIR.open(vlm / "target"), reference=open_draft(vlm / "draft-Q4_K_M.gguf"))
    assert result.ok, [c for c in result.checks if c.status == "fail"]
    assert "openvino_language_model.xml: 4 layers (3 sliding_attention, 1 full_attention), hidden 128" in result.finding("target").reason
    assert result.finding("target-locators").status == "pass"
    assert result.finding("layer-types").reason == "layers [1, 2] are all sliding_attention"


def test_a_vlm_target_without_annotation_is_refused_as_genai_would(vlm, draft, tmp_path):
    """Gemma's residual adds follow a norm, so GenAI's name-pattern fallback finds nothing."""
    bare = tmp_path / "target"
    shutil.copytree(vlm / "target", bare)
    xml = bare / "openvino_language_model.xml"
    tree = ET.parse(xml)
    rt = tree.getroot().find("rt_info")
    rt.remove(rt.find("hidden_states_decoder_layers"))
    tree.write(xml)
    finding = verify_draft(draft, target=TargetIR.open(bare)).finding("target-locators")
    assert finding.status == "fail"
    assert "Eagle3 fallback found 0 outputs for 2 requested target layers" in finding.reason


@pytest.mark.slow
def test_vlm_pipeline_accepts_the_converted_draft_on_text_and_image_prompts(vlm, draft):
    r = run_acceptance(TargetIR.open(vlm / "target"), draft, _prompts(vlm), GenerationSettings(max_new_tokens=100, num_assistant_tokens=7, precision="f32"), progress=False)
    assert r.pipeline == "VLMPipeline" and r.device == "CPU"
    assert r.overall.identical, [p.first_difference for p in r.prompts]
    text, image = r.by_kind["text"], r.by_kind["image"]
    assert text.generated_tokens == 500 and image.generated_tokens == 100
    assert text.accepted_tokens >= 0.5 * text.generated_tokens, r.summary()
    assert r.prompts[-1].images == (str(vlm / "image.png"),)
    assert any("image prompts" in line for line in r.summary())


@pytest.mark.slow
def test_a_random_draft_on_a_vlm_target_is_broken(vlm, tmp_path):
    config = json.loads((vlm / "draft-ref" / "config.json").read_text())
    b.random_checkpoint(config, tmp_path / "random")
    Job.of(tmp_path / "random", None, Options(progress=False)).export(tmp_path / "draft")
    r = run_acceptance(TargetIR.open(vlm / "target"), tmp_path / "draft", read_prompts(vlm / "prompts.txt"), GenerationSettings(max_new_tokens=60, num_assistant_tokens=7, precision="f32"), progress=False)
    assert r.overall.identical and r.verdict == "BROKEN", r.summary()

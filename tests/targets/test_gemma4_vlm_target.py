"""`gguf2ov target TEXT.gguf --mmproj MMPROJ.gguf`: a Gemma 4 VLM folder from llama.cpp's two files.

The files are llama.cpp 0c1e570's converter's, of fixtures/tiny-vlm/target-hf (a Gemma4ForConditionalGeneration
with a one-layer vision tower; benchmarks/llamacpp/gemma4_vlm.py): the text GGUF in F32 and as llama-quantize's
Q4_K_M, and the gemma4v mmproj in F32. The folder is checked against transformers 5.5.4 on that checkpoint (the
vision embeddings numerically, the greedy answer on fixtures/tiny-vlm/image.png in VLMPipeline) and against
fixtures/tiny-vlm/target, optimum-intel's image-text-to-text export of it (its layout and its answer).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from gguf2ov.cli import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
TEXT_F32 = DATA / "gemma4-vlm-llamacpp-F32.gguf"
TEXT_Q4_K_M = DATA / "gemma4-vlm-llamacpp-Q4_K_M.gguf"
MMPROJ = DATA / "gemma4-vlm-mmproj-llamacpp-F32.gguf"
LLAMACPP_ANSWER = DATA / "gemma4-vlm-llamacpp.json"
VLM = REPO / "fixtures" / "tiny-vlm"
HF = VLM / "target-hf"
IMAGE = VLM / "image.png"
IMAGE_PROMPT = "The red fox lives in the forest. It likes to eat"  # fixtures/tiny-vlm's image prompt
NEW_TOKENS = 100
SOFT_TOKENS = "70"  # the fixture's preprocessor_config (max_soft_tokens)


def _build(out: Path, text: Path = TEXT_F32) -> Path:
    assert main(["target", str(text), "--mmproj", str(MMPROJ), "--image-max-tokens", SOFT_TOKENS, "-o", str(out),
                 "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("vlm") / "target")


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(HF), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def image_inputs():
    """transformers' Gemma4 image processor on the fixture image, as the fixture states it (70 soft tokens)."""
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    with Image.open(IMAGE) as image:
        return Gemma4ImageProcessorPil.from_pretrained(str(HF))(images=image.convert("RGB"), return_tensors="pt")


def _ports(model) -> list:
    return [(p.get_any_name(), p.get_element_type().get_type_name(), p.get_partial_shape().rank.get_length())
            for p in (*model.inputs, *model.outputs)]


def test_the_folder_has_the_layout_of_optimums_export(folder):
    """The same models with the same inputs and outputs (names, types, ranks) as fixtures/tiny-vlm/target, and
    config.json / preprocessor_config.json stating what the fixture's do for images."""
    import openvino as ov

    core = ov.Core()
    ours = sorted(p.name for p in folder.glob("openvino_*.xml"))
    assert ours == sorted(p.name for p in (VLM / "target").glob("openvino_*.xml"))
    for name in ours:
        if "tokenizer" not in name:
            assert _ports(core.read_model(folder / name)) == _ports(core.read_model(VLM / "target" / name)), name
    # the per-layer model gives what optimum's gives without per-layer embeddings: [B, L, layers, 0]
    per_layer = core.read_model(folder / "openvino_text_embeddings_per_layer_model.xml")
    assert str(per_layer.output(0).get_partial_shape()) == "[?,?,4,0]"

    config = json.loads((folder / "config.json").read_text())
    fixture = json.loads((VLM / "target" / "config.json").read_text())
    for key in ("architectures", "model_type", "boi_token_id", "image_token_id", "eoi_token_id", "video_token_id",
                "boa_token_id", "audio_token_id", "eoa_token_index"):
        assert config[key] == fixture[key], key
    for key, value in config["vision_config"].items():
        assert value == fixture["vision_config"][key], key
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "head_dim", "global_head_dim", "sliding_window",
                "final_logit_softcapping", "vocab_size", "rope_parameters", "hidden_size_per_layer_input"):
        assert config["text_config"][key] == fixture["text_config"][key], key
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    fixture_pre = json.loads((VLM / "target" / "preprocessor_config.json").read_text())
    assert pre == {k: fixture_pre[k] for k in pre}
    assert json.loads((folder / "gguf2ov.json").read_text())["sources"]["mmproj"]["path"] == str(MMPROJ)


def test_the_vision_embeddings_equal_transformers_get_image_features(folder, hf_model, image_inputs):
    """The vision embeddings model built from the mmproj computes transformers' get_image_features (vision tower,
    pooler, embedder) within float32 rounding: 64 soft tokens of the text width from 630 patches (padded)."""
    import openvino as ov
    import torch

    pixels, positions = image_inputs["pixel_values"], image_inputs["image_position_ids"]
    with torch.no_grad():
        want = hf_model.model.get_image_features(pixel_values=pixels, image_position_ids=positions).pooler_output
    model = ov.Core().compile_model(folder / "openvino_vision_embeddings_model.xml", "CPU",
                                    {"INFERENCE_PRECISION_HINT": "f32"})
    got = model({"pixel_values": pixels.numpy(), "image_position_ids": positions.numpy()})[0]
    assert got.shape == tuple(want.shape) == (64, 128)
    assert np.abs(got - want.numpy()).max() <= 1e-5 * np.abs(want.numpy()).max()  # measured 1.2e-7 (of 0.40)


def test_the_text_embeddings_are_gemmas_scaled_embedding(folder, hf_model):
    """openvino_text_embeddings_model: the embedding table times sqrt(hidden), as transformers' scaled embedding."""
    import openvino as ov
    import torch

    ids = np.arange(512, dtype=np.int64)[None]
    with torch.no_grad():
        want = hf_model.model.language_model.embed_tokens(torch.from_numpy(ids)).numpy()
    got = ov.Core().compile_model(folder / "openvino_text_embeddings_model.xml", "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})({"input": ids})[0]
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


# an untied head and its own keys and values in every layer (the fixture's head is tied)
UNTIED = dict(model_type="gemma4_text", hidden_size=48, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=16,
              layer_types=["sliding_attention", "full_attention"], sliding_window=3, final_logit_softcapping=30.0,
              hidden_size_per_layer_input=0, tie_word_embeddings=False)


@pytest.mark.parametrize("geometry", ["tied", "untied"])
def test_the_language_model_on_the_text_embeddings_is_the_text_target(tmp_path, geometry):
    """The VLM's language model fed the text embeddings model's output gives the text target's logits over two
    stateful steps (the same weights and arithmetic, the embedding lookup moved out), tied head or not."""
    import target_builders as tb
    from opened import open_target

    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.numerics import EXACT, core
    from gguf2ov.targets.graph import build_target_ir, build_text_embeddings_model, target_forms

    source_path = TEXT_F32 if geometry == "tied" else tb.write_target_checkpoint(tmp_path / "hf", UNTIED, seed=4)
    text_xml = tb.target_ir(source_path, tmp_path / "text")
    source, variant = open_target(source_path), parse_variant("fp32")
    language = build_target_ir(target_forms(source, variant), inputs_embeds=True)
    embeddings = build_text_embeddings_model(source.config, target_forms(source, variant).weight)
    language, embeddings = (core().compile_model(m, "CPU", EXACT) for m in (language, embeddings))
    request, past = language.create_infer_request(), 0
    layers = source.config.num_layers
    for (want, _), ids in zip(tb.run_steps(text_xml, steps := tb.steps(source.config.vocab_size)), steps):
        n = len(ids)
        got = request.infer({"inputs_embeds": embeddings({"input": ids[None]})[0],
                             "per_layer_inputs": np.zeros((1, n, layers, 0), np.float32),
                             "attention_mask": np.ones((1, past + n), np.int64),
                             "position_ids": np.arange(past, past + n)[None], "beam_idx": np.zeros(1, np.int32)})
        assert np.array_equal(got[language.outputs[0]], want)
        past += n


def _hf_greedy(hf_model, image_inputs) -> str:
    """transformers' greedy answer to the image prompt, its ids as VLMPipeline lays them out for Gemma 4 (the
    image's <|image>, soft tokens and <image|> before the prompt's, no BOS: the tokenizer adds none)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(HF))
    c = hf_model.config
    n = int(image_inputs["num_soft_tokens_per_image"][0])
    ids = torch.tensor([[c.boi_token_id] + [c.image_token_id] * n + [c.eoi_token_id] + tok(IMAGE_PROMPT)["input_ids"]])
    with torch.no_grad():
        out = hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                do_sample=False, pixel_values=image_inputs["pixel_values"],
                                image_position_ids=image_inputs["image_position_ids"])
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def _genai_answers(folder: Path) -> tuple[str, str]:
    """VLMPipeline's greedy answers to the image prompt with the image and without it."""
    from gguf2ov.runtime.genai import Prompt, generate, generation_config, make_pipeline, properties
    from gguf2ov.runtime.target import TargetIR

    pipe = make_pipeline(TargetIR.open(folder), "CPU", properties("f32"))
    cfg = generation_config(pipe, NEW_TOKENS, None)
    return tuple(generate(pipe, Prompt(IMAGE_PROMPT, images), cfg, False).text for images in ((str(IMAGE),), ()))


@pytest.mark.slow
def test_vlm_pipeline_answers_as_transformers_and_the_optimum_folder(folder, hf_model, image_inputs, tmp_path):
    """The greedy answer on the fixture image (100 tokens) is transformers', the optimum folder's and llama.cpp's
    (llama-mtmd-cli, recorded by benchmarks/llamacpp/gemma4_vlm.py), and the image changes it; the folder built
    from llama-quantize's Q4_K_M text file gives the same answer on the image."""
    with_image, without = _genai_answers(folder)
    assert with_image == _hf_greedy(hf_model, image_inputs)
    assert with_image == _genai_answers(VLM / "target")[0]
    llamacpp = json.loads(LLAMACPP_ANSWER.read_text())  # llama-mtmd-cli on the same pair (81 soft tokens)
    assert (llamacpp["prompt"], llamacpp["new_tokens"]) == (IMAGE_PROMPT, NEW_TOKENS)
    assert with_image == llamacpp["text"]
    assert with_image != without
    assert _genai_answers(_build(tmp_path / "q4", TEXT_Q4_K_M))[0] == with_image  # measured on this fixture


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--weight-format", "int8"], ["--weight-format", "int4"], ["--grid", "compact"]])
def test_other_weight_forms_of_the_language_model_keep_the_vision_model(tmp_path, folder, flags):
    """From the Q4_K_M file in NNCF's int8 and int4 and in the file's own factorisation: the folder builds, its
    checks pass, VLMPipeline answers the image prompt, and the vision model is the float32 one."""
    out = tmp_path / "target"
    assert main(["target", str(TEXT_Q4_K_M), "--mmproj", str(MMPROJ), "--image-max-tokens", SOFT_TOKENS, *flags,
                 "-o", str(out), "--quiet"]) == 0
    name = "openvino_vision_embeddings_model.bin"
    assert (out / name).read_bytes() == (folder / name).read_bytes()
    assert _genai_answers(out)[0].strip()


@pytest.mark.slow
def test_run_with_mmproj_attaches_the_dflash_draft_in_vlm_pipeline(tmp_path):
    """`gguf2ov run DRAFT --target TEXT.gguf --mmproj MMPROJ --image IMG`: the VLM target is built, the fixture's
    DFlash draft attaches in VLMPipeline, and the text with the draft is the target's alone on every prompt."""
    out = tmp_path / "run"
    main(["run", str(VLM / "draft-Q4_K_M.gguf"), "--target", str(TEXT_F32), "--mmproj", str(MMPROJ),
          "--image-max-tokens", SOFT_TOKENS, "--image", str(IMAGE), "--prompts", str(VLM / "prompts.txt"),
          "--variants", "fp32", "-o", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["target"]["status"] == "pass"
    assert (out / "target" / "openvino_vision_embeddings_model.xml").is_file()
    accept = report["results"]["accept:gguf"]
    assert accept["overall"]["identical"] and accept["overall"]["accepted_tokens"] > 0
    assert accept["by_kind"]["image"]["identical"] and accept["by_kind"]["image"]["accepted_tokens"] > 0
    assert "VLMPipeline on CPU" in (out / "report.md").read_text()


# --- refused -------------------------------------------------------------------------------------------

def _mmproj_with(path: Path, kv: dict, drop=(), extra=None) -> Path:
    """A copy of the mmproj with metadata changed (None drops a key), tensors dropped or `extra` ones added."""
    from ggufs import write_gguf

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    gguf = open_gguf(MMPROJ)
    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture"}
    meta = {k: v for k, v in (meta | kv).items() if v is not None}
    write_gguf(path, "clip", meta, {n: gguf.load(n) for n in gguf.tensors if n not in drop} | (extra or {}))
    return path


def _text_without_image_tokens(path: Path) -> Path:
    """A copy of the F32 text GGUF whose vocabulary names the image token otherwise."""
    from ggufs import write_gguf

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    gguf = open_gguf(TEXT_F32)
    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture"}
    meta["tokenizer.ggml.tokens"] = [t if t != "<|image|>" else "<image_soft_token>" for t in
                                     meta["tokenizer.ggml.tokens"]]
    write_gguf(path, "gemma4", meta, {n: gguf.load(n) for n in gguf.tensors})
    return path


BAD_INPUTS = {
    # case -> (the text GGUF, the mmproj, each a path or a maker of one in tmp_path), the error line's text
    "an audio mmproj": (TEXT_F32, lambda tmp: _mmproj_with(tmp / "audio.gguf", {
        "clip.vision.projector_type": None, "clip.has_vision_encoder": False, "clip.has_audio_encoder": True,
        "clip.audio.projector_type": "gemma4a"}),
        "holds an audio projector (gemma4a) and no image projector; this target builds images through 'gemma4v' only"),
    "another projector": (TEXT_F32, lambda tmp: _mmproj_with(tmp / "gemma3.gguf", {"clip.vision.projector_type": "gemma3"}),
                          "holds projector 'gemma3'"),
    "the mmproj of another text model": (DATA / "gemma4-llamacpp-F32.gguf", MMPROJ,
                                         "projects images to width 128, but the text model's width is 64"),
    "a text GGUF as the mmproj": (TEXT_F32, TEXT_Q4_K_M, "is not an mmproj file"),
    "a missing tensor": (TEXT_F32, lambda tmp: _mmproj_with(tmp / "no-proj.gguf", {}, drop=("mm.input_projection.weight",)),
                         "has no tensor mm.input_projection.weight"),
    "clipped linears": (TEXT_F32, lambda tmp: _mmproj_with(tmp / "clipped.gguf", {}, extra={
        "v.blk.0.attn_q.input_max": np.ones(1, np.float32)}), "clipped linears (use_clipped_linears"),
    "a tensor of another shape": (TEXT_F32, lambda tmp: _mmproj_with(tmp / "wide.gguf", {}, extra={
        "v.blk.0.ffn_up.weight": np.ones((96, 32), np.float32)}), "tensor v.blk.0.ffn_up.weight is [96, 32], not [64, 32]"),
    "a head count of 0": (TEXT_F32, lambda tmp: _mmproj_with(tmp / "heads.gguf", {"clip.vision.attention.head_count": 0}),
                          "clip.vision.attention.head_count is 0, not a positive int"),
    "a vocabulary without the image's tokens": (lambda tmp: _text_without_image_tokens(tmp / "text.gguf"), MMPROJ,
                                                "the text GGUF's vocabulary has no '<|image|>' (image_token_id)"),
    "a checkpoint target": (HF, MMPROJ, "--mmproj applies to a GGUF target only"),
    "a qwen3 text GGUF": ("q4_k_m", MMPROJ, "a qwen3 target is built as a text model only"),  # a conftest fixture
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_mmproj_input_is_one_error_line_and_no_folder(tmp_path, capsys, request, case):
    def made(path):
        return request.getfixturevalue(path) if isinstance(path, str) else path(tmp_path) if callable(path) else path

    text, mmproj, message = BAD_INPUTS[case]
    args = ["target", str(made(text)), "--mmproj", str(made(mmproj))]
    capsys.readouterr()
    out = tmp_path / "out"
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


def test_an_mmproj_with_an_audio_tower_too_builds_its_images(tmp_path, folder):
    """A vision and audio mmproj (Gemma 4 E2B's kind): the audio tower, clamps and all, is left out, and the
    vision embeddings model is the one of the vision-only file."""
    audio = {"a.blk.0.attn_q.weight": np.ones((8, 8), np.float32), "a.blk.0.attn_q.input_max": np.ones(1, np.float32)}
    both = _mmproj_with(tmp_path / "both.gguf", {"clip.has_audio_encoder": True, "clip.audio.projector_type": "gemma4a"},
                        extra=audio)
    out = tmp_path / "target"
    assert main(["target", str(TEXT_F32), "--mmproj", str(both), "--image-max-tokens", SOFT_TOKENS, "-o", str(out),
                 "--quiet"]) == 0
    name = "openvino_vision_embeddings_model.bin"
    assert (out / name).read_bytes() == (folder / name).read_bytes()


def test_image_max_tokens_without_mmproj_is_refused(tmp_path, capsys):
    assert main(["target", str(TEXT_F32), "--image-max-tokens", "70", "-o", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith("error: --image-max-tokens applies with --mmproj")
    assert not (tmp_path / "out").exists()


def test_run_refuses_mmproj_beside_an_openvino_folder(tmp_path, capsys):
    assert main(["run", str(VLM / "draft-Q4_K_M.gguf"), "--target", str(VLM / "target"), "--mmproj", str(MMPROJ),
                 "-o", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --mmproj applies to a target the run builds"), err
    assert not (tmp_path / "run").exists()

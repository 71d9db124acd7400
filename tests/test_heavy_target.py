"""A widened target computes the original's function, so a draft trained for one serves the other.

Small widening sizes keep the export quick; the benchmark uses the defaults.
"""

import json

import dflash_builders as b
import pytest

from gguf2ov.errors import Gguf2ovError
from gguf2ov.model.source import open_draft

EXTRA_LAYERS = 2
PROMPT = "The red fox lives in the forest. It likes to eat"
NEW_TOKENS = 20


def _tiny_qwen3(tied: bool):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=128, tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # norms off 1 so that copying them unchanged into new layers would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_widened_model_computes_the_same_function(tied):
    import torch

    from gguf2ov.tools.widen import TOLERANCE, compare_function, forward_all, widen_model

    model = _tiny_qwen3(tied)
    wide = widen_model(model, extra_layers=3, intermediate_size=256)
    assert wide.config.num_hidden_layers == 6 and wide.config.intermediate_size == 256
    assert len(wide.config.layer_types) == 6
    for layer in wide.model.layers[3:]:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert torch.all(layer.input_layernorm.weight == 1) and torch.all(layer.self_attn.q_norm.weight == 1)
    assert torch.equal(wide.lm_head.weight, model.lm_head.weight)

    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(1))
    diffs = compare_function(forward_all(model, ids), forward_all(wide, ids), model.config.num_hidden_layers)
    assert set(diffs) == {"logits", "hidden_states[1]", "hidden_states[2]", "final norm"}
    assert max(diffs.values()) < TOLERANCE, diffs


def test_widening_only_pads():
    from gguf2ov.tools.widen import widen_model

    with pytest.raises(Gguf2ovError, match="can only pad"):
        widen_model(_tiny_qwen3(True), extra_layers=1, intermediate_size=32)


def _target_hf(factory):
    hf = b.FIXTURES / "target-hf"
    if (hf / "config.json").is_file() and b.fixture_pair():
        return hf
    return b.once("target", factory, b.build_target) / "hf"


@pytest.mark.slow
def test_widened_target_folder_runs_in_genai_like_the_original(tmp_path_factory):
    import openvino as ov

    from gguf2ov.runtime.target import read_locators
    from gguf2ov.stages.accept import run_acceptance
    from gguf2ov.stages.export import export_draft
    from gguf2ov.tools.widen import widen_target

    hf = _target_hf(tmp_path_factory)
    cfg = json.loads((hf / "config.json").read_text())
    n, inter = cfg["num_hidden_layers"], cfg["intermediate_size"]
    out = tmp_path_factory.mktemp("heavy")
    # No widening at all: an f32 export of the original, the baseline for GenAI (the fixture's own
    # target IR has int8 weights, so its greedy text may differ).
    base = widen_target(hf, out / "base", extra_layers=0, intermediate_size=inter, progress=False)
    wide = widen_target(hf, out / "wide", extra_layers=EXTRA_LAYERS, intermediate_size=inter + 256, progress=False)

    assert wide.layers == (n, n + EXTRA_LAYERS) and wide.intermediate_size == (inter, inter + 256)
    assert wide.parameters[1] > wide.parameters[0] == base.parameters[1]
    assert max(wide.max_abs_diff.values()) < 1e-4, wide.max_abs_diff
    assert "IR taps vs original" in wide.max_abs_diff
    assert set(wide.weight_types) <= {"f32", "i64", "i32"}

    folder = out / "wide"
    need = {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml",
            "config.json", "gguf2ov.json"}
    assert need <= {p.name for p in folder.iterdir()}
    assert not [p.name for p in out.iterdir() if ".partial-" in p.name]
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == n + EXTRA_LAYERS
    prov = json.loads((folder / "gguf2ov.json").read_text())
    assert prov["options"]["extra_layers"] == EXTRA_LAYERS and len(prov["sources"]["target_hf"]["sha256"]) == 64

    locators = read_locators(ov.Core().read_model(str(folder / "openvino_model.xml")))
    assert sorted(locators) == list(range(n + EXTRA_LAYERS))
    # Ids the draft can read keep pointing at the same decoder layers; the last is the final norm.
    for i in range(n - 1):
        assert f"layers.{i}/" in locators[i]["producer"]
    assert "norm" in locators[n + EXTRA_LAYERS - 1]["producer"]

    # Same function in GenAI: greedy text equal, and a draft attached to either target sees the same
    # hidden states, so it proposes and gets accepted exactly the same tokens.
    draft = export_draft(open_draft(b.draft_gguf(tmp_path_factory)), out / "draft", progress=False)
    runs = [run_acceptance(t, draft.out_dir, [PROMPT], max_new_tokens=NEW_TOKENS, num_assistant_tokens=3,
                           progress=False) for t in (out / "base", folder)]
    texts = {r.prompts[0].text_target for r in runs} | {r.prompts[0].text_draft for r in runs}
    assert len(texts) == 1 and runs[0].overall.generated_tokens > 0
    assert runs[0].overall.accepted_tokens == runs[1].overall.accepted_tokens
    if b.fixture_pair():  # the trained draft keeps being useful on the widened target
        assert runs[1].overall.accepted_tokens >= NEW_TOKENS // 4

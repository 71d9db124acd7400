"""A widened target computes the original's function, so a draft trained for one serves the other.

The checks of the widening use small sizes; the widened target run in GenAI is the demo's (the
defaults), built once per session. The widening itself is NumPy; transformers' PyTorch forward is
the independent reference it is checked against here: a random Qwen3, and the hybrid (Qwen3.5:
Gated DeltaNet and gated attention layers) and mixture-of-experts (Qwen3-MoE) fixture targets.
"""

import json
from pathlib import Path

import dflash_builders as b
import pytest

from gguf2ov.errors import Gguf2ovError
from gguf2ov.runtime.target import TargetIR
from gguf2ov.tools.widen import DEFAULT_EXTRA_LAYERS as EXTRA_LAYERS
from gguf2ov.tools.widen import DEFAULT_INTERMEDIATE_SIZE

PROMPT = "The red fox lives in the forest. It likes to eat"
NEW_TOKENS = 20
FIXTURES_ROOT = b.FIXTURES.parent
HYBRID, MOE = FIXTURES_ROOT / "tiny-hybrid", FIXTURES_ROOT / "tiny-moe"


def _tiny_qwen3(path, tied: bool):
    """A random tiny Qwen3 checkpoint (transformers' own save) whose norms are off 1."""
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
    model.save_pretrained(str(path))
    return model


def _forward(model, ids):
    import torch

    with torch.no_grad():
        return model(ids, output_hidden_states=True)


@pytest.mark.parametrize("tied", [True, False])
def test_widened_checkpoint_computes_the_same_function_in_transformers(tied, tmp_path):
    """The NumPy widening checked against transformers' own Qwen3 forward (not gguf2ov's graph)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from gguf2ov.tools.widen import TOLERANCE, write_widened_checkpoint

    model = _tiny_qwen3(tmp_path / "orig", tied)
    written = write_widened_checkpoint(tmp_path / "orig", tmp_path / "wide", extra_layers=3, intermediate_size=256)
    wide, info = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "wide"), dtype=torch.float32, output_loading_info=True)
    # from_pretrained keeps random values for a key it does not find: every key must be there
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    wide.eval()
    assert wide.config.num_hidden_layers == 6 and wide.config.intermediate_size == 256
    assert len(wide.config.layer_types) == 6 and written["config"]["dtype"] == "float32"
    for layer in wide.model.layers[3:]:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert torch.all(layer.input_layernorm.weight == 1) and torch.all(layer.self_attn.q_norm.weight == 1)
    assert torch.equal(wide.lm_head.weight, model.lm_head.weight)
    assert written["parameters"] == (sum(p.numel() for p in model.parameters()),
                                     sum(p.numel() for p in wide.parameters()))

    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(1))
    a, b = _forward(model, ids), _forward(wide, ids)
    diffs = {"logits": float((a.logits - b.logits).abs().max()),
             "final norm": float((a.hidden_states[-1] - b.hidden_states[-1]).abs().max())}
    for i in range(1, 3):  # decoder-layer outputs: target layer ids 0..N-2
        diffs[f"layer {i - 1}"] = float((a.hidden_states[i] - b.hidden_states[i]).abs().max())
    assert max(diffs.values()) < TOLERANCE, diffs
    assert float(a.logits.abs().max()) > 100 * TOLERANCE  # the model computes something to compare


@pytest.mark.parametrize("fixture", [HYBRID, MOE], ids=["hybrid", "moe"])
def test_widened_hybrid_and_moe_checkpoints_compute_the_same_function_in_transformers(fixture, tmp_path):
    """The trained fixture targets: appended Gated DeltaNet, gated attention and mixture-of-experts
    layers are no-ops in transformers' own forward, and the padded experts or MLPs add nothing."""
    import torch
    from transformers import AutoModelForCausalLM

    from gguf2ov.tools.widen import TOLERANCE, write_widened_checkpoint

    hf = fixture / "target-hf"
    cfg = json.loads((hf / "config.json").read_text())
    n, extra, moe = cfg["num_hidden_layers"], 3, cfg["model_type"] == "qwen3_moe"
    width = "moe_intermediate_size" if moe else "intermediate_size"
    written = write_widened_checkpoint(hf, tmp_path / "wide", extra_layers=extra, intermediate_size=cfg[width] + 64)
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    wide, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "wide"), dtype=torch.float32,
                                                      output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    wide.eval()
    assert wide.config.num_hidden_layers == n + extra and getattr(wide.config, width) == cfg[width] + 64
    assert written["config"]["dtype"] == "float32"
    if not moe:  # each appended layer keeps the type of the layer it copies
        assert wide.config.layer_types == cfg["layer_types"] + cfg["layer_types"][:extra]
    for layer in wide.model.layers[n:]:
        mixer = layer.linear_attn.out_proj if hasattr(layer, "linear_attn") else layer.self_attn.o_proj
        mlp = layer.mlp.experts.down_proj if moe else layer.mlp.down_proj.weight
        assert not mixer.weight.any() and not mlp.any()
        # norms scaling by 1: Qwen3.5's decoder norms scale by (1 + w), its gated norm by w
        assert torch.all(layer.input_layernorm.weight == (0 if cfg["model_type"] == "qwen3_5_text" else 1))
        if hasattr(layer, "linear_attn"):
            assert torch.all(layer.linear_attn.norm.weight == 1)
    assert written["parameters"] == (sum(p.numel() for p in model.parameters()),
                                     sum(p.numel() for p in wide.parameters()))

    ids = torch.randint(0, cfg["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(1))
    a, b_ = _forward(model, ids), _forward(wide, ids)
    diffs = {"logits": float((a.logits - b_.logits).abs().max()),
             "final norm": float((a.hidden_states[-1] - b_.hidden_states[-1]).abs().max())}
    for i in range(1, n):  # decoder-layer outputs: target layer ids 0..N-2
        diffs[f"layer {i - 1}"] = float((a.hidden_states[i] - b_.hidden_states[i]).abs().max())
    assert max(diffs.values()) < TOLERANCE, diffs
    assert float(a.logits.abs().max()) > 100 * TOLERANCE


def test_widening_only_pads():
    from gguf2ov.tools.widen import read_widening, widened_config

    widening = read_widening(b.FIXTURES / "target-hf")
    with pytest.raises(Gguf2ovError, match="can only pad"):
        widened_config(widening, extra_layers=1, intermediate_size=32)
    with pytest.raises(Gguf2ovError, match="extra_layers must be >= 0"):
        widened_config(widening, extra_layers=-1, intermediate_size=widening.intermediate_size)
    moe = read_widening(MOE / "target-hf")  # a mixture of experts pads every expert
    assert moe.width.key == "moe_intermediate_size" and moe.intermediate_size == 32
    with pytest.raises(Gguf2ovError, match="smaller than the target's moe_intermediate_size 32"):
        widened_config(moe, extra_layers=1, intermediate_size=16)


def test_every_kind_a_widened_model_type_is_built_of_has_its_widening():
    """Widening's per-kind tables (tools/widen.py, as targets/layers/kind.py says) cover every kind of every model
    type it widens, and name registered kinds only: a kind added to such a model type, or renamed, fails here, not
    with a KeyError in the middle of widening."""
    from gguf2ov.targets.config import map_of_type
    from gguf2ov.targets.layers import REGISTRY
    from gguf2ov.tools.widen import BRANCH_OUTPUTS, MLP_WIDTHS, PLAIN_NORMS, WIDENED_TYPES

    for model_type in WIDENED_TYPES:
        target = map_of_type(model_type).target
        assert not target.get("layer"), f"{model_type}: a decoder layer of other blocks than its mixer and MLP"
        kinds = {*target["mixers"].values(), target["mlp"]}
        assert kinds <= set(BRANCH_OUTPUTS), f"{model_type}: no branch output for {kinds - set(BRANCH_OUTPUTS)}"
        assert target["mlp"] in MLP_WIDTHS, f"{model_type}: no MLP width for {target['mlp']}"
    assert {*BRANCH_OUTPUTS, *PLAIN_NORMS, *MLP_WIDTHS} <= set(REGISTRY)


def test_only_the_model_types_it_knows_are_widened(tmp_path):
    from gguf2ov.cli.widen import widen_target

    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(Gguf2ovError, match="only qwen3, qwen3_5_text, qwen3_moe targets"):
        widen_target(tmp_path / "llama", tmp_path / "out", progress=False)
    with pytest.raises(Gguf2ovError, match="config.json is missing"):
        widen_target(tmp_path, tmp_path / "out", progress=False)
    # a mixture of experts whose config makes some layers dense: the copies would change kind
    (tmp_path / "dense-moe").mkdir()
    cfg = json.loads((MOE / "target-hf" / "config.json").read_text())
    (tmp_path / "dense-moe" / "config.json").write_text(json.dumps({**cfg, "mlp_only_layers": [1]}))
    with pytest.raises(Gguf2ovError, match="with dense layers"):
        widen_target(tmp_path / "dense-moe", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_comparison_sees_an_appended_layer_that_is_not_a_no_op(tmp_path_factory):
    """A widened layer whose attention writes to the residual stream changes the final norm and the
    logits, and nothing the draft reads before it: the check compares what it should."""
    from safetensors.numpy import load_file, save_file

    from opened import build_target
    from gguf2ov.tools.widen import TOLERANCE, same_function, write_widened_checkpoint

    hf = _target_hf(tmp_path_factory)
    cfg = json.loads((hf / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    work = tmp_path_factory.mktemp("not-a-no-op")
    write_widened_checkpoint(hf, work / "hf", extra_layers=1, intermediate_size=cfg["intermediate_size"])
    weights = load_file(str(work / "hf" / "model.safetensors"))
    name = f"model.layers.{n}.self_attn.o_proj.weight"
    assert not weights[name].any()
    weights[name] = weights["model.layers.0.self_attn.o_proj.weight"]
    save_file(weights, str(work / "hf" / "model.safetensors"), metadata={"format": "pt"})
    build_target(hf, work / "original", weight_format="fp32", progress=False)
    build_target(work / "hf", work / "wide", weight_format="fp32", progress=False)

    diffs = same_function(work / "original", work / "wide", n, cfg["vocab_size"])
    assert set(diffs) == {"logits", "final norm", *(f"layer {i}" for i in range(n - 1))}
    assert diffs["logits"] > TOLERANCE and diffs["final norm"] > TOLERANCE, diffs
    assert max(diffs[f"layer {i}"] for i in range(n - 1)) == 0.0, diffs


def _target_hf(factory):
    hf = b.FIXTURES / "target-hf"
    if (hf / "config.json").is_file() and b.fixture_pair():
        return hf
    return b.once("target", factory, b.build_target) / "hf"


@pytest.mark.slow
def test_widened_target_folder_runs_in_genai_like_the_original(fixtures_dir, heavy_widening, fixture_draft,
                                                               tmp_path_factory):
    """The demo's widened target (`gguf2ov widen-target`'s defaults, tests/conftest.py heavy_widening)."""
    import openvino as ov

    from gguf2ov.runtime.target import read_locators
    from gguf2ov.runtime.genai import GenerationSettings
    from gguf2ov.stages.accept import run_acceptance
    from gguf2ov.cli.widen import widen_target

    hf = fixtures_dir / "target-hf"
    cfg = json.loads((hf / "config.json").read_text())
    n, inter = cfg["num_hidden_layers"], cfg["intermediate_size"]
    out = tmp_path_factory.mktemp("heavy")
    # No widening at all: an f32 export of the original, the baseline for GenAI (the fixture's own
    # target IR has int8 weights, so its greedy text may differ).
    base = widen_target(hf, out / "base", extra_layers=0, intermediate_size=inter, progress=False)
    wide = heavy_widening

    assert wide.layers == (n, n + EXTRA_LAYERS) and wide.intermediate_size == (inter, DEFAULT_INTERMEDIATE_SIZE)
    assert DEFAULT_INTERMEDIATE_SIZE > inter
    assert wide.parameters[1] > wide.parameters[0] == base.parameters[1]
    assert max(wide.max_abs_diff.values()) < 1e-4, wide.max_abs_diff
    assert set(wide.max_abs_diff) == {"logits", "final norm", *(f"layer {i}" for i in range(n - 1))}
    assert set(wide.weight_types) <= {"f32", "i64", "i32"}

    folder = Path(wide.out_dir)
    need = {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml",
            "config.json", "generation_config.json", "gguf2ov.json"}
    assert need <= {p.name for p in folder.iterdir()} and not (folder / ".scratch").exists()
    assert not [p.name for p in folder.parent.iterdir() if ".partial-" in p.name]
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
    runs = [run_acceptance(TargetIR.open(t), fixture_draft, [PROMPT], GenerationSettings(max_new_tokens=NEW_TOKENS, num_assistant_tokens=3), progress=False) for t in (out / "base", folder)]
    texts = {r.prompts[0].text_target for r in runs} | {r.prompts[0].text_draft for r in runs}
    assert len(texts) == 1 and runs[0].overall.generated_tokens > 0
    assert runs[0].overall.accepted_tokens == runs[1].overall.accepted_tokens
    if b.fixture_pair():  # the trained draft keeps being useful on the widened target
        assert runs[1].overall.accepted_tokens >= NEW_TOKENS // 4


@pytest.mark.slow
@pytest.mark.parametrize("fixture", [HYBRID, MOE], ids=["hybrid", "moe"])
def test_widened_hybrid_and_moe_targets_run_in_genai_like_the_originals(fixture, tmp_path):
    """`gguf2ov widen-target` on the hybrid and MoE fixture targets: the same function in OpenVINO at
    every id a draft can read, and in GenAI the same greedy text, with the fixture's draft attached
    accepted exactly as on the original."""
    import openvino as ov

    from gguf2ov.cli.widen import widen_target
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job, Options
    from gguf2ov.runtime.genai import GenerationSettings, read_prompts
    from gguf2ov.runtime.target import read_locators
    from gguf2ov.stages.accept import run_acceptance
    from gguf2ov.tools.widen import read_widening

    hf = fixture / "target-hf"
    widening = read_widening(hf)
    n, width, extra = widening.layers, widening.intermediate_size, 4
    # the original as an f32 OpenVINO target (nothing widened), the baseline for GenAI
    widen_target(hf, tmp_path / "base", extra_layers=0, intermediate_size=width, progress=False)
    wide = widen_target(hf, tmp_path / "wide", extra_layers=extra, intermediate_size=2 * width, progress=False)
    assert wide.layers == (n, n + extra) and wide.intermediate_size == (width, 2 * width)
    assert wide.width_key == widening.width.key and wide.parameters[1] > wide.parameters[0]
    assert set(wide.max_abs_diff) == {"logits", "final norm", *(f"layer {i}" for i in range(n - 1))}
    assert max(wide.max_abs_diff.values()) < 1e-4, wide.max_abs_diff
    config = json.loads((tmp_path / "wide" / "config.json").read_text())
    types = list(widening.target.layer_types)
    assert config.get("layer_types", types + types[:extra]) == types + types[:extra]
    locators = read_locators(ov.Core().read_model(str(tmp_path / "wide" / "openvino_model.xml")))
    assert sorted(locators) == list(range(n + extra))
    for i in range(n - 1):  # the ids the draft reads keep pointing at the same decoder layers
        assert f"layers.{i}/" in locators[i]["producer"]

    draft = Job.of(fixture / "draft-Q4_K_M.gguf", None, Options(progress=False)).export(
        tmp_path / "draft", parse_variant("gguf")).out_dir
    prompts = read_prompts(fixture / "prompts.txt")[:2]
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, num_assistant_tokens=3)
    runs = [run_acceptance(TargetIR.open(t), draft, prompts, settings, progress=False) for t in (tmp_path / "base", tmp_path / "wide")]
    for a, w in zip(runs[0].prompts, runs[1].prompts):
        assert a.text_target == a.text_draft == w.text_target == w.text_draft
    assert runs[0].overall.accepted_tokens == runs[1].overall.accepted_tokens >= NEW_TOKENS // 2

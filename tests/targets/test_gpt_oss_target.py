"""gpt-oss targets: transformers' `gpt_oss` checkpoints and llama.cpp's `gpt-oss` GGUFs.

A tiny random GptOssForCausalLM (q/k/v/o biases, a sink logit per head, sliding layers whose window
of 4 is shorter than the 7-token first step beside a full layer, YaRN RoPE, a biased router choosing
2 of 4 experts with biased gate, up and down and the clamped SwiGLU) against transformers' forward
over two stateful steps; what the CPU plugin compiles its experts into (two GatherMatmul a layer);
what OpenVINO's paged conversion (GenAI's, when a draft attaches) keeps of its sinks and windows.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import target_builders as tb
from gpt_oss_data import GPT_OSS

WINDOWS = [4, 0, 4]  # the paged attention's sliding window per layer (0: full)


def write_gpt_oss(path, seed: int = 3, vocab: int = tb.VOCAB):
    """The random checkpoint, its experts' gate and up weights scaled by 5 so that the SwiGLU's clamp at
    7 cuts some of their values (at the writer's scale of 0.2 none reaches it)."""
    from safetensors.numpy import load_file, save_file

    hf = tb.write_target_checkpoint(path, GPT_OSS, seed=seed, vocab=vocab)
    weights = load_file(hf / "model.safetensors")
    for name in weights:
        if name.endswith("experts.gate_up_proj"):
            weights[name] = weights[name] * np.float32(5)
    save_file(weights, hf / "model.safetensors", metadata={"format": "pt"})
    return hf


@pytest.fixture(scope="module")
def gpt_oss_hf(tmp_path_factory):
    return write_gpt_oss(tmp_path_factory.mktemp("gpt_oss") / "hf")


@pytest.fixture(scope="module")
def gpt_oss_ir(tmp_path_factory, gpt_oss_hf):
    return tb.target_ir(gpt_oss_hf, tmp_path_factory.mktemp("gpt_oss_ir"))


def _transformers(hf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf))


def test_the_fixture_exercises_every_gpt_oss_feature(gpt_oss_hf):
    """The window is shorter than the first step, the sinks and biases are not zero, the clamp bites."""
    import torch

    model = _transformers(gpt_oss_hf)
    assert GPT_OSS["sliding_window"] < len(tb.steps(tb.VOCAB)[0])
    layer = model.model.layers[0]
    assert layer.self_attn.sinks.abs().min() > 0 and layer.mlp.experts.down_proj_bias.abs().max() > 0
    assert model.config.rope_parameters["rope_type"] == "yarn"
    seen = {}
    layer.mlp.experts.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    with torch.no_grad():
        model(torch.tensor(tb.steps(tb.VOCAB)[0])[None])
        gate_up = seen["x"] @ layer.mlp.experts.gate_up_proj + layer.mlp.experts.gate_up_proj_bias[:, None]
    assert gate_up.abs().max() > layer.mlp.experts.limit  # values the clamp cuts


def test_a_checkpoint_matches_transformers_over_two_stateful_steps(gpt_oss_ir, gpt_oss_hf):
    worst = tb.worst_against_transformers(gpt_oss_ir, _transformers(gpt_oss_hf))
    assert max(worst.values()) < 1e-5, worst


def test_the_experts_compile_into_two_gather_matmul_a_layer(gpt_oss_ir):
    kinds, _ = tb.runtime_kinds(gpt_oss_ir)
    assert kinds["GatherMatmul"] == 2 * GPT_OSS["num_hidden_layers"]
    assert kinds["Tile"] == 0 and kinds["ScatterElementsUpdate"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("weight_format, fused", [("fp16", {"f32"}), ("int8", {"u8"}), ("int4", {"u4"})])
def test_every_checkpoint_format_builds_and_fuses(tmp_path, gpt_oss_hf, fixtures_dir, weight_format, fused):
    """fp16 and NNCF's int8 / int4 (groups of 32: the widths are 64 and 32): every check of the command passes (2 GatherMatmul a layer compiled,
    stateful and paged), NNCF's codes stay compressed on them, the router stays float32."""
    from opened import build_target

    result = build_target(gpt_oss_hf, tmp_path / "t", weight_format=weight_format,
                          group_size=32 if weight_format == "int4" else None, tokenizer_dir=fixtures_dir / "target-hf")
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    for paged in (False, True):
        kinds, weights = tb.runtime_kinds(tmp_path / "t" / "openvino_model.xml", paged, {"INFERENCE_PRECISION_HINT": "f32"})
        assert kinds["GatherMatmul"] == 2 * GPT_OSS["num_hidden_layers"] and kinds["Tile"] == 0
        assert set(weights) == fused


def test_the_paged_conversion_keeps_the_sinks_and_windows(gpt_oss_ir, gpt_oss_hf):
    """Every layer a paged attention with its window, the checkpoint's sinks as its sinks input
    (SDPAToPagedAttention carries SDPA's sixth input into input 20), no state op left."""
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    from gguf2ov.hf.checkpoint import Checkpoint

    summary = tb.paged_summary(gpt_oss_ir)
    assert [window for _, window, _ in summary["attention"]] == [[w] for w in WINDOWS]
    model = ov.Core().read_model(str(gpt_oss_ir))
    paged_attention_transformation(model)
    assert not [op for op in model.get_ordered_ops() if op.get_type_name() in ("ReadValue", "Assign")]
    attention = [op for op in model.get_ordered_ops() if op.get_type_name() == "PagedAttentionExtension"]
    ckpt = Checkpoint(gpt_oss_hf)
    for i, op in enumerate(attention):
        sinks = op.input_value(20).get_node()
        assert sinks.get_type_name() == "Constant", sinks.get_type_name()
        np.testing.assert_array_equal(sinks.get_data().reshape(-1), ckpt.load(f"model.layers.{i}.self_attn.sinks"))


@pytest.mark.slow
def test_optimums_own_export_computes_the_same_without_the_locators_dflash_needs(tmp_path, gpt_oss_hf, gpt_oss_ir):
    """optimum-intel 2.2.0's `gpt_oss` export of the same checkpoint: the same interface and state
    variables, the same logits over two stateful steps (1e-5), the same paged conversion (windows,
    scale, heads); it writes no hidden-state locators, which GenAI's DFlash needs, and this target has."""
    import openvino as ov

    theirs = tb.optimum_export(gpt_oss_hf, tmp_path / "optimum") / "openvino_model.xml"
    assert tb.interface(gpt_oss_ir) == tb.interface(theirs)
    steps = tb.steps(tb.VOCAB)
    for (a, _), (b, _) in zip(tb.run_steps(gpt_oss_ir, steps), tb.run_steps(theirs, steps)):
        assert tb.relative(a, b) <= 1e-5
    assert tb.paged_summary(gpt_oss_ir) == tb.paged_summary(theirs)
    assert not ov.Core().read_model(str(theirs)).has_rt_info("hidden_states_decoder_layers")
    assert sorted(tb.locators(gpt_oss_ir)) == list(range(GPT_OSS["num_hidden_layers"]))


def test_the_paged_check_sees_lost_sinks(tmp_path, gpt_oss_hf, fixtures_dir, monkeypatch, capsys):
    """The command's target-paged check holds every paged attention to its sinks: an attention built
    without them (SDPA's five inputs) is stopped in one error line, before the folder is put in place."""
    from gguf2ov.cli import main
    from gguf2ov.targets.layers import pieces

    monkeypatch.setattr(pieces, "_sdpa_with_sinks", lambda q, k, v, mask, scale, sinks:
                        pieces._ops().scaled_dot_product_attention(q, k, v, mask, scale, causal=False))
    out = tmp_path / "out"
    assert main(["target", str(gpt_oss_hf), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "attention 0: heads [2, 16], window 4, sinks 0 (expected [2, 16], 4, 4)" in err[0], err
    assert not out.exists()


# --- the GGUF: llama.cpp's layout, MXFP4 experts ---------------------------------------------------

def write_llamacpp_layout(hf, out):
    """The checkpoint in the layout llama.cpp's converter writes a gpt-oss GGUF in (conversion/gpt_oss.py
    GptOssModel.modify_tensors): the experts [E, K, N] transposed to [E, N, K], the interleaved gate and up
    (weights and biases) apart; named as the gpt-oss map names them, for the writer to run it backwards."""
    import shutil

    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(hf / "config.json", out / "config.json")
    weights = {}
    for name, x in load_file(hf / "model.safetensors").items():
        head = name.rsplit(".", 1)[0] + "."
        if name.endswith("experts.gate_up_proj"):
            nk = x.swapaxes(-1, -2)
            weights |= {head + "gate_proj": nk[:, 0::2], head + "up_proj": nk[:, 1::2]}
        elif name.endswith("experts.gate_up_proj_bias"):
            weights |= {head + "gate_proj_bias": x[:, 0::2], head + "up_proj_bias": x[:, 1::2]}
        elif name.endswith("experts.down_proj"):
            weights[head + "down_nk"] = x.swapaxes(-1, -2)
        else:
            weights[name] = x
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, out / "model.safetensors",
              metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def mxfp4_gguf(tmp_path_factory, gpt_oss_hf):
    """The writer's MXFP4_MOE of the checkpoint: MXFP4 experts, Q8_0 attention, embedding and head, F32
    norms, biases, sinks and routers (llama-quantize's mix)."""
    from gguf2ov.tools.gguf_writer import write_gguf

    folder = tmp_path_factory.mktemp("gpt_oss_gguf")
    path = folder / "gpt-oss-MXFP4_MOE.gguf"
    write_gguf(write_llamacpp_layout(gpt_oss_hf, folder / "llamacpp"), path, "gpt-oss", mix="MXFP4_MOE",
               extra_metadata={"gpt-oss.vocab_size": tb.VOCAB})
    return path


def _transformers_on(source, hf):
    """transformers' model of `hf`'s config holding the source's values, in its own layout."""
    import torch

    model = _transformers(hf)
    state = {}
    for name in source.expected:
        x = np.array(source.f32(name))
        if name.endswith(("experts.gate_up_nk", "experts.down_nk")):  # [E, N, K] -> transformers' [E, K, N]
            name, x = name.removesuffix("_nk") + "_proj", x.swapaxes(-1, -2)
        state[name] = torch.from_numpy(np.ascontiguousarray(x))
    assert not model.load_state_dict(state, strict=False).missing_keys
    return model


def test_a_gguf_with_mxfp4_experts_matches_transformers_on_its_values(tmp_path, mxfp4_gguf, gpt_oss_hf, gpt_oss_ir,
                                                                     fixtures_dir):
    """`gguf2ov target FILE.gguf`: two stateful steps against transformers holding the file's dequantized
    weights (1e-5); the experts stay compressed on the two GatherMatmul a layer (as ggml's doubled E2M1 values
    in i8, the file's values exactly: GatherMatmul compresses no f4e2m1 in 2026.4.1, benchmarks/mxfp4.md);
    the MXFP4 rounding itself
    (and Q8_0's) moves the logits far from the checkpoint's (0.64 of their largest on this random model,
    whose experts' weights are 5x the others'): the file's rounding, which the IR carries, not its own."""
    from gguf2ov.gguf.read import open_gguf
    from opened import build_target, open_target

    types = {n: t.qtype.name for n, t in open_gguf(mxfp4_gguf).tensors.items()}
    assert {types[f"blk.0.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")} == {"MXFP4"}
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == "Q8_0"
    assert {types["blk.0.ffn_gate_inp.weight"], types["blk.0.attn_sinks.weight"], types["blk.0.ffn_up_exps.bias"]} \
        == {"F32"}
    result = build_target(mxfp4_gguf, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    assert result.weight_format == "gguf"
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    xml = tmp_path / "t" / "openvino_model.xml"
    worst = tb.worst_against_transformers(xml, _transformers_on(open_target(mxfp4_gguf), gpt_oss_hf))
    assert max(worst.values()) < 1e-5, worst
    kinds, weights = tb.runtime_kinds(xml)
    assert kinds["GatherMatmul"] == 2 * GPT_OSS["num_hidden_layers"] and set(weights) == {"i8"}
    steps = tb.steps(tb.VOCAB)
    rounded = tb.relative(tb.run_steps(xml, steps)[0][0], tb.run_steps(gpt_oss_ir, steps)[0][0])
    assert rounded > 1e-2, rounded  # what the 1e-5 against the file's values tells apart


def test_a_large_target_is_checked_on_a_probe_of_its_kinds_and_forms(tmp_path, mxfp4_gguf, fixtures_dir,
                                                                      monkeypatch):
    """Above the compile budget, the check compiles a small model of the target's distinct layers, with the
    same kinds (sliding and full attention with sinks, the clamped experts) and MXFP4 experts."""
    from gguf2ov.targets import probe
    from opened import build_target

    monkeypatch.setattr(probe, "COMPILE_BUDGET", 0)
    result = build_target(mxfp4_gguf, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    finding = {c.name: c for c in result.checks}["target-compiled"]
    assert finding.status == "pass", finding.reason
    assert finding.reason.startswith("4 GatherMatmul, no Tile or ScatterElementsUpdate, stateful and paged (fused "
                                     "weights: 4 i8)"), finding.reason
    # a sliding layer and a full one: the third is a sliding layer of the same forms again
    assert "checked on a 2-layer model of the target's layer kinds and weight forms (standing for layers 0, 1" in \
        finding.reason


# --- bad input -----------------------------------------------------------------------------------------

def _bad_gguf(tmp_path, hf, name, metadata=None, drop=()):
    """The checkpoint as an F32 gpt-oss GGUF with metadata overridden or tensors (by the map's HF name) left out."""
    from safetensors.numpy import load_file, save_file

    from gguf2ov.tools.gguf_writer import write_gguf

    layout = write_llamacpp_layout(hf, tmp_path / f"{name}-layout")
    weights = load_file(layout / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k not in drop}, layout / "model.safetensors")
    path = tmp_path / f"{name}.gguf"
    write_gguf(layout, path, "gpt-oss", mix="F32", extra_metadata={"gpt-oss.vocab_size": tb.VOCAB, **(metadata or {})})
    return path


def _bad_checkpoint(tmp_path, hf, name, config=None, replace=None):
    import shutil

    from safetensors.numpy import load_file, save_file

    out = tmp_path / name
    shutil.copytree(hf, out)
    save_file(load_file(hf / "model.safetensors") | (replace or {}), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(tb.config_of(hf) | (config or {})))
    return out


BAD = {
    "GGUF: RoPE scaling llama.cpp's gpt-oss does not use": (
        lambda t, hf: _bad_gguf(t, hf, "rope", metadata={"gpt-oss.rope.scaling.type": "longrope"}),
        "gpt-oss.rope.scaling.type holds 'longrope'; the gpt-oss map knows ['none', 'yarn']"),
    "GGUF: no sinks": (
        lambda t, hf: _bad_gguf(t, hf, "sinks", drop=("model.layers.1.self_attn.sinks",)),
        "blk.1.attn_sinks.weight"),
    "GGUF: a top k above the expert count": (
        lambda t, hf: _bad_gguf(t, hf, "topk", metadata={"gpt-oss.expert_used_count": 5}),
        "num_experts_per_tok is 5, above num_local_experts 4"),
    "checkpoint: experts of another width": (
        lambda t, hf: _bad_checkpoint(t, hf, "width", config={"intermediate_size": 48}),
        "model.layers.0.mlp.experts.gate_up_proj (4, 64, 64) != (4, 64, 96)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_gpt_oss_input_is_one_error_line_and_no_folder(tmp_path, gpt_oss_hf, fixtures_dir, capsys, case):
    from gguf2ov.cli import main

    make, message = BAD[case]
    source = make(tmp_path, gpt_oss_hf)
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(source), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and not any("Traceback" in line for line in err)
    assert message in err[0], err[0]
    assert not out.exists()


# --- against llama.cpp (tests/data, made by benchmarks/llamacpp/gpt_oss.py) ------------------------------

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt-oss-tiny"
LLAMACPP_RECORD = Path(__file__).resolve().parents[1] / "data" / "gpt-oss-llamacpp.json"


def test_the_writer_writes_llama_quantizes_mxfp4_moe_byte_for_byte(tmp_path):
    """The trained tiny model's checkpoint through the writer's MXFP4_MOE: every tensor of llama.cpp's own
    file (its converter, then llama-quantize MXFP4_MOE) by name, type and bytes."""
    from gguf import GGUFReader

    from gguf2ov.tools.gguf_writer import write_gguf

    path = tmp_path / "ours.gguf"
    write_gguf(write_llamacpp_layout(TINY, tmp_path / "layout"), path, "gpt-oss", mix="MXFP4_MOE")
    theirs = {t.name: t for t in GGUFReader(TINY / "llamacpp-MXFP4_MOE.gguf").tensors}
    ours = {t.name: t for t in GGUFReader(path).tensors}
    assert sorted(ours) == sorted(theirs)
    assert {t.tensor_type.name for n, t in theirs.items() if "_exps.weight" in n} == {"MXFP4"}
    for name, t in theirs.items():
        assert ours[name].tensor_type == t.tensor_type, name
        assert ours[name].data.tobytes() == t.data.tobytes(), name


def test_the_target_of_llamacpps_file_gives_its_greedy_text(tmp_path):
    """`gguf2ov target` on llama.cpp's own MXFP4_MOE file (its tokenizer from the file): GenAI's greedy
    text (stateful, f32) is llama-simple's on every fixture prompt, as recorded."""
    import openvino_genai as ov_genai

    from gguf2ov.runtime.genai import F32_HINT
    from opened import build_target

    record = json.loads(LLAMACPP_RECORD.read_text())
    result = build_target(TINY / "llamacpp-MXFP4_MOE.gguf", tmp_path / "t")
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    pipe = ov_genai.LLMPipeline(str(tmp_path / "t"), "CPU", ATTENTION_BACKEND="SDPA", **F32_HINT)
    config = pipe.get_generation_config()
    config.max_new_tokens, config.do_sample = record["new_tokens"], False
    assert [pipe.generate(p, config) for p in record["prompts"]] == record["texts"]


# --- in OpenVINO GenAI, with a DFlash draft attached ---------------------------------------------------

@pytest.mark.slow
def test_genai_runs_the_target_with_a_dflash_draft_attached(tmp_path, fixtures_dir):
    """A random DFlash draft (taps at layers 0 and 2, both sliding) attached to the target in GenAI's
    continuous-batching pipeline, where the target is paged (PagedAttention with its sinks and windows,
    GatherMatmul experts): the greedy text with the draft is the paged target's alone, on every fixture
    prompt, and that is the stateful target's (LLMPipeline on the SDPA backend: the IR as built)."""
    import openvino_genai as ov_genai

    from gguf2ov.runtime.genai import F32_HINT, GenerationSettings, read_prompts
    from gguf2ov.runtime.target import TargetIR
    from gguf2ov.stages.accept import run_acceptance, target_alone
    from opened import build_target

    hf = write_gpt_oss(tmp_path / "hf", vocab=512)  # the fixture tokenizer's
    result = build_target(hf, tmp_path / "target", tokenizer_dir=fixtures_dir / "target-hf")
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    tb.random_dflash_draft(tmp_path, GPT_OSS["hidden_size"], [0, 2])
    prompts = read_prompts(fixtures_dir / "prompts.txt")
    settings = GenerationSettings(max_new_tokens=24, num_assistant_tokens=5, precision="f32")
    target = TargetIR.open(tmp_path / "target")
    baseline = target_alone(target, prompts, settings, progress=False)
    r = run_acceptance(target, tmp_path / "draft", prompts, settings, baseline=baseline, progress=False)
    assert r.overall.identical, [p.first_difference for p in r.prompts]
    stateful = ov_genai.LLMPipeline(str(tmp_path / "target"), "CPU", ATTENTION_BACKEND="SDPA", **F32_HINT)
    config = stateful.get_generation_config()
    config.max_new_tokens, config.do_sample = 24, False
    paged = [runs[0].text for runs in baseline.runs]
    assert [stateful.generate(p.text, config) for p in prompts] == paged
    assert all(len(stateful.get_tokenizer().encode(p.text).input_ids.data[0]) > GPT_OSS["sliding_window"]
               for p in prompts)

"""Small target LMs for the target tests: random checkpoints of each architecture, optimum-intel's
export of them (the reference), and the same stateful steps run through any target IR.

Geometries cover what the builder must get right: GQA ratios 2, 3, 4 and 8, head_dim other than
hidden / heads, tied and untied heads, biases (qwen2's q/k/v, llama's attention and MLP), Llama 3
and YaRN RoPE scaling, sliding-window layers (qwen2, gemma3, and mistral's every layer), Gemma's
(1 + w) norms, four norms per layer, scaled embedding, query_pre_attn_scalar and final logit
softcapping, and mixtures of experts (renormalised or not, a dense layer among them).
"""

import json
from collections import Counter
from pathlib import Path

import numpy as np

FIXTURE_TARGET = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-dflash" / "target-hf"

GEOMETRIES = {
    # GQA 3, head_dim 24 != 96 / 6, untied head
    "qwen3-untied-gqa3": dict(model_type="qwen3", hidden_size=96, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False),
    # GQA 8, head_dim 16 != 64 / 8, Llama 3 RoPE, biases on attention and MLP
    "llama3-gqa8-bias": dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False,
                             attention_bias=True, mlp_bias=True,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    # YaRN RoPE: its attention scaling multiplies cos and sin; tied head
    "qwen3-yarn-tied": dict(model_type="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    # GQA 2, tied head, q/k/v biases, layers 1 and 2 sliding (window 5 < the 7-token first step)
    "qwen2-tied-sliding": dict(model_type="qwen2", hidden_size=96, intermediate_size=128, num_hidden_layers=3,
                               num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=True,
                               use_sliding_window=True, sliding_window=5, max_window_layers=1),
    # Gemma 3: sliding / full / sliding layers (window 4), local and global RoPE bases, head_dim 24,
    # query_pre_attn_scalar 32, final logit softcapping
    # Gemma 1 (a map and this geometry are all it took): MQA, head_dim 32 != 96 / 4, GeGLU, (1 + w) norms,
    # scaled embedding, tied head
    "gemma-mqa": dict(model_type="gemma", hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                      hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    "gemma3-sliding-softcap": dict(model_type="gemma3_text", hidden_size=96, intermediate_size=128,
                                   num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=24,
                                   query_pre_attn_scalar=32, sliding_window=4, final_logit_softcapping=30.0,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   tie_word_embeddings=True),
    # Mistral (a map and this geometry are all it took): every layer sliding (window 4 < the 7-token first
    # step), GQA 4, head_dim 16 != 64 / 8, untied head
    "mistral-sliding": dict(model_type="mistral", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=16, sliding_window=4,
                            tie_word_embeddings=False),
    # mixtures of experts (qwen3_moe): 8 experts, top 2, renormalised, untied head
    "qwen3moe-top2-untied": dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=96,
                                 moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 tie_word_embeddings=False),
    # top 3 of 6 not renormalised, layer 2 dense (mlp_only_layers), GQA 4, head_dim 24, tied head
    "qwen3moe-dense-layer-tied": dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=80,
                                      moe_intermediate_size=48, num_experts=6, num_experts_per_tok=3,
                                      norm_topk_prob=False, mlp_only_layers=[2], num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                                      tie_word_embeddings=True),
}
VOCAB = 300


def write_target_checkpoint(path: Path, geometry: dict, seed: int = 0, dtype=None, vocab: int = VOCAB) -> Path:
    """A random target checkpoint whose weights look trained enough to tell layers apart (`vocab`: the
    fixture tokenizer's 512 for a target GenAI runs)."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    spec = dict(geometry)
    config = CONFIG_MAPPING[spec.pop("model_type")](vocab_size=vocab, max_position_embeddings=256, **spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    gemma = config.model_type in ("gemma", "gemma3_text")
    hybrid = config.model_type.startswith("qwen3_5")  # (1 + w) norms but the gated one, and recurrences
    with torch.no_grad():
        for name, p in model.named_parameters():
            if hybrid and name.endswith(("linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.norm.weight")):
                p.copy_(_recurrent_init(name, p))
                continue
            # Gemma's, Gemma 3's and Qwen3.5's norms multiply by (1 + w): theirs start near 0, the others' near 1
            p.copy_(0.2 * torch.randn_like(p) + (1.0 if "norm" in name and not (gemma or hybrid) else 0.0))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4's output scale of each layer, saved with the weights
                b.copy_(0.5 + torch.rand_like(b))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    return path


def _recurrent_init(name: str, p):
    """A Gated DeltaNet layer's decay (A_log: -exp(A_log) between -4.2 and -0.2), its bias and its gated
    norm (w, near 1) as transformers initialises them, spread so that a head order error shows."""
    import torch

    if name.endswith("A_log"):
        return torch.log(0.2 + 4 * torch.rand_like(p))
    return torch.randn_like(p) if name.endswith("dt_bias") else 1 + 0.3 * torch.randn_like(p)


def optimum_export(hf_dir: Path, out: Path) -> Path:
    """optimum-intel 2.2.0's `text-generation-with-past` export in float32.

    optimum-intel 2.2.0 refuses gemma and gemma3_text with transformers > 5.0 (their config classes
    state MAX_TRANSFORMERS_VERSION 5.0); the limit is lifted for the export, whose trace the tests hold
    to transformers' own model (test_target_graph.py)."""
    from optimum.exporters.openvino import main_export, model_configs
    from optimum.intel import OVConfig

    capped = [model_configs.GemmaOpenVINOConfig, model_configs.Gemma3TextOpenVINOConfig]
    limits = [c.__dict__.get("MAX_TRANSFORMERS_VERSION") for c in capped]
    for c in capped:
        c.MAX_TRANSFORMERS_VERSION = "5.99"
    try:
        main_export(str(hf_dir), str(out), task="text-generation-with-past", ov_config=OVConfig(dtype="fp32"))
    finally:
        for c, limit in zip(capped, limits):
            if limit is None:
                del c.MAX_TRANSFORMERS_VERSION
            else:
                c.MAX_TRANSFORMERS_VERSION = limit
    return out


def random_dflash_draft(work: Path, hidden_size: int, layer_ids: list[int], vocab: int = 512) -> Path:
    """A random DFlash draft of the fixture's geometry, `hidden_size` wide, tapping `layer_ids`, exported to
    `work`/draft: what the target tests attach in GenAI (random weights: the text must stay the target's)."""
    import dflash_builders as b

    from gguf2ov.job import Job, Options

    config = json.loads(json.dumps(b.DRAFT_CONFIG))
    config.update(hidden_size=hidden_size, vocab_size=vocab)
    config["dflash_config"] = {"target_layer_ids": list(layer_ids), "mask_token_id": 1, "block_size": 8}
    b.random_checkpoint(config, work / "draft-hf")
    Job.of(work / "draft-hf", None, Options(progress=False)).export(work / "draft")
    return work / "draft"


def steps(vocab: int, lengths=(7, 3), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).astype(np.int64) for n in lengths]


def run_steps(xml, token_steps, layers: dict[int, str] | None = None, properties: dict | None = None):
    """[(logits [1, L, V], {layer: hidden [1, L, H]})] for stateful steps over `token_steps`, with
    the hidden states at the producers `layers` names, compiled in float32 with dynamic
    quantization off (numerics.compile_exact) and `properties` on top."""
    import openvino as ov

    from gguf2ov.numerics import EXACT, core

    model = ov.Core().read_model(str(xml))
    nodes = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    layers = layers or {}
    model.add_outputs([nodes[name].output(0) for name in layers.values()])
    compiled = core().compile_model(model, "CPU", {**EXACT, **(properties or {})})
    request = compiled.create_infer_request()
    out, past = [], 0
    for ids in token_steps:
        n = len(ids)
        result = request.infer({"input_ids": ids[None], "attention_mask": np.ones((1, past + n), np.int64),
                                "position_ids": np.arange(past, past + n)[None], "beam_idx": np.zeros(1, np.int32)})
        hidden = {i: np.array(result[compiled.outputs[1 + k]]) for k, i in enumerate(layers)}
        out.append((np.array(result[compiled.outputs[0]]), hidden))
        past += n
    return out


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def locators(xml) -> dict[int, str]:
    import openvino as ov

    from gguf2ov.runtime.target import read_locators

    return {i: v["producer"] for i, v in read_locators(ov.Core().read_model(str(xml))).items()}


def optimum_locators(hf_dir: Path, xml) -> dict[int, str]:
    """optimum-intel's hidden-state locators of its own export (it writes them for qwen3 only; for the
    other architectures its discovery is run on the export, with the PyTorch model it came from)."""
    import openvino as ov
    from optimum.exporters.openvino.utils_annotations import discover_hidden_state_rt_info
    from transformers import AutoModelForCausalLM

    model = ov.Core().read_model(str(xml))
    if model.has_rt_info("hidden_states_decoder_layers"):
        return locators(xml)
    source = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    found = discover_hidden_state_rt_info(source, model, source.config)["layers"]
    return {int(i): v["producer"] for i, v in found.items()}


def paged_summary(xml) -> dict:
    """What OpenVINO's SDPAToPagedAttention (run by GenAI when a draft is attached) makes of a target:
    inputs, outputs, and per paged attention its scale, sliding window and head geometry."""
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation
    from openvino.passes import ConstantFolding, Manager

    model = ov.Core().read_model(str(xml))
    paged_attention_transformation(model)

    def value(output):
        sub = ov.Model([ov.opset13.result(output)], [], "value").clone()
        manager = Manager()
        manager.register_pass(ConstantFolding())
        manager.run_passes(sub)
        node = sub.get_results()[0].input_value(0).get_node()
        return np.array(node.get_data()).reshape(-1).tolist() if node.get_type_name() == "Constant" else None

    attention = []
    for op in model.get_ordered_ops():
        if op.get_type_name() == "PagedAttentionExtension":
            rt = op.get_rt_info()
            geometry = [int(rt[k].astype(int)) for k in ("num_k_heads", "k_head_size", "num_v_heads", "v_head_size")]
            attention.append((value(op.input_value(9)), value(op.input_value(10)), geometry))

    def ports(ps):
        return sorted((p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name()) for p in ps)

    return {"inputs": ports(model.inputs), "outputs": ports(model.outputs), "attention": attention,
            "states": len(model.get_variables())}


def interface(xml) -> dict:
    import openvino as ov

    model = ov.Core().read_model(str(xml))

    def ports(ps):
        return [(sorted(p.get_names()), str(p.get_partial_shape()), p.get_element_type().get_type_name()) for p in ps]

    variables = sorted((v.get_info().variable_id, str(v.get_info().data_shape), v.get_info().data_type.get_type_name())
                       for v in model.get_variables())
    return {"inputs": ports(model.inputs), "outputs": ports(model.outputs), "variables": variables}


def config_of(hf_dir: Path) -> dict:
    return json.loads((Path(hf_dir) / "config.json").read_text())


def runtime_kinds(xml, paged: bool = False, properties=None):
    """(layer types of the CPU plugin's runtime model, the element types of the GatherMatmul weights)."""
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    model = ov.Core().read_model(str(xml))
    if paged:
        paged_attention_transformation(model)
    ops = ov.Core().compile_model(model, "CPU", properties or {}).get_runtime_model().get_ordered_ops()
    kinds = Counter(op.get_rt_info()["layerType"].astype(str) for op in ops)
    weights = Counter(op.input_value(1).get_element_type().get_type_name() for op in ops
                      if op.get_rt_info()["layerType"].astype(str) == "GatherMatmul")
    return kinds, weights


def target_ir(hf_dir: Path, out: Path, variant: str = "fp32") -> Path:
    """gguf2ov's target graph of a checkpoint (or GGUF) saved into `out`, without the command's checks
    and extras: the path of its openvino_model.xml."""
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.ir.weights import save_ir
    from gguf2ov.targets.graph import build_target_ir, target_forms
    from opened import open_target

    out.mkdir(parents=True, exist_ok=True)
    forms = target_forms(open_target(hf_dir), parse_variant(variant))
    save_ir(build_target_ir(forms), out, forms)
    return out / "openvino_model.xml"


def worst_against_transformers(xml, model, vocab: int | None = None) -> dict:
    """The largest relative difference of the logits and of every locator's output, each of the two
    stateful steps against the same positions of transformers' one forward over both (`vocab`: the
    text model's, where the model's config states none at its top, a VLM's)."""
    import torch

    token_steps = steps(vocab or model.config.vocab_size)
    with torch.no_grad():
        ref = model(torch.tensor(np.concatenate(token_steps))[None], output_hidden_states=True)
    runs = run_steps(xml, token_steps, locators(xml), properties={"KV_CACHE_PRECISION": "f32"})
    worst, start = {}, 0
    for logits, hidden in runs:
        span = slice(start, start + logits.shape[1])
        worst["logits"] = max(worst.get("logits", 0), relative(logits, ref.logits.numpy()[:, span]))
        for i, h in hidden.items():
            worst[i] = max(worst.get(i, 0), relative(h, ref.hidden_states[i + 1].numpy()[:, span]))
        start = span.stop
    return worst

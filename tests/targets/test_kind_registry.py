"""A new kind of layer is one module and one registry line; a new decoder-layer shape is a map section.

Two kinds that gguf2ov does not ship are written here, each registered by its class statement (the
one line `layers/__init__.py` would hold for a shipped kind): a squared-ReLU MLP (role `mlp`) and a
per-layer output scale (role `block`, placed by the map's `layer` steps after the residual adds, as
Gemma 4's layer scalar is). A map in a folder named by GGUF2OV_MAPS builds a decoder of them, a GGUF
of that architecture becomes a target IR, the IR passes the checks `gguf2ov target` runs, and its
logits and every locator equal transformers' LlamaForCausalLM with the same two changes, over two
stateful steps. Nothing in the package changes for it.
"""

import numpy as np
import pytest
import target_builders as tb
from ggufs import decoder_kv, decoder_tensors, write_gguf

from gguf2ov.ir.graph_ops import const, linear, named
from gguf2ov.ir.graph_ops import ops as _ops
from gguf2ov.targets.layers import REGISTRY, LayerKind, layer_prefix

MAP = """
# A Llama decoder whose MLP is down(relu(up(x))^2) and whose layers end with a learned scale.
arch: toyscaled
extends: _decoder.yaml
hf: {architectures: [LlamaForCausalLM], model_type: llama}
unset: {tensors: ["blk.{N}.ffn_gate.weight"]}
tensors:
  blk.{N}.layer_output_scale.weight: model.layers.{N}.layer_scalar
target:
  mixers: {full_attention: attention}
  mlp: relu2_mlp
  layer:
    - {block: mixer, norm: input_layernorm}
    - {block: mlp, norm: post_attention_layernorm}
    - {block: layer_scale, residual: false}
"""


@pytest.fixture(scope="module")
def new_kinds():
    """The two kinds, registered for this module's tests (and taken out after)."""

    class SquaredReluMLP(LayerKind, name="relu2_mlp", role="mlp"):
        def tensors(self, c, i):
            p, h, inter = layer_prefix(i) + "mlp.", c.hidden_size, c.intermediate_size
            return {p + "up_proj.weight": (inter, h), p + "down_proj.weight": (h, inter)}

        def names(self, options):
            return {"mlp.up_proj.weight": True, "mlp.down_proj.weight": True}

        def build(self, g, x, i):
            ops, p = _ops(), layer_prefix(i) + "mlp."
            up = ops.relu(linear(x, g.weight(p + "up_proj.weight"), p + "up_proj"))
            return linear(ops.multiply(up, up), g.weight(p + "down_proj.weight"), p + "down_proj")

    class LayerScale(LayerKind, name="layer_scale", role="block"):
        def tensors(self, c, i):
            return {layer_prefix(i) + "layer_scalar": (1,)}

        def names(self, options):
            return {"layer_scalar": True}

        def build(self, g, x, i):
            name = layer_prefix(i) + "layer_scalar"
            return named(_ops().multiply(x, const(g.vector(name))), f"__module.{name}/aten::mul/Multiply")

    yield SquaredReluMLP, LayerScale
    del REGISTRY["relu2_mlp"], REGISTRY["layer_scale"]


@pytest.fixture
def toy_gguf(tmp_path, monkeypatch, new_kinds):
    from gguf2ov.maps.load import MAPS_ENV

    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "toyscaled.yaml").write_text(MAP)
    monkeypatch.setenv(MAPS_ENV, str(maps))
    rng = np.random.default_rng(5)
    names = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down"]
    tensors = {k: 0.3 * v for k, v in decoder_tensors(rng, names).items()}
    for n in range(2):
        for norm in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{n}.{norm}.weight"] = 1 + tensors[f"blk.{n}.{norm}.weight"]
        tensors[f"blk.{n}.layer_output_scale.weight"] = np.array([0.5 + n], np.float32)
    write_gguf(tmp_path / "toy.gguf", "toyscaled", decoder_kv("toyscaled"), tensors)
    return tmp_path / "toy.gguf"


def _transformers_twin(source):
    """LlamaForCausalLM with the GGUF's weights, each MLP squared-ReLU and each layer's output scaled."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    class SquaredRelu(torch.nn.Module):
        def __init__(self, h, inter):
            super().__init__()
            self.up_proj = torch.nn.Linear(h, inter, bias=False)
            self.down_proj = torch.nn.Linear(inter, h, bias=False)

        def forward(self, x):
            return self.down_proj(torch.relu(self.up_proj(x)) ** 2)

    c = source.config
    model = LlamaForCausalLM(LlamaConfig.from_dict(c.raw)).eval()
    weights = {n: torch.from_numpy(np.array(source.f32(n))) for n in source.expected}
    for i, layer in enumerate(model.model.layers):
        layer.mlp = SquaredRelu(c.hidden_size, c.intermediate_size)
        scale = weights.pop(f"model.layers.{i}.layer_scalar")
        layer.forward = (lambda forward, s: lambda *a, **k: forward(*a, **k) * s)(layer.forward, scale)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied
    return model


def test_a_new_kind_is_one_module_and_a_map_builds_it(tmp_path, toy_gguf, new_kinds):
    import openvino as ov

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.ir.weights import save_ir
    from gguf2ov.targets.checks import target_findings
    from gguf2ov.targets.graph import build_target_ir, target_forms
    from gguf2ov.targets.source import open_target_gguf

    source = open_target_gguf(open_gguf(toy_gguf))
    assert (source.config.mlp, [s.block for s in source.config.layer]) == ("relu2_mlp", ["mixer", "mlp", "layer_scale"])
    assert list(source.expected)[1:9] == [
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"]
    forms = target_forms(source, parse_variant("fp32"))
    save_ir(build_target_ir(forms), tmp_path / "ir", forms)
    xml = tmp_path / "ir" / "openvino_model.xml"
    findings = target_findings(ov.Core().read_model(str(xml)), source.config)
    assert [f.name for f in findings if f.status != "pass"] == [], [f.reason for f in findings]
    worst = tb.worst_against_transformers(xml, _transformers_twin(source))
    assert max(worst.values()) <= 1e-5, worst
    assert set(worst) == {"logits", 0, 1}


def test_a_map_of_the_new_kinds_is_held_against_them(tmp_path, toy_gguf, new_kinds):
    """Without the scale tensor in the map, it is refused when read, naming what the kind reads."""
    from gguf2ov.errors import Gguf2ovError
    from gguf2ov.maps.load import load_map
    from gguf2ov.targets.decoder import decoder_of

    assert decoder_of(load_map("toyscaled")).layer[-1].block == "layer_scale"
    bad = tmp_path / "bad.yaml"
    bad.write_text(MAP.replace("tensors:\n  blk.{N}.layer_output_scale.weight: model.layers.{N}.layer_scalar\n", ""))
    with pytest.raises(Gguf2ovError, match=r"the map names no tensor for model.layers.\{N\}.layer_scalar, which the "
                                           r"full_attention layers' kinds \(attention, relu2_mlp, layer_scale\) read"):
        decoder_of(load_map(path=bad))

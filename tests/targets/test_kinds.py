"""The layer-kind contract holds every kind: each is a LayerKind registered under the name maps use,
its module defines the kind and nothing else public, and the kind defines only the contract's hooks,
so a misspelt hook is a failing test rather than a hook that silently never runs."""

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

from gguf2ov.targets.decoder import PRE_NORM, Step, decoder_of, layer_steps
from gguf2ov.targets.layers import REGISTRY
from gguf2ov.targets.layers.kind import CONTRACT, ROLES, LayerKind

# every kind the package registers (`layers/__init__.py`'s line), not those a test registers for itself
SHIPPED = sorted(name for name, kind in REGISTRY.items() if type(kind).__module__.startswith("gguf2ov.targets.layers."))


def _module_names(module) -> set[str]:
    """The public names a module defines itself (top-level defs, classes, assignments), imports aside."""
    tree = ast.parse(inspect.getsource(module))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def test_the_shipped_kinds_are_registered_by_their_map_names():
    # every kind module registers its kind (a module left off the registry line registers none)
    folder = Path(importlib.import_module("gguf2ov.targets.layers").__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "kind", "pieces"}
    assert sorted(type(REGISTRY[name]).__module__.rsplit(".", 1)[1] for name in SHIPPED) == sorted(modules)
    for name, kind in REGISTRY.items():
        assert isinstance(kind, LayerKind) and kind.NAME == name and kind.ROLE in ROLES


@pytest.mark.parametrize("name", SHIPPED)
def test_a_kind_module_defines_its_kind_and_nothing_else_public(name):
    kind = type(REGISTRY[name])
    module = importlib.import_module(kind.__module__)
    assert _module_names(module) == {kind.__name__}, f"{module.__name__} defines public names beyond its kind"
    defined = {n for n in vars(kind) if not n.startswith("_")}
    assert defined <= CONTRACT, f"{kind.__name__} defines {sorted(defined - CONTRACT)}, which the contract has not"


def test_a_misspelt_hook_is_seen(tmp_path):
    """The check above on a kind whose author wrote `int8_weight` for `int8_weights`."""
    source = tmp_path / "misspelt_kind.py"
    source.write_text("from gguf2ov.targets.layers.kind import LayerKind\n\n\n"
                      "class Misspelt(LayerKind):\n"
                      "    def tensors(self, c, i):\n        return {}\n\n"
                      "    def build(self, g, x, i):\n        return x\n\n"
                      "    def int8_weight(self, c, i):\n        return ['a']\n")
    spec = importlib.util.spec_from_file_location("misspelt_kind", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {n for n in vars(module.Misspelt) if not n.startswith("_")} - CONTRACT == {"int8_weight"}
    assert module.Misspelt().int8_weights(None, 0) == []  # the contract's default: what the typo would have run


def test_every_hook_has_a_default_but_tensors_build_and_names():
    with pytest.raises(TypeError, match="layer kind bare does not state tensors or build or names"):
        class Bare(LayerKind, name="bare", role="mlp"):
            pass
    with pytest.raises(TypeError, match="does not state build or names"):
        class Half(LayerKind, name="half", role="mlp"):
            def tensors(self, c, i):
                return {}
    assert "bare" not in REGISTRY and "half" not in REGISTRY


class _Stated(LayerKind):
    """States every hook a kind must; without a name it registers nothing (an intermediate class)."""

    def tensors(self, c, i):
        return {}

    def build(self, g, x, i):
        return x

    def names(self, options):
        return {}


def test_a_kind_is_registered_once_and_in_a_known_role():
    with pytest.raises(TypeError, match="registered twice"):
        class Again(_Stated, name="attention", role="mixer"):
            pass
    with pytest.raises(TypeError, match="role 'mixing'"):
        class Odd(_Stated, name="odd", role="mixing"):
            pass
    assert "odd" not in REGISTRY and type(REGISTRY["attention"]).__name__ == "Attention"


def _target_map(tmp_path, target: str):
    from gguf2ov.maps.load import load_map

    path = tmp_path / "toy.yaml"
    path.write_text(f"arch: toy\nextends: _decoder.yaml\nhf: {{model_type: llama}}\ntarget:\n{target}")
    return load_map(path=path)


@pytest.mark.parametrize("mixers, mlp, unknown", [("{full_attention: attention, x: mamba}", "dense", "mamba"),
                                                  ("{full_attention: attention}", "swiglu2", "swiglu2"),
                                                  ("{full_attention: dense}", "dense", "dense"),  # an MLP as mixer
                                                  ("{full_attention: attention}", "attention", "attention")])
def test_a_map_naming_an_unknown_kind_is_refused(tmp_path, mixers, mlp, unknown):
    from gguf2ov.errors import Gguf2ovError

    with pytest.raises(Gguf2ovError) as e:
        decoder_of(_target_map(tmp_path, f"  mixers: {mixers}\n  mlp: {mlp}\n"))
    assert f"the toy map builds its layers with {unknown}, which this gguf2ov does not know" in e.value.message
    assert "mixers: attention, gated_attention, gated_deltanet" in e.value.message and "fix the map" in e.value.hint


@pytest.mark.parametrize("target, needle", [
    ("  forward: {qk_norms: true}\n", "forward: qk_norms is not an option of this decoder or its kinds (attention, "
                                     "dense); known: norm_offset, partial_rotary, qk_norm, qkv_bias, scaled_embedding"),
    ("  layer: [{block: mixer, norm: input_layernorm}]\n", "layer must have one mixer step, then one mlp step"),
    ("  layer: [{block: attention}, {block: mlp}]\n", "a step is {block, norm, post_norm, residual}, block one of "
                                                       "layer_scalar, mixer, mlp"),
    ("  layer: [{block: mixer, pre_norm: x}, {block: mlp}]\n", "layer step {'block': 'mixer', 'pre_norm': 'x'}"),
    ("  head_dim: [global_head_dim]\n", "head_dim maps layer types to config keys"),
    ("  rope_factors: [sliding_attention]\n", "rope_factors lists layer types")])
def test_a_target_section_the_decoder_cannot_build_is_one_error_naming_the_map(tmp_path, target, needle):
    from gguf2ov.errors import Gguf2ovError

    with pytest.raises(Gguf2ovError) as e:
        decoder_of(_target_map(tmp_path, "  mixers: {full_attention: attention}\n  mlp: dense\n" + target))
    assert e.value.message.startswith(f"tensor map {tmp_path / 'toy.yaml'}: target: ") and needle in e.value.message


@pytest.mark.parametrize("sliding, window, types", [
    ("every_layer", 5, ["sliding_attention"] * 2), ("every_layer", None, ["full_attention"] * 2),
    ("by_layer_types", 5, ["full_attention"] * 2)])
def test_which_layers_slide_when_a_config_states_no_layer_types(tmp_path, monkeypatch, sliding, window, types):
    """MistralConfig states no layer_types: the map says that its window, when set, is every layer's."""
    from gguf2ov.maps.load import MAPS_ENV, load_map
    from gguf2ov.targets.config import target_config

    (tmp_path / "toy.yaml").write_text("arch: toy\nextends: _decoder.yaml\nhf: {model_type: mistral}\ntarget:\n"
                                       "  mixers: {full_attention: attention, sliding_attention: attention}\n"
                                       f"  mlp: dense\n  sliding: {sliding}\n")
    monkeypatch.setenv(MAPS_ENV, str(tmp_path))
    raw = dict(model_type="mistral", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2,
               vocab_size=300, sliding_window=window)
    c = target_config(raw, "toy", load_map("toy"))
    assert list(c.layer_types) == types and c.sliding_window == (window if "sliding_attention" in types else None)


def test_a_sliding_rule_the_decoder_does_not_know_is_refused(tmp_path):
    from gguf2ov.errors import Gguf2ovError

    with pytest.raises(Gguf2ovError, match="sliding is 'some_layers', not one of by_layer_types, every_layer"):
        decoder_of(_target_map(tmp_path, "  mixers: {full_attention: attention}\n  mlp: dense\n  sliding: some_layers\n"))


def test_the_decoder_layer_is_the_maps_and_llamas_by_default():
    from gguf2ov.maps.load import load_map

    assert decoder_of(load_map("qwen3")).layer == PRE_NORM
    assert decoder_of(load_map("gemma3")).layer == (
        Step("mixer", "input_layernorm", "post_attention_layernorm"),
        Step("mlp", "pre_feedforward_layernorm", "post_feedforward_layernorm"))
    assert decoder_of(load_map("qwen3")).options == {"norm_offset": 0.0, "scaled_embedding": False,
                                                     "partial_rotary": False, "qk_norm": True, "qkv_bias": False,
                                                     "sinks": False}


def test_only_the_gated_deltanet_keeps_a_recurrent_state():
    assert {n for n, k in REGISTRY.items() if k.RECURRENT} == {"gated_deltanet"}


def test_a_layers_kinds_are_its_steps():
    from types import SimpleNamespace

    c = SimpleNamespace(mixers=("gated_deltanet", "gated_attention"), mlp="moe", num_layers=2, layer=PRE_NORM)
    assert [(s.norm, k.NAME) for s, k in layer_steps(c, 1)] == [("input_layernorm", "gated_attention"),
                                                                ("post_attention_layernorm", "moe")]


@pytest.mark.parametrize("config, layers", [
    ({"model_type": "qwen3_5_text", "num_hidden_layers": 4,
      "layer_types": ["linear_attention"] * 3 + ["full_attention"]}, 3),
    # a VLM's language model, as the hub's Qwen3.5 checkpoints and optimum's exports state it
    ({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 2,
                                               "layer_types": ["linear_attention", "full_attention"]}}, 1),
    ({"model_type": "qwen3", "num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}, 0),
    ({"model_type": "gemma3_text", "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}, 0),
    # a model type no map builds: read by every map's kinds
    ({"model_type": "qwen3_next", "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}, 1),
    ({"model_type": "llama", "num_hidden_layers": 2}, 0)])
def test_the_recurrent_layers_genai_makes_room_for_are_the_kinds(tmp_path, config, layers):
    """GenAI's scheduler sizes its linear-attention state pool for a target whose kinds keep a
    recurrent state (`runtime/genai.py` scheduler, `ovms`): the kinds say which do."""
    import json

    from gguf2ov.runtime.genai import recurrent_layers
    from gguf2ov.runtime.target import TargetIR

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert recurrent_layers(TargetIR(tmp_path)) == layers


# --- a map and its kinds, held against each other when the map is read ----------------------------

def test_every_shipped_target_map_fits_its_kinds():
    from gguf2ov.maps.load import load_map
    from gguf2ov.targets.config import target_arches

    assert {"qwen3", "llama", "gemma", "gemma3", "qwen2", "qwen3moe", "qwen35", "qwen35moe"} <= set(target_arches())
    for arch in target_arches():
        assert decoder_of(load_map(arch)).arch == arch


QWEN3_LIKE = """arch: toy
extends: _decoder.yaml
hf: {model_type: qwen3}
tensors:
  blk.{N}.attn_q_norm.weight: model.layers.{N}.self_attn.q_norm.weight
  blk.{N}.attn_k_norm.weight: model.layers.%s.weight
%s
target:
  mixers: {full_attention: attention}
  mlp: dense
  forward: {qk_norm: true}
"""


@pytest.mark.parametrize("k_norm, extra, needle", [
    ("model.layers.{N}.self_attn.k_nrom", "", "the full_attention layers' kinds (attention, dense) do not read "
     "model.layers.{N}.self_attn.k_nrom.weight, which the map names (blk.{N}.attn_k_norm.weight)"),
    ("model.layers.{N}.self_attn.k_norm", "unset: {tensors: [\"blk.{N}.attn_v.weight\"]}",
     "the map names no tensor for model.layers.{N}.self_attn.v_proj.weight, which the full_attention layers' "
     "kinds (attention, dense) read"),
    ("model.layers.{N}.self_attn.k_norm", "optional: {rope_freqs.weight: model.rope.inv_freq}",
     "the map names model.rope.inv_freq, which the decoder does not read"),
    ("model.layers.{N}.self_attn.k_norm", "shapes: {\"model.layers.{N}.self_attn.q_norm.weight\": [head_dim]}",
     "a map with a `target:` section states no `shapes`: a target's shapes are its layer kinds'")])
def test_a_map_that_does_not_fit_its_kinds_is_refused_before_any_file(tmp_path, k_norm, extra, needle):
    """A misspelt HF name, a tensor no rule names, a tensor outside the decoder, shapes stated twice: each
    one error naming the map, when it is read."""
    from gguf2ov.errors import Gguf2ovError
    from gguf2ov.maps.load import load_map

    path = tmp_path / "toy.yaml"
    path.write_text(QWEN3_LIKE % (k_norm.replace("model.layers.", "", 1), extra))
    with pytest.raises(Gguf2ovError) as e:
        decoder_of(load_map(path=path))
    assert str(path) in e.value.message and needle in e.value.message


def _configs():
    """Resolved configs of every layer kind, from the target tests' geometries."""
    import json

    import target_builders as tb

    from gguf2ov.targets.config import target_config

    configs = [tb.GEOMETRIES[name] for name in tb.GEOMETRIES]
    configs.append(dict(model_type="qwen3_5_moe_text", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, shared_expert_intermediate_size=48, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
                        attention_bias=True))
    configs.append(dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, mlp_bias=True))
    configs.append(dict(model_type="gemma4_text", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                        layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                        hidden_size_per_layer_input=8, vocab_size_per_layer_input=300))
    configs.append(dict(model_type="gpt_oss", hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                        attention_bias=True))
    return [target_config(json.loads(json.dumps({"vocab_size": 300, **g})), "geometry") for g in configs]


def test_the_names_a_kind_states_cover_the_tensors_it_reads():
    """`names(options)` (what a map is held against) covers every name `tensors(c, i)` gives in its layer, and
    `model_names(options)` every other (the model's, read by the first layer), and the names it says every
    layer reads are read in every layer, over configs of every kind."""
    from gguf2ov.targets.decoder import layer_kinds

    seen = set()
    for c in _configs():
        for i, kind in layer_kinds(c):
            names, model = kind.names(c.options), kind.model_names(c.options)
            prefix = f"model.layers.{i}."
            tensors = kind.tensors(c, i)
            outside = {n for n in tensors if not n.startswith(prefix)}
            assert outside <= set(model) and (i > 0 or not model or outside == set(model)), (kind.NAME, outside)
            read = {n[len(prefix):] for n in tensors if n.startswith(prefix)}
            assert read <= set(names), (kind.NAME, read - set(names))
            assert {n for n, always in names.items() if always} <= read, kind.NAME
            seen.add(kind.NAME)
    assert seen == set(SHIPPED)


def test_the_attention_pieces_take_a_layers_own_geometry():
    """A kind whose layers have their own head size and count (Gemma 4's sliding and global layers) states
    its tensors with the same piece as the config-wide attention."""
    from types import SimpleNamespace

    from gguf2ov.targets.layers.pieces import Heads, attention_tensors, heads_of

    c = SimpleNamespace(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16)
    assert heads_of(c) == Heads(4, 2, 16)
    mine = attention_tensors(c, "p.", 1, True, False, False, Heads(4, 1, 32))
    assert mine == {"p.q_proj.weight": (128, 64), "p.q_norm.weight": (32,), "p.k_proj.weight": (32, 64),
                    "p.k_norm.weight": (32,), "p.v_proj.weight": (32, 64), "p.o_proj.weight": (64, 128)}
    assert attention_tensors(c, "p.", 1, False, False, False)["p.k_proj.weight"] == (32, 64)

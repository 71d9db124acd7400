"""A target's config, resolved the way transformers resolves it, and the architecture it is built as.

Which architectures are targets, and how each is built, is data: a map in `tensor_maps/` with a
`target:` section names the kind of each layer type (`mixers`), the MLP kind (`mlp`), the decoder
layer's norms and residual steps (`layer`) and the options of its forward (`forward`), read by
`decoder.py`. The map travels as an object: a GGUF's config is built as the map it was opened
through (`--map`'s, for an architecture no shipped map names too), a checkpoint's as the target map
of its model type, and the TargetConfig keeps it (`amap`); nothing looks a map up again by name.
`target_config` fills in every default with
transformers' config class for the model type (head_dim, layer types, RoPE parameters per layer
type); transformers is imported for its config classes only (the RoPE tables are computed from
them in NumPy, `ir/rope.py`), no model is built and no remote code is run.
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import Gguf2ovError
from ..ir.rope import rope_table
from ..maps.rules import is_int

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def target_maps(maps_dir=None) -> list:
    """The maps with a `target:` section (maps.arch_map.ArchMap), shipped or found through GGUF2OV_MAPS, by name."""
    from ..maps.load import shipped_maps

    return [m for m in shipped_maps(maps_dir) if m.target is not None]


def target_arches(maps_dir=None) -> tuple[str, ...]:
    """The architectures `gguf2ov target` builds: the maps with a `target:` section."""
    return tuple(m.arch for m in target_maps(maps_dir))


def map_of_type(model_type):
    """The target map whose HF model type is `model_type` (tensor_maps/<arch>.yaml `hf.model_type`; the
    first by name where several are); None: no map builds it."""
    return next((m for m in target_maps() if m.hf.get("model_type") == model_type), None)


def target_map(model_type, where):
    """`map_of_type`, refused in one line when no map builds the model type: the map a config.json (a
    checkpoint's, an OpenVINO folder's) is built as."""
    amap = map_of_type(model_type)
    if amap is None:
        hint = f"supported model types: {', '.join(sorted(t for m in target_maps() if (t := m.hf.get('model_type'))))}"
        if model_type == "gemma3":
            hint = "a gemma3 checkpoint with a vision tower: export its text model (model_type gemma3_text)"
        raise Gguf2ovError(f"{where}: model_type {model_type!r} is not a target this tool builds", hint=hint)
    return amap


@dataclass(frozen=True, eq=False)
class TargetConfig:
    """What the target graph is built from: the config resolved as transformers resolves it."""

    raw: dict                      # the config.json written beside the IR
    arch: str                      # the map's architecture: qwen3 | llama | qwen2 | gemma3 | ...
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int         # the dense MLP's width (0: the config states none)
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    mixers: tuple[str, ...]        # the kind of layer that mixes tokens, per layer (targets/layers/)
    mlp: str                       # the kind of every layer's MLP
    layer: tuple                   # the decoder layer's residual steps (decoder.Step)
    options: dict                  # the map's forward options, defaults filled in (decoder.py)
    sliding_window: int | None     # the window of the sliding layers (None: no sliding layer)
    head_dims: dict                # layer type -> its head size (head_dim, or the map's `head_dim` key's)
    rope: dict                     # layer type -> (inverse frequencies f32 [rotary dims / 2], attention scaling)
    attention_scale: float         # query_pre_attn_scalar ** -0.5 (Gemma), else head_dim ** -0.5
    activation: str                # silu | gelu_tanh
    attention_bias: bool = False   # q/k/v/o biases (config.attention_bias)
    mlp_bias: bool = False
    embedding_scale: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    hf: object = field(default=None, repr=False)  # transformers' config object: what a kind reads beyond these
    amap: object = field(default=None, repr=False)  # the map it is built as (maps.arch_map.ArchMap): the decoder's


def target_config(raw: dict, where, amap=None, complete: bool = False) -> TargetConfig:
    """Validate a target's config (config.json, or built from GGUF metadata through its map).

    `amap`: the map it is built as (the one a GGUF was opened through, `--map`'s too), whose `target:`
    section gives the layers' kinds, steps and options; None: the target map of its model type.
    `complete`: the config written beside the IR states every value the graph is built with
    (transformers' defaults for what `raw` leaves out), as save_pretrained writes it: for a GGUF,
    whose metadata states less than a checkpoint's config.json.
    """
    from .decoder import check_config, decoder_of

    raw = text_model_config(raw, where)
    if amap is None:
        amap = target_map(raw.get("model_type"), where)
    decoder = decoder_of(amap)  # the map's target section, held against the kinds
    forward = decoder.options
    hf = _hf_config(raw, where)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not is_int(getattr(hf, key, None)) or getattr(hf, key) <= 0:
            raise Gguf2ovError(f"{where}: {key} is {getattr(hf, key, None)!r}, not a positive integer")
    # the dense MLP's width: a config whose every MLP is a mixture of experts states none (Qwen3.5-MoE);
    # the kinds that build a dense MLP refuse its absence (layers/mlp.py check)
    intermediate = getattr(hf, "intermediate_size", None)
    if intermediate is not None and (not is_int(intermediate) or intermediate <= 0):
        raise Gguf2ovError(f"{where}: intermediate_size is {intermediate!r}, not a positive integer")
    heads = hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    if not (is_int(kv_heads) and kv_heads > 0 and heads % kv_heads == 0):
        raise Gguf2ovError(f"{where}: {heads} attention heads do not split into {kv_heads!r} key/value heads")
    if not is_int(head_dim) or head_dim <= 0 or head_dim % 2:
        raise Gguf2ovError(f"{where}: head_dim is {head_dim!r}, not a positive even integer")
    layers = hf.num_hidden_layers
    mixers_by_type = decoder.mixers
    layer_types = tuple(getattr(hf, "layer_types", None) or _layer_types(hf, decoder.sliding))
    if len(layer_types) != layers or not set(layer_types) <= set(mixers_by_type):
        raise Gguf2ovError(f"{where}: layer_types must give one of {', '.join(mixers_by_type)} for each of the "
                           f"{layers} layers, got {list(layer_types)[:8]}")
    mixers = tuple(mixers_by_type[t] for t in layer_types)
    window = getattr(hf, "sliding_window", None) if "sliding_attention" in layer_types else None
    if "sliding_attention" in layer_types and not (is_int(window) and window > 0):
        raise Gguf2ovError(f"{where}: sliding layers need a positive sliding_window, got {window!r}")
    activation = getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", None)
    if activation not in ACTIVATIONS:
        raise Gguf2ovError(f"{where}: activation {activation!r} is not supported",
                           hint=f"supported: {', '.join(ACTIVATIONS)}")
    for key in ("attn_logit_softcapping", "use_bidirectional_attention"):
        # Gemma 4's "vision" lets image tokens see each other: a text model's attention stays causal
        if getattr(hf, key, None) and getattr(hf, key) != "vision":
            # SDPA (and the paged attention GenAI runs) has no logit cap; bidirectional Gemma is an encoder
            raise Gguf2ovError(f"{where}: {key} is {getattr(hf, key)!r}: not supported in an OpenVINO LLM target")
    for key, why in decoder.refuse.items():
        if getattr(hf, key, None):
            raise Gguf2ovError(f"{where}: {key} is {getattr(hf, key)!r}: {why}, which this version does not build")
    head_dims = _head_dims(hf, decoder.head_dim, layer_types, head_dim, where)
    scalar = getattr(hf, "query_pre_attn_scalar", None)
    cap = getattr(hf, "final_logit_softcapping", None)
    config = TargetConfig(
        raw=hf.to_dict() if complete else raw, arch=amap.arch, hidden_size=hf.hidden_size, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate or 0,
        vocab_size=hf.vocab_size, rms_norm_eps=float(hf.rms_norm_eps),
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)), layer_types=layer_types,
        mixers=mixers, mlp=decoder.mlp, layer=decoder.layer, options=forward, sliding_window=window,
        head_dims=head_dims, rope=_rope(hf, layer_types, head_dims, where, bool(forward["partial_rotary"])),
        attention_scale=float((scalar or head_dim) ** -0.5), activation=ACTIVATIONS[activation],
        attention_bias=bool(getattr(hf, "attention_bias", False)), mlp_bias=bool(getattr(hf, "mlp_bias", False)),
        # float32, as the embedding module's buffer holds it: Gemma's sqrt(3072) is 55.4256, not 55.43
        embedding_scale=float(np.float32(hf.hidden_size ** 0.5)) if forward["scaled_embedding"] else None,
        final_logit_softcapping=float(cap) if cap else None,
        bos_token_id=getattr(hf, "bos_token_id", None), eos_token_id=getattr(hf, "eos_token_id", None),
        pad_token_id=getattr(hf, "pad_token_id", None), hf=hf, amap=amap)
    check_config(config, where)  # what each layer kind refuses
    return config


def _layer_types(hf, sliding: str) -> list[str]:
    """The layer types of a config that states none: every layer full, or, where the map says every
    layer slides (`decoder.py`), sliding over the config's window when it sets one."""
    windowed = sliding == "every_layer" and getattr(hf, "sliding_window", None) is not None
    return ["sliding_attention" if windowed else "full_attention"] * hf.num_hidden_layers


def text_model_config(raw: dict, where) -> dict:
    """The config a target is built from: `raw`, or a VLM's language model, its `text_config`, for the
    model types a map names in `checkpoint.text_config_of` (the hub's Qwen3.5 checkpoints are VLMs):
    named as the map's text model, with the VLM's tied-embeddings flag, which its lm_head follows."""
    for amap in target_maps():
        if raw.get("model_type") in amap.checkpoint.text_config_of:
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise Gguf2ovError(f"{where}: a {raw.get('model_type')} config without a text_config object")
            text = {**text, "model_type": amap.hf["model_type"], "architectures": list(amap.hf["architectures"])}
            if "tie_word_embeddings" in raw:
                text["tie_word_embeddings"] = raw["tie_word_embeddings"]
            return text
    return raw


def _hf_config(raw: dict, where):
    """transformers' config class for the model type, filled from `raw` (never remote code)."""
    from transformers import CONFIG_MAPPING

    clean = {k: v for k, v in raw.items() if k not in ("auto_map", "transformers_version")}
    try:
        return CONFIG_MAPPING[raw["model_type"]].from_dict(clean)
    except Exception as e:  # transformers validates the geometry (ValueError, or huggingface_hub's strict-dataclass errors)
        raise Gguf2ovError(f"{where}: not a valid {raw.get('model_type')} config: {' '.join(str(e).split())[:300]}") \
            from e


def _head_dims(hf, keys: dict, layer_types, head_dim: int, where) -> dict:
    """{layer type: head size}: the config's head_dim, or for a type the map names in `head_dim` the
    config key it names, where the config sets it (Gemma 4's global layers: global_head_dim)."""
    dims = {}
    for layer_type in sorted(set(layer_types)):
        size = getattr(hf, keys[layer_type], None) if layer_type in keys else None
        if size is not None and not (is_int(size) and size > 0 and size % 2 == 0):
            raise Gguf2ovError(f"{where}: {keys[layer_type]} is {size!r}, not a positive even integer")
        dims[layer_type] = size or head_dim
    return dims


def _rope(hf, layer_types, head_dims: dict, where, partial: bool = False) -> dict:
    """{layer type: (inverse frequencies, attention scaling)}, as transformers' rotary embedding makes them;
    `partial`: the model turns the first partial_rotary_factor of each head only (the map's forward)."""
    tables = {}
    for layer_type in sorted(set(layer_types)):
        head_dim = head_dims[layer_type]
        inv_freq, scaling = rope_table(hf, layer_type, where, partial=partial, layer_head_dim=head_dim)
        if partial and not (0 < 2 * inv_freq.size <= head_dim):
            raise Gguf2ovError(f"{where}: RoPE rotates {2 * inv_freq.size} of {head_dim} head dimensions")
        if not partial and 2 * inv_freq.size != head_dim:
            raise Gguf2ovError(f"{where}: RoPE rotates {2 * inv_freq.size} of {head_dim} head dimensions: "
                               "partial rotary embeddings are not supported")
        tables[layer_type] = (inv_freq, scaling)
    return tables

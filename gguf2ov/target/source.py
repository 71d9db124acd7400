"""A target language model opened once, from a GGUF (through its map) or a checkpoint folder.

`open_target()` reads the config, resolves it the way transformers does (its config class for the
model type fills in every default: head_dim, layer types, RoPE parameters per layer type), checks
the tensor names and shapes strictly against the graph `target_graph` builds, and then hands out
one tensor at a time (`source.TensorSource`): float32 values, row chunks of them, or the GGUF's
raw quantized bytes. Nothing holds the model in memory whole.

Supported: the decoder-only LMs of the shipped maps `qwen3`, `llama`, `qwen2` and `gemma3` (text),
with transformers 5.5.4's forward for each (`_FORWARD`). transformers is imported for its config
classes only (the RoPE tables are computed from them in NumPy, `rope.py`); no model is built and no
remote code is run.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..maps.rules import is_int
from ..names import CONFIG_FILE
from ..ir.rope import rope_table
from ..ir.tensors import TensorSource, tensor_mismatch

# The maps whose models `target_graph` builds, and what each forward does beyond Llama's decoder
# (transformers 5.5.4, models/<type>/modeling_<type>.py):
# qwen2: biases on q/k/v (not o); qwen3: RMSNorm on each query and key head; gemma3: those norms
# too, norms after attention and after the MLP (four per layer), RMSNorms scaling by (1 + w),
# token embeddings scaled by sqrt(hidden_size).
_FORWARD = {
    "llama": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "gemma3": {"qk_norm": True, "sandwich_norms": True, "norm_offset": 1.0, "scaled_embedding": True},
}
TARGET_ARCHES = tuple(_FORWARD)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
LAYER_TYPES = ("full_attention", "sliding_attention")

# llama.cpp stores Llama 3's RoPE scaling as a tensor of per-frequency divisors (its converter's
# rope_factors; the llama map drops it), not as config keys: RoPE turns by position * inv_freq / factor.
ROPE_FACTORS = "rope_freqs.weight"
# and other RoPE scaling as {arch}.rope.scaling.* keys, which no map reads yet
ROPE_SCALING_KEY = "{arch}.rope.scaling.type"

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
# Tensors a checkpoint may hold that the graph does not read: a tied model's lm_head copy, and the
# RoPE buffers older checkpoints saved.
_UNUSED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True, eq=False)
class TargetConfig:
    """What the target graph is built from: the config resolved as transformers resolves it."""

    raw: dict                      # the config.json written beside the IR
    arch: str                      # the map's architecture: qwen3 | llama | qwen2 | gemma3
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None     # the window of the sliding layers (None: no sliding layer)
    rope: dict                     # layer type -> (inverse frequencies f32 [head_dim / 2], attention scaling)
    attention_scale: float         # query_pre_attn_scalar ** -0.5 (Gemma), else head_dim ** -0.5
    activation: str                # silu | gelu_tanh
    attention_bias: bool = False   # q/k/v/o biases (config.attention_bias)
    qkv_bias: bool = False         # q/k/v biases without an o bias (qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    norm_offset: float = 0.0
    embedding_scale: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None

    @property
    def q_bias(self) -> bool:
        return self.attention_bias or self.qkv_bias


def target_config(raw: dict, where, arch: str | None = None, complete: bool = False) -> TargetConfig:
    """Validate a target's config (config.json, or built from GGUF metadata through its map).

    `complete`: the config written beside the IR states every value the graph is built with
    (transformers' defaults for what `raw` leaves out), as save_pretrained writes it: for a GGUF,
    whose metadata states less than a checkpoint's config.json.
    """
    arch = arch or _arch_of(raw.get("model_type"), where)
    hf = _hf_config(raw, where)
    forward = _FORWARD[arch]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not is_int(getattr(hf, key, None)) or getattr(hf, key) <= 0:
            raise Gguf2ovError(f"{where}: {key} is {getattr(hf, key, None)!r}, not a positive integer")
    heads = hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    if not (is_int(kv_heads) and kv_heads > 0 and heads % kv_heads == 0):
        raise Gguf2ovError(f"{where}: {heads} attention heads do not split into {kv_heads!r} key/value heads")
    if not is_int(head_dim) or head_dim <= 0 or head_dim % 2:
        raise Gguf2ovError(f"{where}: head_dim is {head_dim!r}, not a positive even integer")
    layers = hf.num_hidden_layers
    layer_types = tuple(getattr(hf, "layer_types", None) or ["full_attention"] * layers)
    if len(layer_types) != layers or not set(layer_types) <= set(LAYER_TYPES):
        raise Gguf2ovError(f"{where}: layer_types must give one of {', '.join(LAYER_TYPES)} for each of the "
                           f"{layers} layers, got {list(layer_types)[:8]}")
    window = getattr(hf, "sliding_window", None) if "sliding_attention" in layer_types else None
    if "sliding_attention" in layer_types and not (is_int(window) and window > 0):
        raise Gguf2ovError(f"{where}: sliding layers need a positive sliding_window, got {window!r}")
    activation = getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", None)
    if activation not in ACTIVATIONS:
        raise Gguf2ovError(f"{where}: activation {activation!r} is not supported",
                           hint=f"supported: {', '.join(ACTIVATIONS)}")
    for key in ("attn_logit_softcapping", "use_bidirectional_attention"):
        if getattr(hf, key, None):
            # SDPA (and the paged attention GenAI runs) has no logit cap; bidirectional Gemma is an encoder
            raise Gguf2ovError(f"{where}: {key} is {getattr(hf, key)!r}: not supported in an OpenVINO LLM target")
    scalar = getattr(hf, "query_pre_attn_scalar", None)
    cap = getattr(hf, "final_logit_softcapping", None)
    return TargetConfig(
        raw=hf.to_dict() if complete else raw, arch=arch, hidden_size=hf.hidden_size, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=hf.intermediate_size, vocab_size=hf.vocab_size,
        rms_norm_eps=float(hf.rms_norm_eps), tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        layer_types=layer_types, sliding_window=window, rope=_rope(hf, layer_types, head_dim, where),
        attention_scale=float((scalar or head_dim) ** -0.5), activation=ACTIVATIONS[activation],
        attention_bias=bool(getattr(hf, "attention_bias", False)), qkv_bias=forward.get("qkv_bias", False),
        mlp_bias=bool(getattr(hf, "mlp_bias", False)), qk_norm=forward.get("qk_norm", False),
        sandwich_norms=forward.get("sandwich_norms", False), norm_offset=forward.get("norm_offset", 0.0),
        # float32, as the embedding module's buffer holds it: Gemma's sqrt(3072) is 55.4256, not 55.43
        embedding_scale=float(np.float32(hf.hidden_size ** 0.5)) if forward.get("scaled_embedding") else None,
        final_logit_softcapping=float(cap) if cap else None,
        bos_token_id=getattr(hf, "bos_token_id", None), eos_token_id=getattr(hf, "eos_token_id", None),
        pad_token_id=getattr(hf, "pad_token_id", None))


def _arch_of(model_type, where) -> str:
    """The map whose HF model type `model_type` is (tensor_maps/<arch>.yaml `hf.model_type`)."""
    from ..maps.load import load_map

    by_type = {load_map(arch).hf.get("model_type"): arch for arch in TARGET_ARCHES}
    if model_type not in by_type:
        hint = f"supported model types: {', '.join(sorted(t for t in by_type if t))}"
        if model_type == "gemma3":
            hint = "a gemma3 checkpoint with a vision tower: export its text model (model_type gemma3_text)"
        raise Gguf2ovError(f"{where}: model_type {model_type!r} is not a target this tool builds", hint=hint)
    return by_type[model_type]


def _hf_config(raw: dict, where):
    """transformers' config class for the model type, filled from `raw` (never remote code)."""
    from transformers import CONFIG_MAPPING

    clean = {k: v for k, v in raw.items() if k not in ("auto_map", "transformers_version")}
    try:
        return CONFIG_MAPPING[raw["model_type"]].from_dict(clean)
    except (TypeError, ValueError, KeyError) as e:  # transformers validates the geometry
        raise Gguf2ovError(f"{where}: not a valid {raw.get('model_type')} config: {' '.join(str(e).split())[:300]}") \
            from e


def _rope(hf, layer_types, head_dim: int, where) -> dict:
    """{layer type: (inverse frequencies, attention scaling)}, as transformers' rotary embedding makes them."""
    tables = {}
    for layer_type in sorted(set(layer_types)):
        inv_freq, scaling = rope_table(hf, layer_type, where)
        if 2 * inv_freq.size != head_dim:
            raise Gguf2ovError(f"{where}: RoPE rotates {2 * inv_freq.size} of {head_dim} head dimensions: "
                               "partial rotary embeddings are not supported")
        tables[layer_type] = (inv_freq, scaling)
    return tables


def target_tensor_shapes(c: TargetConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the target graph reads, with its shape, in the graph's order (NNCF's too)."""
    h, hd, inter = c.hidden_size, c.head_dim, c.intermediate_size
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    shapes = {EMBEDDING: (c.vocab_size, h)}

    def linear(name, out, inp, bias):
        shapes[name + ".weight"] = (out, inp)
        if bias:
            shapes[name + ".bias"] = (out,)

    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        linear(p + "self_attn.q_proj", q, h, c.q_bias)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
        linear(p + "self_attn.k_proj", kv, h, c.q_bias)
        if c.qk_norm:
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        linear(p + "self_attn.v_proj", kv, h, c.q_bias)
        linear(p + "self_attn.o_proj", h, q, c.attention_bias)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if c.sandwich_norms:
            shapes[p + "pre_feedforward_layernorm.weight"] = (h,)
        linear(p + "mlp.gate_proj", inter, h, c.mlp_bias)
        linear(p + "mlp.up_proj", inter, h, c.mlp_bias)
        linear(p + "mlp.down_proj", h, inter, c.mlp_bias)
        if c.sandwich_norms:
            shapes[p + "post_feedforward_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        shapes[LM_HEAD] = (c.vocab_size, h)
    return shapes


class TargetSource(TensorSource):
    """A validated target whose weights are read one tensor at a time.

    `config` the TargetConfig; `expected` the tensors the graph reads (name -> shape);
    `ignored` the tensors present but unused (a tied model's lm_head copy, RoPE buffers).
    """

    embeddings = (EMBEDDING,)

    def __init__(self, path: Path, kind: str, config: TargetConfig, found: dict, mapped=None, checkpoint=None):
        super().__init__(path, kind, mapped, checkpoint)
        self.config = config
        self.expected = target_tensor_shapes(config)
        self.last_matmul_shared = config.tie_word_embeddings  # the lm_head reads the embedding table
        self.ignored = _check_tensors(self.expected, found, config, path)

    @property
    def arch(self) -> str:
        return self.config.arch

    def describe(self) -> str:
        c = self.config
        return (f"{self.path.name} ({self.kind}, {c.arch}): {c.num_layers} layers, hidden {c.hidden_size}, "
                f"vocab {c.vocab_size}, {sum(int(np.prod(s)) for s in self.expected.values()) / 1e6:.1f} M parameters")


def _check_tensors(expected: dict, found: dict, config: TargetConfig, where) -> list[str]:
    ignored = sorted(k for k in found if k not in expected and (
        k.endswith(_UNUSED_SUFFIXES) or (k == LM_HEAD and config.tie_word_embeddings)))
    if problems := tensor_mismatch(expected, {k: v for k, v in found.items() if k not in ignored}):
        raise Gguf2ovError(f"{where}: tensors do not match the {config.arch} model its config describes: {problems}",
                           hint="check that config.json belongs to these weights (or pass --map with the map that "
                                "covers this file)")
    return ignored


def open_target(path, map_path=None) -> TargetSource:
    """Open a target GGUF (a path, or a GgufFile already opened) or checkpoint folder, validated and
    ready to stream weights."""
    from ..gguf.read import GgufFile, is_gguf_file

    gguf = path if isinstance(path, GgufFile) else None
    path = Path(gguf.path if gguf else path)
    if not path.exists():
        raise Gguf2ovError(f"{path} does not exist")
    if gguf or is_gguf_file(path):
        return _open_gguf(gguf or path, path, map_path)
    if not path.is_dir():
        raise Gguf2ovError(f"{path} is neither a GGUF file nor a checkpoint folder")
    if map_path is not None:
        raise Gguf2ovError("--map applies to a GGUF source only", hint="a checkpoint folder is read by its config.json")
    from ..hf.checkpoint import Checkpoint, read_json_object

    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise Gguf2ovError(f"no {CONFIG_FILE} in {path}", hint="pass a Hugging Face checkpoint folder or a GGUF file")
    raw = read_json_object(config_path)
    config = target_config(raw, config_path)
    checkpoint = Checkpoint(path)  # memory-mapped safetensors, read one tensor at a time
    return TargetSource(path, "checkpoint", config, dict(checkpoint.shapes), checkpoint=checkpoint)


def _open_gguf(gguf, path: Path, map_path) -> TargetSource:
    from ..maps.load import open_mapped

    mapped = open_mapped(gguf, map_path)
    if mapped.amap.arch not in TARGET_ARCHES:
        hint = ("a DFlash draft: export it with `gguf2ov export`" if mapped.amap.arch == "dflash"
                else f"supported: {', '.join(TARGET_ARCHES)}")
        raise Gguf2ovError(f"{path} is a {mapped.amap.arch} model, not a target this tool builds", hint=hint)
    scaling = mapped.gguf.get(ROPE_SCALING_KEY.format(arch=mapped.amap.arch))
    if scaling not in (None, "none"):
        raise Gguf2ovError(f"{path}: {ROPE_SCALING_KEY.format(arch=mapped.amap.arch)} is {scaling!r}: RoPE scaling "
                           "stated in GGUF metadata is not read by the map, and the target would turn positions wrongly",
                           hint="build the target from the Hugging Face checkpoint, whose config states its RoPE")
    found = {e.hf_name: e.shape for e in mapped.plan if e.hf_name is not None}
    raw = dict(mapped.config)
    if raw.get("vocab_size") is None and EMBEDDING in found:
        raw["vocab_size"] = found[EMBEDDING][0]  # a file without a vocabulary states it by its table
    config = target_config(raw, path, arch=mapped.amap.arch, complete=True)
    if ROPE_FACTORS in mapped.gguf.tensors:
        factors = mapped.gguf.load(ROPE_FACTORS).reshape(-1)
        if factors.size * 2 != config.head_dim:
            raise Gguf2ovError(f"{path}: {ROPE_FACTORS} holds {factors.size} factors for a head_dim of {config.head_dim}")
        rope = {t: ((inv_freq / factors).astype(np.float32), scaling) for t, (inv_freq, scaling) in config.rope.items()}
        config = dataclasses.replace(config, rope=rope)
    return TargetSource(path, "gguf", config, found, mapped=mapped)

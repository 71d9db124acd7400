"""RoPE's inverse frequencies and attention scaling, in NumPy, as transformers 5.5.4 computes them.

`rope_table(config, layer_type)` follows `modeling_rope_utils.py` (`_compute_linear_scaling_rope_parameters`,
`_compute_llama3_parameters`, `_compute_yarn_parameters`) and the models' `compute_default_rope_parameters`
step for step, in the same dtypes: float32 tensors, Python floats (float64) for the scalars around them,
each scalar cast to float32 where torch casts it (every operation on a float32 tensor and a Python
number computes in float32). `config` is a config.json dict (a DFlash draft's, with its model's defaults
filled in) or transformers' config object built from one (a target's).

Every step is exact IEEE float32 arithmetic, the same in NumPy as in torch, except the power: torch's
CPU kernel takes float32 powers with SLEEF's SIMD powf on whole vectors and libm's powf on the rest,
each within 1 ULP but not correctly rounded (nor is NumPy's). Here the power is the correctly rounded
float32 one, so a table equals transformers' wherever torch's powers round correctly; elsewhere a
power is 1 ULP off, and the table by what that becomes (2 ULP at most measured).
"""

import math

import numpy as np

from ..errors import Gguf2ovError

# The RoPE types whose tables are fixed when the model is built. `dynamic` and `longrope` change
# them with the sequence length, which a static graph would have to trace (optimum patches longrope).
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")
# RotaryEmbeddingConfigMixin.default_theta, for a config.json that states no base
DEFAULT_THETA = 10_000.0


def rope_table(config, layer_type: str | None = None, where="the config", partial: bool = False,
               layer_head_dim: int | None = None) -> tuple[np.ndarray, float]:
    """The inverse frequencies (float32 [rotary dim / 2]) and attention scaling of `layer_type`'s RoPE.

    `partial`: the model's own default RoPE turns `partial_rotary_factor` of the head (Qwen3.5's
    compute_default_rope_parameters); most models' default turns the whole head whatever it says.
    `layer_head_dim`: the head size of the layer type's proportional RoPE, where it is not the config's
    head_dim (Gemma 4's global layers: global_head_dim)."""
    params = rope_parameters(config, layer_type)
    kind = params["rope_type"]
    if kind not in ROPE_TYPES:
        raise Gguf2ovError(f"{where}: RoPE type {kind!r} is not supported",
                           hint=f"supported: {', '.join(ROPE_TYPES)} (dynamic and longrope tables change with the "
                                "sequence length)")
    # `getattr(config, "head_dim", None) or hidden_size // num_attention_heads` (yarn's getattr has no `or`:
    # the same but for an explicit None, where transformers fails)
    head_dim = _get(config, "head_dim") or _get(config, "hidden_size") // _get(config, "num_attention_heads")
    if kind == "default":
        return _default(params, _rotary_dim(params, head_dim) if partial else head_dim)
    if kind == "linear":
        return _linear(params, head_dim)
    if kind == "proportional":
        return _proportional(params, layer_head_dim or head_dim)
    if kind == "llama3":
        return _llama3(params, head_dim)
    return _yarn(params, head_dim, _get(config, "max_position_embeddings"))


def rope_parameters(config, layer_type: str | None = None) -> dict:
    """`layer_type`'s RoPE parameters, as transformers resolves them before computing a table.

    The config classes' `convert_rope_params_to_dict` and `standardize_rope_params` (which the rope
    functions call again): a legacy `rope_scaling` wins over `rope_parameters`, `type` names the
    `rope_type`, top-level `rope_theta` and `partial_rotary_factor` move in, and llama3/yarn/longrope
    get `original_max_position_embeddings`. On a config object this is already done but for the
    second call's overrides; on it again it changes nothing else.
    """
    # a config object aliases rope_scaling to rope_parameters
    params = _get(config, "rope_scaling") or _get(config, "rope_parameters") or {}
    # Gemma 3's parameters are keyed by layer type, and its RotaryEmbedding reads one dict per type;
    # the others read the one dict for every layer
    keyed = isinstance(params.get(layer_type), dict)
    params = dict(params[layer_type] if keyed else params)
    params.setdefault("rope_theta", _get(config, "rope_theta", DEFAULT_THETA))
    params.setdefault("rope_type", params.get("type", "default"))
    if _get(config, "partial_rotary_factor") is not None:
        params["partial_rotary_factor"] = _get(config, "partial_rotary_factor")
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        # a top-level value overrides the dict's (Phi 3's case), for a global dict only
        original = None if keyed else _get(config, "original_max_position_embeddings")
        if original is not None:
            params["original_max_position_embeddings"] = original
        params.setdefault("original_max_position_embeddings", _get(config, "max_position_embeddings"))
    return params


def _default(params: dict, head_dim: int) -> tuple[np.ndarray, float]:
    # <Model>RotaryEmbedding.compute_default_rope_parameters: the whole head_dim (partial_rotary_factor unread)
    return np.float32(1.0) / _powers(params["rope_theta"], head_dim), 1.0


def _linear(params: dict, head_dim: int) -> tuple[np.ndarray, float]:
    # _compute_linear_scaling_rope_parameters: `inv_freq /= factor`, float32(factor)
    inv_freq = np.float32(1.0) / _powers(params["rope_theta"], _rotary_dim(params, head_dim))
    return inv_freq / np.float32(params["factor"]), 1.0


def _proportional(params: dict, head_dim: int) -> tuple[np.ndarray, float]:
    # _compute_proportional_rope_parameters: a table over the whole head whose first
    # int(partial_rotary_factor * head_dim // 2) frequencies turn (exponents over the whole head_dim) and
    # whose others are 0 (cos 1, sin 0: those dimensions pass unturned); `inv_freq /= factor`
    angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
    turned = np.float32(1.0) / _powers(params["rope_theta"], head_dim)[:angles]
    inv_freq = np.concatenate([turned, np.zeros(head_dim // 2 - angles, np.float32)])
    return inv_freq / np.float32(params.get("factor", 1.0)), 1.0


def _llama3(params: dict, head_dim: int) -> tuple[np.ndarray, float]:
    # _compute_llama3_parameters; the wavelength bounds are Python floats, compared as float32
    inv_freq = np.float32(1.0) / _powers(params["rope_theta"], _rotary_dim(params, head_dim))
    factor = np.float32(params["factor"])
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = np.float32(old_context / low), np.float32(old_context / high)
    # `2 * math.pi / inv_freq` is torch's `inv_freq.reciprocal() * (2 * math.pi)`, as is `old_context / wavelen`
    wavelen = (np.float32(1.0) / inv_freq) * np.float32(2 * math.pi)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = ((np.float32(1.0) / wavelen) * np.float32(old_context) - np.float32(low)) / np.float32(high - low)
    smoothed = (np.float32(1.0) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled), 1.0


def _yarn(params: dict, head_dim: int, max_positions: int) -> tuple[np.ndarray, float]:
    # _compute_yarn_parameters: the correction range and attention factor in Python floats, the rest float32
    base, dim = params["rope_theta"], _rotary_dim(params, head_dim)
    original = params["original_max_position_embeddings"]
    factor = params["factor"]
    if factor is None:
        factor = max_positions / original
    powers = _powers(base, dim)
    extrapolation = np.float32(1.0) / powers
    interpolation = np.float32(1.0) / (np.float32(factor) * powers)
    low, high = _yarn_correction_range(params, dim, base, original)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    # kept as transformers writes it: 1 - (1 - ramp) is not ramp in float32
    extrapolation_factor = np.float32(1.0) - ramp
    inv_freq = interpolation * (np.float32(1.0) - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, _yarn_attention_factor(params, factor)


def _yarn_correction_range(params: dict, dim: int, base, original: int) -> tuple[float, float]:
    """The dimensions between which yarn's ramp runs (find_correction_range), truncated unless `truncate` is false.

    transformers reads `truncate` from the top level of rope_parameters, which is this dict in every
    config it builds (a yarn config keyed by layer type fails its validation in 5.5.4).
    """
    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = correction_dim(params.get("beta_fast") or 32)
    high = correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_attention_factor(params: dict, factor: float) -> float:
    """`attention_factor` if stated, else transformers' get_mscale: 0.1 ln(factor) + 1, or with both
    mscale and mscale_all_dim set, the ratio of the one scaled by each."""
    def get_mscale(mscale):
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    if params.get("mscale") and params.get("mscale_all_dim"):
        return float(get_mscale(params["mscale"]) / get_mscale(params["mscale_all_dim"]))
    return get_mscale(1)


def _powers(base, dim: int) -> np.ndarray:
    """base ** (2i / dim) for i < dim / 2 in float32, as `base ** (torch.arange(0, dim, 2).float() / dim)`."""
    # int64 -> float32, then divided by float32(dim): exact steps, the same in NumPy
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    # torch casts the base to float32 and raises it in float32; raised in float64 and rounded once,
    # this is the correctly rounded float32 power
    return (np.float64(np.float32(base)) ** exponents.astype(np.float64)).astype(np.float32)


def _rotary_dim(params: dict, head_dim: int) -> int:
    # int(head_dim * partial_rotary_factor), truncated, as each rope function takes it
    return int(head_dim * params.get("partial_rotary_factor", 1.0))


def _get(config, key: str, default=None):
    """A key of a config.json dict, or an attribute of transformers' config object."""
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)

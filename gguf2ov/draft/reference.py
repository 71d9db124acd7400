"""The draft's function in NumPy: the reference an exported draft IR is compared with.

`reference_outputs()` is what `verify`'s checkpoint-match compares the IR with. It computes
optimum-intel's `Qwen3DFlashForCausalLM` in NumPy (with a DFlash 2 draft's convolutions, as the
PyTorch reference in dflash2_torch.py computes them), one decoder layer at a time: each layer's
weights come from the opened source, run every call, and are dropped, so the peak is one layer in
float32 whatever the draft's size, and nothing of transformers or optimum is imported (10-12 s and
400 MB on their own, more than the rest of a gguf export of a 1 B draft). The tests hold it to
optimum's class on the fixture and on random geometries (tests/draft/test_draft_graph.py).
"""

import numpy as np

from .source import DraftSource


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)))


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _softmax(x: np.ndarray) -> np.ndarray:
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


class _Call:
    """One draft call's inputs and its running state through the layers."""

    def __init__(self, feeds: dict, inv_freq: np.ndarray, scaling: float):
        self.x = np.asarray(feeds["inputs_embeds"], dtype=np.float32)
        self.hidden = np.asarray(feeds["hidden_states"], dtype=np.float32)
        positions = np.asarray(feeds["position_ids"]).astype(np.float32)
        freqs = positions[..., None] * inv_freq  # [B, L, hd/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        self.cos = (np.cos(emb) * np.float32(scaling))[:, None]  # [B, 1, L, hd]
        self.sin = (np.sin(emb) * np.float32(scaling))[:, None]
        mask = np.asarray(feeds["attention_mask"]).astype(np.float32)
        self.mask = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :].astype(np.float32)
        self.context = None


def reference_outputs(draft: DraftSource, calls: list[dict], chained: bool = True) -> list[np.ndarray]:
    """last_hidden_state for each draft call; chained calls share the K/V cache, as GenAI's steps do.

    Kept on the opened source per set of calls: every variant of a draft is checked on the same
    synthetic steps, and each computation reads the whole draft once more."""
    key = (chained, draft.config.input_embedding_scale, _digest(calls))  # a copy fitted for other embeddings shares it
    cache = draft.__dict__.setdefault("_reference_outputs", {})
    if key not in cache:
        cache[key] = _compute(draft, calls, chained)
    return cache[key]


def _digest(calls: list[dict]) -> str:
    import hashlib

    h = hashlib.sha256()
    for feeds in calls:
        for name in sorted(feeds):
            value = np.ascontiguousarray(feeds[name])
            h.update(name.encode() + str(value.shape).encode() + value.dtype.str.encode() + value.tobytes())
    return h.hexdigest()


def _compute(draft: DraftSource, calls: list[dict], chained: bool) -> list[np.ndarray]:
    config = draft.config
    eps = config.rms_norm_eps
    inv_freq, scaling = config.rope()
    runs = [_Call(feeds, inv_freq, scaling) for feeds in calls]
    for run in runs:
        run.x = run.x * np.float32(config.input_embedding_scale)
    fc = draft.f32("fc.weight")
    hidden_norm = draft.f32("hidden_norm.weight")
    for run in runs:
        run.context = _rms_norm(run.hidden @ fc.T, hidden_norm, eps)
    del fc
    for i, (window, causal) in enumerate(zip(config.layer_windows, config.causal_layers)):
        layer = {name[len(f"layers.{i}."):]: draft.f32(name) for name in draft.names if name.startswith(f"layers.{i}.")}
        cache = None
        for run in runs:
            run.x, cache = _layer(run, layer, config, window, causal, cache if chained else None)
        del layer
    norm = draft.f32("norm.weight")
    return [_rms_norm(run.x, norm, eps)[:, 1:] for run in runs]


def _conv_kernels(normed: np.ndarray, w: dict, name: str, config) -> np.ndarray | None:
    """A DFlash 2 convolution's per-row coefficients [B, T, 2, ks, H] (None for a v1 draft)."""
    if not config.is_dflash2:
        return None
    b, t, h = normed.shape
    ks, gs = config.conv_kernel_size, config.conv_group_size
    dyn = (normed @ w[f"{name}.kernel_projection.weight"].T).reshape(b, t, 2, ks, h // gs)
    return w[f"{name}.base_kernel"][None, None] + np.repeat(dyn, gs, axis=-1)  # group g covers channels g*gs..


def _conv(x: np.ndarray, kernels: np.ndarray | None, side: int) -> np.ndarray:
    """y[i] = sum_t kernel[i, side, t] * x[i - t], zero before the block's first row."""
    if kernels is None:
        return x
    y = np.zeros_like(x)
    for tap in range(kernels.shape[3]):
        y[:, tap:] += kernels[:, tap:, side, tap] * x[:, :x.shape[1] - tap]
    return y


def _layer(run: _Call, w: dict, config, window: int | None, causal: bool, cache):
    """One decoder layer on the block rows, reading [context, block]; returns (rows, updated cache)."""
    heads, kv_heads, hd, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
    x, context = run.x, run.context
    b, t, c = x.shape[0], x.shape[1], context.shape[1]
    normed = _rms_norm(x, w["input_layernorm.weight"], eps)
    attention_conv = _conv_kernels(normed, w, "attention_conv", config)
    normed = _conv(normed, attention_conv, 0)
    q = _rms_norm((normed @ w["self_attn.q_proj.weight"].T).reshape(b, t, heads, hd), w["self_attn.q_norm.weight"], eps)
    kv_in = np.concatenate([context, normed], axis=1)
    k = _rms_norm((kv_in @ w["self_attn.k_proj.weight"].T).reshape(b, c + t, kv_heads, hd),
                  w["self_attn.k_norm.weight"], eps)
    v = (kv_in @ w["self_attn.v_proj.weight"].T).reshape(b, c + t, kv_heads, hd)
    q, k, v = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    q = q * run.cos[..., -t:, :] + _rotate_half(q) * run.sin[..., -t:, :]
    k = k * run.cos + _rotate_half(k) * run.sin
    # only the context is cached; the block is the draft's own guess and never kept
    k_ctx, v_ctx = k[:, :, :c], v[:, :, :c]
    if cache is not None:
        k_ctx, v_ctx = np.concatenate([cache[0], k_ctx], axis=2), np.concatenate([cache[1], v_ctx], axis=2)
    new_cache = (k_ctx, v_ctx)
    if window:
        k_ctx, v_ctx = k_ctx[:, :, -window:], v_ctx[:, :, -window:]
    keys = np.concatenate([k_ctx, k[:, :, c:]], axis=2)
    values = np.concatenate([v_ctx, v[:, :, c:]], axis=2)
    kv_len = keys.shape[2]
    mask = run.mask[..., -kv_len:]
    if window or causal:
        distance = np.arange(kv_len - t, kv_len)[:, None] - np.arange(kv_len)[None, :]
        hidden = (distance < 0) if causal else np.zeros(distance.shape, bool)
        if window:
            hidden |= (distance >= window) | (not causal and distance <= -window)
        mask = mask + np.where(hidden, np.finfo(np.float32).min, 0).astype(np.float32)
    groups = heads // kv_heads
    keys, values = np.repeat(keys, groups, axis=1), np.repeat(values, groups, axis=1)
    scores = (q @ keys.transpose(0, 1, 3, 2)) * np.float32(hd ** -0.5) + mask
    attn = (_softmax(scores) @ values).transpose(0, 2, 1, 3).reshape(b, t, heads * hd)
    x = x + _conv(attn @ w["self_attn.o_proj.weight"].T, attention_conv, 1)
    normed = _rms_norm(x, w["post_attention_layernorm.weight"], eps)
    mlp_conv = _conv_kernels(normed, w, "mlp_conv", config)
    normed = _conv(normed, mlp_conv, 0)
    gate = normed @ w["mlp.gate_proj.weight"].T
    mlp = (gate / (1 + np.exp(-gate)) * (normed @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T
    return (x + _conv(mlp, mlp_conv, 1)).astype(np.float32), new_cache

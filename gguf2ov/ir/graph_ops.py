"""The OpenVINO opset pieces the draft and the target graphs share, as optimum-intel's trace writes them.

Both graph builders (draft/graph.py, targets/graph.py) reproduce what optimum-intel 2.2.0 exports
from transformers' PyTorch modules, node names included where tools look nodes up by name
(`__module.<path>/aten::linear/MatMul`, a norm's `aten::mul/Multiply_1`). The pieces here are
those of every Qwen3/Llama-style decoder: RMSNorm, Linear, RoPE tables and their application, the
stateful K/V cache reordered by `beam_idx`, and the grouped-query head repeat.
"""


import numpy as np

F32_MIN = float(np.finfo(np.float32).min)
I64_MAX = int(np.iinfo(np.int64).max)


def ops():
    from openvino import opset13

    return opset13


def const(values, dtype=np.float32):
    return ops().constant(np.asarray(values, dtype=dtype))


def named(node, name: str):
    node.set_friendly_name(name)
    return node


def dim(node, axis: int):
    """node.shape[axis] as a 1-element i64 tensor."""
    o = ops()
    return o.gather(o.shape_of(node, "i64"), const([axis], np.int64), const(0, np.int64))


def last_rows(x, count, axis: int):
    """x[..., -count:, ...] along `axis`, with `count` a 1-element i64 tensor."""
    o = ops()
    return o.slice(x, o.negative(count), const([I64_MAX], np.int64), const([1], np.int64), const([axis], np.int64))


def rms_norm(x, weight: np.ndarray, eps: float, scope: str):
    """transformers' RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * weight.

    `weight` is the factor the norm multiplies by: Gemma's (1 + w) is computed by the caller, as
    optimum's trace folds it into one constant.
    """
    o = ops()
    p = f"__module.{scope}/aten::"
    square = named(o.power(x, const(2.0)), p + "pow/Power")
    mean = named(o.reduce_mean(square, const([-1], np.int64), True), p + "mean/ReduceMean")
    root = named(o.sqrt(named(o.add(mean, const(eps)), p + "add/Add")), p + "rsqrt/Sqrt")
    inverse = named(o.divide(const(1.0), root), p + "rsqrt/Divide")
    normed = named(o.multiply(x, inverse), p + "mul/Multiply")
    return named(o.multiply(const(weight), normed), p + "mul/Multiply_1")


def group_sums(x, groups: int, group: int):
    """x [..., groups * group] summed over each `group` consecutive inputs: [..., groups]."""
    o = ops()
    x = x if hasattr(x, "get_partial_shape") else x.output(0)
    rank = x.get_partial_shape().rank.get_length()
    grouped = o.reshape(x, const([0] * (rank - 1) + [groups, group], np.int64), True)
    return o.reduce_sum(grouped, const([-1], np.int64), False)


def linear(x, weight, scope: str, bias: np.ndarray | None = None):
    """x @ weight^T (+ bias), named as optimum names a Linear's nodes. A `SplitWeight` adds the MatMul of
    its offset on the group sums of x."""
    o = ops()
    from ..gguf.transcode import SplitWeight

    split = isinstance(weight, SplitWeight)
    y = named(o.matmul(x, weight.values if split else weight, False, True), f"__module.{scope}/aten::linear/MatMul")
    if split:
        sums = group_sums(x, weight.offset.get_partial_shape()[1].get_length(), weight.group)
        offset = named(o.matmul(sums, weight.offset, False, True), f"__module.{scope}/offset/MatMul")
        y = named(o.add(y, offset), f"__module.{scope}/offset/Add")
    if bias is None:
        return y
    return named(o.add(y, const(bias)), f"__module.{scope}/aten::linear/Add")


def rope_tables(position_ids, inv_freq: np.ndarray, scaling: float):
    """cos and sin [B, 1, L, head_dim] for every position, as transformers' rotary embeddings make them."""
    o = ops()
    freqs = o.matmul(const(inv_freq.reshape(1, -1, 1)), o.unsqueeze(o.convert(position_ids, "f32"),
                                                                     const([1], np.int64)), False, False)
    freqs = o.transpose(freqs, const([0, 2, 1], np.int64))
    emb = o.concat([freqs, freqs], -1)
    cos, sin = o.cos(emb), o.sin(emb)
    if scaling != 1.0:
        cos, sin = o.multiply(cos, const(scaling)), o.multiply(sin, const(scaling))
    axis = const([1], np.int64)
    return o.unsqueeze(cos, axis), o.unsqueeze(sin, axis)


def _rotate_half(x, half: int):
    o = ops()
    first = o.slice(x, const([0], np.int64), const([half], np.int64), const([1], np.int64), const([-1], np.int64))
    second = o.slice(x, const([half], np.int64), const([2 * half], np.int64), const([1], np.int64),
                     const([-1], np.int64))
    return o.concat([o.negative(second), first], -1)


def apply_rope(x, cos, sin, half: int):
    """x * cos + rotate_half(x) * sin (transformers' apply_rotary_pos_emb, NEOX halves)."""
    o = ops()
    return o.add(o.multiply(x, cos), o.multiply(_rotate_half(x, half), sin))


def kv_state(new, batch, name: str, kv_heads: int, head_dim: int, beam_idx):
    """(past + new along the sequence axis, its Assign): a state variable reordered by `beam_idx`.

    ReadValue -> Gather(beam_idx) -> Concat is the pattern every stateful optimum export has, and
    the one OpenVINO's SDPAToPagedAttention replaces by the paged cache.
    """
    from openvino import opset6

    o = ops()
    shape = o.concat([batch, const([kv_heads, 0, head_dim], np.int64)], 0)
    init = o.broadcast(const(0.0), shape)
    past = opset6.read_value(init, name, np.float32, [-1, kv_heads, -1, head_dim])
    past = o.gather(past, beam_idx, const(0, np.int64))
    cached = o.concat([past, new], 2)
    return cached, opset6.assign(cached, name)


def repeat_kv(x, kv_heads: int, groups: int, head_dim: int):
    """[B, kv, L, hd] -> [B, kv * groups, L, hd] by Unsqueeze -> Broadcast (bidirectional) -> Reshape, the
    pattern transformers' repeat_kv traces to. Two passes read it: SDPAToPagedAttention takes the
    key/value head count from the Unsqueeze, and the CPU plugin's StatefulSDPAFusion keeps the cache
    inside its SDPA (in f16 under KV_CACHE_PRECISION) only if each of these nodes has one consumer and
    the Broadcast is bidirectional; a broadcast shape read from the Unsqueeze made it decompose the
    attention instead (measured: 0 fused SDPAs, logits 8.6e-5 away from optimum's in the second step)."""
    o = ops()
    if groups == 1:
        return x
    x = o.unsqueeze(x, const([2], np.int64))
    x = o.broadcast(x, const([1, 1, groups, 1, 1], np.int64), broadcast_spec="BIDIRECTIONAL")
    return o.reshape(x, const([0, kv_heads * groups, -1, head_dim], np.int64), True)

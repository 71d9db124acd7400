"""Carrying a GGUF file's own quantization grid into the OpenVINO IR, instead of re-quantizing.

Every block-quantized GGUF type is affine per group: value = scale * (code - zero_point), with
integer codes and one scale and zero point per 16- or 32-element group (Q4_K: y = d*sc*q - dmin*m,
so zero_point = dmin*m / (d*sc)). OpenVINO's compressed-weight pattern,
Constant(u4|u8) -> Convert(f32) -> Subtract(zero_point) -> Multiply(scale) -> Reshape, expresses
exactly that, and the CPU plugin runs it as a FullyConnected with compressed weights (checked:
f32 scales and f32 zero points are accepted and kept compressed). So the IR holds the GGUF's codes,
and its values equal the dequantized GGUF grid up to float32 rounding of the zero point: no second
rounding, unlike NNCF choosing new scales at any group size.
"""

import numpy as np

from .quants import AffineCodes


def _decompression(codes: AffineCodes):
    import openvino as ov
    from openvino import opset13 as ops

    out, n = codes.codes.shape
    g = codes.group_size
    grouped = codes.codes.reshape(out, n // g, g)
    if codes.bits <= 4:
        flat = grouped.reshape(-1)
        packed = np.ascontiguousarray(flat[0::2] | (flat[1::2] << np.uint8(4)))  # u4: low nibble first
        weight = ov.op.Constant(ov.Tensor(packed, ov.Shape([out, n // g, g]), ov.Type.u4), shared_memory=False)
    else:
        weight = ops.constant(np.ascontiguousarray(grouped), dtype=np.uint8)
    x = ops.convert(weight, "f32")
    x = ops.subtract(x, ops.constant(codes.zero_point.reshape(out, n // g, 1).astype(np.float32)))
    x = ops.multiply(x, ops.constant(codes.scale.reshape(out, n // g, 1).astype(np.float32)))
    return ops.reshape(x, ops.constant(np.array([out, n], dtype=np.int64)), False)


def transcode(ov_model, grids: dict[str, AffineCodes]) -> list[str]:
    """Replace the weights named in `grids` by their GGUF grid; returns the names replaced."""
    from .irweights import weight_param_name

    replaced = []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        name = weight_param_name(op)
        if name not in grids:
            continue
        codes = grids[name]
        expected = tuple(op.input_value(1).get_partial_shape().to_shape())
        if codes.codes.shape != expected:
            raise ValueError(f"{name}: GGUF grid {codes.codes.shape} does not fit the IR weight {expected}")
        op.input(1).replace_source_output(_decompression(codes).output(0))
        replaced.append(name)
    return replaced

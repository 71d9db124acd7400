"""GGUF block (de)quantization in vectorised numpy.

`dequantize` returns exactly the float32 bits gguf-py's `gguf.quants.dequantize` returns (same
operation order: scales are multiplied first, f16 fields widen through numpy's f16->f32 cast), only
faster: it works on cache-sized chunks of blocks and writes straight into the output array.

`quantize` writes blocks as llama.cpp's reference quantizers do without an importance matrix. For
the K-quants it replays `quantize_row_q{4,5,6}_K_ref` from `ggml-quants.c` in float32, vectorised
over sub-blocks; the per-element sums are accumulated in llama.cpp's sequential order because a
different summation order changes which search step wins and so the bytes.
"""

from __future__ import annotations

from typing import Callable

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import Gguf2ovError

QType = GGMLQuantizationType

# ~64K output floats per chunk keeps the working set of one chunk inside L2.
_CHUNK_ELEMENTS = 1 << 16

# llama.cpp treats a group whose largest magnitude is below this as all zeros.
_GROUP_MAX_EPS = np.float32(1e-15)

_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# byte arithmetic
# ---------------------------------------------------------------------------------------------

def n_bytes(n_elements: int, qtype: QType) -> int:
    """Bytes that `n_elements` values occupy in `qtype` (a multiple of the block size)."""
    block_size, type_size = _sizes(qtype)
    if n_elements % block_size:
        raise Gguf2ovError(
            f"{n_elements} elements is not a multiple of the {qtype.name} block size {block_size}")
    return n_elements // block_size * type_size


def quant_byte_shape(shape: tuple[int, ...], qtype: QType) -> tuple[int, ...]:
    """Byte-array shape of a tensor of `shape` (torch order, last axis = GGUF ne[0])."""
    if not shape:
        raise Gguf2ovError(f"a {qtype.name} tensor needs at least one dimension")
    return (*shape[:-1], n_bytes(shape[-1], qtype))


def _sizes(qtype: QType) -> tuple[int, int]:
    try:
        return GGML_QUANT_SIZES[QType(qtype)]
    except (KeyError, ValueError):
        raise Gguf2ovError(f"unknown GGML type {qtype!r}") from None


def _f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 stored at byte `offset` of every block, widened to float32, shape (n, 1)."""
    return blocks[:, offset:offset + 2].view(np.float16).astype(np.float32)


def _split_nibbles(packed: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
    """Write the low and high nibbles of `packed` (uint8) into the float32 views `low`, `high`."""
    np.copyto(low, packed & np.uint8(0x0F), casting="unsafe")
    np.copyto(high, packed >> np.uint8(4), casting="unsafe")


# ---------------------------------------------------------------------------------------------
# dequantization kernels: kernel(blocks uint8 (n, type_size), out float32 (n, block_size))
# ---------------------------------------------------------------------------------------------

def _dequant_bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    widened = blocks.view(np.uint16).astype(np.uint32) << np.uint32(16)
    out[...] = widened.view(np.float32)


def _dequant_q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, blocks[:, 2:].view(np.int8), casting="unsafe")
    np.multiply(out, _f16_field(blocks, 0), out=out)


def _legacy_codes(blocks: np.ndarray, out: np.ndarray, qs_offset: int, qh_offset: int | None) -> None:
    """Unsigned 4/5-bit codes of Q4_0/Q4_1/Q5_0/Q5_1 blocks as float32 into `out`.

    Byte j holds element j in its low nibble and element j+16 in its high nibble; Q5 types keep
    bit 4 of element j in bit j of a little-endian uint32.
    """
    halves = out.reshape(-1, 2, 16)
    qs = blocks[:, qs_offset:qs_offset + 16]
    if qh_offset is None:
        _split_nibbles(qs, halves[:, 0], halves[:, 1])
        return
    high_bits = np.unpackbits(blocks[:, qh_offset:qh_offset + 4], axis=-1, bitorder="little")
    high_bits <<= np.uint8(4)
    high_bits.reshape(-1, 2, 16)[:, 0] |= qs & np.uint8(0x0F)
    high_bits.reshape(-1, 2, 16)[:, 1] |= qs >> np.uint8(4)
    np.copyto(out, high_bits, casting="unsafe")


def _dequant_q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    _legacy_codes(blocks, out, 2, None)
    np.subtract(out, np.float32(8), out=out)
    np.multiply(out, _f16_field(blocks, 0), out=out)


def _dequant_q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    _legacy_codes(blocks, out, 6, 2)
    np.subtract(out, np.float32(16), out=out)
    np.multiply(out, _f16_field(blocks, 0), out=out)


def _dequant_q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    _legacy_codes(blocks, out, 4, None)
    np.multiply(out, _f16_field(blocks, 0), out=out)
    np.add(out, _f16_field(blocks, 2), out=out)


def _dequant_q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    _legacy_codes(blocks, out, 8, 4)
    np.multiply(out, _f16_field(blocks, 0), out=out)
    np.add(out, _f16_field(blocks, 2), out=out)


def k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K/Q5_K's 12 scale bytes into eight 6-bit scales and eight 6-bit mins (uint8).

    llama.cpp `get_scale_min_k4`: sub-blocks 0-3 keep scale and min in the low 6 bits of bytes
    0-3 and 4-7; sub-blocks 4-7 keep their low 4 bits in bytes 8-11 and the top 2 bits in the
    top bits of bytes 0-3 (scales) and 4-7 (mins).
    """
    low, mid, tail = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 0x3F, (tail & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([mid & 0x3F, (tail >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return scales, mins


def _scaled(field: np.ndarray, small_ints: np.ndarray) -> np.ndarray:
    """f32 field times small integer scales, shaped (n, groups, 1) for broadcasting."""
    return (field * small_ints.astype(np.float32))[:, :, None]


def _q4_k_codes(blocks: np.ndarray, out: np.ndarray) -> None:
    # qs chunk c: byte l holds element 64c+l (low nibble) and 64c+32+l (high nibble).
    chunks = out.reshape(-1, 4, 2, 32)
    _split_nibbles(blocks[:, 16:144].reshape(-1, 4, 32), chunks[:, :, 0], chunks[:, :, 1])


def _q5_k_codes(blocks: np.ndarray, out: np.ndarray) -> None:
    qs = blocks[:, 48:176].reshape(-1, 4, 1, 32) >> _NIBBLE_SHIFTS[:, None]
    qs &= np.uint8(0x0F)
    # qh byte l bit k is bit 4 of element 32k+l.
    high = np.unpackbits(blocks[:, 16:48], axis=-1, bitorder="little")
    codes = qs.reshape(-1, 8, 32) | (high.reshape(-1, 32, 8).transpose(0, 2, 1) << np.uint8(4))
    np.copyto(out.reshape(-1, 8, 32), codes, casting="unsafe")


def _dequant_q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    _q4_k_codes(blocks, out)
    _apply_scale_min(blocks, *k_scales_mins(blocks[:, 4:16]), out)


def _dequant_q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    _q5_k_codes(blocks, out)
    _apply_scale_min(blocks, *k_scales_mins(blocks[:, 4:16]), out)


def _apply_scale_min(blocks: np.ndarray, scales: np.ndarray, mins: np.ndarray, out: np.ndarray) -> None:
    """out = (d*scale)*q - dmin*min per 32-element sub-block, as gguf-py and llama.cpp order it."""
    groups = out.reshape(-1, 8, 32)
    np.multiply(groups, _scaled(_f16_field(blocks, 0), scales), out=groups)
    np.subtract(groups, _scaled(_f16_field(blocks, 2), mins), out=groups)


# Q6_K codes are unpacked eight at a time, in uint64 words, by shifts taken from these arrays (one
# shift per word, for a chunk's blocks): each ql byte is copied twice and each qh byte four times
# into place, then a shift, a mask and an or run over the whole chunk. Shifting the fields out of
# short runs instead (numpy's inner loop restarting every 32 or 64 bytes, and a uint8 left shift
# that numpy does not vectorise) took most of the kernel's time. A word's bytes are shifted by at
# most 6 bits and masked, so no byte receives bits of another.
_Q6_K_BLOCKS = _CHUNK_ELEMENTS // 256
_Q6_K_QL_SHIFTS = np.ascontiguousarray(np.broadcast_to(np.array([0, 4], np.uint64)[:, None],
                                                         (_Q6_K_BLOCKS, 2, 2, 8))).reshape(-1, 32)
_Q6_K_QH_SHIFTS = np.ascontiguousarray(np.broadcast_to(np.array([0, 2, 4, 6], np.uint64)[:, None],
                                                         (_Q6_K_BLOCKS, 2, 4, 4))).reshape(-1, 32)
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW_PAIRS = np.uint64(0x0303030303030303)


def _q6_k_codes(blocks: np.ndarray, codes: np.ndarray) -> None:
    """The signed codes (6-bit code - 32) of Q6_K blocks, as int8 bytes into `codes` (n, 256) uint8.

    Per 128-element half: ql bytes 0-63 low nibbles are elements 0-63, high nibbles 64-127; qh
    byte l holds bits 4-5 of elements l, l+32, l+64, l+96 in bit pairs 0, 2, 4, 6.
    """
    n = blocks.shape[0]
    words = codes.view(np.uint64)
    np.copyto(codes.reshape(n, 2, 2, 64), blocks[:, 0:128].reshape(n, 2, 1, 64))
    np.right_shift(words, _Q6_K_QL_SHIFTS[:n], out=words)
    np.bitwise_and(words, _LOW_NIBBLES, out=words)
    high = np.empty((n, 2, 4, 32), np.uint8)
    np.copyto(high, blocks[:, 128:192].reshape(n, 2, 1, 32))
    high_words = high.view(np.uint64).reshape(n, 32)
    np.right_shift(high_words, _Q6_K_QH_SHIFTS[:n], out=high_words)
    np.bitwise_and(high_words, _LOW_PAIRS, out=high_words)
    np.left_shift(high_words, np.uint64(4), out=high_words)
    np.bitwise_or(words, high_words, out=words)
    codes -= np.uint8(32)  # wraps: as int8, code - 32


def _dequant_q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    codes = np.empty((blocks.shape[0], 256), np.uint8)
    _q6_k_codes(blocks, codes)
    np.copyto(out, codes.view(np.int8), casting="unsafe")  # q - 32 in float32, as gguf-py computes it
    groups = out.reshape(-1, 16, 16)
    np.multiply(groups, _scaled(_f16_field(blocks, 208), blocks[:, 192:208].view(np.int8)), out=groups)


def _dequant_q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # qs byte l of a 32-byte run holds 2-bit codes of elements l, l+32, l+64, l+96 of its half.
    codes = blocks[:, 16:80].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    codes &= np.uint8(0x03)
    np.copyto(out, codes.reshape(out.shape), casting="unsafe")
    packed = blocks[:, 0:16]
    groups = out.reshape(-1, 16, 16)
    np.multiply(groups, _scaled(_f16_field(blocks, 80), packed & np.uint8(0x0F)), out=groups)
    np.subtract(groups, _scaled(_f16_field(blocks, 82), packed >> np.uint8(4)), out=groups)


def _dequant_q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # Sixteen 6-bit scales: low 4 bits from nibbles of bytes 0-7, top 2 bits from bytes 8-11.
    packed = blocks[:, 96:108]
    low = (packed[:, 0:8].reshape(-1, 1, 8) >> _NIBBLE_SHIFTS[:, None]).reshape(-1, 16) & np.uint8(0x0F)
    top = (packed[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None])
    scales = (low | ((top.reshape(-1, 16) & np.uint8(0x03)) << np.uint8(4))).view(np.int8) - np.int8(32)
    codes = blocks[:, 32:96].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    codes &= np.uint8(0x03)
    # hmask byte l bit k set means "no -4 offset" for element 32k+l.
    hmask = blocks[:, 0:32].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
    hmask = (hmask & np.uint8(1)) ^ np.uint8(1)
    signed = codes.reshape(-1, 8, 32).view(np.int8) - (hmask << np.uint8(2)).view(np.int8)
    np.copyto(out, signed.reshape(out.shape), casting="unsafe")
    groups = out.reshape(-1, 16, 16)
    np.multiply(groups, _scaled(_f16_field(blocks, 108), scales), out=groups)


# MXFP4: ggml's `kvalues_mxfp4`, the E2M1 values doubled (code 8 is +0, not E2M1's -0), and
# `ggml_e8m0_to_fp32_half`: the E8M0 scale 2^(e-127) halved, 2^(e-128), which makes them whole again.
# Its bits for e < 2 are subnormals ggml writes out: 2^-128 and 2^-127.
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
E8M0_HALF = np.where(np.arange(256) < 2, np.uint32(0x00200000) << np.arange(256, dtype=np.uint32),
                      (np.arange(256, dtype=np.uint32) - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(np.float32)


def _dequant_mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    # byte 0: the E8M0 exponent e; qs byte j: element j in the low nibble, element j+16 in the high one.
    halves = out.reshape(-1, 2, 16)
    qs = blocks[:, 1:17]
    np.take(MXFP4_VALUES, qs & np.uint8(0x0F), out=halves[:, 0], mode="clip")
    np.take(MXFP4_VALUES, qs >> np.uint8(4), out=halves[:, 1], mode="clip")
    np.multiply(out, E8M0_HALF[blocks[:, 0]][:, None], out=out)  # d * q in gguf-py; the same product


_DEQUANT_KERNELS: dict[QType, Callable[[np.ndarray, np.ndarray], None]] = {
    QType.BF16: _dequant_bf16,
    QType.Q8_0: _dequant_q8_0,
    QType.Q4_0: _dequant_q4_0,
    QType.Q4_1: _dequant_q4_1,
    QType.Q5_0: _dequant_q5_0,
    QType.Q5_1: _dequant_q5_1,
    QType.Q2_K: _dequant_q2_k,
    QType.Q3_K: _dequant_q3_k,
    QType.Q4_K: _dequant_q4_k,
    QType.Q5_K: _dequant_q5_k,
    QType.Q6_K: _dequant_q6_k,
    QType.MXFP4: _dequant_mxfp4,
}

DEQUANTIZE_TYPES: tuple[QType, ...] = (QType.F32, QType.F16, *_DEQUANT_KERNELS)


def dequantize(data: np.ndarray, qtype: QType) -> np.ndarray:
    """Float32 values of a GGUF tensor's raw data, bit-identical to `gguf.quants.dequantize`.

    `data` is what gguf-py's reader holds for the tensor: the typed array for F32/F16, otherwise
    bytes whose last axis is the row in bytes. The result has the element shape (last axis =
    GGUF ne[0]). As in gguf-py, F32 input comes back as a view, not a copy.
    """
    qtype = _known_type(qtype)
    data = np.asarray(data)
    if qtype == QType.F32:
        return data.view(np.float32)
    if qtype == QType.F16:
        return data.view(np.float16).astype(np.float32)
    kernel = _DEQUANT_KERNELS.get(qtype)
    if kernel is None:
        raise _unsupported("dequantization", qtype, DEQUANTIZE_TYPES)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = data.view(np.uint8) if data.ndim else data.reshape(1).view(np.uint8)
    if raw.shape[-1] % type_size:
        raise Gguf2ovError(
            f"{qtype.name} data has {raw.shape[-1]} bytes per row, not a multiple of the "
            f"{type_size}-byte block", hint="the tensor's type or shape in the file is wrong")
    blocks = raw.reshape(-1, type_size)
    out = np.empty((blocks.shape[0], block_size), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // block_size)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, blocks.shape[0], step):
            kernel(blocks[start:start + step], out[start:start + step])
    return out.reshape(*raw.shape[:-1], raw.shape[-1] // type_size * block_size)


_GROUP_SCALES = {  # (elements per scale, f16 d's byte, the small scales' bytes and type, or None)
    QType.Q8_0: (32, 0, None), QType.Q4_0: (32, 0, None), QType.Q5_0: (32, 0, None), QType.Q4_1: (32, 0, None),
    QType.Q5_1: (32, 0, None), QType.Q4_K: (32, 0, "k"), QType.Q5_K: (32, 0, "k"), QType.Q6_K: (16, 208, "i8"),
    # MXFP4: the doubled E2M1 values count in 2^(e-128), their E8M0 scale halved (steps of 1 to 4 of it)
    QType.MXFP4: (32, 0, "e8m0"),
}


def group_scales(data: np.ndarray, qtype: QType) -> tuple[np.ndarray, int]:
    """(each group's step |d*sc| (or |d|), shaped like the tensor with its last axis in groups; the elements
    per group): the unit a weight's code counts in, which bounds how far another form may move it."""
    group, d_at, small = _GROUP_SCALES[_known_type(qtype)]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.asarray(data).view(np.uint8)
    blocks = raw.reshape(-1, type_size)
    d = E8M0_HALF[blocks[:, d_at]][:, None] if small == "e8m0" else _f16_field(blocks, d_at)
    if small == "k":
        d = d * k_scales_mins(blocks[:, 4:16])[0].astype(np.float32)
    elif small == "i8":
        d = d * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return np.abs(d).reshape(*raw.shape[:-1], raw.shape[-1] // type_size * block_size // group), group


def step_changes(values: np.ndarray, data: np.ndarray, qtype: QType) -> np.ndarray:
    """Each group's largest |values - the file's dequantized values| in its own steps (`group_scales`); a
    group whose step is 0 (one constant) against float32's rounding of that constant."""
    ref = dequantize(data, qtype)
    scales, group = group_scales(data, qtype)
    change = np.abs(np.asarray(values, np.float32) - ref).reshape(*scales.shape, group).max(-1)
    floor = np.finfo(np.float32).eps * np.abs(ref).reshape(*scales.shape, group).max(-1)
    return change / np.maximum(scales, np.maximum(floor, np.finfo(np.float32).tiny))


def _known_type(qtype) -> QType:
    try:
        return QType(qtype)
    except ValueError:
        raise Gguf2ovError(f"unknown GGML type {qtype!r}") from None


def _unsupported(what: str, qtype: QType, supported: tuple[QType, ...]) -> Gguf2ovError:
    names = ", ".join(t.name for t in supported)
    return Gguf2ovError(f"{what} of {qtype.name} tensors is not supported", hint=f"supported: {names}")


# ---------------------------------------------------------------------------------------------
# quantization
# ---------------------------------------------------------------------------------------------
# The K-quant search works on element-major arrays: shape (elements per group, groups), so that
# a reduction over axis 0 adds the rows one after the other, which is the order of llama.cpp's
# `for (i = 0; i < n; ++i) sum += ...` loops (numpy's pairwise summation would only kick in
# along a contiguous last axis).

# Super-blocks quantized per call: bounds the float32 temporaries of the search to a few MB.
_QUANTIZE_CHUNK_BLOCKS = 512

_F32 = np.float32


# Beyond this, llama.cpp's `nearest_int` (which asserts it, in debug builds only) is not rounding.
_NEAREST_INT_RANGE = _F32(4194303)


def _nearest_int(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's `nearest_int`, bit for bit, as float32: it adds 1.5*2^23 and reads the low 23
    bits of the sum. Within +-(2^22 - 1) that is round half to even (np.rint); NaN gives 0, +-Inf
    -2^22, and larger values wrap. Those reach the K-quantizers when a sub-block's range is below
    ~1e-37 or dmin overflows f16, and the clamps after them then write code 0, not the top code."""
    values = np.asarray(values, dtype=np.float32)
    odd = ~(np.abs(values) <= _NEAREST_INT_RANGE)  # NaN too
    odd_values = values[odd] if odd.any() else None  # before `out` overwrites them
    result = np.rint(values, out=out)
    if odd_values is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            summed = odd_values + _F32(12582912)
        result[odd] = ((summed.view(np.int32) & np.int32(0x007FFFFF)) - np.int32(0x00400000)).astype(np.float32)
    return result


def _f16_round(values: np.ndarray) -> np.ndarray:
    """(f16 bits as uint8 pairs, value widened back to float32) for float32 `values` (n,)."""
    half = values.astype(np.float16)
    return half.view(np.uint8).reshape(-1, 2), half.astype(np.float32)


def _make_qkx2_quants(x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, rdelta: float,
                      nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp `make_qkx2_quants` (use_mad false) for every column of `x` (elements, groups).

    Returns the codes (float32, elements x groups), the scale and the (non-negative) min per group.
    """
    nmax_f = _F32(nmax)
    lowest = np.minimum(x.min(axis=0), _F32(0))
    highest = x.max(axis=0)
    flat = highest == lowest
    sum_w = np.add.reduce(weights, axis=0)
    sum_x = np.add.reduce(weights * x, axis=0)
    trial = np.empty_like(x)
    scratch = np.empty_like(x)

    def codes_for(iscale: np.ndarray, offset: np.ndarray) -> np.ndarray:
        np.subtract(x, offset, out=trial)
        np.multiply(trial, iscale, out=trial)
        _nearest_int(trial, out=trial)
        np.maximum(trial, _F32(0), out=trial)
        return np.minimum(trial, nmax_f, out=trial)

    def weighted_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add.reduce(np.multiply(a, b, out=scratch), axis=0)

    def weighted_error(scale: np.ndarray, codes: np.ndarray, offset: np.ndarray) -> np.ndarray:
        diff = np.multiply(scale, codes, out=scratch)
        diff += offset
        diff -= x
        np.multiply(diff, diff, out=diff)
        return weighted_sum(weights, diff)

    iscale = nmax_f / (highest - lowest)
    scale = _F32(1) / iscale
    codes = codes_for(iscale, lowest).copy()
    best_error = weighted_error(scale, codes, lowest)
    best_min = lowest
    weighted = np.empty_like(x)
    for step in range(nstep + 1):
        # The search rescales around the best min found so far, as llama.cpp does.
        factor = _F32(rmin) + _F32(rdelta) * _F32(step) + nmax_f
        codes_for(factor / (highest - best_min), best_min)
        np.multiply(weights, trial, out=weighted)
        sum_l = np.add.reduce(weighted, axis=0)
        sum_l2 = weighted_sum(weighted, trial)
        sum_xl = weighted_sum(weighted, x)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive_min = this_min > 0
        this_min = np.where(positive_min, _F32(0), this_min)
        this_scale = np.where(positive_min, sum_xl / sum_l2, this_scale)
        error = weighted_error(this_scale, trial, this_min)
        better = (det > 0) & (error < best_error)
        np.copyto(codes, trial, where=better)
        best_error = np.where(better, error, best_error)
        scale = np.where(better, this_scale, scale)
        best_min = np.where(better, this_min, best_min)
    codes[:, flat] = 0
    scale = np.where(flat, _F32(0), scale)
    the_min = -np.where(flat, lowest, best_min)
    return codes, scale, the_min


def _make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp `make_qx_quants` with rmse_type 1 and no importance weights, per column of `x`.

    Returns the codes offset by nmax (float32) and the scale per group.
    """
    nmax_f = _F32(nmax)
    columns = np.arange(x.shape[1])
    # The signed value of the first largest magnitude (llama.cpp keeps the first on ties).
    signed_max = x[np.abs(x).argmax(axis=0), columns]
    negligible = np.abs(signed_max) < _GROUP_MAX_EPS
    weights = x * x
    weights_x = weights * x
    trial = np.empty_like(x)
    scratch = np.empty_like(x)

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        np.multiply(iscale, x, out=trial)
        _nearest_int(trial, out=trial)
        np.maximum(trial, -nmax_f, out=trial)
        np.minimum(trial, nmax_f - _F32(1), out=trial)
        sum_lx = np.add.reduce(np.multiply(weights_x, trial, out=scratch), axis=0)
        np.multiply(weights, trial, out=scratch)
        sum_l2 = np.add.reduce(np.multiply(scratch, trial, out=scratch), axis=0)
        return sum_lx, sum_l2

    sum_lx, sum_l2 = fit(-nmax_f / signed_max)
    codes = trial.copy()
    scale = np.where(sum_l2 != 0, sum_lx / sum_l2, _F32(0))
    best = scale * sum_lx
    for step in range(-9, 10):
        if step == 0:
            continue
        sum_lx, sum_l2 = fit(-(nmax_f + _F32(0.1) * _F32(step)) / signed_max)
        better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
        np.copyto(codes, trial, where=better)
        scale = np.where(better, sum_lx / sum_l2, scale)
        best = np.where(better, scale * sum_lx, best)
    codes += nmax_f
    codes[:, negligible] = 0
    scale = np.where(negligible, _F32(0), scale)
    return codes, scale


def _pack_k_scales(scale_codes: np.ndarray, min_codes: np.ndarray) -> np.ndarray:
    """Pack eight 6-bit scales and mins per block (uint8, (n, 8)) into 12 bytes (see `k_scales_mins`)."""
    low_s, high_s = scale_codes[:, :4], scale_codes[:, 4:]
    low_m, high_m = min_codes[:, :4], min_codes[:, 4:]
    return np.concatenate([
        low_s | ((high_s >> 4) << 6),
        low_m | ((high_m >> 4) << 6),
        (high_s & 0x0F) | ((high_m & 0x0F) << 4),
    ], axis=1)


def _quantize_scale_min_blocks(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Shared core of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref` for blocks x (n, 256).

    Returns (d and dmin f16 bytes (n, 4), packed scales (n, 12), codes (n, 8, 32) uint8).
    """
    n_blocks = x.shape[0]
    groups = np.ascontiguousarray(x.reshape(-1, 32).T)
    sum_x2 = np.add.reduce(groups * groups, axis=0)
    av_x = np.sqrt(sum_x2 / _F32(32))
    weights = av_x + np.abs(groups)
    codes, scales, mins = _make_qkx2_quants(groups, weights, nmax, rmin, rdelta, nstep)
    scales = scales.reshape(n_blocks, 8)
    mins = mins.reshape(n_blocks, 8)

    # llama.cpp keeps the largest with `if (scale > max_scale)` from 0: a NaN scale is skipped
    max_scale = np.fmax(np.fmax.reduce(scales, axis=1), _F32(0))
    max_min = np.fmax(np.fmax.reduce(mins, axis=1), _F32(0))
    inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0))
    inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0))
    # llama.cpp stores nearest_int's result in a uint8 before MIN(63, .): negatives wrap.
    scale_codes = np.minimum(_nearest_int(inv_scale[:, None] * scales).astype(np.int64).astype(np.uint8), 63)
    min_codes = np.minimum(_nearest_int(inv_min[:, None] * mins).astype(np.int64).astype(np.uint8), 63)
    d_bytes, d = _f16_round(max_scale / _F32(63))
    dmin_bytes, dmin = _f16_round(max_min / _F32(63))

    # Requantize against the stored (f16, 6-bit) scale and min; a zero scale keeps the search codes.
    step = (d[:, None] * scale_codes.astype(np.float32)).reshape(-1)
    shift = (dmin[:, None] * min_codes.astype(np.float32)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        requantized = np.clip(_nearest_int((groups + shift) / step), _F32(0), _F32(nmax))
    codes = np.where(step != 0, requantized, codes)
    codes = codes.T.reshape(n_blocks, 8, 32).astype(np.uint8)
    header = np.concatenate([d_bytes, dmin_bytes], axis=1)
    return header, _pack_k_scales(scale_codes, min_codes), codes


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    header, scales, codes = _quantize_scale_min_blocks(x, 15, -1.0, 0.1, 20)
    pairs = codes.reshape(-1, 4, 2, 32)
    qs = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
    return np.concatenate([header, scales, qs.reshape(-1, 128)], axis=1)


def _quantize_q5_k(x: np.ndarray) -> np.ndarray:
    header, scales, codes = _quantize_scale_min_blocks(x, 31, -0.5, 0.1, 15)
    pairs = (codes & 0x0F).reshape(-1, 4, 2, 32)
    qs = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
    # qh byte l, bit k: bit 4 of element 32k+l.
    qh = np.packbits((codes >> 4).transpose(0, 2, 1), axis=-1, bitorder="little")
    return np.concatenate([header, scales, qh.reshape(-1, 32), qs.reshape(-1, 128)], axis=1)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    n_blocks = x.shape[0]
    groups = np.ascontiguousarray(x.reshape(-1, 16).T)
    codes, scales = _make_qx_quants(groups, 32)
    scales = scales.reshape(n_blocks, 16)
    blocks_idx = np.arange(n_blocks)
    # llama.cpp keeps the first largest |scale| with `if (abs_scale > max_abs_scale)` from 0: a NaN
    # scale is skipped, and a block whose scales are all NaN is written as zeros
    abs_scales = np.abs(scales)
    abs_scales[np.isnan(abs_scales)] = 0
    largest = abs_scales.argmax(axis=1)
    max_scale = scales[blocks_idx, largest]
    empty = abs_scales[blocks_idx, largest] < _GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _F32(-128) / max_scale
        d_bytes, d = _f16_round(_F32(1) / iscale)
        scale_codes = np.minimum(_nearest_int(iscale[:, None] * scales), _F32(127))
        # llama.cpp stores MIN(127, nearest_int(.)) in an int8: out-of-range results wrap
        scale_codes = np.where(empty[:, None], _F32(0), scale_codes).astype(np.int32).astype(np.int8)
        step = (d[:, None] * scale_codes.astype(np.float32)).reshape(-1)
        requantized = np.clip(_nearest_int(groups / step), _F32(-32), _F32(31)) + _F32(32)
    codes = np.where(step != 0, requantized, codes)
    codes = codes.T.reshape(n_blocks, 2, 4, 32).astype(np.uint8)
    # Per 128-element half: ql[l] = e(l) | e(l+64) << 4, ql[l+32] = e(l+32) | e(l+96) << 4,
    # qh[l] = bits 4-5 of e(l), e(l+32), e(l+64), e(l+96) in bit pairs 0, 2, 4, 6.
    low = codes & 0x0F
    ql = low[:, :, 0:2] | (low[:, :, 2:4] << 4)
    high = codes >> 4
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), scale_codes.view(np.uint8), d_bytes], axis=1)
    out[empty] = 0
    return out


_QUANT_KERNELS: dict[QType, Callable[[np.ndarray], np.ndarray]] = {
    QType.Q4_K: _quantize_q4_k,
    QType.Q5_K: _quantize_q5_k,
    QType.Q6_K: _quantize_q6_k,
}

# gguf-py's quantizers for these reproduce llama.cpp's `quantize_row_*_ref` bit for bit (MXFP4: on
# every block of finite values; a block holding NaN or Inf gets another scale byte).
_GGUF_PY_QUANTIZED = (QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.MXFP4)

QUANTIZE_TYPES: tuple[QType, ...] = (QType.F32, QType.F16, *_GGUF_PY_QUANTIZED, *_QUANT_KERNELS)


def quantize(values: np.ndarray, qtype: QType) -> np.ndarray:
    """Raw GGUF bytes of float32 `values` (..., n) quantized as llama.cpp writes `qtype`.

    `n` (GGUF ne[0]) must be a multiple of the block size. The result is uint8, shaped
    (..., n / block_size * type_size). K-quants follow llama.cpp's reference quantizer without an
    importance matrix (what `llama-quantize` runs when it has none).
    """
    qtype = _known_type(qtype)
    if qtype not in QUANTIZE_TYPES:
        raise _unsupported("quantization", qtype, QUANTIZE_TYPES)
    values = np.asarray(values, dtype=np.float32)
    byte_shape = quant_byte_shape(values.shape, qtype)
    if qtype == QType.F32:
        return np.ascontiguousarray(values).view(np.uint8).reshape(byte_shape)
    if qtype == QType.F16:
        return values.astype(np.float16).view(np.uint8).reshape(byte_shape)
    if qtype in _GGUF_PY_QUANTIZED:
        return gguf.quants.quantize(values, qtype).reshape(byte_shape)
    kernel = _QUANT_KERNELS[qtype]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = values.reshape(-1, block_size)
    out = np.empty((blocks.shape[0], type_size), dtype=np.uint8)
    step = _QUANTIZE_CHUNK_BLOCKS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for start in range(0, blocks.shape[0], step):
            out[start:start + step] = kernel(blocks[start:start + step])
    return out.reshape(byte_shape)

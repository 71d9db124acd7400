import hashlib
import warnings

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf import quants

Q = gguf.GGMLQuantizationType
BLOCK_TYPES = [Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]
# Byte offsets of the f16 fields of each block type (ggml-common.h).
F16_FIELDS = {
    Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.BF16: [], Q.MXFP4: [],
}


def gguf_py_dequantize(data, qtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return gguf.quants.dequantize(data, qtype)


def assert_same_bits(ours, reference):
    assert ours.dtype == np.float32 and reference.dtype == np.float32
    assert ours.shape == reference.shape
    assert np.array_equal(ours.view(np.uint32), reference.view(np.uint32))


def finite_blocks(qtype, n_blocks, rng):
    """Random blocks whose f16 scale fields are finite and of a realistic magnitude."""
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    if qtype == Q.BF16:
        values = rng.standard_normal(n_blocks).astype(np.float32)
        blocks[:] = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    if qtype == Q.MXFP4:  # E8M0 scale bytes 1..250: finite values (255 makes +-inf; 0 subnormals, covered below)
        blocks[:, 0] = rng.integers(1, 251, n_blocks)
    return blocks


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py_on_valid_blocks(qtype):
    rng = np.random.default_rng(int(qtype))
    # More blocks than one internal chunk, and a count that does not divide it.
    n_blocks = (1 << 16) // GGML_QUANT_SIZES[qtype][0] * 2 + 3
    blocks = finite_blocks(qtype, n_blocks, rng)
    ours = quants.dequantize(blocks, qtype)
    assert np.isfinite(ours).all()
    assert_same_bits(ours, gguf_py_dequantize(blocks, qtype))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py_on_raw_bytes_including_nan_and_inf(qtype):
    rng = np.random.default_rng(100 + int(qtype))
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(4096, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        # Force some NaN (0x7E01, 0xFE00), +-inf and subnormal scales.
        blocks[:4, offset:offset + 2] = np.array([[0x01, 0x7E], [0x00, 0xFE], [0x00, 0x7C], [0x01, 0x00]])
    ours = quants.dequantize(blocks, qtype)
    reference = gguf_py_dequantize(blocks, qtype)
    if F16_FIELDS[qtype]:
        assert np.isnan(reference).any()
    assert_same_bits(ours, reference)


def test_mxfp4_dequantize_is_ggmls_on_every_scale_and_code():
    """Block e holds the codes 0..15 twice, for every E8M0 byte e: ggml's `dequantize_row_mxfp4` output (its
    subnormal halved scales for e < 2, +-inf and +-2^127 for e = 255, +0 for code 8) hashes to this
    (sha256 of its float32 bytes, printed by that C function linked from llama.cpp 0c1e570's build)."""
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    codes = np.arange(32) % 16
    blocks[:, 1:] = codes[:16] | (codes[16:] << 4)
    with np.errstate(over="ignore"):
        values = quants.dequantize(blocks, Q.MXFP4)
    assert hashlib.sha256(values.tobytes()).hexdigest() == \
        "ee524a21c467ad8308a6f9626064a326c93d12c3bdc42e64aacef3d67cc0c291"
    assert values[127, 1] == 0.5 and values[127, 7] == 6 and values[127, 15] == -6 and values[128, 5] == 6
    assert values[0, 1] == np.float32(2.0 ** -128) and not np.signbit(values[:, 8]).any()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.Q5_0, Q.BF16, Q.MXFP4], ids=lambda t: t.name)
def test_dequantize_keeps_leading_dimensions(qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = finite_blocks(qtype, 3 * 4 * 2, np.random.default_rng(7))
    data = blocks.reshape(3, 4, 2 * type_size)
    ours = quants.dequantize(data, qtype)
    assert ours.shape == (3, 4, 2 * block_size)
    assert_same_bits(ours, gguf_py_dequantize(data, qtype))
    one_row = quants.dequantize(data[1, 2], qtype)
    assert_same_bits(one_row, ours[1, 2])


def test_dequantize_float_types():
    values = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    assert_same_bits(quants.dequantize(values, Q.F32), values)
    halves = values.astype(np.float16)
    assert_same_bits(quants.dequantize(halves, Q.F16), gguf_py_dequantize(halves, Q.F16))


def test_dequantize_rejects_unsupported_type_naming_supported_ones():
    with pytest.raises(Gguf2ovError) as caught:
        quants.dequantize(np.zeros((1, 66), np.uint8), Q.IQ2_XXS)
    assert "IQ2_XXS" in str(caught.value)
    assert "Q4_K" in caught.value.hint and "Q6_K" in caught.value.hint


def test_dequantize_rejects_partial_blocks():
    with pytest.raises(Gguf2ovError, match="144-byte block"):
        quants.dequantize(np.zeros((2, 145), np.uint8), Q.Q4_K)


def test_byte_arithmetic():
    assert quants.n_bytes(4096, Q.Q4_K) == 4096 // 256 * 144
    assert quants.n_bytes(64, Q.F16) == 128
    assert quants.quant_byte_shape((3, 512), Q.Q6_K) == (3, 420)
    assert quants.quant_byte_shape((3, 64), Q.Q8_0) == (3, 68)
    with pytest.raises(Gguf2ovError, match="multiple of the Q4_K block size 256"):
        quants.n_bytes(300, Q.Q4_K)


def _reference_input(n_blocks):
    """Deterministic float32 blocks built with integer hashing and exact float32 operations.

    Blocks 1-4 hold the edge cases the reference quantizer special-cases: a zero sub-block, a
    constant negative sub-block, an all-zero block, an all-positive block.
    """
    state = np.arange(n_blocks * 256, dtype=np.uint64) * np.uint64(6364136223846793005)
    state += np.uint64(1442695040888963407)
    state ^= state >> np.uint64(29)
    state *= np.uint64(0xBF58476D1CE4E5B9)
    state ^= state >> np.uint64(32)
    u = ((state >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) / np.float32(1 << 23)
    x = ((u * u * u + u * np.float32(0.25)) * np.float32(0.05)).reshape(n_blocks, 256)
    x[1, :40] = 0
    x[2, 64:96] = np.float32(-0.3)
    x[3] = 0
    x[4] = np.abs(x[4])
    return x


# sha256 of the bytes llama.cpp's quantize_row_q{4,5,6}_K_ref (ggml-quants.c, compiled without
# floating-point contraction) writes for _reference_input(64); MXFP4: quantize_row_mxfp4_ref, as
# llama.cpp 0c1e570's build (libggml-base) has it.
LLAMA_CPP_REFERENCE_SHA256 = {
    Q.Q4_K: "ac7e344213aca14d58040a098d001e4e6793b2e269af6f09dca8461fdd19ad50",
    Q.Q5_K: "bd48ff6d63d4d3618b13c6b5ee8ef10b8e46cb50ab50bab90bd0e9c2a2903175",
    Q.Q6_K: "bf6c714054a4934c84eb9cec3310fe97a28eb9e5e571feb5d3abbb9944e62f8e",
    Q.MXFP4: "a2cffcc4fe5edea1d8813dd4bab921c934f0d3daa93c5b5e01947aa98dd9a5bc",
}


@pytest.mark.parametrize("qtype", list(LLAMA_CPP_REFERENCE_SHA256), ids=lambda t: t.name)
def test_quantize_matches_llama_cpp_reference_bytes(qtype):
    packed = quants.quantize(_reference_input(64), qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    assert packed.dtype == np.uint8 and packed.shape == (64, 256 // block * type_size)
    assert hashlib.sha256(packed.tobytes()).hexdigest() == LLAMA_CPP_REFERENCE_SHA256[qtype]


def _degenerate_input():
    """Blocks where the quantizer's intermediate values overflow: sub-blocks whose range is below
    ~1e-37 (the inverse scale is Inf), a block around -5e6 (dmin overflows f16), and values near
    the float32 maximum (the weighted sums become Inf or NaN)."""
    x = _reference_input(9).astype(np.float64)
    x[0, :32] = np.linspace(0, 1e-38, 32)
    x[1, 32:64] = -np.linspace(0, 3e-38, 32)
    x[2] = -5e6 + x[2] * 16
    x[3, :16] = np.linspace(0, 1e-38, 16)
    x[4, 64:96] = 1e-39 * np.arange(32)
    x[5] = x[5] / 0.0625 * 3e38
    x[6, 96:128] = x[6, 96:128] / 0.0625 * 3e38
    x[7, :16] = 3e38
    x[8, 200:216] = -3e38
    return x.astype(np.float32)


# sha256 of the bytes llama.cpp's quantize_row_q{4,5,6}_K_ref (compiled as above) writes for
# _degenerate_input(): its `nearest_int` turns Inf and NaN into codes the clamps then make 0,
# and a NaN scale never becomes a block's largest.
LLAMA_CPP_DEGENERATE_SHA256 = {
    Q.Q4_K: "20e52daaee9d219a85f774a65a9711df088abfd20eb756e0c966d46759fc850b",
    Q.Q5_K: "74464ace76a25257d36f8d97d73b5a7f32dfe599e783730279e1f285fd2f94fc",
    Q.Q6_K: "01585e342822966489cac3f65d48139c7b3d3e216436563ece9a5f98f0fadb3a",
}


@pytest.mark.parametrize("qtype", list(LLAMA_CPP_DEGENERATE_SHA256), ids=lambda t: t.name)
def test_k_quantize_matches_llama_cpp_where_values_overflow(qtype):
    with np.errstate(all="ignore"):
        packed = quants.quantize(_degenerate_input(), qtype)
    assert hashlib.sha256(packed.tobytes()).hexdigest() == LLAMA_CPP_DEGENERATE_SHA256[qtype]


def test_nearest_int_is_llama_cpps_bit_trick():
    # llama.cpp: float val = fval + 12582912.f; return (bits(val) & 0x007fffff) - 0x00400000;
    # expected values printed by that C function.
    values = np.array([np.inf, -np.inf, np.nan, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 63.49, 4194303, 4194304,
                       5e6, -5e6, 1e30, -1e30], np.float32)
    expected = [-4194304, -4194304, 0, 0, 2, 2, 0, -2, -2, 63, 4194303, -4194304, -3791456, 2582912, 651978, 651978]
    assert quants._nearest_int(values).tolist() == expected


def test_k_quantize_edge_blocks():
    x = _reference_input(8)
    q6 = quants.quantize(x, Q.Q6_K)
    assert not q6[3].any()  # an all-zero block is written as zero bytes
    q4 = quants.quantize(x, Q.Q4_K)
    assert not q4[3].any()
    back = quants.dequantize(q4, Q.Q4_K)
    assert np.all(back[1, :32] == 0)
    assert np.allclose(back[2, 64:96], -0.3, atol=0.3 / 63)


@pytest.mark.parametrize("qtype, max_rel_error", [
    (Q.Q4_K, 0.09), (Q.Q5_K, 0.045), (Q.Q6_K, 0.022), (Q.Q8_0, 0.006),
    (Q.Q4_0, 0.12), (Q.Q4_1, 0.1), (Q.Q5_0, 0.06), (Q.Q5_1, 0.05), (Q.BF16, 0.003), (Q.F16, 0.001), (Q.MXFP4, 0.13),
], ids=lambda v: getattr(v, "name", str(v)))
def test_quantize_round_trip_error_is_sane(qtype, max_rel_error):
    x = np.random.default_rng(11).standard_normal((2, 3, 512)).astype(np.float32) * np.float32(0.02)
    packed = quants.quantize(x, qtype)
    assert packed.dtype == np.uint8
    assert packed.shape == quants.quant_byte_shape(x.shape, qtype)
    back = quants.dequantize(packed, qtype)
    assert back.shape == x.shape
    rel = np.linalg.norm(back - x) / np.linalg.norm(x)
    assert rel < max_rel_error


def test_quantize_float32_is_raw_bytes():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert_same_bits(quants.dequantize(quants.quantize(x, Q.F32), Q.F32), x)


@pytest.mark.parametrize("qtype, min_fraction", [(Q.Q4_K, 0.999), (Q.Q6_K, 0.75)], ids=lambda v: getattr(v, "name", str(v)))
def test_k_quantize_is_stable_on_its_own_grid(qtype, min_fraction):
    # Measured on Gaussian data: Q4_K 100%, Q6_K ~81% (make_qx_quants may pick another scale
    # when the values already sit on a grid).
    x = np.random.default_rng(5).standard_normal((16, 4096)).astype(np.float32) * np.float32(0.02)
    first = quants.quantize(x, qtype)
    second = quants.quantize(quants.dequantize(first, qtype), qtype)
    type_size = GGML_QUANT_SIZES[qtype][1]
    same = (first.reshape(-1, type_size) == second.reshape(-1, type_size)).all(axis=1)
    assert same.mean() >= min_fraction


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16, Q.MXFP4], ids=lambda t: t.name)
def test_legacy_quantize_is_gguf_py(qtype):
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    assert np.array_equal(quants.quantize(x, qtype), gguf.quants.quantize(x, qtype))


def test_quantize_errors():
    with pytest.raises(Gguf2ovError, match="multiple of the Q4_K block size"):
        quants.quantize(np.zeros((2, 128), np.float32), Q.Q4_K)
    with pytest.raises(Gguf2ovError) as caught:
        quants.quantize(np.zeros((2, 256), np.float32), Q.IQ4_NL)
    assert "IQ4_NL" in str(caught.value) and "Q6_K" in caught.value.hint
    with pytest.raises(Gguf2ovError, match="unknown GGML type"):
        quants.quantize(np.zeros(256, np.float32), 999)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4],
                         ids=lambda t: t.name)
def test_group_scales_are_the_step_between_a_groups_values(qtype):
    """Within a group every dequantized value is a whole number of its group's step from any other, and the
    values span at most the codes' range in steps: the unit a requantized form's change is measured in (MXFP4:
    ggml's doubled E2M1 values, -12 to 12 of its halved scale)."""
    rng = np.random.default_rng(200 + int(qtype))
    rows, n = 3, 2 * GGML_QUANT_SIZES[qtype][0]
    data = finite_blocks(qtype, rows * n // GGML_QUANT_SIZES[qtype][0], rng).reshape(rows, -1)
    scales, group = quants.group_scales(data, qtype)
    assert scales.shape == (rows, n // group) and (scales >= 0).all()
    values = quants.dequantize(data, qtype).reshape(rows, n // group, group)
    live = scales > 0
    steps = (values - values[..., :1])[live] / scales[live][:, None]
    assert np.abs(steps - np.round(steps)).max() < 1e-3
    if qtype == Q.MXFP4:
        assert np.abs(steps).max() <= 24 and np.abs(steps).max() >= 12  # from -12 to 12: the range, filled
        return
    bits = {Q.Q8_0: 8, Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q4_K: 4, Q.Q5_K: 5, Q.Q6_K: 6}[qtype]
    assert np.abs(steps).max() <= 2 ** bits - 1
    assert np.abs(steps).max() >= 2 ** (bits - 1)  # random codes fill the range: the step is not too small either

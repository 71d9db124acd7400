"""Carrying a GGUF file's own quantization grid into the OpenVINO IR, instead of re-quantizing.

Every block-quantized GGUF type is affine per group: value = scale * (code - zero_point). OpenVINO's
compressed-weight pattern Constant(codes) -> Convert(f32) -> Subtract(zero_point) -> Multiply(scale)
-> Reshape -> MatMul expresses that, and the CPU plugin runs it as a FullyConnected on the codes.
The pattern needs scale and zero point to be constant, not to be Constants: the plugin folds
constant subgraphs before it matches the pattern. So the IR stores each type's own factorisation,
in the file's own bit widths, and compilation multiplies it out:

- Q4_K / Q5_K (y = d*sc*q - dmin*m): sc and m as u6 per 32, d and dmin as f16 per 256;
  scale = d*sc and zero point = dmin*m / (d*sc) are small subgraphs over them.
- Q6_K (y = d*sc*(q - 32)): int8 sc per 16, f16 d per 256, zero point 32.
- Q8_0: int8 codes times f16 d. Q4_0 / Q5_0: f16 d, zero point 8 / 16.
- Q4_1 / Q5_1 (y = d*q + m): f16 d and m per 32, zero point -m/d.
- MXFP4 (y = E2M1 code * 2^(e-127)): f4e2m1 codes and an f8e8m0 scale per 32, the file's bytes ("MXFP4" below).

This compact form is a draft's; a target's weights take the split form (`grid_weight(...,
split=True)`, "Which forms run fast" below), its table the folded one ("Run-time memory" below). Bits per weight of the compact form, IR / GGUF
(`grid_bits`; tests/gguf/test_transcode.py): Q4_K 4.5 / 4.5, Q6_K 6.5625 /
6.5625, Q8_0 8.5 / 8.5, Q4_0 4.5 / 4.5, Q4_1 5 / 5, Q5_0 6.5 / 5.5, Q5_1 7 / 6, Q5_K 6.5 / 5.5, MXFP4 4.25 / 4.25.
A Q4_K_M file (Q4_K and Q6_K) is carried at 1.00x its tensor bytes plus ~50 bytes of shape
constants per tensor (the tiny test draft's whole IR .bin: 1.0009x its GGUF tensor bytes; Gemma 3
270M's 2-D weights: 1.032x, as its Q5_0 fallbacks cost their extra bit). The folded form, f32
scale and zero point per group and 5/6-bit codes in bytes, costs 2 bits/weight more per 32-group
and 4 per 16-group, and a Q6_K's codes 2 more: 1.38x on a Q4_K_M file.

What the CPU plugin keeps compressed was measured (openvino 2026.4.1, x86 AVX2, f32 hint), as it
decides these choices:
- u4, u8 and i8 codes (also i4, nf4, f4e2m1, u2) become a compressed FullyConnected. u1, u3
  and u6 do not: converted straight to f32 they are folded into f32 weights at compile time.
- Constant(u6) -> Convert(u8) is folded into a u8 Constant before the pattern is matched, so 5-
  and 6-bit codes are stored as u6 and run as u8. Storing 5-bit codes exactly (a u4 and a u1 plane
  added in i16, u16 or i32) also ends as u8 codes, but compiling 1 GB of f32-equivalent weights
  then took 8-13 s instead of 2 s and peaked at 0.74-2.4 GB instead of 0.64 GB; added in u8 or
  with bitwise ops the planes are not folded at all (u8 Eltwise at run time, f32 FullyConnected).
  So Q5 types pay one bit.
- the scale and zero-point subgraphs fold to f32 per-group constants: at run time a weight costs
  its codes (4 or 8 bits) plus 32-bit scale (and zero point) per group.
Compiling 1.07 GB of f32-equivalent Q4_K weights peaked at 0.41 GB RSS (the same weights as f32
Constants: 2.2 GB), and inference matches x @ dequantized W^T to ~4e-7.

Run-time memory: the plugin's folding makes private copies, the folded form does not. Measured
(openvino 2026.4.1, this Xeon with AMX): 8 weights of 12288 x 4096 saved to an IR, compiled from
disk, anonymous memory after the first inference, where the FullyConnected repacks its codes in
every form:

| type | compact form: IR, run time | folded form: IR, run time | per token |
|---|---|---|---|
| Q4_K | 216 MiB, 407 MiB | 288 MiB, 310 MiB | 28 ms in both |
| Q6_K | 315 MiB, 989 MiB | 480 MiB, 496 MiB | 41-46 ms in both |

The compact form's folded scale subgraph (and a Q6_K's u8 codes) stay referenced beside the
repacked weights: a weight runs at ~1.9x (Q4_K) and ~3x (Q6_K) its stored size, where the folded
form runs at its stored size and its file pages can be dropped once repacked. An 8B Q4_K_M target
in LLMPipeline needs a 9.75 GiB memory limit in the compact form and 6.5 GiB in the folded one
(benchmarks/bench_target_build.py). So a target is built folded or split (nothing to fold either:
IR ~1.38x its GGUF's tensor bytes folded, ~1.27x split; `gguf2ov target --grid compact` keeps the
compact form) and a draft compact, where the IR's
size is the figure users compare (a folded 8B draft, 803 MB against 591, saved 0.34 GiB of the
pair's 9.3 GiB in GenAI).

Values: Q8_0, Q4_0, Q5_0 and Q6_K evaluate bit for bit to `quants.dequantize` (the same f32
operations on the same operands). Where the file stores a minimum the zero point is a quotient:
float32 rounding, ~1e-7 relative per tensor (6.5e-8 at worst on Gemma's Q4_K). A group whose
scale is zero holds -dmin*m (or m) whatever its codes and has no finite zero point: its codes are
stored as 0 and its scale factor (and a zero d) as 1, which gives back that constant (exactly
when d is 0, to float32 rounding when only sc is).

An embedding table (a target's, read by a Gather) takes another form, because the CPU plugin's
ConvertGatherToGatherCompressed pass, unlike the FullyConnected one, neither folds scale subgraphs
nor takes u6 codes (`grid_weight(..., folded=True)`): u6 codes stored as u8, and where the scale or
zero point is computed from several fields (K-quants, Q6_K, Q4_1/Q5_1) both stored folded as f32
per group. Every type then runs as a u4/u8/i8 Gather (a 32768 x 4096 table: +40-56 MB compiled
instead of +534 MB as f32). Gemma 3 270M's Q8_0 table keeps its own form: the whole target IR is
1.032x the file's tensor bytes. A Q4_K table costs 6 bits a weight instead of 4.5 (an 8B target's
151936 x 4096 table: +117 MB, 2.5% of its Q4_K_M file).

MXFP4: its nibbles are E2M1 codes and its scale byte an E8M0 exponent, which are OpenVINO's f4e2m1 and
f8e8m0: ggml's doubled values (`kvalues_mxfp4`) times its halved scale (`ggml_e8m0_to_fp32_half`) are the
same products. Code 8 (E2M1's -0, ggml's +0) is stored as code 0, so the IR's weights are gguf-py's bit for
bit, for every scale byte 0..254 and every code (tests/gguf/test_transcode.py). Byte 255 is no finite E8M0
scale: NaN in OpenVINO, where ggml makes 0, +-2^127 or +-inf. What the CPU plugin keeps (openvino 2026.4.1,
measured; benchmarks/bench_mxfp4.py):
- FullyConnected: the f4e2m1 codes, multiplied in float32 (the default dynamic quantization leaves them
  alone). The f8e8m0 scales' Convert folds into f32 (1 bit a weight, private, like any scale subgraph); the
  folded form stores them so (5 bits a weight). A scale byte of 0 (values below 2^-125; ggml writes it only
  for a block of zeros) runs as zeros.
- GatherMatmul (experts) compresses u8/i8/u4/i4 codes only (`GatherMatmul::getSupportedCompressedWeightsTypes`;
  a later version of it in public source lists f4e2m1 too): f4e2m1 experts compile to an f32 GatherMatmul, 32
  bits a weight (201 M weights: 1553 MiB). So [E, N, K] weights run on ggml's own operands, its doubled values
  as i8 and its halved scale as f32 (9 bits a weight): folded, the IR stores them (225 MiB at run time);
  compact, the IR keeps the file's bytes and a Convert chain the plugin folds into the i8 codes when it
  compiles, and keeps beside GatherMatmul's repacked copy (449 MiB).
- Gather (an embedding table): no f4e2m1 either (an f32 Gather); the table takes the i8 form.

Which forms run fast (openvino 2026.4.1, a 2-core AMD EPYC with AVX512_VNNI and AVX512_BF16; CPU
time of one thread, the machine shared). The plugin runs a compressed FullyConnected one of two ways:
it decompresses the weight to f32 per call, or, with dynamic quantization of f32 activations
(`DYNAMIC_QUANTIZATION_GROUP_SIZE`), multiplies in int8. The int8 path takes a weight only if its zero
point is u8, u4 or absent and its group is at least the activations' group: the folded form's f32
zero point never takes it, a Q6_K's groups of 16 only with an activation group of 16. In cache (two
MLP blocks, 1024 x 2048), against the folded Q4_K at one row: codes times d*sc with no zero point
0.71-0.79, the split form (the minimum apart) 0.79-0.89, NNCF's u4 with a u4 zero point per 32
0.76-0.86; at eight rows (a verify of K = 7) the folded form costs 2.2x its one-row time and the
split form half of that. A constant zero point (Q6_K's 32) stays an f32 scalar. The int8 path is
not the f32 path's arithmetic for one row and for several, so a pair's greedy text can part from the
target's alone where a target takes it: the split form with the plugin's own activation group (32)
on the fixture's Q4_K_M pair (406 of 599 drafted accepted, identical only in exact arithmetic), and
an activation group of 16 in the target's `runtime_options` (which would take Q6_K's groups of 16,
the tied head's too) on the widened pair. So a target's default stays folded, off the int8 path, and
carries no activation group of its own; `--grid split` is there for its cheaper verify. The int8 path quantizes activations, not weights: the weights stay the file's grid, and what it changes
in the logits is stated beside the other forms' (benchmarks/target_fidelity.py, docs/benchmarks.md,
"What the split form buys, measured").

Memory: the builder decodes the memory-mapped bytes in ~1 MB row chunks straight into the buffers
of the final Constants (uint8/uint32 bit arithmetic, four codes per word): no float arrays, and
a 4096x12288 Q4_K tensor takes ~0.25 s. With `postpone`, that happens while OpenVINO writes the
.bin, one tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from ..errors import Gguf2ovError
from .quants import E8M0_HALF, MXFP4_VALUES, QType, k_scales_mins

# Raw bytes decoded per step: bounds a chunk's uint8/uint32 temporaries to ~10 MB.
_CHUNK_BYTES = 1 << 20


# ---------------------------------------------------------------------------------------------
# packing into OpenVINO's sub-byte layouts (found by converting single set bits)
# ---------------------------------------------------------------------------------------------
# u4: element 2k in the low nibble of byte k, 2k+1 in the high nibble.
# u6: elements 4k..4k+3 in bytes 3k..3k+2: byte 3k = lo(e0) << 4 | lo(e1), byte 3k+1 =
#     lo(e2) << 4 | lo(e3), byte 3k+2 = hi(e0) << 6 | hi(e1) << 4 | hi(e2) << 2 | hi(e3), where
#     lo is the low 4 bits and hi the top 2.
# Quads of elements are handled as little-endian uint32 words (byte r = element r), so the u6
# codes are computed a word at a time straight from the GGUF's nibble and high-bit bytes.

_NIBBLES = np.uint32(0x0F0F0F0F)
_F16_ONE = np.float16(1.0)


def _u6_quads(low: np.ndarray, high: np.ndarray, out: np.ndarray) -> None:
    """Four 6-bit values per uint32 word -> their 3 u6 bytes, or 4 u8 bytes when `out` holds u8 codes.

    `low` holds the low 4 bits of element r in byte r of each word, `high` the top 2 bits the same
    way; `out` is uint8 (..., 3) or (..., 4) with one row per word.
    """
    if out.shape[-1] == 4:  # u8 codes (the Gather form): byte r = element r
        out[...] = (low | (high << 4)).astype("<u4", copy=False).view(np.uint8).reshape(*low.shape, 4)
        return
    b0 = ((low << 4) & 0xF0) | ((low >> 8) & 0x0F)
    b1 = ((low >> 12) & 0xF0) | ((low >> 24) & 0x0F)
    b2 = ((high << 6) & 0xC0) | ((high >> 4) & 0x30) | ((high >> 14) & 0x0C) | ((high >> 24) & 0x03)
    word = b0 | (b1 << 8) | (b2 << 16)
    out[...] = word.astype("<u4", copy=False).view(np.uint8).reshape(*word.shape, 4)[..., :3]


def _words(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data).view("<u4")


def _pack_u6(values: np.ndarray, out: np.ndarray) -> None:
    """values uint8 (n, 4k) < 64 -> out uint8 (n, 3k), or (n, 4k) as they are."""
    words = _words(values)
    _u6_quads(words & _NIBBLES, (words >> 4) & np.uint32(0x03030303), out.reshape(*words.shape, -1))


def _legacy_nibbles(qs: np.ndarray, out: np.ndarray) -> None:
    """Q4_0/Q4_1 qs (n, 16): byte j holds element j (low) and j+16 (high) -> u4 (n, 16)."""
    a, b = qs[:, 0::2], qs[:, 1::2]
    o = out.reshape(-1, 2, 8)
    o[:, 0] = (a & np.uint8(0x0F)) | (b << np.uint8(4))
    o[:, 1] = (a >> np.uint8(4)) | (b & np.uint8(0xF0))


def _k_nibbles(qs: np.ndarray, out: np.ndarray) -> None:
    """Q4_K qs (n, 128): chunk c byte l holds element 64c+l (low), 64c+32+l (high) -> u4 (n, 128)."""
    q = qs.reshape(-1, 4, 16, 2)
    a, b = q[..., 0], q[..., 1]
    o = out.reshape(-1, 4, 2, 16)
    o[:, :, 0] = (a & np.uint8(0x0F)) | (b << np.uint8(4))
    o[:, :, 1] = (a >> np.uint8(4)) | (b & np.uint8(0xF0))


def _legacy_q5_codes(qs: np.ndarray, qh: np.ndarray, out: np.ndarray) -> None:
    """Q5_0/Q5_1 -> u6 (n, 24) or u8 (n, 32). qs as in Q4_0; bit j of qh (a little-endian uint32) is bit 4 of
    element j."""
    nibbles = _words(qs)                                            # (n, 4): elements 4k.. low nibbles
    low = np.concatenate([nibbles & _NIBBLES, (nibbles >> 4) & _NIBBLES], axis=1)
    # 4 bits b3..b0 -> bytes 3..0 of a word: the shifted copies (0, 7, 14, 21) never overlap.
    four = (_words(qh) >> np.arange(0, 32, 4, dtype=np.uint32)) & np.uint32(0x0F)
    high = (four * np.uint32(0x00204081)) & np.uint32(0x01010101)  # (n, 8)
    _u6_quads(low, high, out.reshape(-1, 8, out.shape[-1] // 8))


def _k5_codes(qs: np.ndarray, qh: np.ndarray, out: np.ndarray) -> None:
    """Q5_K -> u6 (n, 192) or u8 (n, 256). Element 32k+l: low nibble as in Q4_K, bit 4 = bit k of qh[l]."""
    n = qs.shape[0]
    nibbles = _words(qs).reshape(n, 4, 1, 8) >> np.array([0, 4], dtype=np.uint32).reshape(1, 1, 2, 1)
    low = (nibbles & _NIBBLES).reshape(n, 8, 8)                       # (n, group, quad)
    high = (_words(qh).reshape(n, 1, 8) >> np.arange(8, dtype=np.uint32).reshape(1, 8, 1)) & np.uint32(0x01010101)
    _u6_quads(low, high, out.reshape(n, 8, 8, -1))


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    return blocks[:, offset:offset + 2].view(np.float16)


# ---------------------------------------------------------------------------------------------
# per-type fill: blocks (n, type_size) -> slices (n, per-block bytes) of the final Constants
# ---------------------------------------------------------------------------------------------

def _fill_q8_0(b, o):
    o["d"][...] = _f16(b, 0)
    o["codes"][...] = b[:, 2:34].view(np.int8)


def _fill_legacy(d_at, m_at, qh_at, qs_at):
    def fill(b, o):
        if qh_at is None:
            _legacy_nibbles(b[:, qs_at:qs_at + 16], o["codes"])
        else:
            _legacy_q5_codes(b[:, qs_at:qs_at + 16], b[:, qh_at:qh_at + 4], o["codes"])
        d = _f16(b, d_at)
        if m_at is None:
            o["d"][...] = d
            return
        o["m"][...] = _f16(b, m_at)
        # value = d*q + m; with d == 0 every element is m: codes 0, d 1, zero point -m.
        zero = d[:, 0] == 0
        o["d"][...] = np.where(zero[:, None], _F16_ONE, d)
        if zero.any():
            o["codes"][zero] = 0
    return fill


def _fill_k(five_bits: bool):
    def fill(b, o):
        if five_bits:
            _k5_codes(b[:, 48:176], b[:, 16:48], o["codes"])
        else:
            _k_nibbles(b[:, 16:144], o["codes"])
        d = _f16(b, 0)
        o["dmin"][...] = _f16(b, 2)
        scales, mins = k_scales_mins(b[:, 4:16])
        _pack_u6(mins, o["mins"])
        # A group with d*sc == 0 holds -dmin*m: codes 0, scale factor 1 (and d 1 if d is 0).
        zero = (scales == 0) | (d == 0)
        if zero.any():
            scales = np.where(zero, np.uint8(1), scales)
            d = np.where(d == 0, _F16_ONE, d)
            o["codes"].reshape(b.shape[0], 8, -1)[zero] = 0
        o["d"][...] = d
        _pack_u6(scales, o["scales"])
    return fill


def _fill_q6_k(b, o):
    n = b.shape[0]
    # Per 128-element half h: element 32q+l has its low 4 bits in ql[64h + 32(q%2) + l] (low
    # nibble for q < 2, high nibble otherwise) and its top 2 bits in qh[32h + l], bits 2q..2q+1.
    ql = _words(b[:, 0:128]).reshape(n, 2, 2, 8)
    qh = _words(b[:, 128:192]).reshape(n, 2, 8)
    out = o["codes"].reshape(n, 2, 4, 8, -1)
    for q in range(4):
        low = (ql[:, :, q % 2] >> np.uint32(4 * (q // 2))) & _NIBBLES
        high = (qh >> np.uint32(2 * q)) & np.uint32(0x03030303)
        _u6_quads(low, high, out[:, :, q])
    o["scales"][...] = b[:, 192:208].view(np.int8)
    o["d"][...] = _f16(b, 208)


# MXFP4 ("MXFP4" above): E2M1 code 8 (-0; +0 in ggml's table) as code 0, a byte (both nibbles) at a time
_POSITIVE_ZEROS = np.array([b & ~(0x08 if b & 0x0F == 0x08 else 0) & ~(0x80 if b & 0xF0 == 0x80 else 0)
                            for b in range(256)], dtype=np.uint8)
# f8e8m0 as OpenVINO converts it: 2^(e-127), and 255 NaN (not a finite scale in E8M0; ggml's values are then
# 0, +-2^127 or +-inf)
_E8M0 = np.append(np.ldexp(np.float32(1), np.arange(255) - 127).astype(np.float32), np.float32(np.nan))
_MXFP4_I8 = MXFP4_VALUES.astype(np.int8)


def _mxfp4_codes(b, o):
    _legacy_nibbles(b[:, 1:17], o["codes"])
    o["codes"][...] = _POSITIVE_ZEROS[o["codes"]]


def _fill_mxfp4(b, o):
    _mxfp4_codes(b, o)
    o["d"][...] = b[:, 0:1]


def _fill_mxfp4_f32(b, o):
    _mxfp4_codes(b, o)
    o["d"][...] = _E8M0[b[:, 0:1]]


def _fill_mxfp4_i8(b, o):
    """ggml's own operands: its doubled values as i8 and its halved scale as f32, whose products are gguf-py's."""
    halves = o["codes"].reshape(-1, 2, 16)
    halves[:, 0] = _MXFP4_I8[b[:, 1:17] & np.uint8(0x0F)]
    halves[:, 1] = _MXFP4_I8[b[:, 1:17] >> np.uint8(4)]
    o["d"][...] = E8M0_HALF[b[:, 0:1]]


@dataclass(frozen=True)
class SplitWeight:
    """A weight W [out, in] = values + offset repeated over each `group` inputs: a K-quant's codes times
    their scale (`values`), and its offset per group apart (`offset` [out, in / group], the negated
    minimum), which the Linear adds as group_sums(x) @ offset^T (`grid_weight(..., split=True)`; ir.graph_ops.linear).

    Added, not subtracted: the CPU plugin turns a Subtract of a MatMul into an Add of the MatMul times -1,
    and that Multiply in the weight's subgraph makes it fold the minimum's u8 codes into f32 weights."""

    values: object
    offset: object
    group: int


@dataclass(frozen=True)
class _Layout:
    group: int                  # elements per scale
    codes: str                  # OpenVINO type of the codes Constant: u4, u6 (5- and 6-bit codes), i8, f4e2m1
    zero_point: str             # "none", "const", "min" (value = d*q + m), "k" (d*sc*q - dmin*m)
    center: int                 # the constant zero point ("const")
    params: tuple               # (name, OpenVINO type, items per block)
    fill: object


_K_PARAMS = (("d", "f16", 1), ("dmin", "f16", 1), ("scales", "u6", 8), ("mins", "u6", 8))
_LAYOUTS = {
    QType.Q8_0: _Layout(32, "i8", "none", 0, (("d", "f16", 1),), _fill_q8_0),
    QType.Q4_0: _Layout(32, "u4", "const", 8, (("d", "f16", 1),), _fill_legacy(0, None, None, 2)),
    QType.Q5_0: _Layout(32, "u6", "const", 16, (("d", "f16", 1),), _fill_legacy(0, None, 2, 6)),
    QType.Q4_1: _Layout(32, "u4", "min", 0, (("d", "f16", 1), ("m", "f16", 1)), _fill_legacy(0, 2, None, 4)),
    QType.Q5_1: _Layout(32, "u6", "min", 0, (("d", "f16", 1), ("m", "f16", 1)), _fill_legacy(0, 2, 4, 8)),
    QType.Q4_K: _Layout(32, "u4", "k", 0, _K_PARAMS, _fill_k(False)),
    QType.Q5_K: _Layout(32, "u6", "k", 0, _K_PARAMS, _fill_k(True)),
    QType.Q6_K: _Layout(16, "u6", "const", 32, (("d", "f16", 1), ("scales", "i8", 16)), _fill_q6_k),
    QType.MXFP4: _Layout(32, "f4e2m1", "none", 0, (("d", "f8e8m0", 1),), _fill_mxfp4),
}
# MXFP4's other forms (see "MXFP4" above): the f32 scale of the folded 2-D form, and i8 codes with f32 scales,
# which a Gather and GatherMatmul keep compressed.
_MXFP4_F32_SCALE = _Layout(32, "f4e2m1", "none", 0, (("d", "f32", 1),), _fill_mxfp4_f32)
_MXFP4_I8_CODES = _Layout(32, "i8", "none", 0, (("d", "f32", 1),), _fill_mxfp4_i8)
_TYPE_BITS = {"f32": 32, "f16": 16, "i8": 8, "f8e8m0": 8, "u6": 6, "u4": 4, "f4e2m1": 4}


def has_grid(qtype) -> bool:
    """Whether a weight of this GGML type can be carried on its own grid."""
    try:
        return QType(qtype) in _LAYOUTS
    except ValueError:
        return False


_TYPE_BYTES = {"f32": 4, "f16": 2, "u8": 1, "i8": 1, "f8e8m0": 1, "u6": 6 / 8, "u4": 4 / 8, "f4e2m1": 4 / 8}


def grid_bytes(qtype, shape, folded: bool = False, split: bool = False, gather: bool = False) -> int:
    """The bytes a weight of `qtype` and [out, in] `shape` takes in the IR on its own grid (its
    Constants as `grid_weight` makes them; the few shape constants aside)."""
    kinds = grid_constants(qtype, shape, folded, split, gather)
    return int(sum(_TYPE_BYTES[kind] * np.prod(dims, dtype=np.int64) for kind, dims in kinds.values()))


def grid_constants(qtype, shape, folded: bool = False, split: bool = False, gather: bool = False) -> dict:
    """{constant: (OpenVINO type, shape)} of the weight's Constants as `grid_weight` makes them (the few shape
    constants aside): what `grid_bytes` adds up and what a scratch file (`ir.spill`) would hold."""
    layout = _layout(QType(qtype), shape, folded or split, gather)
    return _constant_kinds(QType(qtype), layout, shape, _form(layout, shape, folded or gather, split))


def _layout(qtype: QType, shape, folded: bool, gather: bool) -> _Layout:
    """The file's own layout, or the form MXFP4 takes folded or in a Gather."""
    if qtype == QType.MXFP4 and (folded or gather):
        return _MXFP4_I8_CODES if gather or len(shape) == 3 else _MXFP4_F32_SCALE
    return _LAYOUTS[qtype]


def grid_bits(qtype) -> float:
    """Bits per weight of a `qtype` weight's IR constants (the few shape constants aside)."""
    layout = _LAYOUTS[QType(qtype)]
    block = GGML_QUANT_SIZES[QType(qtype)][0]
    return _TYPE_BITS[layout.codes] + sum(_TYPE_BITS[kind] * items for _, kind, items in layout.params) / block


# ---------------------------------------------------------------------------------------------
# the builder
# ---------------------------------------------------------------------------------------------

def grid_weight(raw, qtype, shape, folded: bool = False, postpone=None, check=None, gather: bool = False,
                split: bool = False, spill=None, ahead=None):
    """The f32 [out, in] output of a decompression subgraph holding the GGUF tensor's own grid.

    `raw` is the tensor's stored bytes as `GgufFile.raw` returns them (torch-order rows, last axis
    in bytes), or a callable returning them; the result is meant as the second input of
    `MatMul(x, W, transpose_b=True)` or the table of an embedding Gather.

    `folded`: the form the CPU plugin runs from as it is stored, with nothing to fold when it
    compiles: scale and zero point stored as f32 per group wherever the file computes them from
    several fields, computed in numpy with the same f32 operations the subgraph does (identical
    values), and 5- and 6-bit codes as u8. A Q4_K weight costs 6 bits instead of 4.5, a Q6_K one
    10 instead of 6.56. An embedding Gather needs it: ConvertGatherToGatherCompressed needs the
    scale and zero point as Constants and takes u4/u8/i8 codes, not u6 (measured, 32768 x 4096
    table, openvino 2026.4.1: a Q4_K table with its scale subgraph stops compilation with
    "constant != nullptr"; Q5_0/Q5_K/Q6_K with u6 codes compile to an f32 Gather, +534 MB; in
    this form each is a u4 or u8 Gather, +40-56 MB). A target's MatMuls take it too (see "Run-time
    memory" above).

    `postpone(type, shape, make, name)`: builds the Constants as PostponedConstants whose values
    `make()` returns only while OpenVINO writes the .bin (ir.weights.WeightForms passes it); the
    tensor is then decoded once, then, not held in memory until the model is saved; `spill` (an
    ir.spill.Spill): where a weight too big to be one buffer in memory is decoded instead; `ahead` (an
    ir.postponed.DecodeAhead): decodes each weight in a worker thread while the one before is written.

    `gather`: the table of an embedding Gather, in the form the plugin keeps compressed there (the folded
    one; for MXFP4, i8 codes: see "MXFP4" above).

    `split` (a target's MatMul weights; implies `folded`): a weight whose type stores a minimum per group
    (Q4_K, Q5_K: y = d*sc*q - dmin*m) is returned as a `SplitWeight`: its codes times an f32 scale
    d*sc per group with no zero point, and the offset -dmin*m per group apart (m as u8 codes, -dmin as
    an f32 scale per block), which the Linear adds as `group_sums(x) @ offset^T` (`graph_ops.linear`). The same values, exactly; what it
    buys is the CPU plugin's int8 path: a weight with an f32 zero point (the folded form) runs as an
    f32 decompression, one without takes the dynamic quantization of its activations, faster per
    token and far cheaper per extra row ("Which forms run fast" below). Other types, 3-D weights and
    `folded` tables are returned as `folded` makes them.

    A 3-D `shape` [E, N, K] is a mixture of experts' weights (ggml ne {K, N, E}, for
    `MatMul(x [E, T, K], W, transpose_b=True)`): the rows are decoded as those of an [E * N, K]
    weight, and every Constant keeps the expert axis (codes [E, N, K / G, G], scale and zero point
    [E, N, K / G, 1]), which the CPU plugin's GatherMatmul needs to run them compressed (the 2-D
    form reshaped to [E, N, K] is decompressed at compile time, measured).

    `check(values, total)` sees every chunk of the float Constants as it is made (the file's f16 scales
    and minimums, or the folded f32 scale and zero point; `total` of them in the weight), so that a
    NaN or Inf in the file's fields is refused where it is decoded.
    """
    try:
        qtype = QType(qtype)
    except ValueError:
        raise Gguf2ovError(f"unknown GGML type {qtype!r}") from None
    if qtype not in _LAYOUTS:
        names = ", ".join(t.name for t in _LAYOUTS)
        raise Gguf2ovError(f"{qtype.name} weights cannot be carried on their GGUF grid", hint=f"supported: {names}")
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (2, 3):
        raise Gguf2ovError(f"a GGUF grid weight must be 2-D [out, in] or 3-D [experts, out, in], not {shape}")
    layout, folded = _layout(qtype, shape, folded or split, gather), folded or gather
    block = GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        raise Gguf2ovError(f"{qtype.name} rows of {shape[-1]} elements are not whole {block}-element blocks")
    form = _form(layout, shape, folded, split)
    kinds = _constant_kinds(qtype, layout, shape, form)
    if postpone is None:
        tensors = _decode(raw, qtype, layout, shape, kinds, form, check)
        constants = {name: _constant(tensor) for name, tensor in tensors.items()}
    else:
        constants = _postponed_constants(raw, qtype, layout, shape, kinds, form, postpone, check, spill, ahead)
    if form == "split":
        return _split_decompression(layout, constants, shape)
    if form == "folded" and _folds(layout):
        return _folded_decompression(layout, constants, shape)
    return _decompression(layout, constants, shape, u6=layout.codes == "u6" and form == "compact")


def _form(layout: _Layout, shape, folded: bool, split: bool) -> str:
    """"split" (a 2-D weight with a minimum per group, asked to split), "folded" or "compact"."""
    if split and layout.zero_point == "k" and len(shape) == 2:
        return "split"
    return "folded" if folded or split else "compact"


def _constant_kinds(qtype, layout: _Layout, shape, form: str) -> dict[str, tuple[str, list[int]]]:
    """{constant: (OpenVINO type, shape)} of the weight's Constants (the leading axes: rows, or experts and rows)."""
    *rows, n = shape
    groups, blocks_per_row = n // layout.group, n // GGML_QUANT_SIZES[qtype][0]
    folded = form != "compact"
    codes = "u8" if folded and layout.codes == "u6" else layout.codes
    kinds = {"codes": (codes, [*rows, groups, layout.group])}
    if form == "split":  # K-quants: f32 d*sc per group; m per group as u8, f32 -dmin per block (8 groups)
        per_block = GGML_QUANT_SIZES[qtype][0] // layout.group
        kinds["scale"] = ("f32", [*rows, groups, 1])
        kinds["mins"] = ("u8", [*rows, blocks_per_row, per_block])
        kinds["dmin"] = ("f32", [*rows, blocks_per_row, 1])
        return kinds
    if folded and _folds(layout):
        kinds["scale"] = ("f32", [*rows, groups, 1])
        if layout.zero_point in ("min", "k"):
            kinds["zero_point"] = ("f32", [*rows, groups, 1])
        return kinds
    for name, kind, items in layout.params:
        kinds[name] = (kind, [*rows, blocks_per_row, items])
    return kinds


def _folds(layout: _Layout) -> bool:
    """Whether the folded form stores the scale (and zero point) multiplied out: they are computed from several
    stored fields (K-quants, Q6_K, Q4_1/Q5_1). A type whose scale is one f16 per group (Q8_0, Q4_0,
    Q5_0) keeps it: the plugin takes that Convert as it is (a Q8_0 table compiled to an i8 Gather)."""
    return layout.zero_point in ("min", "k") or any(name == "scales" for name, _, _ in layout.params)


def _decode(raw, qtype, layout: _Layout, shape, kinds: dict, form: str, check=None, spill=None) -> dict:
    """The weight's Constants' data as ov.Tensors, decoded from the stored bytes chunk by chunk, each
    chunk of a float Constant shown to `check(values, total)`; in memory, or mapped from a scratch file
    when `spill` (an ir.spill.Spill) takes a weight this big."""
    import openvino as ov

    block, type_size = GGML_QUANT_SIZES[qtype]
    *lead, n = shape
    rows = int(np.prod(lead))
    row_bytes = n // block * type_size
    data = np.asarray(raw() if callable(raw) else raw).view(np.uint8)
    if data.size != rows * row_bytes:
        raise Gguf2ovError(f"{qtype.name} data of {data.size} bytes does not hold a {shape} tensor "
                           f"({rows * row_bytes} bytes)")
    data = data.reshape(rows, row_bytes)  # a view of the mapped file (a copy only of rows cut from a fused tensor)
    blocks_per_row = n // block
    n_blocks = rows * blocks_per_row

    # Every Constant is allocated at its final size and filled block by block in place; a big weight's
    # in a scratch file instead, a chunk at a time (ir/spill.py).
    scratch = spill.file(kinds) if spill is not None else None
    if scratch is None:
        tensors = {name: ov.Tensor(getattr(ov.Type, kind), ov.Shape(dims)) for name, (kind, dims) in kinds.items()}
        views = {name: t.data.reshape(n_blocks, -1) for name, t in tensors.items()}
    else:
        block_bytes = {name: size // n_blocks for name, size in scratch.sizes.items()}
    step = max(1, _CHUNK_BYTES // row_bytes)
    floats = [name for name, (kind, _) in kinds.items() if kind in ("f16", "f32")]
    float_total = sum(int(np.prod(kinds[name][1], dtype=np.int64)) for name in floats)
    try:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                b0, b1 = r0 * blocks_per_row, r1 * blocks_per_row
                if scratch is None:
                    out = {k: v[b0:b1] for k, v in views.items()}
                else:
                    items = {k: np.dtype(_CHUNK_ITEM.get(kinds[k][0], np.uint8)) for k in kinds}
                    out = {k: np.empty((b1 - b0, size // items[k].itemsize), items[k]) for k, size in block_bytes.items()}
                _decode_chunk(data[r0:r1], type_size, layout, form, out)
                if check is not None:
                    for name in floats:
                        check(out[name], float_total)
                if scratch is not None:
                    for name, values in out.items():
                        scratch.write(name, b0 * block_bytes[name], values)
        return tensors if scratch is None else scratch.tensors()
    finally:
        if scratch is not None:
            scratch.close()


# The numpy type a chunk of each kind of Constant is filled in, as `ov.Tensor.data` gives it (sub-byte
# and 8-bit float types as their packed bytes)
_CHUNK_ITEM = {"f32": np.float32, "f16": np.float16, "i8": np.int8}


def _decode_chunk(rows, type_size: int, layout: _Layout, form: str, out: dict) -> None:
    """One chunk of rows' blocks decoded into `out` (per Constant, one row of bytes per block)."""
    chunk = np.ascontiguousarray(rows).reshape(-1, type_size)
    if form != "compact" and _folds(layout):
        # the file's own parameters for this chunk, as numbers (u6 kept one per byte), then folded
        params = {name: np.empty((out["codes"].shape[0], items), _NUMPY[kind]) for name, kind, items in layout.params}
        layout.fill(chunk, {"codes": out["codes"], **params})
        (_split if form == "split" else _fold)(layout, params, out)
    else:
        layout.fill(chunk, out)


_NUMPY = {"f16": np.float16, "i8": np.int8, "u6": np.uint8}


def _fold(layout: _Layout, params: dict, out: dict) -> None:
    """scale and zero point per group from a chunk's parameters: the f32 operations of `_decompression`."""
    f32 = np.float32
    d = params["d"].astype(f32)
    if layout.zero_point in ("none", "const"):
        out["scale"][...] = d * params["scales"].astype(f32) if "scales" in params else d
        return
    if layout.zero_point == "min":
        out["scale"][...] = d
        out["zero_point"][...] = -params["m"].astype(f32) / d
        return
    scale = d * params["scales"].astype(f32)
    out["scale"][...] = scale
    out["zero_point"][...] = params["dmin"].astype(f32) * params["mins"].astype(f32) / scale


def _split(layout: _Layout, params: dict, out: dict) -> None:
    """scale d*sc per group and the offset's factors, m and -dmin, from a chunk's parameters. `fill` stored a
    group whose d*sc is 0 with codes 0 (and sc or d 1): that group's values are -dmin*m whatever its scale."""
    f32 = np.float32
    out["scale"][...] = params["d"].astype(f32) * params["scales"].astype(f32)
    out["mins"][...] = params["mins"]
    out["dmin"][...] = -params["dmin"].astype(f32)


def _constant(tensor):
    import openvino as ov

    return ov.op.Constant(tensor, shared_memory=True)


def _postponed_constants(raw, qtype, layout, shape, kinds: dict, form: str, postpone, check=None, spill=None,
                         ahead=None) -> dict:
    """PostponedConstants of the weight: the first one OpenVINO writes decodes the tensor (or takes it
    from `ahead`, an ir.postponed.DecodeAhead, which decodes it while the weight before is written),
    each hands out its own part, and the last one drops what is left."""
    pending: dict = {}

    def decode():
        return _decode(raw, qtype, layout, shape, kinds, form, check, spill)

    index = ahead.add(decode) if ahead is not None else None

    def part(name):
        def make():
            if not pending:
                pending.update(decode() if ahead is None else ahead.take(index))
            return pending.pop(name)
        return make

    return {name: postpone(kind, dims, part(name)) for name, (kind, dims) in kinds.items()}


def _per_group(node, rows, groups: int):
    from openvino import opset13 as ops

    rows = list(rows) if isinstance(rows, (list, tuple)) else [rows]
    return ops.reshape(node, ops.constant(np.array([*rows, groups, 1], dtype=np.int64)), False)


def _codes_f32(codes, u6: bool):
    from openvino import opset13 as ops

    if u6:
        # u6 is no type the plugin decompresses: this Convert folds into u8 codes when compiled.
        codes = ops.convert(codes, "u8")
    return ops.convert(codes, "f32")


def _decompression(layout: _Layout, constants: dict, shape, u6: bool):
    from openvino import opset13 as ops

    *rows, n = shape
    groups = n // layout.group

    def f32(name):
        constant = constants[name]
        return constant if constant.get_output_element_type(0).get_type_name() == "f32" else ops.convert(constant, "f32")

    zero_point = None
    if layout.zero_point in ("none", "const"):
        scale = f32("d")
        if "scales" in constants:  # Q6_K: d per 256 times an int8 scale per 16
            scale = _per_group(ops.multiply(scale, f32("scales")), rows, groups)
        if layout.zero_point == "const":
            zero_point = _center(layout)
    elif layout.zero_point == "min":
        scale = f32("d")
        zero_point = ops.divide(ops.negative(f32("m")), scale)
    else:
        scale = _per_group(ops.multiply(f32("d"), f32("scales")), rows, groups)
        minimum = _per_group(ops.multiply(f32("dmin"), f32("mins")), rows, groups)
        zero_point = ops.divide(minimum, scale)
    codes = _codes_f32(constants["codes"], u6)
    if layout.codes == "f4e2m1" and len(shape) == 3:
        codes, scale = _as_i8_codes(codes, scale)
    return _affine(codes, zero_point, scale, shape)


def _as_i8_codes(codes, scale):
    """f4e2m1 codes and their scale as ggml's operands, doubled codes in i8 and a halved scale, for MXFP4 experts:
    GatherMatmul takes no f4e2m1 codes (see "MXFP4" above), and the plugin folds this into an i8 Constant."""
    from openvino import opset13 as ops

    doubled = ops.convert(ops.multiply(codes, ops.constant(np.float32(2))), "i8")
    return ops.convert(doubled, "f32"), ops.multiply(scale, ops.constant(np.float32(0.5)))


def _folded_decompression(layout: _Layout, constants: dict, shape):
    from openvino import opset13 as ops

    zero_point = constants.get("zero_point")
    if zero_point is None and layout.zero_point == "const":
        zero_point = _center(layout)
    return _affine(_codes_f32(constants["codes"], False), zero_point, constants["scale"], shape)


def _center(layout: _Layout):
    """A constant zero point (Q4_0 8, Q5_0 16, Q6_K 32) as an f32 scalar. As a u8 scalar (the same value) the
    CPU plugin's int8 path would take Q4_0's and Q5_0's groups of 32 under its own activation group, and a
    pair's greedy text then parts from its target's alone (the MoE fixture's Q4_K_M pair, measured)."""
    from openvino import opset13 as ops

    return ops.constant(np.float32(layout.center))


def _split_decompression(layout: _Layout, constants: dict, shape):
    from openvino import opset13 as ops

    *rows, n = shape
    values = _affine(_codes_f32(constants["codes"], False), None, constants["scale"], shape)
    offset = ops.multiply(ops.convert(constants["mins"], "f32"), constants["dmin"])
    offset = ops.reshape(offset, ops.constant(np.array([*rows, n // layout.group], dtype=np.int64)), False)
    return SplitWeight(values, offset.output(0), layout.group)


def _affine(codes, zero_point, scale, shape):
    from openvino import opset13 as ops

    w = codes if zero_point is None else ops.subtract(codes, zero_point)
    w = ops.multiply(w, scale)
    return ops.reshape(w, ops.constant(np.array(list(shape), dtype=np.int64)), False).output(0)

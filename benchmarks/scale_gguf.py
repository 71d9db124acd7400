"""Real-size DFlash draft GGUFs in seconds: random but valid Q4_K_M blocks, no quantizer.

For cost measurements the weight values do not matter, only a file with the right geometry,
tensor types and metadata. `gguf2ov.tools.gguf_writer.write_dflash_gguf` quantizes real weights with
llama.cpp's reference K-quantizer (558 s for a 1.05 B-parameter draft on 2 cores); this module
writes random quant blocks directly (a 1 B file in seconds):

- Q4_K (144-byte super-block of 8 x 32): f16 `d` ~9e-5 and `dmin` = 8 d (per-block jitter), 6-bit
  scales in 32..63, 6-bit mins chosen so that each sub-block is centred near zero
  (m ~ sc * 7.5 * d / dmin, +-2), random nibbles. Weights come out std ~0.02.
- Q6_K (210 bytes, 16 x 16): random ql/qh (6-bit codes), int8 scales of magnitude 64..127 with
  random sign, f16 `d` ~1.1e-5. Weights std ~0.02.
- F32 norms: 1 + 0.05 N(0, 1).

Everything that is not random comes from the project's own writer, so the file is what
`write_dflash_gguf` would write for a checkpoint of this geometry: tensor names
(`GgufWriter.gguf_name_for`, the dflash map run backwards), tensor order (sorted HF names, as a
safetensors checkpoint lists them), the Q4_K_M type mix (`gguf_writer.tensor_type`: attn_v and
ffn_down Q6_K on the `use_more_bits` layers), metadata (`GgufWriter.gguf_metadata` of the HF config,
so dflash.target_layers = HF ids + 1 and tokenizer.ggml.mask_token_id), the value types
(`gguf_writer.add_value`), general.file_type and quantization_version. Tensors go through
gguf-py's GGUFWriter, one tensor at a time (`add_tensor_info` then `write_tensor_data`), so the
builder holds one tensor (at most ~75 MB) in memory.

No tokenizer metadata by default (the draft has no embedding; the HF config then has no
vocab_size and transformers' default, 151936, applies). `vocab=N` writes a synthetic gpt2-style
list of N tokens, to measure metadata cost.

    python -m benchmarks.scale_gguf --list
    python -m benchmarks.scale_gguf qwen3-8b-dflash            # builds (or finds) the cached file
    python -m benchmarks.scale_gguf tiny --rebuild --check     # and dequantizes a sample of it
"""

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE

BUILDER_VERSION = 1  # bump when the bytes a geometry produces change (invalidates the cache)
MIX = "Q4_K_M"


@dataclass(frozen=True)
class Geometry:
    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    n_targets: int
    vocab: int = 0                 # 0: no tokenizer metadata
    mask_token_id: int = 151669    # Qwen3's <|mask|> slot used by the z-lab drafts
    block_size: int = 16
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    context_length: int = 40960
    # DFlash 2 (conv_kernel 0: a v1 draft): convolutions per layer and the candidate selector
    conv_kernel: int = 0
    conv_group: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    taps: tuple[int, ...] = ()     # the target layers (HF ids) the draft reads; () spreads them (below)
    note: str = ""

    @property
    def target_layer_ids(self) -> list[int]:
        """`taps`, or distinct HF ids spread over a 36-layer target: [1, 9, 17, 25, 33] for 5."""
        if self.taps:
            return list(self.taps)
        if self.n_targets == 1:
            return [1]
        step = max(1, 32 // (self.n_targets - 1))
        return [1 + step * i for i in range(self.n_targets)]

    def hf_config(self) -> dict:
        config = {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "intermediate_size": self.ffn,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.context_length, "tie_word_embeddings": False,
            "dflash_config": {"target_layer_ids": self.target_layer_ids, "mask_token_id": self.mask_token_id,
                              "block_size": self.block_size},
        }
        if self.conv_kernel:
            config.update(architectures=["DFlash2DraftModel"], is_causal=False, vocab_size=self.vocab)
            config["dflash_config"].update(conv_kernel_size=self.conv_kernel, conv_group_size=self.conv_group,
                                           selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
        return config

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF name -> PyTorch shape, sorted by name (a safetensors checkpoint's order)."""
        h, hd = self.hidden, self.head_dim
        shapes = {"fc.weight": (h, self.n_targets * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
        for i in range(self.layers):
            p = f"layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.heads * hd, h),
                p + "self_attn.k_proj.weight": (self.kv_heads * hd, h),
                p + "self_attn.v_proj.weight": (self.kv_heads * hd, h),
                p + "self_attn.o_proj.weight": (h, self.heads * hd),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (self.ffn, h), p + "mlp.up_proj.weight": (self.ffn, h),
                p + "mlp.down_proj.weight": (h, self.ffn),
            }
            if self.conv_kernel:
                for conv in ("attention_conv.", "mlp_conv."):
                    shapes |= {p + conv + "base_kernel": (2, self.conv_kernel, h),
                               p + conv + "kernel_projection.weight": (2 * self.conv_kernel * (h // self.conv_group), h)}
        if self.conv_kernel:
            rank = self.selector_rank
            shapes |= {"candidate_selector.hidden_projection.weight": (rank, h),
                       "candidate_selector.predecessor_codebook": (self.vocab, rank),
                       "candidate_selector.successor_codebook": (self.vocab, rank)}
        return dict(sorted(shapes.items()))

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.hf_shapes().values())

    def key(self) -> str:
        """Cache key: every field that changes the file's bytes, plus the builder version."""
        # a v1 geometry's key leaves the DFlash 2 fields out, so cached v1 files stay valid
        dflash2 = ("conv_kernel", "conv_group", "selector_rank", "selector_top_k")
        fields = {k: v for k, v in asdict(self).items() if k != "note" and (self.conv_kernel or k not in dflash2)
                  and (k != "taps" or self.taps)}
        blob = json.dumps({"v": BUILDER_VERSION, **fields}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


GEOMETRIES = {g.name: g for g in [
    Geometry("tiny", hidden=256, layers=2, ffn=768, heads=4, kv_heads=2, head_dim=64, n_targets=2,
             note="smoke run"),
    Geometry("small", hidden=2048, layers=4, ffn=6144, heads=16, kv_heads=8, head_dim=128, n_targets=4),
    Geometry("medium", hidden=4096, layers=2, ffn=12288, heads=32, kv_heads=8, head_dim=128, n_targets=5,
             note="Qwen3-8B width, 2 layers"),
    Geometry("qwen3-4b-dflash", hidden=2560, layers=5, ffn=9728, heads=32, kv_heads=8, head_dim=128,
             n_targets=5, note="Qwen3-4B-DFlash-b16 geometry: the draft of the 4B target benchmark"),
    Geometry("qwen3-8b-dflash", hidden=4096, layers=5, ffn=12288, heads=32, kv_heads=8, head_dim=128,
             n_targets=5, note="Qwen3-8B-DFlash-b16 geometry (the issue's)"),
    Geometry("qwen3.5-9b-dflash", hidden=4096, layers=5, ffn=12288, heads=32, kv_heads=8, head_dim=128, n_targets=5,
             vocab=248320, mask_token_id=248070, rope_theta=10000000.0, taps=(1, 8, 15, 22, 29),
             note="z-lab/Qwen3.5-9B-DFlash's geometry (third-party docs): the draft of the 9B hybrid benchmark"),
    Geometry("guide-1.3b", hidden=4096, layers=6, ffn=12288, heads=32, kv_heads=8, head_dim=128, n_targets=8,
             note="the guide's GGUF-only draft: 8 target layers, fc 4096x32768"),
    Geometry("qwen3.8-27b-dflash2", hidden=5120, layers=5, ffn=17408, heads=32, kv_heads=8, head_dim=128,
             n_targets=5, vocab=248320, mask_token_id=248070, block_size=8, rope_theta=10000000.0,
             conv_kernel=2, conv_group=16, selector_rank=256, selector_top_k=16,
             note="incoai/Qwen3.8-27B-DFlash2's geometry: convolutions, and a selector the IR leaves out"),
    # z-lab/gemma-4-31B-it-DFlash's geometry as a third-party GGUF of it states it (Lucebox/gemma-4-31B-it-DFlash-GGUF,
    # not read from the hub here): hidden 5376, 5 layers, ffn 10752, 64/8 heads of 128, taps [1, 12, 23, 35, 46, 57]
    # of 60, block 16, mask token 4, vocab 262144, rope base 1e6. Left out: its sliding window (2048) and final
    # logit softcap (30), which this builder's Qwen3 draft does not state; neither changes its cost.
    Geometry("gemma-4-31b-dflash", hidden=5376, layers=5, ffn=10752, heads=64, kv_heads=8, head_dim=128, n_targets=6,
             vocab=262144, mask_token_id=4, block_size=16, rope_theta=1e6, taps=(1, 12, 23, 35, 46, 57),
             note="z-lab/gemma-4-31B-it-DFlash's geometry (third-party docs): the draft of the Gemma 4 31B benchmark"),
    # z-lab/gpt-oss-20b-DFlash's config.json as third-party code quotes it (not read from the hub here): hidden
    # 2880, 8 layers, ffn 7680, 64/8 heads of 64, taps [1, 6, 11, 16, 21], block 8, mask token 200000, vocab
    # 201088, rope base 150000, RMS eps 1e-5. Left out: its attention biases (attention_bias true, 0.1% of its
    # weights) and YaRN (factor 32 over 4096), which this builder's Qwen3 draft does not state. 2880 and 14400
    # are not whole 256-blocks: its Q4_K tensors fall back to Q5_0 and Q6_K to Q8_0, as llama-quantize's do.
    Geometry("gpt-oss-20b-dflash", hidden=2880, layers=8, ffn=7680, heads=64, kv_heads=8, head_dim=64, n_targets=5,
             vocab=201088, mask_token_id=200000, block_size=8, rope_theta=150000.0, rms_norm_eps=1e-5,
             context_length=131072, taps=(1, 6, 11, 16, 21),
             note="z-lab/gpt-oss-20b-DFlash's geometry (third-party docs): the draft of the gpt-oss-20b benchmark"),
]}


# -- random quant blocks ---------------------------------------------------------------------------

Q4K_D = 0.02 / (4.61 * 48.6)   # code std 4.61 (uniform 0..15), rms scale ~48.6 (uniform 32..63)
Q6K_D = 0.02 / (18.5 * 97.0)   # (q - 32) std 18.5, rms |scale| ~97 (uniform 64..127)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(-1, 2)


def q4_k_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random valid Q4_K super-blocks, shape (n, 144)."""
    b = np.frombuffer(bytearray(rng.bytes(n * 144)), np.uint8).reshape(n, 144)  # qs: random nibbles
    d = Q4K_D * rng.uniform(0.75, 1.25, n).astype(np.float32)
    dmin = 8.0 * d
    b[:, 0:2] = _f16_bytes(d)
    b[:, 2:4] = _f16_bytes(dmin)
    sc = (32 + rng.integers(0, 32, (n, 8))).astype(np.uint8)
    # m * dmin ~ sc * d * 7.5 centres each sub-block's codes 0..15 near zero
    m = np.clip(np.rint(sc * 7.5 / 8.0) + rng.integers(-2, 3, (n, 8)), 0, 63).astype(np.uint8)
    # ggml's get_scale_min_k4 inverted: j<4 in the low 6 bits of q[j] / q[j+4]; j>=4 split into a
    # nibble of q[j+4] and the top two bits of q[j-4] / q[j].
    q = np.empty((n, 12), np.uint8)
    q[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    q[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    q[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    b[:, 4:16] = q
    return b


def q6_k_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random valid Q6_K super-blocks, shape (n, 210): ql[128] qh[64] scales[16] d."""
    b = np.frombuffer(bytearray(rng.bytes(n * 210)), np.uint8).reshape(n, 210)  # ql, qh: random codes
    mag = rng.integers(64, 128, (n, 16))
    sign = np.where(rng.integers(0, 2, (n, 16)) == 1, -1, 1)
    b[:, 192:208] = (mag * sign).astype(np.int8).view(np.uint8)
    b[:, 208:210] = _f16_bytes(Q6K_D * rng.uniform(0.75, 1.25, n).astype(np.float32))
    return b


Q8_0_D = 0.02 / 73.3          # int8 codes uniform in -128..127: std 73.9
MXFP4_E = 120                 # E8M0 exponent: ggml's doubled E2M1 values (rms 5.6) x 2^(e-127) / 2 ~ 0.02


def q8_0_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random valid Q8_0 blocks, shape (n, 34): f16 `d`, 32 int8 codes."""
    b = np.frombuffer(bytearray(rng.bytes(n * 34)), np.uint8).reshape(n, 34)
    b[:, 0:2] = _f16_bytes(Q8_0_D * rng.uniform(0.75, 1.25, n).astype(np.float32))
    return b


Q5_0_D = 0.02 / 9.2           # 5-bit codes uniform in 0..31 around 16: std 9.2


def q5_0_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random valid Q5_0 blocks, shape (n, 22): f16 `d`, 32 high bits, 32 low nibbles (Q4_K's fallback where
    a row is not whole 256-blocks, as llama-quantize falls back)."""
    b = np.frombuffer(bytearray(rng.bytes(n * 22)), np.uint8).reshape(n, 22)
    b[:, 0:2] = _f16_bytes(Q5_0_D * rng.uniform(0.75, 1.25, n).astype(np.float32))
    return b


def mxfp4_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random valid MXFP4 blocks, shape (n, 17): an E8M0 exponent byte in MXFP4_E +- 1, 32 E2M1 nibbles."""
    b = np.frombuffer(bytearray(rng.bytes(n * 17)), np.uint8).reshape(n, 17)
    b[:, 0] = rng.integers(MXFP4_E - 1, MXFP4_E + 2, n).astype(np.uint8)
    return b


def random_tensor(rng: np.random.Generator, qtype, shape: tuple[int, ...]) -> np.ndarray:
    """Data for one tensor as GGUFWriter takes it: float32 elements, or (rows, bytes) uint8 blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    if qtype == Q.F32:
        return (1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if qtype == Q.BF16:  # N(0, 0.02) rounded down to bfloat16, as bytes
        bits = (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8).reshape(*shape[:-1], 2 * shape[-1])
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if cols % block:
        raise ValueError(f"{qtype.name} needs rows that are whole blocks of {block}: {shape}")
    n = rows * cols // block
    make = {Q.Q4_K: q4_k_blocks, Q.Q6_K: q6_k_blocks, Q.Q8_0: q8_0_blocks, Q.MXFP4: mxfp4_blocks,
            Q.Q5_0: q5_0_blocks}.get(qtype)
    if make is None:
        raise ValueError(f"no random block builder for {qtype.name} (shape {shape})")
    return make(rng, n).reshape(*shape[:-1], cols // block * size)


# -- the file ------------------------------------------------------------------------------------

def cache_path(geom: Geometry, cache_dir: Path = CACHE) -> Path:
    return Path(cache_dir) / f"{geom.name}-{geom.key()}.gguf"


def write_scale_gguf(geom: Geometry, out_path: Path, seed: int | None = None) -> dict:
    """Write the draft GGUF for `geom` at `out_path` (atomically); returns a build record."""
    from gguf2ov.tools.gguf_writer import ARCH

    start = time.perf_counter()
    rng = np.random.default_rng(int(geom.key(), 16) if seed is None else seed)
    vocab = (geom.vocab, geom.mask_token_id) if geom.vocab else None
    built = write_random_gguf(out_path, ARCH, geom.name, geom.hf_config(), geom.hf_shapes(), geom.layers, rng, vocab)
    return {"geometry": asdict(geom), "key": geom.key(), "path": str(out_path), "bytes": Path(out_path).stat().st_size,
            "parameters": geom.parameters, **built, "build_seconds": round(time.perf_counter() - start, 2),
            "builder_version": BUILDER_VERSION}


def write_random_gguf(out_path: Path, arch: str, name: str, config: dict, shapes: dict, n_layers: int, rng,
                      vocab: tuple[int, int | None] | None = None, types: dict | None = None,
                      tokenizer_dir: Path | None = None, extra: dict | None = None, order: list | None = None,
                      llamacpp: bool = False, constants: dict | None = None, mix: str = MIX) -> dict:
    """An `arch` GGUF of random blocks for the HF tensors `shapes` (in that order), metadata from
    the map of `arch` run backwards on `config`. `vocab` = (size, token that must be in it) writes a
    synthetic gpt2-style token list, `tokenizer_dir` an HF tokenizer's as llama.cpp does
    (`gguf_writer`); `types`: GGUF name -> type, overriding the mix; `extra`: GGUF name -> numpy shape
    of tensors the map does not name (an MTP block's own); `order`: the GGUF names in the order to
    write them (default: `shapes`' order, then `extra`'s); `llamacpp`: the metadata as llama.cpp's
    converter writes it (`llamacpp_metadata`); `constants`: GGUF name -> F32 values written as they are
    (a rope_freqs), first; `mix`: the llama-quantize mix the file states (general.file_type) and whose
    types apply where `types` names none. Where the map has ops, a quantized tensor's
    random blocks take the shape the ops reversed give (head reorders keep it), and an F32 tensor's
    values are the map's ops reversed on random checkpoint values (ssm_a = -exp(A_log) < 0).
    Returns the tensor count, type counts and metadata keys."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType

    from gguf2ov.maps.load import load_map
    from gguf2ov.maps.rules import apply_ops
    from gguf2ov.tools.gguf_writer import MIXES, QUANT_VERSION, _add_tokenizer, add_value, tensor_type, write_atomically

    amap = load_map(arch)
    # Header and metadata exactly as write_gguf orders them.
    writer = GGUFWriter(path=None, arch=arch)
    writer.add_name(name)
    writer.add_file_type(MIXES[mix][1])
    writer.add_quantization_version(QUANT_VERSION)
    tokenizer_keys = set()
    if vocab:
        size, needed = vocab
        if needed is not None and not 0 <= needed < size:
            raise ValueError(f"{name}: token {needed} outside the vocabulary of {size}")
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list([f"tok{i}" for i in range(size)])
        writer.add_token_types([TokenType.NORMAL] * size)
    elif tokenizer_dir is not None:
        tokenizer_keys = _add_tokenizer(writer, Path(tokenizer_dir), config.get("vocab_size"), "qwen2")
    metadata = amap.writer.gguf_metadata(config)
    if llamacpp:
        metadata = llamacpp_metadata(arch, metadata, config)
    for key, value in metadata.items():
        if key not in tokenizer_keys:  # each key once, as write_gguf writes them
            add_value(writer, key, value)
    keys = sorted(set(writer.kv_data[0]) - {"general.name"})

    n_expert = metadata.get(f"{arch}.expert_count", 1)
    planned = {}  # GGUF name -> (HF shape, ops, GGUF shape)
    for hf_name, shape in shapes.items():
        gguf_name, ops = amap.writer.gguf_name_for(hf_name)
        gguf_shape = apply_ops(ops, np.zeros(shape, np.float32), config, reverse=True).shape if ops else shape
        planned[gguf_name] = (tuple(shape), ops, tuple(gguf_shape))
    planned |= {n: (tuple(s), (), tuple(s)) for n, s in (extra or {}).items()}
    if order is not None:
        if sorted(order) != sorted(planned):
            raise ValueError(f"{name}: the order names other tensors than the geometry "
                             f"(only in the order: {sorted(set(order) - set(planned))[:5]}, "
                             f"only in the geometry: {sorted(set(planned) - set(order))[:5]})")
        planned = {n: planned[n] for n in order}
    plan, counts = [], {}
    for gguf_name, values in (constants or {}).items():
        values = np.ascontiguousarray(values, np.float32)
        plan.append((gguf_name, values, (), values.shape, GGMLQuantizationType.F32))
        counts["F32"] = counts.get("F32", 0) + 1
        writer.add_tensor_info(gguf_name, values.shape, np.dtype(np.float32), values.nbytes)
    for gguf_name, (hf_shape, ops, shape) in planned.items():
        qtype = (types or {}).get(gguf_name) or tensor_type(gguf_name, shape, mix, n_layers, n_expert)
        plan.append((gguf_name, hf_shape, ops, shape, qtype))
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        if qtype.name == "F32":
            writer.add_tensor_info(gguf_name, shape, np.dtype(np.float32), 4 * math.prod(shape))
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            byte_shape = (*shape[:-1], shape[-1] // block * size)
            writer.add_tensor_info(gguf_name, byte_shape, np.dtype(np.uint8), math.prod(byte_shape), raw_dtype=qtype)

    def write_tensors():
        for gguf_name, hf_shape, ops, shape, qtype in plan:  # one tensor in memory at a time
            if isinstance(hf_shape, np.ndarray):  # a constant
                writer.write_tensor_data(hf_shape)
            elif qtype.name == "F32" and ops:
                values = apply_ops(ops, random_tensor(rng, qtype, hf_shape), config, reverse=True)
                writer.write_tensor_data(np.ascontiguousarray(values, np.float32))
            else:
                writer.write_tensor_data(random_tensor(rng, qtype, shape))

    write_atomically(writer, Path(out_path), write_tensors)
    return {"tensors": len(plan), "type_counts": counts,
            "metadata_keys": keys}


def ensure_gguf(geom: Geometry, cache_dir: Path = CACHE, rebuild: bool = False) -> dict:
    """The cached file for `geom`, built if absent; the record says whether it was cached."""
    path = cache_path(geom, cache_dir)
    sidecar = path.with_suffix(".json")
    if not rebuild and path.is_file() and sidecar.is_file():
        record = json.loads(sidecar.read_text())
        if record.get("bytes") == path.stat().st_size:
            return record | {"cached": True, "path": str(path)}
    record = write_scale_gguf(geom, path)
    sidecar.write_text(json.dumps(record, indent=2) + "\n")
    return record | {"cached": False}


# llama.cpp's converter (conversion/qwen.py, Qwen3NextModel.filter_tensors) writes the MTP block after
# the decoder's blocks: its layer as one more block, its own tensors under these names.
MTP_NEXTN = {"mtp.fc.weight": "nextn.eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
             "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight", "mtp.norm.weight": "nextn.shared_head_norm.weight"}


def target_tensors(geom, amap) -> tuple[dict, dict]:
    """A target geometry's checkpoint tensors as a GGUF of its architecture holds them: ({map HF name:
    shape}, {GGUF name: shape} of the tensors the map does not name). The checkpoint's prefixes are
    renamed as the map reads them, per-expert tensors stacked into one [E, N, K] each (as llama.cpp's
    converter stacks them), and the MTP block renamed as llama.cpp's converter renames it."""
    from gguf2ov.tools.gguf_writer import stacked_experts

    stored = geom.shapes()
    renamed = amap.checkpoint.names([n for n in stored if not n.startswith("mtp.")], amap.arch, geom.name)
    shapes = {}
    for hf_name, parts in stacked_experts(renamed).items():
        shapes[hf_name] = (len(parts), *stored[renamed[parts[0]]]) if parts else stored[renamed[hf_name]]
    extra = {}
    for name, shape in stored.items():
        if name.startswith("mtp.layers."):
            i, rest = name[len("mtp.layers."):].split(".", 1)
            shapes[f"model.layers.{geom.layers + int(i)}.{rest}"] = shape
        elif name in MTP_NEXTN:
            extra[f"blk.{geom.layers}.{MTP_NEXTN[name]}"] = shape
    return shapes, extra


def llamacpp_layout(geom, cache_dir: Path = CACHE) -> dict:
    """What llama.cpp's own tools write for a geometry's Q4_K_M file: {"tensors": [(GGUF name, type)] in
    the file's order, "metadata": {key: value types}}, from a narrow copy of it (the same layers, layer
    types, MTP block and tied head; 256 wide, so that, as in the real geometry, every quantized row is
    whole 256-blocks and no type falls back; 16 experts where it has experts, since llama.cpp's Q4_K_M
    rules tell only 8 experts from others) written as a bf16 checkpoint, converted by
    convert_hf_to_gguf.py and quantized by llama-quantize Q4_K_M. Which tensors llama-quantize gives
    more bits depends on counters over the file's order (an `attn_qkv` counts as an `attn_v`), so the
    order and the types are taken together. A gpt-oss geometry (`GptOssGeometry`): its own mix (MXFP4_MOE), the
    same layers and experts 64 wide, the checkpoint as transformers saves it. Cached as JSON."""
    from dataclasses import replace

    from benchmarks.random_target import write_checkpoint

    mix = getattr(geom, "mix", MIX)
    path = Path(cache_dir) / f"layout-{geom.name}-{geom.key()}-{mix}.json"
    if path.is_file():
        return json.loads(path.read_text())
    if geom.model_type == "gpt_oss":
        return _write_layout(path, gpt_oss_checkpoint, replace(geom, name=f"{geom.name}-layout", hidden=64, ffn=64,
                                                              heads=2, kv_heads=1, head_dim=32, vocab=1024), mix)
    narrow = replace(geom, name=f"{geom.name}-layout", hidden=256, ffn=256, vocab=1024, heads=2 if not geom.hybrid else 1,
                     kv_heads=1, head_dim=256 if geom.hybrid else 128,
                     linear_key_heads=(2 if geom.linear_key_heads == geom.linear_value_heads else 1) if geom.hybrid else 0,
                     linear_value_heads=2 if geom.hybrid else 0, linear_head_dim=128,
                     experts=16 if geom.moe else 0, experts_per_tok=2 if geom.moe else 0, moe_ffn=256 if geom.moe else 0)
    return _write_layout(path, write_checkpoint, narrow, MIX)


def _write_layout(path: Path, write_checkpoint, narrow, mix: str) -> dict:
    """`llamacpp_layout`'s record of the narrow geometry's checkpoint (written by `write_checkpoint`) through
    llama.cpp's converter (bf16) and llama-quantize `mix`, written at `path`."""
    from gguf import GGUFReader

    from benchmarks.llamacpp.tools import convert, quantize

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        hf = write_checkpoint(narrow, Path(tmp) / "hf")
        bf16 = convert(hf, Path(tmp) / "bf16.gguf", "bf16")
        reader = GGUFReader(str(quantize(bf16, Path(tmp) / f"{mix}.gguf", mix)))
        layout = {"tensors": [(t.name, t.tensor_type.name) for t in reader.tensors],
                  "metadata": {k: [t.name for t in f.types] for k, f in reader.fields.items() if not k.startswith("GGUF.")}}
    path.write_text(json.dumps(layout) + "\n")
    return layout


def gpt_oss_checkpoint(geom, out: Path) -> Path:
    """A random `gpt_oss` checkpoint of a (narrow) geometry as transformers saves one (gate and up
    interleaved in one [E, K, 2N] tensor), with random_target's tokenizer: what llama.cpp's converter reads."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from benchmarks.random_target import write_tokenizer

    config = {k: v for k, v in geom.config().items() if k not in ("model_type", "architectures", "dtype")}
    torch.manual_seed(0)
    model = GptOssForCausalLM(GptOssConfig(**config))
    model.config.architectures = ["GptOssForCausalLM"]
    model.to(torch.bfloat16).save_pretrained(out)
    write_tokenizer(out, geom.vocab)
    return out


def llamacpp_metadata(arch: str, metadata: dict, config: dict) -> dict:
    """The metadata llama.cpp's converter writes where the map run backwards writes less: block_count
    counts the MTP block (`nextn_predict_layers`), the recurrent-layer flags cover it (false), the rope
    sections are four, the value head size is stated, and gpt-oss states its expert width as the FFN's too."""
    out = dict(metadata)
    if n := config.get("mtp_num_hidden_layers", 0):
        out[f"{arch}.block_count"] += n
        out[f"{arch}.nextn_predict_layers"] = n
        if (flags := f"{arch}.attention.recurrent_layers") in out:
            out[flags] = [*out[flags], *[False] * n]
    if (sections := f"{arch}.rope.dimension_sections") in out:
        out[sections] = [*out[sections], *[0] * (4 - len(out[sections]))]
    if (key := f"{arch}.attention.key_length") in out:
        out.setdefault(f"{arch}.attention.value_length", out[key])
    if arch == "gemma4":  # the head sizes again as value and RoPE sizes, per layer kind
        for suffix in ("", "_swa"):
            if (key := f"{arch}.attention.key_length{suffix}") in out:
                out.setdefault(f"{arch}.attention.value_length{suffix}", out[key])
                out.setdefault(f"{arch}.rope.dimension_count{suffix}", out[key])
        out.setdefault(f"{arch}.embedding_length_per_layer_input", 0)
    if arch == "gpt-oss":  # the converter's TextModel writes intermediate_size as the FFN length too
        out.setdefault(f"{arch}.feed_forward_length", out[f"{arch}.expert_feed_forward_length"])
    return out


def gemma4_types(geom, amap) -> dict:
    """llama-quantize's Q4_K_M types where they differ from `gguf_writer.tensor_type`'s for a gemma4 file:
    the tied token_embd (the output too) in Q6_K, and attn_v in Q6_K by llama-quant.cpp's counter over the
    attn_v tensors in the file's order (`use_more_bits(i_attention_wv, n_attention_wv)`), not over the
    layers: global layers with K as V, and shared-KV layers, have none. With per-layer embeddings,
    per_layer_token_embd in Q6_K as token_embd (llama-quant.cpp counts it a token embedding, and a tied
    model's take the output's type) and per_layer_model_proj left as converted (BF16: llama-quant.cpp
    never quantizes it). Checked against llama-quantize 0c1e570's Q4_K_M of a 42-layer E4B-like bf16 file
    written by its converter (hidden 256): these types, and the others gguf_writer's."""
    from gguf import GGMLQuantizationType as Q

    from gguf2ov.tools.gguf_writer import use_more_bits

    names = [amap.writer.gguf_name_for(n)[0] for n in geom.shapes()]
    attn_v = [n for n in names if n.endswith(".attn_v.weight")]
    types = {n: Q.Q6_K if use_more_bits(i, len(attn_v)) else Q.Q4_K for i, n in enumerate(attn_v)}
    types |= {"token_embd.weight": Q.Q6_K}
    if geom.per_layer_input:
        types |= {"per_layer_token_embd.weight": Q.Q6_K, "per_layer_model_proj.weight": Q.BF16}
    return types


def ensure_target_gguf(geom, cache_dir: Path = CACHE) -> dict:
    """A random Q4_K_M GGUF of a target geometry (`random_target.TargetGeometry`: its config and
    tensors through its architecture's map), cached as target-NAME-KEY-Q4_K_M.gguf. The vocabulary
    is random_target's tokenizer (the fixture's, padded to the geometry's size), written as llama.cpp
    writes a gpt2-style one.

    A dense geometry's tensors are sorted by name, typed by `gguf_writer.tensor_type` (llama.cpp's
    rules; a tied token_embd is Q6_K, as llama.cpp makes the tensor that doubles as the output). A
    hybrid or mixture-of-experts geometry's are in the order and types of llama.cpp's own file of the
    same layers (`llamacpp_layout`), its MTP block included. A Gemma 4 geometry's (dense, or with experts
    beside the MLP) are layer by layer, typed by `tensor_type` and `gemma4_types` (llama.cpp's converter
    needs a SentencePiece-style tokenizer the padded fixture tokenizer is not): the experts' ffn_gate_up_exps
    Q4_K, ffn_down_exps and ffn_down Q6_K or Q4_K by layer as llama-quant.cpp's ffn_down rule reads the
    layer from the name (more than one expert), falling back to Q8_0 and Q5_0 where a row (704, 2112 for
    26B-A4B) is not whole 256-blocks; the router and its scales F32. A gpt-oss geometry's in its MXFP4_MOE
    mix (target-NAME-KEY-MXFP4_MOE.gguf), ordered as the hybrid and MoE ones."""
    from gguf import GGMLQuantizationType as Q

    from gguf2ov.maps.load import load_map
    from gguf2ov.targets.config import target_map
    from gguf2ov.targets.source import ROPE_FACTORS, rope_factors_of
    from benchmarks.random_target import write_tokenizer

    path = Path(cache_dir) / f"target-{geom.name}-{geom.key()}-{getattr(geom, 'mix', MIX)}.gguf"
    sidecar = path.with_suffix(".json")
    if path.is_file() and sidecar.is_file() and json.loads(sidecar.read_text()).get("bytes") == path.stat().st_size:
        # the path found here: the record keeps the path of the checkout that built the shared file
        return json.loads(sidecar.read_text()) | {"cached": True, "path": str(path)}
    start = time.perf_counter()
    config = geom.config()
    arch = target_map(config["model_type"], geom.name).arch
    rng = np.random.default_rng(int(geom.key(), 16))
    mix = getattr(geom, "mix", MIX)
    if geom.model_type == "gemma4_text":  # llama.cpp's order (layer by layer), its Q4_K_M rules
        shapes, extra, order = geom.shapes(), None, None
        types = gemma4_types(geom, load_map(arch))
        constants = {ROPE_FACTORS: rope_factors_of(config, load_map(arch))}  # as llama.cpp's converter adds it
    elif geom.hybrid or geom.moe:  # a gpt-oss geometry too: llama.cpp's MXFP4_MOE types
        layout = llamacpp_layout(geom, cache_dir)
        # a gpt-oss geometry's shapes are the map's names already
        shapes, extra = (geom.shapes(), None) if geom.model_type == "gpt_oss" else target_tensors(geom, load_map(arch))
        types, order = {n: Q[t] for n, t in layout["tensors"]}, [n for n, _ in layout["tensors"]]
    else:
        shapes, extra, order = dict(sorted(geom.shapes().items())), None, None
        types = {"token_embd.weight": Q.Q6_K} if geom.tied else None
    if geom.model_type != "gemma4_text":
        constants = None
    with tempfile.TemporaryDirectory() as tokenizer:
        write_tokenizer(Path(tokenizer), geom.vocab)
        built = write_random_gguf(path, arch, geom.name, config, shapes, geom.layers, rng, types=types,
                                  tokenizer_dir=Path(tokenizer), extra=extra, order=order,
                                  llamacpp=order is not None or constants is not None, constants=constants, mix=mix)
    if order is not None:  # the keys llama.cpp writes that this file lacks, and the reverse (general.* aside)
        theirs = {k for k in layout["metadata"] if not k.startswith("general.")}
        ours = {k for k in built["metadata_keys"] if not k.startswith("general.")}
        built["metadata_vs_llamacpp"] = {"missing": sorted(theirs - ours), "extra": sorted(ours - theirs)}
    record = {"geometry": asdict(geom), "key": geom.key(), "path": str(path), "bytes": path.stat().st_size,
              "parameters": geom.parameters, **built, "build_seconds": round(time.perf_counter() - start, 2),
              "builder_version": BUILDER_VERSION}
    sidecar.write_text(json.dumps(record, indent=2) + "\n")
    return record | {"cached": False}


def check_values(path, rows: int = 64) -> dict:
    """Dequantize the first `rows` rows of every tensor (gguf-py): finite, mean and std per type."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    by_type: dict[str, list[np.ndarray]] = {}
    for t in reader.tensors:
        data = t.data if t.data.ndim == 1 else t.data[:rows]
        by_type.setdefault(t.tensor_type.name, []).append(dequantize(np.asarray(data), t.tensor_type).ravel())
    out = {}
    for name, parts in by_type.items():
        x = np.concatenate(parts).astype(np.float64)
        out[name] = {"tensors": len(parts), "sampled": int(x.size), "finite": bool(np.isfinite(x).all()),
                     "mean": float(x.mean()), "std": float(x.std()), "min": float(x.min()), "max": float(x.max())}
    return out


def compare_with_writer(geom: Geometry, work: Path | None = None) -> list[str]:
    """Differences between this builder's file and `write_dflash_gguf`'s for the same geometry.

    Builds a random BF16 checkpoint of `geom` (keep it small: the writer quantizes for real),
    writes it with the project's writer and compares the two files' metadata (keys, order, value
    types and values, general.name aside) and tensor list (names, order, types, shapes).
    An empty list means the files differ only in tensor values.
    """
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file

    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    work = Path(work or tempfile.mkdtemp(prefix="scale-compare-"))
    ckpt = work / geom.name
    ckpt.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    sd = {k: (torch.randn(*s, generator=g) * 0.02 + (1.0 if len(s) == 1 else 0.0)).bfloat16()
          for k, s in geom.hf_shapes().items()}
    save_file(sd, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps(geom.hf_config(), indent=2))
    theirs, ours = work / "writer.gguf", work / "scale.gguf"
    write_dflash_gguf(ckpt, theirs, mix=MIX)
    write_scale_gguf(geom, ours)

    def header(path):
        r = GGUFReader(str(path))
        fields = [(k, [t.name for t in f.types], f.contents()) for k, f in r.fields.items()
                  if not k.startswith("GGUF.") and k != "general.name"]
        tensors = [(t.name, t.tensor_type.name, [int(n) for n in t.shape]) for t in r.tensors]
        return fields, tensors

    (f1, t1), (f2, t2) = header(theirs), header(ours)
    problems = []
    if f1 != f2:
        problems.append(f"metadata differs:\n  writer:  {f1}\n  builder: {f2}")
    if t1 != t2:
        diff = [(a, b) for a, b in zip(t1, t2) if a != b] or [(len(t1), len(t2))]
        problems.append(f"tensor list differs (first differences: {diff[:5]})")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", help=f"geometries to build (of {', '.join(GEOMETRIES)})")
    ap.add_argument("--list", action="store_true", help="list the geometries and their parameter counts")
    ap.add_argument("--rebuild", action="store_true", help="ignore the cache")
    ap.add_argument("--check", action="store_true", help="dequantize a sample and print its statistics")
    ap.add_argument("--cache-dir", type=Path, default=CACHE)
    ap.add_argument("--compare-writer", action="store_true",
                    help="compare the file with gguf2ov.tools.gguf_writer's for the same geometry (small sizes only: "
                         "the writer quantizes for real) and exit")
    args = ap.parse_args(argv)
    if args.list or not args.sizes:
        for g in GEOMETRIES.values():
            print(f"{g.name:18} {g.parameters / 1e9:6.3f} B  hidden {g.hidden} layers {g.layers} ffn {g.ffn} "
                  f"heads {g.heads}/{g.kv_heads} head_dim {g.head_dim} targets {g.target_layer_ids}  {g.note}")
        return 0
    for name in args.sizes:
        if name not in GEOMETRIES:
            ap.error(f"unknown geometry {name!r}; choose from {', '.join(GEOMETRIES)}")
        if args.compare_writer:
            problems = compare_with_writer(GEOMETRIES[name])
            print(f"{name}: " + ("same metadata, tensor names, order, types and shapes as gguf_writer"
                                 if not problems else "\n".join(problems)))
            continue
        rec = ensure_gguf(GEOMETRIES[name], args.cache_dir, rebuild=args.rebuild)
        print(f"{name}: {rec['path']} {rec['bytes'] / 2**20:.1f} MiB, {rec['parameters'] / 1e9:.3f} B params, "
              f"{rec['type_counts']}, built in {rec['build_seconds']} s{' (cached)' if rec['cached'] else ''}")
        if args.check:
            for qtype, s in check_values(rec["path"]).items():
                print(f"  {qtype:5} {s['tensors']:3} tensors, {s['sampled']} values sampled: finite={s['finite']} "
                      f"mean {s['mean']:+.5f} std {s['std']:.5f} range [{s['min']:.4f}, {s['max']:.4f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- a VLM's mmproj of real geometry ------------------------------------------------------------------------

@dataclass(frozen=True)
class VisionGeometry:
    """A gemma4v vision tower and projector, as llama.cpp's converter writes its mmproj (F16 weights, F32
    norms and position table): the names, types and metadata of fixtures/tiny-gemma4/mmproj-F16.gguf (llama.cpp's
    own file), at this geometry."""

    name: str
    hidden: int           # clip.vision.embedding_length
    ffn: int              # clip.vision.feed_forward_length
    layers: int           # clip.vision.block_count
    heads: int
    text_hidden: int      # clip.vision.projection_dim: the text model's width
    positions: int = 10240  # the position table's rows (transformers' position_embedding_size)
    patch: int = 16
    note: str = ""

    def key(self) -> str:
        blob = json.dumps({"v": BUILDER_VERSION, **{k: v for k, v in asdict(self).items() if k != "note"}},
                          sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    def tensors(self) -> dict:
        """GGUF name -> (ne, F16 or F32), in the fixture's order."""
        h, f, d = self.hidden, self.ffn, self.hidden // self.heads
        out = {"mm.input_projection.weight": ((h, self.text_hidden), "F16")}
        for i in range(self.layers):
            p = f"v.blk.{i}."
            out |= {p + "ln1.weight": ((h,), "F32"), p + "ffn_down.weight": ((f, h), "F16"),
                    p + "ffn_gate.weight": ((h, f), "F16"), p + "ffn_up.weight": ((h, f), "F16"),
                    p + "attn_post_norm.weight": ((h,), "F32"), p + "ffn_post_norm.weight": ((h,), "F32"),
                    p + "ln2.weight": ((h,), "F32"), p + "attn_k_norm.weight": ((d,), "F32"),
                    p + "attn_k.weight": ((h, h), "F16"), p + "attn_out.weight": ((h, h), "F16"),
                    p + "attn_q_norm.weight": ((d,), "F32"), p + "attn_q.weight": ((h, h), "F16"),
                    p + "attn_v.weight": ((h, h), "F16")}
        return out | {"v.patch_embd.weight": ((self.patch, self.patch, 3, h), "F16"),
                      "v.position_embd.weight": ((h, self.positions, 2), "F32")}


# google/gemma-4-31B-it's vision tower, as far as public material states it: a ~550 M-parameter encoder; here
# SigLIP-so400m's widths (1152 wide, 27 layers of 16 heads, MLP 4304), which third-party configs give Gemma's
# encoders, projecting to the 31B's 5376 (not read from the hub: an estimate of its size, not its config)
VISION_GEOMETRIES = {g.name: g for g in [
    VisionGeometry("gemma-4-31b-vision", hidden=1152, ffn=4304, layers=27, heads=16, text_hidden=5376,
                   note="Gemma 4 31B's vision tower (an estimate: SigLIP-so400m's widths)"),
]}


def ensure_mmproj(geom: VisionGeometry, cache_dir: Path = CACHE) -> dict:
    """A random mmproj of `geom`, cached as mmproj-NAME-KEY-F16.gguf: llama.cpp's gemma4v metadata (the fixture's,
    with this geometry's widths), random F16 weights of std 0.02 and F32 norms of 1 + noise."""
    import gguf

    path = Path(cache_dir) / f"mmproj-{geom.name}-{geom.key()}-F16.gguf"
    if path.is_file():
        return {"path": str(path), "bytes": path.stat().st_size, "cached": True}
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    fixture = gguf.GGUFReader(str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-gemma4" / "mmproj-F16.gguf"))
    widths = {"clip.vision.embedding_length": geom.hidden, "clip.vision.feed_forward_length": geom.ffn,
              "clip.vision.block_count": geom.layers, "clip.vision.attention.head_count": geom.heads,
              "clip.vision.projection_dim": geom.text_hidden, "clip.vision.patch_size": geom.patch,
              "general.name": geom.name}
    writer = gguf.GGUFWriter(str(path) + ".partial", arch="clip")
    for field in fixture.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        value = widths.get(field.name, field.contents())
        writer.add_key_value(field.name, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    rng = np.random.default_rng(int(geom.key(), 16))
    tensors = geom.tensors()
    dtypes = {"F16": np.float16, "F32": np.float32}
    for name, (ne, kind) in tensors.items():
        shape = tuple(reversed(ne))
        writer.add_tensor_info(name, shape, np.dtype(dtypes[kind]), int(np.prod(ne)) * np.dtype(dtypes[kind]).itemsize,
                               gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, (ne, kind) in tensors.items():
        shape = tuple(reversed(ne))
        if kind == "F32":
            values = (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
        else:
            values = (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)
        writer.write_tensor_data(values)
    writer.close()
    Path(str(path) + ".partial").replace(path)
    return {"path": str(path), "bytes": path.stat().st_size, "cached": False,
            "build_seconds": round(time.perf_counter() - start, 1),
            "parameters": sum(int(np.prod(ne)) for ne, _ in tensors.values())}

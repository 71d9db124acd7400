"""The trained fixture pair at a real model's geometry: both models padded so that they compute the trained functions.

Every acceptance figure of a trained pair comes from the small fixture pair (`fixtures/tiny-dflash`: a Qwen3 target
of hidden 256, 4 layers, 4/2 heads of 64, MLP 512, 512 tokens, tied head; its DFlash draft of 2 layers reading
target layers [1, 2], block 8); every real-size figure from random weights, which accept nothing. This module pads
that pair to a real geometry (`GEOMETRIES`: Qwen3-8B's, Qwen3-1.7B's, and a small one the tests run), so that the
two engines can be compared at that size with the trained acceptance (`bench_side_by_side.py padded-8b`), and
writes it as GGUFs with llama.cpp's own converter and `llama-quantize Q4_K_M`.

Each step keeps the function (f32, up to summation order), because:

- **hidden size H -> D** (256 -> 4096): every tensor reading the hidden state has zero columns for the padded
  channels, every tensor writing it zero rows, so the padded channels carry nothing the model reads, except one
  (`channel`, the first padded one), which holds a constant c (below).
- **the residual stream is carried scaled by beta** (a power of two: 4 at 8B): the token embeddings and what
  writes into the residual stream are multiplied by beta, in target and draft: o_proj, and up_proj, which reaches
  down_proj linearly (scaled, down_proj's Q6_K super-scales would leave the float16 subnormal range the fixture's
  small weights put them in, and round otherwise). An RMSNorm is scale-invariant but for its epsilon, so beta is
  what lets one epsilon serve both kinds of norms below; a power of two changes no mantissa, and llama.cpp's
  K-quantizer then writes the same codes (scales times beta).
- **RMSNorm over D where it was over H**: a hidden norm sees mean(x'^2) = (beta^2 sum(x^2) + c^2) / D. With
  eps' = (H beta^2 eps - c^2) / D that is (H beta^2 / D) (mean_H(x^2) + eps): the trained normalization up to one
  factor, which the norm weights take (w * sqrt(H / D) on the real channels; beta cancels). The weights are 0
  on the padded channels, so the constant channel never reaches q, k, v, gate or up.
- **head_dim 64 -> 128** (RoPE NEOX: dims i and i + d/2 form rotary pair i, frequency base^(-2i/d)): the trained
  pair j of a 64-dim head turns at base^(-2j/64) = base^(-2(2j)/128), the frequency of pair 2j of a 128-dim head,
  so a query or key head's dims j and 32 + j go to dims 2j and 64 + 2j, zeros elsewhere. q_norm and k_norm
  (RMS over the head) see half the mean square: with eps' = eps/2 the trained normalization is divided by
  sqrt(2); the attention scale 1/sqrt(128) where it was 1/sqrt(64) divides the scores by another sqrt(2). So
  k_norm's weights are w / sqrt(2) and q_norm's stay w (the two factors cancel on the query). Values are not
  rotated: a value head's 64 dims go to its first 64, and o_proj's columns follow them.
- **one epsilon for both**: eps' = eps / 2 (the head norms') and eps' = (H beta^2 eps - c^2) / D (the hidden
  norms') hold together for c^2 = eps (H beta^2 - D / 2), which is why beta is 4 at 8B (2 would need c^2 < 0).
  c is rounded to float16 and eps' taken from the hidden norms' equation, so those stay exact; the head norms'
  epsilon is then eps (1 - 1.2e-4) at 8B, eps (1 + 6e-4) at 1.7B: under 1e-9 against the fixture's smallest
  query head mean square (0.13), nothing.
- **more heads, other grouping**: the fixture's key/value head g becomes head g; its query head h (group
  g = h // 2, j = h % 2) becomes query head g * G + j, where G is the padded model's query heads per key/value
  head (4 at 8B, 2 at 1.7B), so each reads its own key/value head. The other heads have zero q, k, v rows and
  zero o_proj columns: whatever they attend to, they add nothing.
- **MLP width and more layers**: the MLP is padded with zero rows of gate and up and zero columns of down
  (silu(0) * 0 = 0), and the fixture's layers sit at `positions` among no-op layers (copies whose o_proj and
  down_proj are zero, gguf2ov.tools.widen's rule, `noop_copy`). A no-op layer is the identity, so any layer
  between two real ones holds the state the earlier one wrote: the draft's taps read the padded target there.
  The positions are chosen so that `llama-quantize Q4_K_M` gives the real layers' attn_v and ffn_down the types
  the fixture's 4-layer file has (Q6_K on layers 2 and 3 only; its `use_more_bits` counts layers).
- **a vocabulary whose padded tokens never win**: a padded token's head row is -W (2^14) on the constant channel
  and zero elsewhere, the final norm's weight there 1: its logit is -W c / rms, -200 to -1400 at 8B over the
  fixture's corpus sample, where the real logits are in [-6, 15] (a zero row would give 0, which wins where every
  real logit is negative). The
  tokenizer is the fixture's with its vocabulary padded by tokens its merges never produce (`random_target`). A
  tied head (1.7B) reads the embedding, whose real rows hold c there: every real logit of a position moves by the
  same c * c / rms (under 0.01), which changes no softmax and no argmax.
- **the draft likewise**: its layers as the target's, 3 no-op layers after its 2, its fc reading the padded taps
  (`taps`; those that read no fixture tap have zero columns), plus one row copying the constant channel of the
  first tap, so that its hidden norm sees c^2 as the target's norms do. Its final norm as the target's: it reads
  the target's embedding and head, so it never proposes a padded token either.

The padding code lives here, not in gguf2ov.tools.widen: it is a benchmark's construction for one model type and
one fixture, where widening is a command (`gguf2ov widen-target`) for every model type it knows; it takes the
no-op layer's rule from there (`noop_copy`), so that stays in one place.

Checked (tests/tools/test_padded_pair.py, on `small`: hidden 512, 6 layers, 8/2 and 8/4 heads of 128, vocab
1024, untied and tied): transformers' forward of the padded target against the fixture's (logits on the real
vocabulary, the hidden states the draft reads), the greedy text in transformers and in gguf2ov's target built from
the padded checkpoint (OpenVINO, f32), the draft's outputs (the NumPy reference) on the inputs the padded target
gives it, and the pair in GenAI (the same text, the same tokens accepted).

At the real geometries (`ensure_pair`, cached in results/cache, `pair.json` beside the GGUFs): bf16/f16
checkpoints written, converted and quantized, checkpoints deleted; then in llama.cpp the padded target's greedy
text on the fixture prompts against the fixture target's (both Q4_K_M), and the pair's acceptance
(`llama-speculative-simple --spec-type draft-dflash`) against the fixture pair's.

    python -m benchmarks.padded_pair padded-8b [--no-checks]    # builds (or finds) the pair, prints pair.json

Measured on the 2-core AMD EPYC (Zen 4) shared with other work, load average 5-11:
- `padded-8b` (8.19 B parameters, Qwen3-8B's count; draft 1.05 B): built in 204 s, the target written in 21 s
  (16.4 GB of checkpoint, 1.7 GB of it on disk: `write_sparse_checkpoint`), converted in 49 s (F16, 16.4 GB),
  quantized in 85 s (Q4_K_M, 5.02 GB); the draft in 10 + 30 + 10 s (BF16 2.10 GB, Q4_K_M 621 MB). `padded-1.7b`
  (1.72 B; draft 0.27 B): 75 s, target F16 3.44 GB -> Q4_K_M 1.10 GB, draft BF16 548 MB -> Q4_K_M 164 MB.
- Q4_K_M blocks (`quantized_like_fixture`): the real layers get the types of the fixture's own Q4_K_M file (attn_v
  and ffn_down Q6_K on layers 2 and 3 only), and every real weight dequantizes to that file's values (times beta)
  except attn_output (its 256-wide super-blocks hold 4 real sub-blocks of 32 where the fixture's hold 8, so their
  scales differ: 0.010 at most) and token_embd (8B: Q4_K, where the fixture's tied table is Q6_K: 0.011; 1.7B:
  Q6_K times beta, whose float16 super-scales leave the subnormal range: 0.0045).
- llama.cpp, greedy (llama-simple, 64 new tokens on each fixture prompt, Q4_K_M against the fixture target's
  Q4_K_M): the same text on 4 of 5 prompts at 8B and at 1.7B; the fifth parts after 40 tokens at a near tie
  (which animal the next story is about at 8B, which name at 1.7B), through the two tensors above.
- llama.cpp, the pair (`llama-speculative-simple --spec-type draft-dflash`, K = 7, 100 tokens a prompt): 451 of
  601 drafted tokens accepted at 8B and at 1.7B; the fixture pair 454 of 583.
- The small geometries (the tests): in transformers, float64, the real logits within 1.7e-6 of the fixture's
  (which reach 15; the fixture's own float32 forward is 5.6e-6 from its float64 one), padded tokens' logits -79 to
  -101; in OpenVINO (gguf2ov target, f32) the same greedy text on the 5 prompts, logits within 4.8e-6; the pairs
  in GenAI the same text and 158 of 200 tokens accepted, as the fixture pair. The tests fail if the epsilon is
  left at the fixture's (1.1e-4) or ignores the constant channel (3.5e-4), if k_norm, the query heads' grouping,
  the RoPE placement, the draft's taps or the padded vocabulary's rows are wrong.
"""

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, REPO

FIXTURE = REPO / "fixtures" / "tiny-dflash"
BUILDER_VERSION = 2  # 2: beta on up_proj, not down_proj
PAD_LOGIT_WEIGHT = 2.0 ** 14  # a padded token's head row on the constant channel (negated); exact in f16 and bf16
CONSTANT_NORM_WEIGHT = 1.0  # the final norms' weight on the constant channel
NEW_TOKENS = 64  # llama-simple's greedy continuation of each fixture prompt
PAIR_K, PAIR_TOKENS = 7, 100  # llama-speculative-simple: proposals a step, new tokens a prompt
NOOP_KINDS = ("attention", "dense")  # widen.BRANCH_OUTPUTS' kinds of a Qwen3 layer
SHARD_BYTES = 4 << 30


@dataclass(frozen=True)
class PaddedGeometry:
    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    positions: tuple[int, ...]  # the padded layer each fixture layer becomes; the others are no-op layers
    taps: tuple[int, ...]  # the padded draft's target layer ids (HF: layer i's output)
    draft_layers: int = 5
    dtypes: tuple[str, str] = ("F16", "BF16")  # the 2-D weights of target and draft, as the fixture's (norms: F32)
    note: str = ""

    def key(self) -> str:
        blob = json.dumps({"v": BUILDER_VERSION, **asdict(self), "note": None}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


GEOMETRIES = {g.name: g for g in [
    # Qwen3-8B's geometry (untied head) and Qwen3-8B-DFlash-b16's draft (5 layers, 5 taps spread as its
    # [1, 9, 17, 25, 33]); Q4_K_M's Q6_K layers of 36 are 0-3, 6, 9, ..., 30, 31-35: the fixture's layers at
    # 4 and 13 (Q4_K) and 24 and 33 (Q6_K); its taps 1 and 2 read the outputs of 13 (ids 13-23) and 24 (24-32)
    PaddedGeometry("padded-8b", hidden=4096, layers=36, ffn=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                   tied=False, positions=(4, 13, 24, 33), taps=(1, 9, 17, 25, 33), note="Qwen3-8B"),
    # Qwen3-1.7B's (tied head), a draft of the 8B's kind at its width; Q6_K layers of 28: 0-2, 5, 8, ..., 23, 24-27:
    # the fixture's at 4 and 10 (Q4_K), 14 and 25 (Q6_K); its taps read the outputs of 10 (ids 10-13) and 14 (14-24)
    PaddedGeometry("padded-1.7b", hidden=2048, layers=28, ffn=6144, heads=16, kv_heads=8, head_dim=128, vocab=151936,
                   tied=True, positions=(4, 10, 14, 25), taps=(1, 7, 13, 19, 25), note="Qwen3-1.7B"),
    # what the tests run in seconds: the 8B's grouping of 4 query heads a key/value head (untied) and the 1.7B's
    # of 2 (tied), every kind of padding, in float32
    PaddedGeometry("small", hidden=512, layers=6, ffn=1024, heads=8, kv_heads=2, head_dim=128, vocab=1024,
                   tied=False, positions=(0, 2, 3, 5), taps=(0, 2, 4), draft_layers=3, dtypes=("F32", "F32")),
    PaddedGeometry("small-tied", hidden=512, layers=6, ffn=1024, heads=8, kv_heads=4, head_dim=128, vocab=1024,
                   tied=True, positions=(1, 2, 4, 5), taps=(1, 2, 4), draft_layers=3, dtypes=("F32", "F32")),
]}


# -- the fixture and the constants of a padding ------------------------------------------------------

@dataclass
class Fixture:
    target_config: dict
    draft_config: dict
    target: dict  # HF name -> float32 array
    draft: dict


def read_fixture(folder: Path = FIXTURE) -> Fixture:
    from gguf2ov.hf.checkpoint import Checkpoint

    def load(path):
        checkpoint = Checkpoint(path)
        return {name: checkpoint.load(name) for name in checkpoint.shapes}

    return Fixture(json.loads((folder / "target-hf" / "config.json").read_text()),
                   json.loads((folder / "draft-ref" / "config.json").read_text()),
                   load(folder / "target-hf"), load(folder / "draft-ref"))


@dataclass(frozen=True)
class Padding:
    """The numbers of one padding (the module's docstring says why each keeps the function)."""
    hidden: tuple[int, int]  # H, D
    head_dim: tuple[int, int]
    ffn: tuple[int, int]
    heads: tuple[int, int]
    kv_heads: tuple[int, int]
    eps: float  # the fixture's RMSNorm epsilon
    beta: float  # the residual stream's scale
    constant: float  # c, on `channel` of every real token's embedding
    eps_padded: float  # eps'
    channel: int
    tied: bool

    @property
    def hidden_norm_scale(self) -> float:
        return math.sqrt(self.hidden[0] / self.hidden[1])

    @property
    def key_norm_scale(self) -> float:
        return math.sqrt(self.head_dim[0] / self.head_dim[1])

    @property
    def final_norm_scale(self) -> float:
        """A tied head reads the embedding, which carries beta: the final norms divide it out."""
        return self.hidden_norm_scale / (self.beta if self.tied else 1.0)

    def rope_dims(self) -> np.ndarray:
        """Where each dim of a fixture query or key head goes in a padded head (rotary pair j -> pair m j)."""
        d, d2 = self.head_dim
        j = np.arange(d // 2)
        return np.concatenate([(d2 // d) * j, d2 // 2 + (d2 // d) * j])

    def query_heads(self) -> np.ndarray:
        """The padded query head of each fixture query head: the same place in its key/value head's group."""
        (h, h2), (kv, kv2) = self.heads, self.kv_heads
        h_ = np.arange(h)
        return (h_ // (h // kv)) * (h2 // kv2) + h_ % (h // kv)

    def record(self) -> dict:
        d = asdict(self)
        d["head_norm_eps"] = self.eps_padded * self.head_dim[1] / self.head_dim[0]  # the head norms' effective eps
        return d


def padding_of(config: dict, geom: PaddedGeometry) -> Padding:
    from gguf2ov.errors import Gguf2ovError

    h, d = config["hidden_size"], geom.hidden
    dh, dh2 = config["head_dim"], geom.head_dim
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    bad = []
    if d <= h or geom.ffn < config["intermediate_size"] or geom.vocab < config["vocab_size"]:
        bad.append("the hidden size must grow, the MLP and the vocabulary not shrink")
    if dh2 % dh or dh2 < dh:
        bad.append(f"head_dim {dh2} is not a multiple of the fixture's {dh} (RoPE's pairs must map)")
    if geom.heads % geom.kv_heads or geom.kv_heads < kv or geom.heads // geom.kv_heads < heads // kv:
        bad.append(f"{geom.heads}/{geom.kv_heads} heads cannot hold {heads}/{kv} in their groups")
    if sorted(set(geom.positions)) != list(geom.positions) or len(geom.positions) != config["num_hidden_layers"] \
            or geom.positions[-1] >= geom.layers:
        bad.append(f"positions {geom.positions}: one increasing padded layer per fixture layer, below {geom.layers}")
    if bad:
        raise Gguf2ovError(f"geometry {geom.name}: " + "; ".join(bad))
    eps, ratio = float(config["rms_norm_eps"]), dh / dh2
    beta = 1.0
    while h * beta ** 2 < 2 * d * ratio:  # c^2 = eps (H beta^2 - D ratio) > 0, not tiny
        beta *= 2
    constant = float(np.float16(math.sqrt(eps * (h * beta ** 2 - d * ratio))))
    eps_padded = (h * beta ** 2 * eps - constant ** 2) / d
    return Padding((h, d), (dh, dh2), (config["intermediate_size"], geom.ffn), (heads, geom.heads),
                   (kv, geom.kv_heads), eps, beta, constant, eps_padded, h, geom.tied)


def draft_taps(fixture_taps: list[int], geom: PaddedGeometry, n_fixture_layers: int) -> dict[int, int]:
    """{index of a fixture tap: index of the padded tap reading the same state}: fixture layer t's output is held
    by padded layers positions[t] .. positions[t + 1] - 1 (no-op layers between)."""
    from gguf2ov.errors import Gguf2ovError

    ends = list(geom.positions[1:]) + [geom.layers - 1]
    found = {}
    for k, t in enumerate(fixture_taps):
        if t >= n_fixture_layers - 1:
            raise Gguf2ovError(f"fixture tap {t} is not a decoder layer's output")
        held = range(geom.positions[t], ends[t])
        match = [i for i, p in enumerate(geom.taps) if p in held and i not in found.values()]
        if not match:
            raise Gguf2ovError(f"geometry {geom.name}: no tap of {geom.taps} reads fixture layer {t}'s output "
                               f"(padded layers {held.start}-{held.stop - 1})")
        found[k] = match[0]
    if any(p >= geom.layers - 1 for p in geom.taps):
        raise Gguf2ovError(f"geometry {geom.name}: taps {geom.taps} must be decoder layers' outputs "
                           f"(< {geom.layers - 1})")
    return found


# -- the padded tensors ----------------------------------------------------------------------------

def _place(shape, values: np.ndarray, rows, cols, dtype) -> np.ndarray:
    out = np.zeros(shape, dtype=dtype)
    out[np.ix_(np.arange(shape[0])[rows], np.arange(shape[1])[cols])] = values
    return out


def _norm(weight: np.ndarray, size: int, scale: float, where=None) -> np.ndarray:
    """A norm's weights on the padded width: the trained ones times `scale` (at `where`, or first), 0 elsewhere."""
    out = np.zeros(size, dtype=np.float32)
    out[slice(0, len(weight)) if where is None else where] = weight.astype(np.float64) * scale  # one rounding
    return out


def padded_layer(w: dict, pad: Padding, dtype) -> dict:
    """A trained decoder layer (names inside the layer -> float32) on the padded geometry: name -> (shape, make)."""
    (h, d), (dh, dh2), (f, f2) = pad.hidden, pad.head_dim, pad.ffn
    heads2, kv2 = pad.heads[1], pad.kv_heads[1]
    rope, qh, kv = pad.rope_dims(), pad.query_heads(), np.arange(pad.kv_heads[0])
    q_rows = (qh[:, None] * dh2 + rope).ravel()
    k_rows = (kv[:, None] * dh2 + rope).ravel()
    v_rows = (kv[:, None] * dh2 + np.arange(dh)).ravel()
    o_cols = (qh[:, None] * dh2 + np.arange(dh)).ravel()
    real, beta, a = slice(0, h), np.float32(pad.beta), "self_attn."

    def norm(name, size, scale, where=None):
        return (size,), lambda: _norm(w[name], size, scale, where)

    def place(name, shape, rows, cols, scale=None):
        return shape, lambda: _place(shape, w[name] if scale is None else w[name] * scale, rows, cols, dtype)

    return {
        "input_layernorm.weight": norm("input_layernorm.weight", d, pad.hidden_norm_scale),
        "post_attention_layernorm.weight": norm("post_attention_layernorm.weight", d, pad.hidden_norm_scale),
        a + "q_norm.weight": norm(a + "q_norm.weight", dh2, 1.0, rope),
        a + "k_norm.weight": norm(a + "k_norm.weight", dh2, pad.key_norm_scale, rope),
        a + "q_proj.weight": place(a + "q_proj.weight", (heads2 * dh2, d), q_rows, real),
        a + "k_proj.weight": place(a + "k_proj.weight", (kv2 * dh2, d), k_rows, real),
        a + "v_proj.weight": place(a + "v_proj.weight", (kv2 * dh2, d), v_rows, real),
        a + "o_proj.weight": place(a + "o_proj.weight", (d, heads2 * dh2), real, o_cols, beta),
        "mlp.gate_proj.weight": place("mlp.gate_proj.weight", (f2, d), slice(0, f), real),
        "mlp.up_proj.weight": place("mlp.up_proj.weight", (f2, d), slice(0, f), real, beta),
        "mlp.down_proj.weight": place("mlp.down_proj.weight", (d, f2), real, slice(0, f)),
    }


def _layers(state: dict, prefix: str, n: int) -> list[dict]:
    return [{k[len(f"{prefix}{i}."):]: v for k, v in state.items() if k.startswith(f"{prefix}{i}.")} for i in range(n)]


def _layer_plan(prefix: str, sources: list[int], real: list[dict], pad: Padding, dtype) -> list:
    """(name, shape, make) of every layer: sources[i] is the fixture layer padded layer i is, or (-1 - j) a no-op
    copy of fixture layer j."""
    from gguf2ov.tools.widen import noop_copy

    plan = []
    for i, src in enumerate(sources):
        j, noop = (src, False) if src >= 0 else (-1 - src, True)
        for rest, (shape, make) in padded_layer(real[j], pad, dtype).items():
            if noop:
                make = (lambda rest=rest, make=make: noop_copy(rest, make(), NOOP_KINDS, 0.0))
            plan.append((f"{prefix}{i}.{rest}", shape, make))
    return plan


def target_sources(geom: PaddedGeometry) -> list[int]:
    """The fixture layer at each padded layer (no-op layers: -1 - the real layer copied, the one before them)."""
    sources, last = [], 0
    for i in range(geom.layers):
        if i in geom.positions:
            last = geom.positions.index(i)
            sources.append(last)
        else:
            sources.append(-1 - last)
    return sources


def target_plan(fx: Fixture, geom: PaddedGeometry, pad: Padding) -> list:
    (h, d), v, v2 = pad.hidden, fx.target_config["vocab_size"], geom.vocab
    dtype = _np_dtype(geom.dtypes[0])
    embed = fx.target["model.embed_tokens.weight"]

    def embedding():
        out = np.zeros((v2, d), dtype=dtype)
        out[:v, :h] = embed * np.float32(pad.beta)
        out[:v, pad.channel] = pad.constant
        if pad.tied:
            out[v:, pad.channel] = -PAD_LOGIT_WEIGHT
        return out

    def head():
        out = np.zeros((v2, d), dtype=dtype)
        out[:v, :h] = fx.target.get("lm_head.weight", embed)
        out[v:, pad.channel] = -PAD_LOGIT_WEIGHT
        return out

    def final_norm():
        out = _norm(fx.target["model.norm.weight"], d, pad.final_norm_scale)
        out[pad.channel] = CONSTANT_NORM_WEIGHT
        return out

    real = _layers(fx.target, "model.layers.", fx.target_config["num_hidden_layers"])
    plan = [("model.embed_tokens.weight", (v2, d), embedding)]
    plan += _layer_plan("model.layers.", target_sources(geom), real, pad, dtype)
    plan.append(("model.norm.weight", (d,), final_norm))
    if not pad.tied:
        plan.append(("lm_head.weight", (v2, d), head))
    return plan


def draft_plan(fx: Fixture, geom: PaddedGeometry, pad: Padding) -> list:
    (h, d) = pad.hidden
    dtype = _np_dtype(geom.dtypes[1])
    fixture_taps = fx.draft_config["dflash_config"]["target_layer_ids"]
    taps = draft_taps(fixture_taps, geom, fx.target_config["num_hidden_layers"])
    n = len(geom.taps)

    def fc():
        out = np.zeros((d, n * d), dtype=dtype)
        for k, k2 in taps.items():
            out[:h, k2 * d:k2 * d + h] = fx.draft["fc.weight"][:, k * h:(k + 1) * h]
        out[pad.channel, pad.channel] = 1  # the first tap's constant channel: the hidden norm sees c^2 too
        return out

    def final_norm():
        out = _norm(fx.draft["norm.weight"], d, pad.final_norm_scale)
        out[pad.channel] = CONSTANT_NORM_WEIGHT
        return out

    n_real = fx.draft_config["num_hidden_layers"]
    real = _layers(fx.draft, "layers.", n_real)
    sources = [i if i < n_real else -1 - (i % n_real) for i in range(geom.draft_layers)]
    plan = [("fc.weight", (d, n * d), fc),
            ("hidden_norm.weight", (d,), lambda: _norm(fx.draft["hidden_norm.weight"], d, pad.hidden_norm_scale))]
    plan += _layer_plan("layers.", sources, real, pad, dtype)
    plan.append(("norm.weight", (d,), final_norm))
    return plan


def _np_dtype(name: str):
    return {"F16": np.float16, "BF16": np.float32, "F32": np.float32}[name]  # bf16 is encoded from float32


def target_config(fx: Fixture, geom: PaddedGeometry, pad: Padding) -> dict:
    config = dict(fx.target_config)
    config.update(hidden_size=geom.hidden, intermediate_size=geom.ffn, num_hidden_layers=geom.layers,
                  num_attention_heads=geom.heads, num_key_value_heads=geom.kv_heads, head_dim=geom.head_dim,
                  vocab_size=geom.vocab, tie_word_embeddings=geom.tied, rms_norm_eps=pad.eps_padded,
                  layer_types=["full_attention"] * geom.layers, dtype=_config_dtype(geom.dtypes[0]))
    return config


def draft_config(fx: Fixture, geom: PaddedGeometry, pad: Padding) -> dict:
    config = dict(fx.draft_config)
    config.update(hidden_size=geom.hidden, intermediate_size=geom.ffn, num_hidden_layers=geom.draft_layers,
                  num_attention_heads=geom.heads, num_key_value_heads=geom.kv_heads, head_dim=geom.head_dim,
                  vocab_size=geom.vocab, rms_norm_eps=pad.eps_padded, num_target_layers=geom.layers,
                  dtype=_config_dtype(geom.dtypes[1]))
    config["dflash_config"] = dict(config["dflash_config"], target_layer_ids=list(geom.taps))
    return config


def _config_dtype(name: str) -> str:
    return {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}[name]


def write_padded_pair(geom: PaddedGeometry, out: Path, fixture: Path = FIXTURE, which=("target", "draft")) -> dict:
    """The padded target (`out/target-hf`, with the padded tokenizer) and draft (`out/draft-hf`) checkpoints,
    one tensor in memory at a time; returns the padding's numbers and the seconds each took."""
    from benchmarks.random_target import write_tokenizer

    fx = read_fixture(fixture)
    pad = padding_of(fx.target_config, geom)
    record = {"padding": pad.record(), "seconds": {}}
    jobs = {"target": (target_plan, target_config, geom.dtypes[0]), "draft": (draft_plan, draft_config, geom.dtypes[1])}
    for name in which:
        plan_of, config_of, dtype = jobs[name]
        start = time.perf_counter()
        folder = out / f"{name}-hf"
        write_sparse_checkpoint(folder, config_of(fx, geom, pad), plan_of(fx, geom, pad), dtype)
        if name == "target":
            write_tokenizer(folder, geom.vocab)
        record["seconds"][f"write {name}"] = round(time.perf_counter() - start, 1)
    return record


def write_sparse_checkpoint(folder: Path, config: dict, plan: list, dtype: str, page: int = 4096) -> None:
    """A checkpoint of the plan's tensors (norms F32, the others `dtype`) whose all-zero pages are holes: the padded
    8B target's 16.4 GB take 1.7 GB of disk, so that llama.cpp's converter can write its F16 copy beside it on a
    shared disk. Files, shards and headers as gguf2ov.hf.write writes them."""
    from gguf2ov.hf.write import TensorSpec, encode, safetensors_header, shard_specs
    from gguf2ov.names import CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX

    specs = [TensorSpec(n, tuple(shape), "F32" if len(shape) == 1 else dtype) for n, shape, _ in plan]
    makes = {n: make for n, _, make in plan}
    shards = shard_specs(specs, SHARD_BYTES)
    files = [SAFETENSORS_FILE] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for file_name, shard in zip(files, shards):
        with open(folder / file_name, "wb") as f:
            f.write(safetensors_header(shard))
            for spec in shard:
                raw = np.frombuffer(memoryview(encode(makes[spec.name](), spec.dtype)).cast("B"), np.uint8)
                pages = np.append(raw, np.zeros(-len(raw) % page, np.uint8)).view(np.uint64).reshape(-1, page // 8)
                edges = np.flatnonzero(np.diff(np.concatenate([[0], pages.any(axis=1), [0]]).astype(np.int8)))
                base = f.tell()
                for first, stop in edges.reshape(-1, 2):  # each run of pages holding a value, the rest skipped
                    f.seek(base + first * page)
                    f.write(raw[first * page:stop * page])
                f.seek(base + len(raw))
            f.truncate(f.tell())  # a hole at the end still counts in the size
    if len(shards) > 1:
        weight_map = {s.name: file_name for file_name, shard in zip(files, shards) for s in shard}
        index = {"metadata": {"total_size": sum(s.n_bytes for s in specs)}, "weight_map": weight_map}
        (folder / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


# -- the GGUFs and their checks in llama.cpp ---------------------------------------------------------

def pair_folder(geom: PaddedGeometry, cache: Path = CACHE) -> Path:
    return cache / f"{geom.name}-{geom.key()}"


def ensure_pair(geom: PaddedGeometry, cache: Path = CACHE, checks: bool = True) -> dict:
    """The padded pair as llama.cpp's converter and `llama-quantize Q4_K_M` write it, built once:
    {"target": GGUF, "draft": GGUF, ...the record in pair.json}. Disk at 8B: 16.4 GB of checkpoint and as much
    F16 GGUF at the peak; each intermediate file is deleted once the next is written."""
    from benchmarks.common import machine_info
    from benchmarks.llamacpp.tools import convert, quantize

    folder = pair_folder(geom, cache)
    record_file = folder / "pair.json"
    # named by the geometry: bench_side_by_side caches what it builds from a GGUF under the file's stem
    target, draft = (folder / f"{geom.name}-{name}-Q4_K_M.gguf" for name in ("target", "draft"))
    if record_file.is_file():
        record = json.loads(record_file.read_text())
    else:
        folder.mkdir(parents=True, exist_ok=True)
        record = {"geometry": asdict(geom), "machine": machine_info(), "files": {}}
        hf = folder / "hf"
        # the target first, converted and its checkpoint deleted before the draft is written: one 8B copy at a time
        record |= write_padded_pair(geom, hf, which=("target",))
        start = time.perf_counter()
        target16 = convert(hf / "target-hf", folder / f"target-{geom.dtypes[0]}.gguf", geom.dtypes[0].lower())
        record["seconds"]["convert target"] = round(time.perf_counter() - start, 1)
        for f in (hf / "target-hf").glob("*.safetensors"):
            f.unlink()
        drafted = write_padded_pair(geom, hf, which=("draft",))
        record["seconds"] |= drafted["seconds"]
        start = time.perf_counter()
        draft16 = convert(hf / "draft-hf", folder / f"draft-{geom.dtypes[1]}.gguf", geom.dtypes[1].lower(),
                          "--target-model-dir", str(hf / "target-hf"))
        record["seconds"]["convert draft"] = round(time.perf_counter() - start, 1)
        shutil.rmtree(hf)
        for name, source, quantized in (("target", target16, target), ("draft", draft16, draft)):
            start = time.perf_counter()
            record["files"][source.name] = source.stat().st_size
            quantize(source, quantized, "Q4_K_M")
            source.unlink()
            record["files"][quantized.name] = quantized.stat().st_size
            record["seconds"][f"quantize {name}"] = round(time.perf_counter() - start, 1)
        record["types"] = real_layer_types(target, geom)
        record_file.write_text(json.dumps(record, indent=1) + "\n")
    if "blocks" not in record:
        record["blocks"] = quantized_like_fixture(target, geom)
        record_file.write_text(json.dumps(record, indent=1) + "\n")
    if checks and "checks" not in record:
        record["checks"] = llama_checks(target, draft)
        record_file.write_text(json.dumps(record, indent=1) + "\n")
    return {"target": target, "draft": draft, **record}


def fixture_target_gguf(cache: Path = CACHE) -> Path:
    """The fixture target as llama.cpp's converter and `llama-quantize Q4_K_M` write it (cached)."""
    from benchmarks.llamacpp.tools import convert, quantize

    out = cache / "tiny-dflash-target-Q4_K_M.gguf"
    if not out.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        f16 = convert(FIXTURE / "target-hf", cache / "tiny-dflash-target-F16.gguf", "f16")
        quantize(f16, out, "Q4_K_M")
        f16.unlink()
    return out


def real_layer_types(gguf_path: Path, geom: PaddedGeometry) -> dict:
    """The GGML types of the real layers' tensors in the padded file beside the fixture's own Q4_K_M file."""
    from gguf import GGUFReader

    def types(path, layers):
        found = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
        return [{k.split(".")[2]: v for k, v in found.items() if k.startswith(f"blk.{i}.") and v != "F32"}
                for i in layers]

    padded = types(gguf_path, geom.positions)
    fixture = types(fixture_target_gguf(), range(len(geom.positions)))
    return {"same as the fixture's": padded == fixture, "padded": padded, "fixture": fixture}


def quantized_like_fixture(gguf_path: Path, geom: PaddedGeometry) -> dict[str, float]:
    """Per kind of weight, the largest difference between the padded file's real values (divided by beta where
    they carry it) and the fixture file's: 0 where llama-quantize wrote the same blocks."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    fx = read_fixture()
    pad = padding_of(fx.target_config, geom)
    padded = {t.name: t for t in GGUFReader(str(gguf_path)).tensors}
    fixture = {t.name: t for t in GGUFReader(str(fixture_target_gguf())).tensors}
    (h, _), (dh, dh2), (f, _) = pad.hidden, pad.head_dim, pad.ffn
    qh, kv, rope = pad.query_heads(), np.arange(pad.kv_heads[0]), pad.rope_dims()
    v = fx.target_config["vocab_size"]
    # GGUF name -> (rows, columns of the real part, scale): rows picked before dequantizing, a few MB each
    layer = {"attn_q": ((qh[:, None] * dh2 + rope).ravel(), slice(0, h), 1.0),
             "attn_k": ((kv[:, None] * dh2 + rope).ravel(), slice(0, h), 1.0),
             "attn_v": ((kv[:, None] * dh2 + np.arange(dh)).ravel(), slice(0, h), 1.0),
             "attn_output": (np.arange(h), (qh[:, None] * dh2 + np.arange(dh)).ravel(), pad.beta),
             "ffn_gate": (np.arange(f), slice(0, h), 1.0), "ffn_up": (np.arange(f), slice(0, h), pad.beta),
             "ffn_down": (np.arange(h), slice(0, f), 1.0)}
    pairs = [(f"blk.{p}.{k}.weight", f"blk.{i}.{k}.weight", *layer[k]) for i, p in enumerate(geom.positions)
             for k in layer]
    pairs.append(("token_embd.weight", "token_embd.weight", np.arange(v), slice(0, h), pad.beta))
    if not geom.tied:  # the fixture's tied table is its head
        pairs.append(("output.weight", "token_embd.weight", np.arange(v), slice(0, h), 1.0))
    found: dict[str, float] = {}
    for name, fixture_name, rows, cols, scale in pairs:
        t, ft = padded[name], fixture[fixture_name]
        values = dequantize(np.asarray(t.data[rows]), t.tensor_type)[:, cols] / np.float32(scale)
        reference = dequantize(np.asarray(ft.data), ft.tensor_type)
        kind = name.split(".")[-2]
        diff = float(np.abs(values - reference).max())
        found[f"{kind} ({t.tensor_type.name})"] = max(found.get(f"{kind} ({t.tensor_type.name})", 0.0), diff)
    return found


def prompts() -> list[str]:
    return [line for line in (FIXTURE / "prompts.txt").read_text().splitlines() if line.strip()]


def llama_simple(gguf_path: Path, prompt: str, tokens: int = NEW_TOKENS) -> str:
    """llama-simple's greedy continuation of `prompt` (it echoes the prompt, then the new tokens)."""
    from benchmarks.llamacpp.tools import tool

    out = subprocess.run([str(tool("llama-simple")), "-m", str(gguf_path), "-n", str(tokens), prompt],
                         capture_output=True, check=True).stdout.decode("utf-8", "replace")
    i = out.find(prompt)
    return out[i + len(prompt):] if i >= 0 else out


def llama_checks(target: Path, draft: Path) -> dict:
    """In llama.cpp: the padded target's greedy text on the fixture prompts against the fixture target's (both
    Q4_K_M), and the pair's acceptance against the fixture pair's (K = 7, 100 tokens a prompt)."""
    from benchmarks.bench_side_by_side import llama_pair

    fixture = fixture_target_gguf()
    start = time.perf_counter()
    texts = [{"prompt": p, "fixture": llama_simple(fixture, p), "padded": llama_simple(target, p)} for p in prompts()]
    pair = {name: llama_pair(t, d, prompts(), PAIR_K, PAIR_TOKENS)
            for name, t, d in (("fixture", fixture, FIXTURE / "draft-Q4_K_M.gguf"), ("padded", target, draft))}
    for run in pair.values():
        run.pop("peak_rss_kib", None)
    return {"greedy identical": sum(t["fixture"] == t["padded"] for t in texts), "prompts": len(texts),
            "texts": texts, "pair": pair, "seconds": round(time.perf_counter() - start, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("geometry", choices=[g for g in GEOMETRIES if g.startswith("padded")])
    p.add_argument("--no-checks", action="store_true", help="build only, without llama.cpp's greedy and pair runs")
    args = p.parse_args(argv)
    record = ensure_pair(GEOMETRIES[args.geometry], checks=not args.no_checks)
    print(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in record.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

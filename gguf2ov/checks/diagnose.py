"""What a converted tensor or config key that disagrees with its reference got wrong, in words.

`check` measures each tensor against its reference with `stats` (Pearson, cosine, relative error,
max |difference|, in float64 chunks). A tensor that fails is tried here against the mistakes a
GGUF converter makes: the reference's transpose, llama.cpp's q/k row permutation (both
directions), another reference tensor of the same shape (a swap), a scale or offset (a norm
stored as w + 1), a name the map gets wrong. The config is compared key by key over the keys the
maps list under `compare`, and a shift of the flagged target layer ids is named as such.
"""

import dataclasses
import json
import math
import re
from dataclasses import dataclass

import numpy as np

from ..hf.checkpoint import Checkpoint
from ..maps.load import compared_keys
from ..maps.rules import apply_ops, config_get

# A converted tensor of any usable quant type correlates far above this with its reference; an
# unrelated one sits near 0. Used to recognise what a failing tensor does match (its transpose,
# a permutation, another tensor), so it is a fixed recognition level, not the pass threshold.
MATCH = 0.9
# Elements per float64 chunk: 8 MiB of float64 per operand.
CHUNK = 1 << 20
# Share of the compared matrices that must match nothing before the whole reference is called
# another model (a few broken tensors are reported one by one instead).
OTHER_MODEL_SHARE = 0.8


# --- result rows ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorFinding:
    name: str                         # HF name
    shape: list[int]                  # ours (the reference's for a missing tensor)
    ref_shape: list[int] | None
    qtype: str                        # GGUF quant type it came from, "-" when unknown
    gguf_name: str | None
    pearson: float | None             # None: undefined (a constant tensor) or not compared
    cosine: float | None
    rel_err: float | None             # ||ours - ref|| / ||ref||
    max_abs: float | None
    status: str                       # pass | fail | missing | extra | shape_mismatch | non_finite
    diagnosis: str | None             # short code, None when the tensor passes
    detail: str = ""                  # the diagnosis in words


@dataclass(frozen=True)
class ConfigFinding:
    key: str
    ours: object
    reference: object
    agrees: bool
    diagnosis: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Diagnosis:
    code: str
    subject: str                      # a tensor name, a config key, or "model"
    message: str


def short_value(value):
    text = json.dumps(value) if isinstance(value, (list, dict)) else value
    return text if not isinstance(text, str) or len(text) <= 60 else text[:57] + "..."


# --- statistics ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stats:
    pearson: float | None
    cosine: float | None
    rel_err: float | None
    max_abs: float | None
    slope: float | None               # least-squares fit ours ~ slope * ref + offset
    offset: float | None
    finite: bool                      # ours has no NaN or Inf
    ref_finite: bool


def _chunks(a: np.ndarray):
    flat = a.reshape(-1)
    for i in range(0, flat.size, CHUNK):
        yield flat[i:i + CHUNK].astype(np.float64)


def stats(ours: np.ndarray, ref: np.ndarray) -> Stats:
    """One pass over both arrays in float64 chunks, on data shifted by the first chunk's means.

    The shift keeps the correlation of a norm weight (values near 1 with a tiny spread) exact,
    where plain sums of squares would cancel; cosine's raw sums are recovered from the shifted ones.
    """
    n = ours.size
    if n == 0 or ours.size != ref.size:
        return Stats(None, None, None, None, None, None, True, True)
    ka = kb = None
    sa = sb = saa = sbb = sab = dd = max_abs = 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # NaN or Inf in either array: told apart below
        for a, b in zip(_chunks(ours), _chunks(ref)):
            if ka is None:
                ka, kb = a.mean(), b.mean()
            d = a - b
            dd += _dot(d, d)
            max_abs = max(max_abs, float(np.abs(d).max()))
            a -= ka
            b -= kb
            sa += a.sum()
            sb += b.sum()
            saa += _dot(a, a)
            sbb += _dot(b, b)
            sab += _dot(a, b)
    finite, ref_finite = math.isfinite(saa) and math.isfinite(ka), math.isfinite(sbb) and math.isfinite(kb)
    if not (finite and ref_finite):
        # Inf - Inf is NaN in either sum: look at the arrays themselves to say which side is broken.
        return Stats(None, None, None, None, None, None, bool(np.isfinite(ours).all()), bool(np.isfinite(ref).all()))
    caa, cbb, cab = saa - sa * sa / n, sbb - sb * sb / n, sab - sa * sb / n   # centred: mean-free
    aa = saa + 2 * ka * sa + n * ka * ka                                        # raw: sum of a^2
    bb = sbb + 2 * kb * sb + n * kb * kb
    ab = sab + ka * sb + kb * sa + n * ka * kb
    ma, mb = ka + sa / n, kb + sb / n
    pearson = cab / math.sqrt(caa * cbb) if caa > 0 and cbb > 0 else None
    cosine = ab / math.sqrt(aa * bb) if aa > 0 and bb > 0 else (1.0 if aa == bb == 0 else None)
    rel_err = math.sqrt(dd / bb) if bb > 0 else (0.0 if dd == 0 else math.inf)
    slope = cab / cbb if cbb > 0 else None
    offset = ma - slope * mb if slope is not None else ma - mb
    return Stats(pearson, cosine, rel_err, max_abs, slope, offset, True, True)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # einsum, not BLAS: OpenBLAS threads fight over busy cores and ran 3x slower on vectors here.
    return float(np.einsum("i,i->", a, b))


def score(pearson, cosine):
    # Pearson is undefined for a constant tensor (an untrained norm of ones): cosine then decides.
    return pearson if pearson is not None else cosine


def max_rel_err(min_corr: float) -> float:
    # Quantization noise uncorrelated with the weights gives rel_err ~ sqrt(1 - r^2) at correlation
    # r; twice that leaves room for the noise a K-quant grid adds, while a scale or offset error
    # (which Pearson cannot see) lands far above it.
    return 2.0 * math.sqrt(max(0.0, 1.0 - min_corr * min_corr))


def corr(a: np.ndarray, b: np.ndarray) -> float:
    s = stats(a, b)
    return score(s.pearson, s.cosine) or 0.0


# --- diagnosis ----------------------------------------------------------------------------------

_LAYER = re.compile(r"\.(\d+)\.")


def _layer_role(name: str):
    m = _LAYER.search(name)
    return (m.group(1), name[:m.start()] + ".{N}." + name[m.end():]) if m else (None, name)


def _swap_candidates(name: str, shape, ref: Checkpoint) -> list[str]:
    """Reference tensors of the same shape a converter could have mixed up with `name`: the same
    layer first (gate/up, q/k), then the same role in other layers."""
    layer, role = _layer_role(name)
    same = [n for n, s in ref.shapes.items() if s == tuple(shape) and n != name]
    same_layer = [n for n in same if _layer_role(n)[0] == layer]
    same_role = [n for n in same if n not in same_layer and _layer_role(n)[1] == role]
    return same_layer + same_role


def _qk_order(w: np.ndarray, n_head: int, reverse: bool) -> np.ndarray:
    """The map's `unpermute_qk` op (reverse: llama.cpp's `LlamaModel.permute`) with `n_head` heads."""
    return apply_ops((("unpermute_qk", {"heads": "n_head"}),), w, {"n_head": n_head}, reverse=reverse)


def _head_counts(name: str, config: dict | None) -> list[int]:
    """Head counts to try for a q/k tensor (its own first: K uses the kv heads), none otherwise."""
    if not config or not re.search(r"(q_proj|k_proj|attn_q|attn_k)\.weight$", name):
        return []
    q, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    first = kv if re.search(r"(k_proj|attn_k)\.weight$", name) else q
    return [h for h in dict.fromkeys([first, q, kv]) if isinstance(h, int) and h > 0]


def diagnose_tensor(name, ours, ref_arr, s: Stats, ref: Checkpoint, config, min_corr, search_swaps):
    """(status, code, sentence) for a tensor that did not pass the plain comparison."""
    if not s.finite:
        return "non_finite", "non_finite", (f"{name} holds NaN or Inf values: the GGUF tensor or its dequantization "
                                            f"is broken")
    if not s.ref_finite:
        return "non_finite", "non_finite", f"the reference's {name} holds NaN or Inf values: the reference is broken"
    status = "fail" if ours.shape == ref_arr.shape else "shape_mismatch"
    found = (_transposed(name, ours, ref_arr) or _scaled(name, s, min_corr) or _permuted(name, ours, ref_arr, config)
             or (search_swaps and _swapped(name, ours, ref, score(s.pearson, s.cosine))))
    if found:
        return (status, *found)
    own = score(s.pearson, s.cosine)
    if status == "fail" and own is not None and own >= MATCH:
        # It is its own reference tensor, only noisier than --min-corr allows: quantization, not a mix-up.
        return "fail", "below_threshold", (f"{name} correlates {own:.4f} with its reference, below --min-corr "
                                           f"{min_corr}: quantization noise of its GGUF type, not a mapping error")
    if status == "shape_mismatch":
        return status, "shape_mismatch", (f"{name} has shape {list(ours.shape)} but the reference has "
                                          f"{list(ref_arr.shape)}, and matches no reference tensor of its shape: "
                                          f"the GGUF and the reference differ in geometry")
    searched = "or another tensor of its shape" if search_swaps else "(other tensors were not searched)"
    return "fail", "no_match", (f"{name} matches nothing (pearson {_fmt(s.pearson)}): not its reference tensor, "
                                f"its transpose, a q/k permutation {searched}")


def _transposed(name, ours, ref_arr):
    # Square tensors too: a transposed square matrix keeps its shape and only correlation shows it.
    if ours.ndim == 2 and ours.shape[::-1] == ref_arr.shape and corr(ours.T, ref_arr) >= MATCH:
        return "transposed", (f"{name} matches the reference's transpose: the converter read it in the wrong "
                              f"orientation (GGUF ne[0] is the contiguous axis: reshape to the reversed ne, never "
                              f"transpose)")
    return None


def _scaled(name, s: Stats, min_corr):
    own = score(s.pearson, s.cosine)
    if own is not None and own >= min_corr and s.rel_err is not None and s.rel_err > max_rel_err(min_corr):
        return "scale_offset", (f"{name} correlates ({own:.4f}) but its values are off: ours ~ {s.slope:.3f} * "
                                f"reference + {s.offset:.3f} (rel_err {s.rel_err:.3f}); a norm stored as w + 1 that "
                                f"was not undone shows slope 1 and offset 1")
    return None


def _permuted(name, ours, ref_arr, config):
    if ours.shape != ref_arr.shape or ours.ndim != 2:
        return None
    for n_head in _head_counts(name, config):
        if ours.shape[0] % (2 * n_head):
            continue
        if corr(_qk_order(ours, n_head, reverse=False), ref_arr) >= MATCH:
            return "qk_permuted", (f"{name} has its rows in llama.cpp's permuted q/k order ({n_head} heads): the "
                                   f"map should un-permute them (op unpermute_qk)")
        if corr(_qk_order(ours, n_head, reverse=True), ref_arr) >= MATCH:
            return "qk_permuted", (f"{name} matches after permuting its rows the llama.cpp way ({n_head} heads): it "
                                   f"was un-permuted although llama.cpp never permuted it; drop the unpermute_qk op")
    return None


def _swapped(name, ours, ref: Checkpoint, own_score):
    best, best_name = max(own_score or 0.0, MATCH), None
    for other in _swap_candidates(name, ours.shape, ref):
        c = corr(ours, ref.load(other))
        if c >= best:
            best, best_name = c, other
    if best_name:
        return "swapped", (f"{name} matches the reference's {best_name} (pearson {best:.4f}) instead of its own: "
                           f"the converter swapped the two")
    return None


def _fmt(v):
    return "n/a" if v is None else f"{v:.4f}"


# --- config -------------------------------------------------------------------------------------

def _config_value(config: dict, entry: dict):
    for path in entry["places"]:
        if (node := config_get(config, path)) is not None:
            return node
    if entry["places"][0] == "head_dim" and config.get("hidden_size") and config.get("num_attention_heads"):
        return config["hidden_size"] // config["num_attention_heads"]  # transformers' default
    return entry["default"]  # published configs leave a key out when it takes the map's default


def compare_config(ours: dict | None, ref: dict | None, target_layer_offset: int | None = None,
                   from_gguf: bool = True, amap=None) -> list[ConfigFinding]:
    """Key by key, over the keys the maps list under `compare` (and `amap`'s, a map given by --map);
    `target_layer_offset` is what was added to the GGUF's flagged target layers."""
    if ours is None or ref is None:
        return []
    checks = []
    for hf_key, entry in compared_keys(amap).items():
        key = hf_key.rsplit(".", 1)[-1]  # as the report names it: target_layer_ids, block_size
        a, b = _config_value(ours, entry), _config_value(ref, entry)
        if a is None and b is None:
            continue
        if isinstance(a, (list, tuple)):
            a = list(a)
        if isinstance(b, (list, tuple)):
            b = list(b)
        agrees = a == b
        code, detail = (None, "") if agrees else ("config_mismatch", f"{key} is {short_value(a)} here but "
                                                  f"{short_value(b)} in the reference")
        if entry["flag"] == "target_layer_offset" and not agrees and target_layer_offset is not None:
            detail = _layer_shift(a, b, target_layer_offset, from_gguf) or detail
        checks.append(ConfigFinding(key, a, b, agrees, code, detail))
    return checks


def _layer_shift(ours, ref, offset: int, from_gguf: bool) -> str | None:
    if not (isinstance(ours, list) and isinstance(ref, list) and len(ours) == len(ref) and ours):
        return None
    shifts = {o - r for o, r in zip(ours, ref)}
    if len(shifts) != 1:
        return None
    shift = shifts.pop()
    text = f"target_layer_ids are shifted by {shift:+d} against the reference ({ours} vs {ref})"
    # ours = stored + offset, so the file stored reference + (shift - offset): + 1 is the current
    # llama.cpp converter (it taps a layer's input), 0 its first DFlash converter.
    stored = shift - offset
    if stored == 0:
        text += ": the GGUF stores them unshifted, so it was probably written by the first llama.cpp DFlash converter"
    elif stored == 1:
        text += ": the GGUF stores them + 1, as the current llama.cpp converter does"
    where = "convert" if from_gguf else "convert the GGUF again"
    return f"{text}; {where} with --target-layer-offset {offset - shift}"


def extra_row(name, ours, gguf_name, qtype, ref: Checkpoint, missing: list[str]):
    """A source tensor the reference lacks, and the missing reference tensor it matches, if any
    (then the map names it wrongly)."""
    detail, match = f"{name} is not in the reference", None
    for other in missing:
        if ref.shapes[other] == ours.shape and np.issubdtype(ours.dtype, np.floating):
            c = corr(ours.astype(np.float32, copy=False), ref.load(other))
            if c >= MATCH:
                detail, match = (f"{name} is not in the reference but matches its {other} (pearson {c:.4f}): "
                                 f"the map names it wrongly"), other
                break
    row = TensorFinding(name, list(ours.shape), None, qtype, gguf_name, None, None, None, None, "extra", "extra",
                        detail)
    return row, match


def missing_row(name: str, ref: Checkpoint, misnamed: dict[str, str]) -> TensorFinding:
    detail = f"{name} is in the reference but not in the source: the GGUF lacks it or the map has no entry for it"
    if name in misnamed:
        detail = f"{name} is in the reference but the source holds it as {misnamed[name]}: the map names it wrongly"
    shape = list(ref.shapes[name])
    return TensorFinding(name, shape, shape, "-", None, None, None, None, None, "missing", "missing", detail)


def other_model(rows: list[TensorFinding]):
    """When nearly every compared matrix matches nothing, one diagnosis for the whole model."""
    matrices = [t for t in rows if len(t.shape) >= 2 and t.status in ("pass", "fail")]
    lost = [t for t in matrices if t.diagnosis == "no_match"]
    if not matrices or len(lost) < OTHER_MODEL_SHARE * len(matrices):
        return rows, None
    worst = max(abs(t.pearson or 0.0) for t in lost)
    message = (f"{len(lost)} of {len(matrices)} weight matrices correlate with nothing in the reference "
               f"(largest |pearson| {worst:.3f}): the reference is probably another model, or the source holds "
               f"other weights")
    rows = [dataclasses.replace(t, diagnosis="other_model", detail=message) if t.diagnosis == "no_match" else t
            for t in rows]
    return rows, message



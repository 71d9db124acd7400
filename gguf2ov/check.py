"""Compare converted weights with reference weights, and say in words what is wrong.

The source is a GGUF (converted in memory through its map, tensor by tensor) or a converted
checkpoint folder; the reference is a Hugging Face checkpoint folder. Each tensor gets its Pearson
correlation, cosine similarity, relative error and max |difference| against the reference tensor
of the same name. A tensor that fails is then tried against the mistakes a GGUF converter makes:
the reference's transpose, llama.cpp's q/k row permutation (both directions), another reference
tensor of the same shape (a swap), a scale or offset (a norm stored as w + 1). The config is
compared key by key, and a shift of the target layer ids is named as such.

Memory: one source tensor, its reference tensor and at most one candidate are held at a time, all
float32; statistics accumulate in float64 over chunks of those arrays.
"""

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint
from .errors import Gguf2ovError

# A converted tensor of any usable quant type correlates far above this with its reference; an
# unrelated one sits near 0. Used to recognise what a failing tensor does match (its transpose,
# a permutation, another tensor), so it is a fixed recognition level, not the pass threshold.
MATCH = 0.9
# Elements per float64 chunk: 8 MiB of float64 per operand.
CHUNK = 1 << 20
# Past this many failing tensors that match nothing, stop searching the reference for swaps: the
# reference is most likely another model and every further search only costs time.
GIVE_UP_SEARCH = 4
# Share of the compared matrices that must match nothing before the whole reference is called
# another model (a few broken tensors are reported one by one instead).
OTHER_MODEL_SHARE = 0.8

STATUS_ORDER = ("non_finite", "shape_mismatch", "missing", "extra", "fail", "pass")

# Config keys compared, with the places a checkpoint may hold them (first present wins): z-lab
# configs keep block_size at the top level, the converter writes it under dflash_config.
CONFIG_KEYS = {
    "hidden_size": ("hidden_size",),
    "num_hidden_layers": ("num_hidden_layers",),
    "num_attention_heads": ("num_attention_heads",),
    "num_key_value_heads": ("num_key_value_heads",),
    "intermediate_size": ("intermediate_size",),
    "head_dim": ("head_dim",),
    "target_layer_ids": ("dflash_config.target_layer_ids", "target_layer_ids"),
    "mask_token_id": ("dflash_config.mask_token_id", "mask_token_id"),
    "block_size": ("dflash_config.block_size", "block_size"),
    # DFlash 2: compared when either side states them (published configs nest them too)
    "conv_kernel_size": ("dflash_config.conv_kernel_size", "conv_kernel_size"),
    "conv_group_size": ("dflash_config.conv_group_size", "conv_group_size"),
    "selector_rank": ("dflash_config.selector_rank", "selector_rank"),
    "selector_top_k": ("dflash_config.selector_top_k", "selector_top_k"),
}
# What the dflash map adds to the GGUF's target layers unless told otherwise (llama.cpp writes
# HF ids + 1); assumed for a converted folder whose gguf2ov.json does not say.
DEFAULT_LAYER_OFFSET = -1
# Shipped drafts leave these out when they take the default.
CONFIG_DEFAULTS = {"block_size": 16}


# --- results ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorCheck:
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
class ConfigCheck:
    key: str
    ours: object
    reference: object
    agrees: bool
    diagnosis: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class QuantSummary:
    qtype: str
    count: int
    passed: int
    mean_pearson: float | None
    min_pearson: float | None
    mean_rel_err: float | None


@dataclass(frozen=True)
class Diagnosis:
    code: str
    subject: str                      # a tensor name, a config key, or "model"
    message: str


@dataclass(frozen=True)
class CheckResult:
    source: str
    reference: str
    min_corr: float
    passed: bool
    tensors: list[TensorCheck]
    config: list[ConfigCheck]
    by_qtype: list[QuantSummary]
    overall: QuantSummary
    diagnoses: list[Diagnosis]
    seconds: float
    taps: object = None  # taps.TapScan, with a target

    def worst_first(self) -> list[TensorCheck]:
        return sorted(self.tensors, key=_severity)

    def tables(self, limit: int | None = None):
        from .report import Table

        rows = self.worst_first()
        shown = rows if limit is None else rows[:limit]
        note = f"... {len(rows) - len(shown)} more (the JSON and Markdown reports list every tensor)" \
            if len(shown) < len(rows) else ""
        tensor_rows = [[t.name, "x".join(map(str, t.shape)), t.qtype, t.pearson, t.cosine, t.rel_err, t.max_abs,
                        t.status, t.diagnosis or ""] for t in shown]
        quant_rows = [[q.qtype, q.count, q.passed, q.mean_pearson, q.min_pearson, q.mean_rel_err]
                      for q in [*self.by_qtype, self.overall]]
        tables = [
            Table("Tensors, worst first",
                  ["tensor", "shape", "qtype", "pearson", "cosine", "rel_err", "max_abs", "status", "diagnosis"],
                  tensor_rows, note),
            Table("Per quant type", ["qtype", "tensors", "passed", "mean pearson", "min pearson", "mean rel_err"],
                  quant_rows),
        ]
        if self.config:
            tables.append(Table("Config", ["key", "ours", "reference", "agrees"],
                                [[c.key, _short(c.ours), _short(c.reference), c.agrees] for c in self.config]))
        if self.taps is not None:
            tables += self.taps.tables()
        return tables

    def summary(self, limit: int | None = None) -> list[str]:
        failed = sum(t.status != "pass" for t in self.tensors)
        config_bad = sum(not c.agrees for c in self.config)
        o = self.overall
        corr = "no pearson" if o.min_pearson is None else f"mean pearson {o.mean_pearson:.4f}, min {o.min_pearson:.4f}"
        if self.passed:
            head = (f"PASS: {len(self.tensors)} tensors correlate >= {self.min_corr} with the reference "
                    f"({corr}); the config agrees")
        else:
            head = (f"FAIL: {failed} of {len(self.tensors)} tensors fail ({corr}), "
                    f"{config_bad} config key(s) disagree")
        lines = [head]
        shown = self.diagnoses if limit is None else self.diagnoses[:limit]
        lines += [f"{d.code}: {d.message}" for d in shown]
        if len(shown) < len(self.diagnoses):
            lines.append(f"... {len(self.diagnoses) - len(shown)} more diagnoses in the JSON and Markdown reports")
        if self.taps is not None and not any(d.code == "layer_fit" for d in self.diagnoses):
            lines += self.taps.summary()
        return lines


class TerminalView:
    """The result as the terminal shows it: the worst tensors and diagnoses only."""

    def __init__(self, result: CheckResult, limit: int = 20):
        self.result, self.limit = result, limit

    def tables(self):
        return self.result.tables(self.limit)

    def summary(self):
        return self.result.summary(self.limit)


def _severity(t: TensorCheck):
    score = _score(t.pearson, t.cosine)
    return STATUS_ORDER.index(t.status), score if score is not None else -2.0, t.name


def _short(value):
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


def _score(pearson, cosine):
    # Pearson is undefined for a constant tensor (an untrained norm of ones): cosine then decides.
    return pearson if pearson is not None else cosine


def _max_rel_err(min_corr: float) -> float:
    # Quantization noise uncorrelated with the weights gives rel_err ~ sqrt(1 - r^2) at correlation
    # r; twice that leaves room for the noise a K-quant grid adds, while a scale or offset error
    # (which Pearson cannot see) lands far above it.
    return 2.0 * math.sqrt(max(0.0, 1.0 - min_corr * min_corr))


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    s = stats(a, b)
    return _score(s.pearson, s.cosine) or 0.0


# --- reading checkpoint folders -----------------------------------------------------------------

# --- sources ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Source:
    """What is checked: names and shapes up front, tensors one by one."""
    shapes: dict[str, tuple[int, ...]]
    config: dict | None
    tensors: object                   # iterator of (hf_name, float32 array, gguf_name, qtype)
    target_layer_offset: int          # what was added to the GGUF's target layers


def _checkpoint_source(path: Path) -> _Source:
    ckpt = Checkpoint(path)
    qtypes = ckpt.recorded_qtypes()

    def tensors():
        for name in ckpt.shapes:
            yield name, ckpt.load(name), None, qtypes.get(name, "-")

    # The offset the converter applied to the GGUF's target layers (None there: the map's own), so
    # that a shift names the right fix.
    offset = (ckpt.provenance().get("options") or {}).get("target_layer_offset")
    offset = offset if isinstance(offset, int) else DEFAULT_LAYER_OFFSET
    return _Source(dict(ckpt.shapes), ckpt.config, tensors(), offset)


def _gguf_source(path, map_path, target_layer_offset) -> _Source:
    from .maps import open_mapped

    # The reference settles what the file cannot: where convert refuses ambiguous target layers
    # without --target-layer-offset, the check takes the map's default and names any shift.
    mapped = open_mapped(path, map_path, target_layer_offset, allow_ambiguous=True)
    arch_map, config = mapped.amap, mapped.config
    shapes = {e.hf_name: tuple(e.shape) for e in mapped.plan if e.hf_name}
    tensors = ((hf_name, array, gguf_name, getattr(qtype, "name", str(qtype)))
               for hf_name, array, gguf_name, qtype in mapped.tensors())
    if target_layer_offset is None:
        rule = arch_map.flag_rule("target_layer_offset")
        target_layer_offset = arch_map.config[rule[0]].get("add", 0) if rule else DEFAULT_LAYER_OFFSET
    return _Source(shapes, config, tensors, target_layer_offset)


def _open_source(source, map_path, target_layer_offset) -> _Source:
    from .read import GgufFile

    if isinstance(source, GgufFile):  # opened once by the caller (`run`)
        return _gguf_source(source, map_path, target_layer_offset)
    if source.is_dir():
        if map_path or target_layer_offset is not None:
            raise Gguf2ovError("--map and --target-layer-offset apply to a GGUF source, not to a checkpoint folder",
                               hint="pass the GGUF file instead, or drop those options")
        return _checkpoint_source(source)
    if not source.is_file():
        raise Gguf2ovError(f"{source}: no such file or folder")
    return _gguf_source(source, map_path, target_layer_offset)


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
    from .maps import apply_ops

    return apply_ops((("unpermute_qk", {"heads": "n_head"}),), w, {"n_head": n_head}, reverse=reverse)


def _head_counts(name: str, config: dict | None) -> list[int]:
    """Head counts to try for a q/k tensor (its own first: K uses the kv heads), none otherwise."""
    if not config or not re.search(r"(q_proj|k_proj|attn_q|attn_k)\.weight$", name):
        return []
    q, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    first = kv if re.search(r"(k_proj|attn_k)\.weight$", name) else q
    return [h for h in dict.fromkeys([first, q, kv]) if isinstance(h, int) and h > 0]


def _diagnose(name, ours, ref_arr, s: Stats, ref: Checkpoint, config, min_corr, search_swaps):
    """(status, code, sentence) for a tensor that did not pass the plain comparison."""
    if not s.finite:
        return "non_finite", "non_finite", (f"{name} holds NaN or Inf values: the GGUF tensor or its dequantization "
                                            f"is broken")
    if not s.ref_finite:
        return "non_finite", "non_finite", f"the reference's {name} holds NaN or Inf values: the reference is broken"
    status = "fail" if ours.shape == ref_arr.shape else "shape_mismatch"
    found = (_transposed(name, ours, ref_arr) or _scaled(name, s, min_corr) or _permuted(name, ours, ref_arr, config)
             or (search_swaps and _swapped(name, ours, ref, _score(s.pearson, s.cosine))))
    if found:
        return (status, *found)
    own = _score(s.pearson, s.cosine)
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
    if ours.ndim == 2 and ours.shape[::-1] == ref_arr.shape and _corr(ours.T, ref_arr) >= MATCH:
        return "transposed", (f"{name} matches the reference's transpose: the converter read it in the wrong "
                              f"orientation (GGUF ne[0] is the contiguous axis: reshape to the reversed ne, never "
                              f"transpose)")
    return None


def _scaled(name, s: Stats, min_corr):
    score = _score(s.pearson, s.cosine)
    if score is not None and score >= min_corr and s.rel_err is not None and s.rel_err > _max_rel_err(min_corr):
        return "scale_offset", (f"{name} correlates ({score:.4f}) but its values are off: ours ~ {s.slope:.3f} * "
                                f"reference + {s.offset:.3f} (rel_err {s.rel_err:.3f}); a norm stored as w + 1 that "
                                f"was not undone shows slope 1 and offset 1")
    return None


def _permuted(name, ours, ref_arr, config):
    if ours.shape != ref_arr.shape or ours.ndim != 2:
        return None
    for n_head in _head_counts(name, config):
        if ours.shape[0] % (2 * n_head):
            continue
        if _corr(_qk_order(ours, n_head, reverse=False), ref_arr) >= MATCH:
            return "qk_permuted", (f"{name} has its rows in llama.cpp's permuted q/k order ({n_head} heads): the "
                                   f"map should un-permute them (op unpermute_qk)")
        if _corr(_qk_order(ours, n_head, reverse=True), ref_arr) >= MATCH:
            return "qk_permuted", (f"{name} matches after permuting its rows the llama.cpp way ({n_head} heads): it "
                                   f"was un-permuted although llama.cpp never permuted it; drop the unpermute_qk op")
    return None


def _swapped(name, ours, ref: Checkpoint, own_score):
    best, best_name = max(own_score or 0.0, MATCH), None
    for other in _swap_candidates(name, ours.shape, ref):
        c = _corr(ours, ref.load(other))
        if c >= best:
            best, best_name = c, other
    if best_name:
        return "swapped", (f"{name} matches the reference's {best_name} (pearson {best:.4f}) instead of its own: "
                           f"the converter swapped the two")
    return None


def _fmt(v):
    return "n/a" if v is None else f"{v:.4f}"


# --- config -------------------------------------------------------------------------------------

def _config_value(config: dict, key: str):
    from .maps import config_get

    for path in CONFIG_KEYS[key]:
        if (node := config_get(config, path)) is not None:
            return node
    if key == "head_dim" and config.get("hidden_size") and config.get("num_attention_heads"):
        return config["hidden_size"] // config["num_attention_heads"]
    return CONFIG_DEFAULTS.get(key)


def compare_config(ours: dict | None, ref: dict | None, target_layer_offset: int = -1,
                   from_gguf: bool = True) -> list[ConfigCheck]:
    """Key by key; `target_layer_offset` is what was added to the GGUF's target layers."""
    if ours is None or ref is None:
        return []
    checks = []
    for key in CONFIG_KEYS:
        a, b = _config_value(ours, key), _config_value(ref, key)
        if a is None and b is None:
            continue
        if isinstance(a, (list, tuple)):
            a = list(a)
        if isinstance(b, (list, tuple)):
            b = list(b)
        agrees = a == b
        code, detail = (None, "") if agrees else ("config_mismatch", f"{key} is {_short(a)} here but "
                                                  f"{_short(b)} in the reference")
        if key == "target_layer_ids" and not agrees:
            detail = _layer_shift(a, b, target_layer_offset, from_gguf) or detail
        checks.append(ConfigCheck(key, a, b, agrees, code, detail))
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


# --- the check ----------------------------------------------------------------------------------

def check(source, reference, min_corr: float = 0.99, map_path=None, target_layer_offset: int | None = None,
          progress: bool = True, target_dir=None, prompts=None) -> CheckResult:
    """`target_dir`: also run the tap scan (which target layers the draft fits) on `prompts`."""
    from .progress import progress as progress_bar

    start = time.perf_counter()
    if not 0.0 < min_corr <= 1.0:
        raise Gguf2ovError(f"--min-corr must be in (0, 1], got {min_corr}")
    from .read import GgufFile

    source = source if isinstance(source, GgufFile) else Path(source)
    reference = Path(reference)
    ref = Checkpoint(reference)
    src = _open_source(source, map_path, target_layer_offset)
    from_gguf = isinstance(source, GgufFile) or not source.is_dir()
    opened, source = source, getattr(source, "path", source)

    missing = [n for n in ref.shapes if n not in src.shapes]
    rows: list[TensorCheck] = []
    misnamed: dict[str, str] = {}     # reference name -> the source name that holds it
    fruitless = 0
    for name, ours, gguf_name, qtype in progress_bar(src.tensors, desc="check", total=len(src.shapes),
                                                     enabled=progress, unit="tensor"):
        ours = np.asarray(ours)
        if name not in ref.shapes:
            row, match = _extra(name, ours, gguf_name, qtype, ref, missing)
            rows.append(row)
            if match:
                misnamed[match] = name
            continue
        ref_arr = ref.load(name)
        if not (np.issubdtype(ours.dtype, np.floating) and np.issubdtype(ref_arr.dtype, np.floating)):
            # Integer tensors (d2t, a vocabulary map) must be equal, not correlated.
            equal = ours.shape == ref_arr.shape and np.array_equal(ours, ref_arr)
            rows.append(TensorCheck(name, list(ours.shape), list(ref_arr.shape), qtype, gguf_name, None, None,
                                    None, None, "pass" if equal else "fail", None if equal else "no_match",
                                    "" if equal else f"{name} differs from the reference (integer values)"))
            continue
        ours = ours.astype(np.float32, copy=False)
        s = stats(ours, ref_arr) if ours.shape == ref_arr.shape else Stats(None, None, None, None, None, None,
                                                                           bool(np.isfinite(ours).all()), True)
        score = _score(s.pearson, s.cosine)
        if (ours.shape == ref_arr.shape and s.finite and s.ref_finite and score is not None
                and score >= min_corr and s.rel_err <= _max_rel_err(min_corr)):
            status, code, detail = "pass", None, ""
        else:
            status, code, detail = _diagnose(name, ours, ref_arr, s, ref, ref.config or src.config, min_corr,
                                             search_swaps=fruitless < GIVE_UP_SEARCH)
            fruitless += code in ("no_match", "shape_mismatch")
        rows.append(TensorCheck(name, list(ours.shape), list(ref_arr.shape), qtype, gguf_name, s.pearson,
                                s.cosine, s.rel_err, s.max_abs, status, code, detail))
        del ours, ref_arr
    rows += [_missing(n, ref, misnamed) for n in missing]

    rows, model_diag = _other_model(rows)
    config = compare_config(src.config, ref.config, src.target_layer_offset, from_gguf=from_gguf)
    diagnoses = [Diagnosis("other_model", "model", model_diag)] if model_diag else []
    diagnoses += [Diagnosis(t.diagnosis, t.name, t.detail) for t in sorted(rows, key=_severity)
                  if t.status != "pass" and t.diagnosis != "other_model"]
    diagnoses += [Diagnosis(c.diagnosis, c.key, c.detail) for c in config if not c.agrees]
    # Without both configs the geometry and the target layers cannot be confirmed: not a pass.
    has_configs = ref.config is not None and src.config is not None
    if not has_configs:
        which = "reference" if ref.config is None else "source"
        diagnoses.append(Diagnosis("no_config", "config", f"the {which} has no config.json: the config (target "
                                   f"layer ids, mask token, geometry) could not be compared"))
    passed = has_configs and all(t.status == "pass" for t in rows) and all(c.agrees for c in config)
    scan = None
    if target_dir is not None:
        from .taps import MISFIT, scan_source

        # the offset the source was read with here (the map's default for an ambiguous file)
        offset = src.target_layer_offset if from_gguf else None
        scan = scan_source(opened, target_dir, map_path, offset, prompts)
        if scan.verdict == MISFIT:
            diagnoses.append(Diagnosis("layer_fit", "target_layer_ids", scan.finding(offset)))
            passed = False
    by_qtype, overall = _quant_summaries(rows)
    return CheckResult(str(source), str(reference), min_corr, passed, rows, config, by_qtype, overall, diagnoses,
                       round(time.perf_counter() - start, 3), scan)


def _extra(name, ours, gguf_name, qtype, ref: Checkpoint, missing: list[str]):
    """A source tensor the reference lacks, and the missing reference tensor it matches, if any
    (then the map names it wrongly)."""
    detail, match = f"{name} is not in the reference", None
    for other in missing:
        if ref.shapes[other] == ours.shape and np.issubdtype(ours.dtype, np.floating):
            c = _corr(ours.astype(np.float32, copy=False), ref.load(other))
            if c >= MATCH:
                detail, match = (f"{name} is not in the reference but matches its {other} (pearson {c:.4f}): "
                                 f"the map names it wrongly"), other
                break
    row = TensorCheck(name, list(ours.shape), None, qtype, gguf_name, None, None, None, None, "extra", "extra", detail)
    return row, match


def _missing(name: str, ref: Checkpoint, misnamed: dict[str, str]) -> TensorCheck:
    detail = f"{name} is in the reference but not in the source: the GGUF lacks it or the map has no entry for it"
    if name in misnamed:
        detail = f"{name} is in the reference but the source holds it as {misnamed[name]}: the map names it wrongly"
    shape = list(ref.shapes[name])
    return TensorCheck(name, shape, shape, "-", None, None, None, None, None, "missing", "missing", detail)


def _other_model(rows: list[TensorCheck]):
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


def _quant_summaries(rows: list[TensorCheck]):
    def summarise(qtype, group):
        corr = [t.pearson for t in group if t.pearson is not None]
        errs = [t.rel_err for t in group if t.rel_err is not None and math.isfinite(t.rel_err)]
        return QuantSummary(qtype, len(group), sum(t.status == "pass" for t in group),
                            float(np.mean(corr)) if corr else None, float(min(corr)) if corr else None,
                            float(np.mean(errs)) if errs else None)

    groups: dict[str, list[TensorCheck]] = {}
    for t in rows:
        groups.setdefault(t.qtype, []).append(t)
    return [summarise(q, g) for q, g in sorted(groups.items())], summarise("all", rows)


# --- command line -------------------------------------------------------------------------------

def configure_parser(parser) -> None:
    parser.add_argument("source", type=Path, metavar="SOURCE", help="a GGUF file or a converted checkpoint folder")
    parser.add_argument("--reference", type=Path, required=True, metavar="REF_DIR",
                        help="a Hugging Face checkpoint folder (config.json + safetensors) to compare against")
    _min_corr_argument(parser)
    parser.add_argument("--map", dest="map_path", type=Path, default=None, metavar="FILE",
                        help="a tensor map YAML to use instead of the shipped one (GGUF source only)")
    parser.add_argument("--target-layer-offset", type=int, default=None, metavar="N",
                        help="HF target_layer_ids = GGUF dflash.target_layers + N (GGUF source only; default: the "
                             "map's, -1; the check names the right N when the ids are shifted)")
    parser.add_argument("--target", type=Path, default=None, metavar="TARGET_DIR",
                        help="also measure which target layers the draft fits (the tap scan) on this OpenVINO target")
    from .accept import add_prompt_arguments
    from .report import add_output_arguments

    add_prompt_arguments(parser)
    # the files hold the full report; the terminal shows the worst tensors
    add_output_arguments(parser, inputs=("source", "reference", "map_path", "target", "prompts", "image"))


def _min_corr_argument(parser) -> None:
    parser.add_argument("--min-corr", type=float, default=0.99, metavar="R",
                        help="the Pearson correlation every tensor must reach (default 0.99)")


def add_convert_arguments(parser) -> None:
    """`convert --reference REF_DIR [--min-corr R]`: check the written checkpoint afterwards."""
    parser.add_argument("--reference", type=Path, default=None, metavar="REF_DIR",
                        help="after writing, check the checkpoint against this Hugging Face checkpoint folder "
                             "and exit 1 if it differs")
    _min_corr_argument(parser)


def check_after_convert(args, out_dir) -> int:
    """Exit code of the check that `convert --reference` runs on its output (0 without --reference)."""
    if getattr(args, "reference", None) is None:
        return 0
    quiet = getattr(args, "quiet", False)
    result = check(out_dir, args.reference, min_corr=args.min_corr, progress=not quiet)
    return _show(result, None, None, quiet=quiet)


def _show(result: CheckResult, json_path, markdown_path, quiet: bool = False) -> int:
    import sys

    from .report import render, write_reports

    write_reports(result, json_path, markdown_path, title="gguf2ov check")
    # Under --quiet only a failure is shown: the exit code alone would not say what is wrong.
    if not quiet or not result.passed:
        title = f"check {result.source} against {result.reference}"
        sys.stdout.write(render(TerminalView(result), "text", title=title))
    return 0 if result.passed else 1


def cli(args) -> int:
    from .accept import prompts_from_args
    from .report import emit, render

    result = check(args.source, args.reference, min_corr=args.min_corr, map_path=args.map_path,
                   target_layer_offset=args.target_layer_offset, progress=not args.quiet,
                   target_dir=args.target, prompts=prompts_from_args(args, default=None))
    text = render(TerminalView(result), "text", title=f"check {result.source} against {result.reference}")
    return emit(result, args, title="gguf2ov check", text=text, code=0 if result.passed else 1)

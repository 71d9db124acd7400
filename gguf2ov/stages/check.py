"""Compare converted weights with reference weights, and say in words what is wrong.

The source is a GGUF (converted in memory through its map, tensor by tensor) or a converted
checkpoint folder; the reference is a Hugging Face checkpoint folder. Each tensor gets its Pearson
correlation, cosine similarity, relative error and max |difference| against the reference tensor
of the same name; `diagnose` explains a tensor or config key that disagrees (a transpose, a q/k
permutation, a swap, a scale or offset, a shift of the target layer ids).

Memory: one source tensor, its reference tensor and at most one candidate are held at a time, all
float32; statistics accumulate in float64 over chunks of those arrays.
"""

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checks.diagnose import (ConfigFinding, Diagnosis, Stats, TensorFinding, compare_config, diagnose_tensor,
                               extra_row, max_rel_err, missing_row, other_model, score, short_value, stats)
from ..checks.taps import TapScan
from ..errors import Gguf2ovError
from ..hf.checkpoint import Checkpoint
from ..maps.arch_map import ArchMap
from ..maps.load import flag_default, open_mapped

# Past this many failing tensors that match nothing, stop searching the reference for swaps: the
# reference is most likely another model and every further search only costs time.
GIVE_UP_SEARCH = 4

STATUS_ORDER = ("non_finite", "shape_mismatch", "missing", "extra", "fail", "pass")


# --- results ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantSummary:
    qtype: str
    count: int
    passed: int
    mean_pearson: float | None
    min_pearson: float | None
    mean_rel_err: float | None



@dataclass(frozen=True)
class CheckResult:
    source: str
    reference: str
    min_corr: float
    passed: bool
    tensors: list[TensorFinding]
    config: list[ConfigFinding]
    by_qtype: list[QuantSummary]
    overall: QuantSummary
    diagnoses: list[Diagnosis]
    seconds: float
    taps: TapScan | None = None  # with a target

    @property
    def title(self) -> str:
        return f"check {self.source} against {self.reference}"

    def worst_first(self) -> list[TensorFinding]:
        return sorted(self.tensors, key=_severity)

    def tables(self, limit: int | None = None):
        from ..report import Table

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
                                [[c.key, short_value(c.ours), short_value(c.reference), c.agrees] for c in self.config]))
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


def _severity(t: TensorFinding):
    own = score(t.pearson, t.cosine)
    return STATUS_ORDER.index(t.status), own if own is not None else -2.0, t.name



# --- sources ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckSource:
    """What is checked: names and shapes up front, tensors one by one (`checkpoint_source` of a folder,
    `gguf_source` of a GGUF read through its map)."""
    path: Path
    from_gguf: bool
    shapes: dict[str, tuple[int, ...]]
    config: dict | None
    tensors: Iterator[tuple[str, np.ndarray, str | None, str]]  # (hf_name, float32 array, gguf_name, qtype)
    target_layer_offset: int | None   # what was added to the GGUF's target layers
    amap: ArchMap | None = None       # the GGUF's map (its `compare` keys count too)


def checkpoint_source(path: Path) -> CheckSource:
    ckpt = Checkpoint(path)
    qtypes = ckpt.recorded_qtypes()

    def tensors():
        for name in ckpt.shapes:
            yield name, ckpt.load(name), None, qtypes.get(name, "-")

    # The offset the converter applied to the GGUF's target layers (None there: the map's own), so
    # that a shift names the right fix.
    offset = (ckpt.provenance().get("options") or {}).get("target_layer_offset")
    offset = offset if isinstance(offset, int) else flag_default("target_layer_offset")
    return CheckSource(Path(path), False, dict(ckpt.shapes), ckpt.config, tensors(), offset)


def gguf_source(gguf, map_path=None, target_layer_offset: int | None = None) -> CheckSource:
    """A GGUF (an opened GgufFile) read through its map, as check compares it."""
    # The reference settles what the file cannot: where convert refuses ambiguous target layers
    # without --target-layer-offset, the check takes the map's default and names any shift.
    mapped = open_mapped(gguf, map_path, target_layer_offset, allow_ambiguous=True)
    arch_map, config = mapped.amap, mapped.config
    shapes = {e.hf_name: tuple(e.shape) for e in mapped.plan if e.hf_name}
    tensors = ((hf_name, array, gguf_name, getattr(qtype, "name", str(qtype)))
               for hf_name, array, gguf_name, qtype in mapped.tensors())
    if target_layer_offset is None:
        rule = arch_map.metadata.flag_rule("target_layer_offset")
        target_layer_offset = arch_map.config[rule[0]].get("add", 0) if rule else flag_default("target_layer_offset")
    return CheckSource(gguf.path, True, shapes, config, tensors, target_layer_offset, arch_map)


# --- the check ----------------------------------------------------------------------------------

def check(src: CheckSource, reference, min_corr: float = 0.99, progress: bool = True, scan=None) -> CheckResult:
    """Compare `src` (a GGUF read through its map, or a converted checkpoint folder) with the reference
    checkpoint folder. `scan`: the tap scan of the source on a target (checks.taps.TapScan, made by
    the job), whose verdict becomes the `layer_fit` diagnosis."""
    from ..progress import progress as progress_bar

    start = time.perf_counter()
    if not 0.0 < min_corr <= 1.0:
        raise Gguf2ovError(f"--min-corr must be in (0, 1], got {min_corr}")
    reference = Path(reference)
    ref = Checkpoint(reference)
    from_gguf = src.from_gguf

    missing = [n for n in ref.shapes if n not in src.shapes]
    rows: list[TensorFinding] = []
    misnamed: dict[str, str] = {}     # reference name -> the source name that holds it
    fruitless = 0
    for name, ours, gguf_name, qtype in progress_bar(src.tensors, desc="check", total=len(src.shapes),
                                                     enabled=progress, unit="tensor"):
        ours = np.asarray(ours)
        if name not in ref.shapes:
            row, match = extra_row(name, ours, gguf_name, qtype, ref, missing)
            rows.append(row)
            if match:
                misnamed[match] = name
            continue
        ref_arr = ref.load(name)
        if not (np.issubdtype(ours.dtype, np.floating) and np.issubdtype(ref_arr.dtype, np.floating)):
            # Integer tensors (d2t, a vocabulary map) must be equal, not correlated.
            equal = ours.shape == ref_arr.shape and np.array_equal(ours, ref_arr)
            rows.append(TensorFinding(name, list(ours.shape), list(ref_arr.shape), qtype, gguf_name, None, None,
                                      None, None, "pass" if equal else "fail", None if equal else "no_match",
                                      "" if equal else f"{name} differs from the reference (integer values)"))
            continue
        ours = ours.astype(np.float32, copy=False)
        s = stats(ours, ref_arr) if ours.shape == ref_arr.shape else Stats(None, None, None, None, None, None,
                                                                           bool(np.isfinite(ours).all()), True)
        own = score(s.pearson, s.cosine)
        if (ours.shape == ref_arr.shape and s.finite and s.ref_finite and own is not None
                and own >= min_corr and s.rel_err <= max_rel_err(min_corr)):
            status, code, detail = "pass", None, ""
        else:
            status, code, detail = diagnose_tensor(name, ours, ref_arr, s, ref, ref.config or src.config, min_corr,
                                                   search_swaps=fruitless < GIVE_UP_SEARCH)
            fruitless += code in ("no_match", "shape_mismatch")
        rows.append(TensorFinding(name, list(ours.shape), list(ref_arr.shape), qtype, gguf_name, s.pearson,
                                  s.cosine, s.rel_err, s.max_abs, status, code, detail))
        del ours, ref_arr
    rows += [missing_row(n, ref, misnamed) for n in missing]

    rows, model_diag = other_model(rows)
    config = compare_config(src.config, ref.config, src.target_layer_offset, from_gguf=from_gguf, amap=src.amap)
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
    if scan is not None:
        from ..checks.taps import MISFIT

        if scan.verdict == MISFIT:
            # the offset the source was read with here (the map's default for an ambiguous file)
            diagnoses.append(Diagnosis("layer_fit", "target_layer_ids",
                                       scan.finding(src.target_layer_offset if from_gguf else None)))
            passed = False
    by_qtype, overall = _quant_summaries(rows)
    return CheckResult(str(src.path), str(reference), min_corr, passed, rows, config, by_qtype, overall, diagnoses,
                       round(time.perf_counter() - start, 3), scan)


def _quant_summaries(rows: list[TensorFinding]):
    def summarise(qtype, group):
        corr = [t.pearson for t in group if t.pearson is not None]
        errs = [t.rel_err for t in group if t.rel_err is not None and math.isfinite(t.rel_err)]
        return QuantSummary(qtype, len(group), sum(t.status == "pass" for t in group),
                            float(np.mean(corr)) if corr else None, float(min(corr)) if corr else None,
                            float(np.mean(errs)) if errs else None)

    groups: dict[str, list[TensorFinding]] = {}
    for t in rows:
        groups.setdefault(t.qtype, []).append(t)
    return [summarise(q, g) for q, g in sorted(groups.items())], summarise("all", rows)

"""Drift of requantized draft variants: size, weight error, and what the draft proposes.

For each variant (fp32 baseline, NNCF int8/int4 at several group sizes, the GGUF-grid transcode)
it measures, against the fp32 export and against the values the GGUF held:
- weights: relative error ||w - w_ref|| / ||w_ref|| and cosine, over all weights and per tensor;
- outputs: on blocks built from the target's own hidden states (or synthetic ones without a
  target), the draft's proposals through the target's lm_head compared with the fp32 draft's:
  top-1 agreement (llama.cpp's "same top p") and mean KL divergence (fp32 || variant).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checks.selector import SelectorGain, log_softmax
from ..errors import Gguf2ovError
from ..numerics import EXACT, describe_numerics
from ..outputs import relocated
from ..names import IR_XML
from ..report import Table, human_bytes
from ..runtime.arithmetic import measured_numerics
from ..runtime.genai import DEFAULT_PROMPTS, text_prompts


@dataclass(frozen=True)
class TensorDrift:
    name: str
    rel_err: float
    cosine: float
    rel_err_gguf: float | None
    cosine_gguf: float | None


@dataclass(frozen=True)
class VariantDrift:
    name: str
    path: str
    size_bytes: int
    rel_err: float
    cosine: float
    rel_err_gguf: float | None
    cosine_gguf: float | None
    top1_agreement: float | None
    kld: float | None
    output_cosine: float
    verified: bool | None
    verify_failures: list[str]
    acceptance: dict | None = None
    tensors: list[TensorDrift] = field(default_factory=list)
    verify: object | None = None  # the stages.verify.VerifyResult of the variant's folder


@dataclass(frozen=True)
class DriftResult:
    source: str
    out_dir: str
    contexts: str            # "target" or "synthetic"
    n_blocks: int
    n_rows: int
    variants: list[VariantDrift]
    plot: str | None
    seconds: float
    provenance: dict
    selector: SelectorGain | None = None  # DFlash 2 with a target: what GenAI's top-1 path leaves
    skipped: dict[str, str] = field(default_factory=dict)  # a default variant this draft cannot take -> why
    # the arithmetic of the output figures: exact f32 (numerics.compile_exact), so that they compare
    # across machines; the acceptance figures, when run, carry their own (the runtime's)
    numerics: dict = field(default_factory=dict)

    def tables(self) -> list[Table]:
        grid = any(v.rel_err_gguf is not None for v in self.variants)
        acc = any(v.acceptance for v in self.variants)
        headers = ["variant", "size", "rel err", "cosine"]
        headers += ["rel err vs GGUF", "cosine vs GGUF"] if grid else []
        headers += ["same top-1", "mean KLD", "out cosine", "verify"]
        headers += ["acceptance", "tok/s"] if acc else []
        rows = []
        for v in self.variants:
            row = [v.name, human_bytes(v.size_bytes), _pct(v.rel_err), f"{v.cosine:.6f}"]
            if grid:
                row += [_pct(v.rel_err_gguf), None if v.cosine_gguf is None else f"{v.cosine_gguf:.6f}"]
            row += [_pct(v.top1_agreement), v.kld, f"{v.output_cosine:.6f}",
                    "-" if v.verified is None else ("pass" if v.verified else "FAIL")]
            if acc:
                a = v.acceptance or {}
                row += [_pct(a.get("acceptance_rate")), a.get("tok_s_draft")]
            rows.append(row)
        note = (f"weights against the fp32 export{' and the dequantized GGUF grid' if grid else ''}; outputs over "
                f"{self.n_rows} proposals in {self.n_blocks} blocks ({self.contexts} contexts)"
                + (f", computed on {describe_numerics(self.numerics)}" if self.numerics else "")
                + (f"; skipped, as this draft cannot take them: {', '.join(self.skipped)}" if self.skipped else ""))
        tables = [Table("Drift per variant", headers, rows, note)]
        return tables + ([self.selector.table()] if self.selector else [])

    def summary(self) -> list[str]:
        lines = [f"{len(self.variants)} variants under {self.out_dir} in {self.seconds:.1f} s"]
        if self.plot:
            lines.append(f"plot: {self.plot}")
        if self.selector:
            s = self.selector
            lines.append(f"DFlash 2 selector (offline, not in the IR): {s.selector_accepted:.2f} accepted tokens per block "
                         f"against {s.top1_accepted:.2f} for GenAI's top-1 path")
        lines += [f"skipped {name}: {why}" for name, why in self.skipped.items()]
        bad = [v.name for v in self.variants if v.verified is False]
        if bad:
            lines.append(f"verify FAILED for: {', '.join(bad)}")
        return lines


def _pct(x) -> str | None:
    if x is None:
        return None
    return f"{100 * x:.2e}%" if 0 < abs(x) < 1e-5 else f"{100 * x:.3f}%"


# -- weight drift ---------------------------------------------------------------------------------

class StreamingSums:
    """Sums for a global relative error and cosine over many tensors, in float64, chunk by chunk."""

    CHUNK = 1 << 22  # elements per float64 pass: bounded memory whatever the tensor

    def __init__(self):
        self.diff2 = self.ref2 = self.val2 = self.dot = 0.0

    def add(self, value: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
        v_all, r_all = value.reshape(-1), ref.reshape(-1)
        d2 = r2 = v2 = dot = 0.0
        for start in range(0, v_all.size, self.CHUNK):
            v = v_all[start:start + self.CHUNK].astype(np.float64)
            r = r_all[start:start + self.CHUNK].astype(np.float64)
            d = v - r
            d2, r2, v2, dot = d2 + float(d @ d), r2 + float(r @ r), v2 + float(v @ v), dot + float(v @ r)
        self.diff2, self.ref2, self.val2, self.dot = self.diff2 + d2, self.ref2 + r2, self.val2 + v2, self.dot + dot
        return _rel_cos(d2, r2, v2, dot)

    def result(self) -> tuple[float, float]:
        return _rel_cos(self.diff2, self.ref2, self.val2, self.dot)


def _rel_cos(d2, r2, v2, dot) -> tuple[float, float]:
    rel = float(np.sqrt(d2 / r2)) if r2 > 0 else float(np.sqrt(d2))
    cos = dot / np.sqrt(v2 * r2) if v2 > 0 and r2 > 0 else float(v2 == r2)
    return rel, float(cos)


class WeightMeter:
    """Drift of one variant's weights, measured one tensor at a time while the variant is built.

    Called with each weight's IR output as the export makes it; the reference is the source's
    float32 value of the same tensor: the fp32 export's weight, and for a GGUF source exactly the
    dequantized grid the file holds.
    """

    def __init__(self, draft):
        self.draft = draft
        self.grid = draft.kind == "gguf"
        self.overall = StreamingSums()
        self.tensors: list[TensorDrift] = []

    def __call__(self, name: str, output, values=None) -> None:
        """`values`: the source tensor when the export has just read it (not read a second time)."""
        from ..ir.irweights import evaluate

        value = evaluate(output)
        reference = values if values is not None else self.draft.f32(name)
        if value.shape != reference.shape:
            raise Gguf2ovError(f"{name}: the variant's weight is {value.shape}, the source's {reference.shape}")
        rel, cos = self.overall.add(value, reference)
        self.tensors.append(TensorDrift(name, rel, cos, rel if self.grid else None, cos if self.grid else None))

    def result(self) -> tuple[float, float, float | None, float | None]:
        """(rel err, cosine) against the fp32 export, and against the GGUF grid (None without one)."""
        missing = sorted(set(n for n, s in self.draft.expected.items() if len(s) == 2) - {t.name for t in self.tensors})
        if missing:
            raise Gguf2ovError(f"the variant lost weights the draft has: {', '.join(missing)}")
        rel, cos = self.overall.result()
        return (rel, cos, rel, cos) if self.grid else (rel, cos, None, None)


# -- output drift ---------------------------------------------------------------------------------

@dataclass
class Blocks:
    """Draft inputs for a set of blocks, and the target's lm_head that scores the outputs (rows ->
    logits; None: no target)."""
    embeds: list[np.ndarray]
    contexts: list[np.ndarray]
    head: Callable[[np.ndarray], np.ndarray] | None
    kind: str


def target_blocks(target, config, prompts, block_size: int, max_blocks: int = 48) -> Blocks:
    """Blocks anchored in the prompts, with the target's hidden states as context (`target`: an
    opened runtime.target.TargetIR; `config`: the draft's DraftConfig)."""
    ids, mask = config.target_layer_ids, config.mask_token_id
    embeds, contexts = [], []
    per_prompt = max(1, max_blocks // max(1, len(prompts)))
    for text in text_prompts(prompts):
        tokens = target.tokenize(text)
        if len(tokens) < 2:
            continue
        hidden = target.hidden_states(tokens, ids)
        anchors = np.unique(np.linspace(1, len(tokens) - 1, num=min(per_prompt, len(tokens) - 1)).astype(int))
        for p in anchors:
            block = np.full(block_size, mask, dtype=np.int64)
            block[0] = tokens[p]  # the seed: the last token the target committed
            embeds.append(target.embed(block))
            contexts.append(hidden[:p])
    if not embeds:
        raise Gguf2ovError("the prompts gave no tokens to build draft blocks from")
    return Blocks(embeds, contexts, target.head_logits, "target")


def synthetic_blocks(config, block_size: int, n_blocks: int = 16, seed: int = 0) -> Blocks:
    rng = np.random.default_rng(seed)
    h, n_ids = config.hidden_size, len(config.target_layer_ids)
    embeds = [rng.normal(0, 0.05, (block_size, h)).astype(np.float32) for _ in range(n_blocks)]
    contexts = [rng.normal(0, 1.0, (int(rng.integers(4, 32)), n_ids * h)).astype(np.float32) for _ in range(n_blocks)]
    return Blocks(embeds, contexts, None, "synthetic")


def draft_outputs(draft_dir, blocks: Blocks) -> list[np.ndarray]:
    from ..runtime.draft_ir import DraftIR

    return DraftIR(draft_dir).run_blocks(list(zip(blocks.embeds, blocks.contexts)))


def output_drift(outputs: list, baseline: list, head: Callable[[np.ndarray], np.ndarray] | None):
    """(top-1 agreement, mean KLD, cosine) of a variant's outputs against the fp32 draft's.

    Block by block: a real vocabulary's logits for every row at once would take gigabytes."""
    out, ref = np.concatenate(outputs).astype(np.float64), np.concatenate(baseline).astype(np.float64)
    cosine = float(np.sum(out * ref) / np.sqrt(np.sum(out * out) * np.sum(ref * ref)))
    if head is None:
        return None, None, cosine
    same, kld = [], []
    for o, r in zip(outputs, baseline):
        logp_out = log_softmax(head(o).astype(np.float64))
        logp_ref = log_softmax(head(r).astype(np.float64))
        same.append(logp_out.argmax(-1) == logp_ref.argmax(-1))
        kld.append(np.sum(np.exp(logp_ref) * (logp_ref - logp_out), axis=-1))
    return float(np.mean(np.concatenate(same))), max(float(np.mean(np.concatenate(kld))), 0.0), cosine


# -- the stage ------------------------------------------------------------------------------------

def plot_drift(variants: list[VariantDrift], path) -> str | None:
    """Size against weight error, one labelled point per variant."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for v in variants:
        x, y = v.size_bytes / 2**20, 100 * v.rel_err
        ax.scatter([x], [y], s=40, color="tab:orange" if v.name == "gguf" else "tab:blue", zorder=3)
        label = v.name if v.top1_agreement is None else f"{v.name} (top-1 {100 * v.top1_agreement:.1f}%)"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("size on disk (MiB)")
    ax.set_ylabel("weight relative error vs fp32 (%)")
    ax.set_title("Draft variants: size against weight drift")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


@dataclass(frozen=True)
class VariantPlan:
    """The variants a drift builds, in order (fp32, the baseline, first), and the ones it skips, with why."""
    build: list
    skipped: dict[str, str]


def plan_variants(draft, variants=None, optional=()) -> VariantPlan:
    """What `drift` builds of `draft` for the variants asked for (names; None: DEFAULT_DRIFT_VARIANTS,
    every one optional). A variant this draft cannot take (NNCF refuses a group size that does not
    divide a weight's input width; the `gguf` grid needs a GGUF source) is skipped when it is in
    `optional` (a default the user did not name), and refused in one line, before any work, when it
    is not. A bad name is refused first."""
    from ..ir.variants import DEFAULT_DRIFT_VARIANTS, parse_variant
    from ..ir.weights import WeightForms

    if variants is None:
        variants = optional = DEFAULT_DRIFT_VARIANTS
    parsed = [parse_variant(n) for n in variants]
    optional = {parse_variant(n).name for n in optional}
    build, skipped = [], {}
    for variant in dict.fromkeys([parse_variant("fp32"), *parsed]):
        try:
            WeightForms(draft, variant)  # NNCF's whole-model decisions: refused as NNCF would refuse them
        except Gguf2ovError as e:
            if variant.name not in optional:
                raise
            skipped[variant.name] = e.message
            continue
        build.append(variant)
    return VariantPlan(build, skipped)


# drift.json, drift.md and the plot
REPORT_BYTES = 200_000


def drift_bytes(draft, variants, heads=None) -> int:
    """The bytes `drift` writes: every variant's folder (with the own heads `heads` gives) and the reports."""
    from ..draft.graph import draft_ir_bytes

    heads = heads or {}
    return sum(draft_ir_bytes(draft, v, heads.get(v.name)) for v in variants) + REPORT_BYTES


def _own(heads: dict, name: str):
    """The draft.head.OwnHead a variant takes (None: GenAI's graft)."""
    choice = heads.get(name)
    return choice.own if choice is not None else None


def drift(draft, out_dir, variants=None, target=None, prompts=None, verify=None, accept=None,
          overwrite: bool = False, progress: bool = True, optional=(), heads=None) -> DriftResult:
    """Build every variant of `draft` (a draft.source.DraftSource, opened once: every variant streams
    from it) under `out_dir`, and measure its drift.

    `variants` (names; None: the defaults) and `optional` as `plan_variants` takes them: a default
    that cannot apply to this draft is skipped, and the result says which and why.

    `target` (a runtime.target.TargetIR): contexts from its hidden states, proposals through its
    lm_head. `verify(folder) -> VerifyResult` checks each variant (the job's: against the source and
    the target); `accept(folder) -> AcceptResult` runs each on the target in GenAI. `heads` ({variant
    name: draft.head.HeadChoice}) gives those variants the target's embedding and lm_head of their own. The target's
    compiled model is released once its blocks are made, before any draft is compiled: the CPU
    plugin holds ~2.2x the target IR while it is compiled (a later use compiles it again).
    """
    from ..draft.graph import write_draft_ir
    from ..ir.weights import ir_size
    from ..outputs import atomic_dir, require_space
    from ..progress import step
    from ..provenance import provenance
    from ..report import write_reports

    start = time.monotonic()
    out_dir = Path(out_dir)
    plan = plan_variants(draft, variants, optional)  # a bad name or a variant that cannot apply: before any work
    parsed = plan.build
    heads = heads or {}
    require_space(out_dir, drift_bytes(draft, parsed, heads), f"{len(parsed)} draft variants",
                  hint="write to another folder (-o), or build fewer variants (--variants)")
    if target is not None:
        target.require_attach_points()  # before minutes of export, not after

    with atomic_dir(out_dir, overwrite=overwrite, inputs=(draft.path, target.path if target is not None else None)) as tmp:
        block = draft.config.block_size
        if target is not None:
            blocks = target_blocks(target, draft.config, prompts or DEFAULT_PROMPTS, block)
            if not _measures_selector(draft, target):
                target.release()
        else:
            blocks = synthetic_blocks(draft.config, block)
        results, baseline_out, selector = [], None, None
        for variant in parsed:
            vdir = tmp / variant.name
            step(f"building variant {variant.name}", progress)
            meter = WeightMeter(draft)
            write_draft_ir(draft, vdir, variant, progress, observe=meter, head=_own(heads, variant.name))
            step(f"measuring {variant.name}", progress)
            outputs = draft_outputs(vdir, blocks)
            baseline_out = baseline_out or outputs
            verified = verify(vdir) if verify is not None else None
            rel, cos, rel_g, cos_g = meter.result()
            top1, kld, out_cos = output_drift(outputs, baseline_out, blocks.head)
            acceptance = _acceptance(accept(vdir)) if accept is not None else None
            results.append(VariantDrift(
                name=variant.name, path=str(out_dir / variant.name), size_bytes=ir_size(vdir),
                rel_err=rel, cosine=cos, rel_err_gguf=rel_g, cosine_gguf=cos_g,
                top1_agreement=top1, kld=kld, output_cosine=out_cos,
                verified=None if verified is None else verified.ok,
                verify_failures=[] if verified is None else [c.name for c in verified.checks if c.status == "fail"],
                acceptance=acceptance, tensors=meter.tensors, verify=verified,
            ))
            if selector is None and _measures_selector(draft, target):
                step("measuring the DFlash 2 selector against the top-1 path", progress)
                from ..checks.selector import selector_gain

                selector = selector_gain(draft, vdir, target, prompts or DEFAULT_PROMPTS)
                target.release()
        plot = plot_drift(results, tmp / "drift.png")
        record = provenance({"source": draft}, {"variants": [v.name for v in parsed], "skipped": list(plan.skipped),
                                                "target": str(target.path) if target is not None else None})
        result = DriftResult(
            source=str(draft.path), out_dir=str(out_dir), contexts=blocks.kind, n_blocks=len(blocks.embeds),
            n_rows=int(sum(len(e) - 1 for e in blocks.embeds)), variants=results,
            plot=str(out_dir / "drift.png") if plot else None, seconds=time.monotonic() - start,
            provenance=record, selector=selector, skipped=plan.skipped,
            numerics=measured_numerics({v.name: tmp / v.name / IR_XML for v in results}, "CPU", EXACT),
        )
        result = relocated(result, tmp, out_dir)
        write_reports(result, tmp / "drift.json", tmp / "drift.md", title="gguf2ov drift")
    return result


def _measures_selector(draft, target) -> bool:
    """A DFlash 2 draft that carries its selector, with a target to measure it against."""
    from ..checks.selector import SELECTOR

    return target is not None and draft.config.is_dflash2 and sum(n.startswith(SELECTOR) for n in draft.ignored) == 3


def _acceptance(r) -> dict:
    """An acceptance run's figures, as drift's table shows them beside the variant's."""
    o = r.overall
    return {"verdict": r.verdict, "identical": o.identical, "identical_exact": o.identical_exact,
            "acceptance_rate": o.acceptance_rate,
            "mean_acceptance_length": o.mean_acceptance_length, "tok_s_target": o.tok_s_target,
            "tok_s_draft": o.tok_s_draft, "speedup": o.speedup, "numerics": r.numerics}

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

from .errors import Gguf2ovError
from .genai import DEFAULT_PROMPTS, add_prompt_arguments, text_prompts
from .numerics import EXACT, describe_numerics, numerics
from .report import Table, add_output_arguments, emit, human_bytes, render
from .selector import SelectorGain, log_softmax



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
                + (f", computed on {describe_numerics(self.numerics)}" if self.numerics else ""))
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
        from .irweights import evaluate

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


def target_blocks(target, draft_config: dict, prompts, block_size: int, max_blocks: int = 48) -> Blocks:
    """Blocks anchored in the prompts, with the target's hidden states as context (`target`: an
    opened `target.Target`)."""
    dflash = draft_config.get("dflash_config", {})
    ids, mask = dflash.get("target_layer_ids"), dflash.get("mask_token_id")
    if ids is None or mask is None:
        raise Gguf2ovError("the draft's config.json has no dflash_config.target_layer_ids / mask_token_id")
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


def synthetic_blocks(draft_config: dict, block_size: int, n_blocks: int = 16, seed: int = 0) -> Blocks:
    rng = np.random.default_rng(seed)
    h = draft_config["hidden_size"]
    n_ids = len(draft_config.get("dflash_config", {}).get("target_layer_ids", [])) or 1
    embeds = [rng.normal(0, 0.05, (block_size, h)).astype(np.float32) for _ in range(n_blocks)]
    contexts = [rng.normal(0, 1.0, (int(rng.integers(4, 32)), n_ids * h)).astype(np.float32) for _ in range(n_blocks)]
    return Blocks(embeds, contexts, None, "synthetic")


def draft_outputs(draft_dir, blocks: Blocks) -> list[np.ndarray]:
    from .draft_ir import DraftIR

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


def drift(source, out_dir, variants=None, target_dir=None, prompts=None, map_path=None,
          target_layer_offset=None, accept_options: dict | None = None, overwrite: bool = False,
          progress: bool = True) -> DriftResult:
    """Build every variant of the draft under `out_dir`, verify each, and measure its drift.

    `source` is a path, a GgufFile or a DraftSource opened once by the caller; every variant
    streams from the one opened source.
    """
    from .export import export_draft
    from .outputs import atomic_dir, require_output_dir
    from .progress import step
    from .provenance import provenance
    from .report import write_reports
    from .requantize import ir_size
    from .variants import DEFAULT_DRIFT_VARIANTS, parse_variant
    from .source import DraftSource, open_draft
    from .verify import verify_draft

    start = time.monotonic()
    out_dir = Path(out_dir)
    names = list(variants or DEFAULT_DRIFT_VARIANTS)
    parsed = [parse_variant(n) for n in names]  # fail on a bad name before any work
    target = None
    if target_dir is not None:
        from .accept import require_target_dir
        from .target import Target

        require_target_dir(target_dir)  # before minutes of export, not after
        target = Target.open(target_dir).require_attach_points()  # opened once: every variant is measured on it
    require_output_dir(out_dir, overwrite, inputs=(getattr(source, "path", source), target_dir, map_path))
    draft = source if isinstance(source, DraftSource) else open_draft(source, map_path, target_layer_offset)
    if draft.kind != "gguf":
        if variants and any(v.weight_format == "gguf" for v in parsed):
            raise Gguf2ovError("the gguf variant needs a GGUF source, not a checkpoint folder")
        parsed = [v for v in parsed if v.weight_format != "gguf"]
    parsed = [parse_variant("fp32")] + [v for v in parsed if v.name != "fp32"]  # the baseline comes first

    with atomic_dir(out_dir, overwrite=overwrite, inputs=(draft.path, target_dir, map_path)) as tmp:
        block = draft.config.block_size
        if target is not None:
            blocks = target_blocks(target, draft.config.raw, prompts or DEFAULT_PROMPTS, block)
        else:
            blocks = synthetic_blocks(draft.config.raw, block)
        results, baseline_out, selector, baseline = [], None, None, None
        for variant in parsed:
            vdir = tmp / variant.name
            step(f"building variant {variant.name}", progress)
            meter = WeightMeter(draft)
            export_draft(draft, vdir, variant=variant, progress=progress, run_verify=False, observe=meter)
            step(f"measuring {variant.name}", progress)
            outputs = draft_outputs(vdir, blocks)
            baseline_out = baseline_out or outputs
            vr = verify_draft(vdir, target_dir=target, tap_scan=False)  # the layers are the variants' same
            rel, cos, rel_g, cos_g = meter.result()
            top1, kld, out_cos = output_drift(outputs, baseline_out, blocks.head)
            acceptance = None
            if target_dir is not None and accept_options is not None:
                baseline = baseline or _target_alone(target_dir, accept_options, progress)  # once for every variant
                acceptance = _acceptance(target_dir, vdir, accept_options, baseline, progress)
            results.append(VariantDrift(
                name=variant.name, path=str(out_dir / variant.name), size_bytes=ir_size(vdir),
                rel_err=rel, cosine=cos, rel_err_gguf=rel_g, cosine_gguf=cos_g,
                top1_agreement=top1, kld=kld, output_cosine=out_cos,
                verified=vr.ok, verify_failures=[c.name for c in vr.checks if c.status == "fail"],
                acceptance=acceptance, tensors=meter.tensors,
            ))
            if selector is None and _measures_selector(draft, target_dir):
                step("measuring the DFlash 2 selector against the top-1 path", progress)
                from .selector import selector_gain

                selector = selector_gain(draft, vdir, target, prompts or DEFAULT_PROMPTS)
        plot = plot_drift(results, tmp / "drift.png")
        record = provenance({"source": draft},
                            {"variants": [v.name for v in parsed], "target": str(target_dir) if target_dir else None})
        result = DriftResult(
            source=str(draft.path), out_dir=str(out_dir), contexts=blocks.kind, n_blocks=len(blocks.embeds),
            n_rows=int(sum(len(e) - 1 for e in blocks.embeds)), variants=results,
            plot=str(out_dir / "drift.png") if plot else None, seconds=time.monotonic() - start,
            provenance=record, selector=selector, numerics=numerics("CPU", EXACT),
        )
        write_reports(result, tmp / "drift.json", tmp / "drift.md", title="gguf2ov drift")
    return result


def _measures_selector(draft, target_dir) -> bool:
    """A DFlash 2 draft that carries its selector, with a target to measure it against."""
    from .selector import SELECTOR

    return target_dir is not None and draft.config.is_dflash2 and sum(n.startswith(SELECTOR) for n in draft.ignored) == 3


def _target_alone(target_dir, options: dict, progress: bool):
    from .accept import target_alone

    return target_alone(target_dir, options["prompts"], device=options.get("device", "CPU"), progress=progress)


def _acceptance(target_dir, draft_dir, options: dict, baseline, progress: bool) -> dict:
    from .accept import run_acceptance

    r = run_acceptance(target_dir, draft_dir, progress=progress, baseline=baseline, **options)
    o = r.overall
    return {"verdict": r.verdict, "identical": o.identical, "identical_exact": o.identical_exact,
            "acceptance_rate": o.acceptance_rate,
            "mean_acceptance_length": o.mean_acceptance_length, "tok_s_target": o.tok_s_target,
            "tok_s_draft": o.tok_s_draft, "speedup": o.speedup, "numerics": r.numerics}


def configure_parser(p) -> None:
    p.add_argument("source", help="a dflash GGUF or a converted checkpoint folder")
    p.add_argument("-o", "--output", required=True, help="folder for the variants and drift.json/md/png")
    p.add_argument("--variants", help="comma-separated, e.g. fp32,int8,int4_sym_g16,gguf (default: all of "
                                      "fp32, int8, int4 sym/asym at group 16/32/128, gguf)")
    p.add_argument("--target", help="OpenVINO target folder: contexts from its hidden states, proposals through its lm_head")
    add_prompt_arguments(p)  # image prompts count for --accept only: contexts come from text
    p.add_argument("--accept", action="store_true", help="with --target: also run an acceptance run per variant")
    p.add_argument("--device", default="CPU", help="device of the acceptance runs (default CPU)")
    p.add_argument("--map", help="tensor map YAML to use instead of the shipped one")
    p.add_argument("--target-layer-offset", type=int, help="see gguf2ov convert")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    add_output_arguments(p, inputs=("source", "target", "map", "prompts", "image"), outputs=("output",))


def cli(args) -> int:
    from .genai import prompts_from_args

    if args.accept and not args.target:
        raise Gguf2ovError("--accept needs --target")
    variants = [v for v in args.variants.split(",") if v.strip()] if args.variants else None
    prompts = prompts_from_args(args, default=None)
    result = drift(args.source, args.output, variants=variants, target_dir=args.target,
                   prompts=prompts, map_path=args.map, target_layer_offset=args.target_layer_offset,
                   accept_options={"prompts": prompts or list(DEFAULT_PROMPTS), "device": args.device}
                   if args.accept else None,
                   overwrite=args.overwrite, progress=not args.quiet)
    return emit(result, args, title="gguf2ov drift", text=render(result, "text", title="gguf2ov drift") + "\n",
                code=0 if all(v.verified is not False for v in result.variants) else 1)

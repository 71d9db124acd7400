"""Acceptance run in OpenVINO GenAI: the target alone vs the target with a DFlash draft attached.

Greedy speculative decoding is exact, so the two texts must be byte-identical; what the draft adds
is measured by how many of its proposals the target accepts. A draft can attach without a word
and still propose nothing useful (wrong layer taps, missing seed-row slice, stateless export), so
acceptance is the number that tells a working conversion from a broken one.

Counting (GenAI 2026.4 DFlash path, where `get_num_draft_tokens()` returns 0):
- accepted tokens   = extended_perf_metrics.get_num_accepted_tokens()
- target steps      = len(main_model_metrics.raw_metrics.m_batch_sizes); each step emits the
                      accepted tokens + 1 (the target's own token)
- draft candidates  = sum(draft_model_metrics.raw_metrics.m_batch_sizes)
Derived, with the vLLM names: acceptance rate = accepted / drafted, mean acceptance length =
1 + accepted / target steps; and the share of generated tokens that came from the draft.
"""

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Gguf2ovError, library_message
from ..names import IR_XML
from ..numerics import EXACT, describe_numerics, rounds_unlike_exact
from ..progress import progress as progress_bar
from ..progress import step
from ..report import Table
from ..runtime.arithmetic import measured_numerics
from ..runtime.genai import (PIPELINES, Generation, GenerationSettings, Prompt, as_prompts, describe_layer_types,
                             generate, generation_config, make_pipeline, properties)
from ..runtime.target import TargetIR, require_not_gguf_named
from ..work import count

EXACT_RECHECK = "with dynamic quantization off and an f32 KV cache"


@dataclass(frozen=True)
class PromptAcceptance:
    """One prompt (or the total over all prompts when `prompt` is None)."""

    prompt: str | None
    identical: bool
    generated_tokens: int
    accepted_tokens: int
    draft_candidates: int
    target_steps: int
    acceptance_rate: float  # accepted / drafted
    accepted_share: float  # accepted / generated
    mean_acceptance_length: float  # 1 + accepted / target steps
    tok_s_target: float
    tok_s_draft: float
    speedup: float
    first_difference: int | None = None  # character offset where the texts part, if they do
    text_target: str | None = None
    text_draft: str | None = None
    images: tuple[str, ...] = ()
    # Where the texts part under the CPU plugin's own arithmetic (activations quantized on the fly, a
    # u8 KV cache): whether they agree in exact arithmetic (None: not rechecked). The multi-token
    # verify pass then rounds like decoding.
    identical_exact: bool | None = None

    @property
    def identity(self) -> str:
        """The identity cell of a table: yes, no, or what the recheck in exact arithmetic gave."""
        if self.identical or self.identical_exact is None:
            return "yes" if self.identical else "no"
        return "no; yes exact" if self.identical_exact else "no, nor exact"


@dataclass(frozen=True)
class DraftLength:
    """What k proposals per step cost and give on this device: the step's time (the draft's proposals and
    the target's verify pass over k + 1 tokens) against one decode step of the target alone, measured
    in the pipeline; the tokens a step emits, from the run's acceptance per position; and their ratio,
    the speedup k would give."""

    k: int
    step_cost: float        # a step with k proposals / a decode step
    tokens_per_step: float  # 1 + the acceptance per position summed up to k
    speedup: float          # tokens_per_step / step_cost


@dataclass(frozen=True)
class AcceptResult:
    target_dir: str
    draft_dir: str
    device: str
    precision: str
    max_new_tokens: int
    num_assistant_tokens: int
    repeats: int
    prompts: tuple[PromptAcceptance, ...]
    overall: PromptAcceptance
    verdict: str                      # PASS | MISMATCH | BROKEN | SLOW
    reasons: tuple[str, ...]
    per_position_acceptance: tuple[float, ...]  # P(proposal i accepted | proposed), i = 1..K
    properties: dict = field(default_factory=dict)
    pipeline: str = "LLMPipeline"
    by_kind: dict = field(default_factory=dict)  # "text" / "image" totals when a run has both
    # the device and arithmetic the figures were measured under, read from compiled models
    # (runtime.arithmetic.measured_numerics): reports from two machines compare when these agree
    numerics: dict = field(default_factory=dict)
    target_layers: str = ""  # the target's kinds of layer, when it has several
    draft_lengths: tuple[DraftLength, ...] = ()  # k = 1..K as measured on this device
    best_num_assistant_tokens: int | None = None  # the k of the best estimated speedup
    # The overall figures again at the top level of the JSON, under their usual names.
    FLAT = ("identical", "identical_exact", "accepted_tokens", "draft_candidates", "target_steps", "acceptance_rate",
            "mean_acceptance_length", "tok_s_target", "tok_s_draft", "speedup")

    def json_flat(self) -> dict:
        return {name: getattr(self.overall, name) for name in self.FLAT}

    @property
    def best(self) -> DraftLength | None:
        return next((d for d in self.draft_lengths if d.k == self.best_num_assistant_tokens), None)

    def tables(self) -> list[Table]:
        headers = ["prompt", "identical", "generated", "accepted", "drafted", "target steps",
                   "accepted/drafted", "accepted/generated", "mean accept len", "tok/s target", "tok/s draft",
                   "speedup"]

        def row(label, p: PromptAcceptance):
            return [label, p.identity, p.generated_tokens, p.accepted_tokens, p.draft_candidates,
                    p.target_steps, p.acceptance_rate, p.accepted_share, p.mean_acceptance_length,
                    p.tok_s_target, p.tok_s_draft, p.speedup]

        rows = [row(f"{i} (image)" if p.images else str(i), p) for i, p in enumerate(self.prompts)]
        rows += [row(f"all {kind}", total) for kind, total in self.by_kind.items()]
        rows.append(row("all", self.overall))
        note = (f"{self.pipeline}, K={self.num_assistant_tokens} assistant tokens, {self.max_new_tokens} new tokens, "
                f"{self.device} {self.precision}, throughput = median of {self.repeats} run(s) after a warm-up"
                + (f"; {describe_numerics(self.numerics)}" if self.numerics else ""))
        tables = [Table("Acceptance: target alone vs target + DFlash draft", headers, rows, note)]
        if self.per_position_acceptance:
            tables.append(Table("Acceptance per draft position", ["position", "accepted when proposed"],
                                [[i + 1, p if p == p else "never proposed"]  # nan: no step proposed that many
                                 for i, p in enumerate(self.per_position_acceptance)]))
        if self.numerics.get("models"):
            tables.append(arithmetic_table(self.numerics))
        if self.draft_lengths:
            tables.append(Table(
                "Proposals per step on this device", ["K", "step / decode step", "tokens per step", "speedup (est.)"],
                [[("*" if d.k == self.best_num_assistant_tokens else "") + str(d.k), d.step_cost, d.tokens_per_step,
                  d.speedup] for d in self.draft_lengths],
                note=f"a step's time with K proposals (draft and verify) over a decode step of the target alone, both "
                     f"measured in the pipeline (median of {PROBE_ROUNDS} {PROBE_TOKENS}-token probes at each K); tokens per step from the "
                     f"acceptance per position at K={self.num_assistant_tokens}; * the best"))
        return tables

    def summary(self) -> list[str]:
        o = self.overall
        lines = [f"verdict: {self.verdict}", *(f"reason: {r}" for r in self.reasons),
            f"greedy text with the draft: {'identical to' if o.identical else 'DIFFERENT from'} the target alone"
            + ("" if o.identical else f" ({sum(not p.identical for p in self.prompts)} of {len(self.prompts)} prompts)")
            + ("" if o.identical or o.identical_exact is None else
               f"; identical {EXACT_RECHECK}" if o.identical_exact else f"; also {EXACT_RECHECK}"),
            f"accepted {o.accepted_tokens} of {o.generated_tokens} generated tokens ({o.accepted_share:.1%}); "
            f"acceptance rate {o.acceptance_rate:.1%} of {o.draft_candidates} drafted; "
            f"mean acceptance length {o.mean_acceptance_length:.2f} tokens per target step",
            f"throughput {o.tok_s_target:.1f} tok/s alone, {o.tok_s_draft:.1f} tok/s with the draft "
            f"(speedup {o.speedup:.2f}x)",
        ]
        for kind, total in self.by_kind.items():
            lines.append(f"{kind} prompts: accepted {total.accepted_tokens} of {total.generated_tokens} "
                         f"({total.accepted_share:.1%}), text {'identical' if total.identical else 'DIFFERENT'}")
        if (best := self.best) is not None:
            # K itself has no estimate when its last positions were never proposed (short generations)
            at = next((d for d in self.draft_lengths if d.k == self.num_assistant_tokens), None)
            lines.append(f"proposals per step that pay best on this device: K={best.k} (estimated {best.speedup:.2f}x: "
                         f"{best.tokens_per_step:.2f} tokens per step for {best.step_cost:.2f} decode steps; at "
                         + (f"K={at.k}: {at.speedup:.2f}x estimated, " if at else
                            f"K={self.num_assistant_tokens}: no estimate, its last positions never proposed; ")
                         + f"{o.speedup:.2f}x measured)")
        lines.append(f"pipeline: {self.pipeline} on {self.device}, target {self.target_dir}{self.target_layers}"
                     + (f" ({describe_numerics(self.numerics)})" if self.numerics else ""))
        return lines


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _first_difference(a: str, b: str) -> int | None:
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def require_draft_dir(draft_dir: Path) -> None:
    """What an acceptance run needs of the draft's folder, checked before the minutes the target alone takes
    (the target's was checked when it was opened: runtime.target.require_target_dir)."""
    require_not_gguf_named("draft", draft_dir)
    if not draft_dir.is_dir():
        raise Gguf2ovError(f"draft folder {draft_dir} does not exist")
    if not (draft_dir / IR_XML).is_file():
        raise Gguf2ovError(f"draft folder {draft_dir} has no openvino_model.xml",
                           hint="export the draft first (gguf2ov export)")


def per_position_acceptance(runs: list[Generation], k: int) -> tuple[float, ...]:
    """P(the i-th proposal is accepted | it was proposed), from the per-step counts.

    Each verify step after the prefill emits accepted + 1 tokens for the draft call before it; a last
    step with one token left to generate runs without a draft call and emits that token (GenAI
    2026.4.1, measured). When the counts do not line up that way (another GenAI version), nothing is
    derived.
    """
    accepted_at, proposed_at = [0] * k, [0] * k
    for run in runs:
        steps, calls = list(run.emitted_per_step[1:]), run.drafted_per_call
        while len(steps) > len(calls) and steps[-1] == 1:  # undrafted last steps: one token each
            steps.pop()
        if len(steps) != len(calls) or sum(e - 1 for e in steps) != run.accepted:
            return ()
        for emitted, drafted in zip(steps, calls):
            for i in range(min(drafted, k)):
                proposed_at[i] += 1
                accepted_at[i] += i < emitted - 1
    return tuple(a / p if p else float("nan") for a, p in zip(accepted_at, proposed_at))


# New tokens of the short generation that measures a step's cost at each number of proposals, and the
# numbers of proposals measured (those up to the run's own, which is measured too).
PROBE_TOKENS = 32
PROBE_ROUNDS = 3
PROBED = (1, 2, 3, 4, 5, 7, 10, 15)


def probed_lengths(k: int) -> tuple[int, ...]:
    return tuple(sorted({n for n in PROBED if n <= k} | {k}))


def draft_lengths(positions: tuple[float, ...], step_seconds: dict[int, float],
                  decode_seconds: float) -> tuple[DraftLength, ...]:
    """For each k measured: its step's cost against a decode step, the tokens a step emits with k
    proposals (1 + P(proposal i accepted) summed over i <= k: a block's proposals are accepted as a
    prefix), and their ratio. Empty when the counts or the times are not there."""
    import math

    if not positions or not decode_seconds > 0:
        return ()
    out = []
    for k, seconds in sorted(step_seconds.items()):
        accepted = positions[:k]
        if len(accepted) < k or not all(math.isfinite(a) for a in accepted) or not seconds > 0:
            continue
        tokens = 1 + sum(accepted)
        cost = seconds / decode_seconds
        out.append(DraftLength(k, cost, tokens, tokens / cost))
    return tuple(out)


# An attached draft whose proposals the target takes less often than this is not working.
BROKEN_BELOW = 0.05
MISMATCH_AT_F32 = "greedy text with the draft differs from the target alone at f32"


def judge(overall: PromptAcceptance, precision: str) -> tuple[str, list[str]]:
    """The verdict on an acceptance run, and why."""
    if not overall.identical and precision == "f32" and not overall.identical_exact:
        return "MISMATCH", [f"{MISMATCH_AT_F32}: the pipeline accepted a token the target would not have produced"]
    if overall.identical:
        reasons = []
    elif precision == "f32":
        reasons = ["greedy text with the draft differs from the target alone under the CPU plugin's own "
                   "arithmetic (its dynamic quantization of activations and its KV cache precision, as in force on "
                   f"this CPU); rerun {EXACT_RECHECK}, the texts are identical: the runtime rounds the multi-token "
                   "verify pass differently from single-token decoding, the draft proposed nothing the target would "
                   "not have produced"]
    else:
        reasons = ["greedy text differs at the device's default precision (bf16 rounding in the multi-token verify "
                   "pass can do that); rerun with --precision f32 to compare byte for byte"]
    if not overall.acceptance_rate >= BROKEN_BELOW:  # also NaN: nothing drafted
        return "BROKEN", reasons + [f"the target accepted {overall.accepted_tokens} of {overall.draft_candidates} "
                                    f"proposals ({overall.acceptance_rate:.1%}): the draft is attached but not working"]
    if not overall.speedup >= 1.0:
        return "SLOW", reasons + [f"proposals are accepted ({overall.acceptance_rate:.1%}) but generation is "
                                  f"{overall.speedup:.2f}x the target alone: on this device the target is too light "
                                  "for the draft's overhead to pay off"]
    return "PASS", reasons


def target_cause(target: TargetIR):
    """The failing finding of the target's graph that changes its text with a draft attached, whatever
    the draft proposes (RoPE positions wrong in a multi-token step once paged: target.positions); None
    when the graph shows none."""
    from ..targets.checks import paged_model
    from ..targets.positions import positions_finding

    model = TargetIR(target.path, target.kind).model  # read for this check alone: `target` stays released
    try:
        finding = positions_finding(paged_model(model), model)
    except RuntimeError:  # a conversion GenAI would have failed first
        return None
    return finding if finding.status == "fail" else None


def _pipeline_runs(target: TargetIR, draft_dir, settings: GenerationSettings, props: dict, prompts, warm_up: bool = True,
                   show: bool = False, failed: str = "", hint: str | None = None,
                   probes: tuple[int, ...] = ()) -> tuple[list[list[Generation]], dict[int, float]]:
    """Per prompt, its `settings.repeats` greedy generations in one GenAI pipeline (the target alone
    when `draft_dir` is None), the pipeline dropped before returning; and, for each k of `probes`, the
    time a step takes in a short generation of the first prompt with k proposals per step in the same
    pipeline (k = 0: a decoded token of the target alone). GenAI's errors become one Gguf2ovError:
    `failed` says what was being run, `hint` what to check."""
    s = settings
    try:
        pipe = make_pipeline(target, s.device, props, draft_dir, s.num_assistant_tokens)
        speculative = draft_dir is not None
        cfg = generation_config(pipe, s.max_new_tokens, s.num_assistant_tokens if speculative else None,
                                s.apply_chat_template)
        if warm_up:  # the first call compiles kernels and allocates the KV cache
            generate(pipe, prompts[0], cfg, speculative)
        runs: list[list[Generation]] = [[] for _ in prompts]
        label = "target+draft" if speculative else "target"
        for _ in range(s.repeats):
            for i, p in enumerate(progress_bar(prompts, desc=label, enabled=show, unit="prompt")):
                runs[i].append(generate(pipe, p, cfg, speculative))
        times: dict[int, list[float]] = {k: [] for k in probes}
        for _ in range(PROBE_ROUNDS if probes else 0):  # rounds over every k: a busy core slows all of them alike
            for k in probes:
                probe = generation_config(pipe, PROBE_TOKENS, k or None, s.apply_chat_template)
                r = generate(pipe, prompts[0], probe, k > 0)
                times[k].append(r.seconds / max(r.steps if k else r.generated, 1))
        probed = {k: statistics.median(v) for k, v in times.items()}
        del pipe
        return runs, probed
    except Gguf2ovError:
        raise
    except Exception as e:  # GenAI reports everything as RuntimeError with a C++ message
        reason = library_message(e, limit=600)
        raise Gguf2ovError(f"OpenVINO GenAI failed {failed}: {reason}", hint=genai_hint(reason) or hint) from e


# What GenAI's own words point at, for the hint under its reason (none: no guess is made).
_GENAI_HINTS = (
    (("hidden-state RT info", "Eagle3 fallback"),
     "the target IR must carry hidden_states_decoder_layers that GenAI can use: gguf2ov verify --target shows "
     "target-locators; a target built by gguf2ov target has them"),
    (("unmanaged state op",),
     "OpenVINO's paged conversion left state ops in the target (a Gated DeltaNet or conv subgraph its fusions do "
     "not match): gguf2ov verify --target shows target-paged"),
    (("linear-attention window", "num_linear_attention_blocks"),
     "GenAI's linear-attention state pool is too small for this many proposals: lower --num-assistant-tokens"),
    (("token-embedding Gather",),
     "GenAI found no embedding Gather to attach the draft to (GenAI's own GGUF reader makes such a target): build "
     "the target with gguf2ov target"),
)


def genai_hint(reason: str) -> str | None:
    return next((hint for phrases, hint in _GENAI_HINTS if any(p in reason for p in phrases)), None)


@dataclass(frozen=True)
class Baseline:
    """The target alone on a set of prompts: what every draft's run is compared with. It does not
    depend on the draft, and on a real CPU target it costs minutes, so a job makes it once."""

    target_dir: Path
    prompts: tuple[Prompt, ...]
    settings: GenerationSettings  # as the target alone ran (`alone()`: no proposals)
    runs: tuple                   # per prompt, its timed Generations
    token_seconds: float = float("nan")  # a decoded token, in the probe every draft length is measured against


def _prompts(prompts) -> tuple[Prompt, ...]:
    prompts = tuple(p for p in as_prompts(prompts) if p.text.strip() or p.images)
    if not prompts:
        raise Gguf2ovError("no prompts to run")
    return prompts


def target_alone(target: TargetIR, prompts, settings: GenerationSettings = GenerationSettings(),
                 progress: bool = True) -> Baseline:
    """Greedy generation with the target alone (runtime.target.TargetIR, as the job opened it), once, for
    any number of drafts' runs."""
    prompts, settings = _prompts(prompts), settings.check().alone()
    if target.kind != "vlm" and any(p.images for p in prompts):
        raise Gguf2ovError(f"image prompts need a VLM target; {target.path} is a text model",
                           hint="pass a folder exported with optimum-intel's image-text-to-text task")
    step(f"target alone ({PIPELINES[target.kind]}): {len(prompts)} prompt(s) x {settings.repeats}", progress)
    count("target-alone baselines (GenAI)")
    runs, probed = _pipeline_runs(target, None, settings, properties(settings.precision, settings.device), prompts,
                                  show=progress, failed=f"on target {target.path}",
                                  hint="check that the target folder runs on its own (gguf2ov verify --target)",
                                  probes=(0,))
    return Baseline(target.path, prompts, settings, tuple(tuple(r) for r in runs), probed[0])


def run_acceptance(target: TargetIR, draft_dir, prompts, settings: GenerationSettings = GenerationSettings(),
                   baseline: Baseline | None = None, explain=None, progress: bool = True) -> AcceptResult:
    """Generate greedily with the target alone (or take `baseline`, made once for several drafts)
    and with the draft attached; compare and count. `target`: the runtime.target.TargetIR the job
    opened. `explain() -> [reasons]` says why a draft that is never accepted is not working (the job
    gives verify's findings)."""
    draft_dir = Path(draft_dir)
    prompts, gen = _prompts(prompts), settings.check()
    require_draft_dir(draft_dir)
    if baseline is None:
        baseline = target_alone(target, prompts, gen, progress=progress)
    elif (baseline.target_dir, baseline.prompts, baseline.settings) != (target.path, prompts, gen.alone()):
        raise ValueError("the baseline was made for another target, prompts or settings")
    props = properties(gen.precision, gen.device)
    base = [list(r) for r in baseline.runs]

    step(f"target + draft (K={gen.num_assistant_tokens}): {len(prompts)} prompt(s) x {gen.repeats}", progress)
    spec, probed = _pipeline_runs(target, draft_dir, gen, props, prompts, show=progress,
                                  failed=f"on target {target.path} with draft {draft_dir}",
                                  probes=probed_lengths(gen.num_assistant_tokens))
    per_prompt = [_prompt_acceptance(p, b_runs, s_runs) for p, b_runs, s_runs in zip(prompts, base, spec)]
    in_force = measured_numerics({"target": target.model_path, "draft": draft_dir / IR_XML}, gen.device, props)
    if gen.precision == "f32" and rounds_unlike_exact(in_force):
        per_prompt = _recheck_exactly(per_prompt, prompts, target, draft_dir, gen, props, progress)
    overall = _total(per_prompt, base, spec)
    by_kind = _totals_by_kind(per_prompt, base, spec, prompts)
    # Image prompts count for identical text; acceptance is judged on the text prompts when there are any.
    judged = dataclasses.replace(by_kind["text"], identical=overall.identical,
                                 identical_exact=overall.identical_exact) if by_kind else overall
    positions = per_position_acceptance([runs[-1] for runs in spec], gen.num_assistant_tokens)
    lengths = draft_lengths(positions, probed, baseline.token_seconds)
    best = max(lengths, key=lambda d: d.speedup).k if lengths else None
    verdict, reasons = _verdict(judged, gen, target, lengths, best, explain)
    return AcceptResult(
        verdict=verdict,
        reasons=tuple(reasons),
        per_position_acceptance=positions,
        target_dir=str(target.path),
        draft_dir=str(draft_dir),
        device=gen.device,
        precision=gen.precision,
        max_new_tokens=gen.max_new_tokens,
        num_assistant_tokens=gen.num_assistant_tokens,
        repeats=gen.repeats,
        prompts=tuple(per_prompt),
        overall=overall,
        properties=props,
        pipeline=PIPELINES[target.kind],
        by_kind=by_kind,
        numerics=in_force,
        target_layers=describe_layer_types(target.layer_types),
        draft_lengths=lengths,
        best_num_assistant_tokens=best,
    )


def arithmetic_table(info: dict) -> Table:
    """The MatMuls of each model by weight form, and whether the compiled model quantizes their activations."""
    rows = [[role, f["form"], f["kernel"], f["matmuls"], f["weights"], f["path"]]
            for role, forms in info["models"].items() for f in forms]
    return Table("Arithmetic of the compiled models", ["model", "weight form", "kernel", "MatMuls", "weights",
                                                       "activations"], rows,
                 note="each weight form compiled alone with the run's properties and again with dynamic quantization "
                      "off: int8 where its output moved")


def _prompt_acceptance(prompt: Prompt, base: list[Generation], spec: list[Generation]) -> PromptAcceptance:
    """One prompt's figures: its last runs alone (`base`) and with the draft (`spec`) compared and counted,
    throughput the median over its runs."""
    b, s = base[-1], spec[-1]
    tok_s_t = statistics.median(r.generated / r.seconds for r in base)
    tok_s_d = statistics.median(r.generated / r.seconds for r in spec)
    return PromptAcceptance(
        prompt=prompt.text,
        images=prompt.images,
        identical=b.text == s.text,
        generated_tokens=s.generated,
        accepted_tokens=s.accepted,
        draft_candidates=s.drafted,
        target_steps=s.steps,
        acceptance_rate=_ratio(s.accepted, s.drafted),
        accepted_share=_ratio(s.accepted, s.generated),
        mean_acceptance_length=1 + _ratio(s.accepted, s.steps),
        tok_s_target=tok_s_t,
        tok_s_draft=tok_s_d,
        speedup=_ratio(tok_s_d, tok_s_t),
        first_difference=_first_difference(b.text, s.text),
        text_target=b.text,
        text_draft=s.text,
    )


def _totals_by_kind(per_prompt, base, spec, prompts) -> dict[str, PromptAcceptance]:
    """The totals over the text prompts and over the image prompts, when a run has both ({} otherwise)."""
    kinds = sorted({p.kind for p in prompts})
    if len(kinds) < 2:
        return {}
    return {k: _total(*zip(*[(a, b, c) for a, b, c, p in zip(per_prompt, base, spec, prompts) if p.kind == k]))
            for k in kinds}


def _verdict(judged: PromptAcceptance, gen: GenerationSettings, target: TargetIR, lengths, best: int | None,
             explain) -> tuple[str, list[str]]:
    """`judge`'s verdict, with what explains it: the target graph's own cause of a MISMATCH, `explain()`'s
    of a BROKEN draft, and for a SLOW one the number of proposals per step that would pay."""
    verdict, reasons = judge(judged, gen.precision)
    if verdict == "MISMATCH" and (cause := target_cause(target)) is not None:
        reasons = [f"{MISMATCH_AT_F32}, and the target's graph says why ({cause.name}): {cause.reason}"]
    if verdict == "BROKEN" and explain is not None:
        reasons += explain()
    if verdict == "SLOW" and best is not None and best != gen.num_assistant_tokens and \
            next(d for d in lengths if d.k == best).speedup > 1.0:
        d = next(d for d in lengths if d.k == best)
        reasons.append(f"with {best} proposals per step instead of {gen.num_assistant_tokens} the draft would pay on "
                       f"this device (estimated {d.speedup:.2f}x): pass --num-assistant-tokens {best}")
    return verdict, reasons


def _recheck_exactly(per_prompt, prompts, target: TargetIR, draft_dir, settings: GenerationSettings, props,
                     progress) -> list[PromptAcceptance]:
    """The prompts whose texts part, generated again with the plugin's dynamic quantization off and a
    float32 KV cache (its default is u8 on x86: the real Gemma 3 target's greedy text
    parts from float32 at a near tie under it).

    With it on (VNNI/AMX CPUs, compressed weights) the target's verify pass over K+1 tokens and its
    single-token decoding can round differently: measured on the widened fixture target exported by
    optimum as int4, 1 of 5 prompts parted at the default group size 32 and none with it off. Only
    the differing prompts are rerun, once each, so a run whose texts agree costs nothing more.
    """
    differing = [i for i, p in enumerate(per_prompt) if not p.identical]
    if not differing:
        return per_prompt
    exact = {**props, **EXACT}
    subset = [prompts[i] for i in differing]
    step(f"texts part on {len(subset)} prompt(s) under the plugin's arithmetic: rechecking {EXACT_RECHECK}", progress)
    once = dataclasses.replace(settings, repeats=1)
    texts = [[runs[0].text for runs in _pipeline_runs(
        target, draft, once, exact, subset, warm_up=False,
        failed=f"rechecking {draft_dir} on {target.path} {EXACT_RECHECK}")[0]] for draft in (None, draft_dir)]
    out = list(per_prompt)
    for i, alone, drafted in zip(differing, *texts):
        out[i] = dataclasses.replace(out[i], identical_exact=alone == drafted)
    return out


def _total(per_prompt, base, spec) -> PromptAcceptance:
    """The figures over a set of prompts; throughput is total tokens over total time, each prompt's
    time being its median run."""
    gen = sum(p.generated_tokens for p in per_prompt)
    acc = sum(p.accepted_tokens for p in per_prompt)
    drafted = sum(p.draft_candidates for p in per_prompt)
    steps = sum(p.target_steps for p in per_prompt)
    t_target = sum(statistics.median(r.seconds for r in runs) for runs in base)
    t_draft = sum(statistics.median(r.seconds for r in runs) for runs in spec)
    tok_s_t = _ratio(sum(runs[-1].generated for runs in base), t_target)
    tok_s_d = _ratio(gen, t_draft)
    return PromptAcceptance(
        prompt=None,
        identical=all(p.identical for p in per_prompt),
        identical_exact=None if all(p.identical_exact is None for p in per_prompt)
        else all(p.identical or p.identical_exact for p in per_prompt),
        generated_tokens=gen,
        accepted_tokens=acc,
        draft_candidates=drafted,
        target_steps=steps,
        acceptance_rate=_ratio(acc, drafted),
        accepted_share=_ratio(acc, gen),
        mean_acceptance_length=1 + _ratio(acc, steps),
        tok_s_target=tok_s_t,
        tok_s_draft=tok_s_d,
        speedup=_ratio(tok_s_d, tok_s_t),
    )

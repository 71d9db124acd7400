"""Which target layers was the draft trained on? Measure it: the tap scan.

A draft that reads the wrong target layers (llama.cpp's first DFlash converter wrote the ids
unshifted, the current one writes HF id + 1) loads, attaches and keeps greedy text identical; it
is only accepted less. Metadata cannot settle which layout a file has, the function can: the draft
predicts the target's next tokens best from the layers it was trained on.

The scan runs the target once per prompt (its greedy continuation, then one pass with every layer
it can tap as an output), builds the blocks GenAI would feed the draft there (as `selector.py`
does), and runs the draft IR, compiled once, on the contexts made from the configured layer ids,
from the ids shifted by -2..+2 (where they stay inside the target), and from any set the caller
names. Each set is scored by how well the draft's rows, through the target's lm_head, predict the
target's own next tokens: mean log-probability per proposal, top-1 agreement per block position,
and the accepted length (leading matches) per block.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import Gguf2ovError
from ..report import Table

SHIFTS = (-2, -1, 1, 2)
# How two layer sets are compared: block by block. Each block gets the mean log-probability of the
# target's next tokens under the draft's proposals, and set A beats set B by the share of blocks on
# which A's is higher (ties count half). The mean log-probability over all blocks is shown but not
# used to decide: a few badly predicted tokens dominate it, and it ranked a one-layer shift above
# the trained ids on one prompt set of the tiny-dflash fixture while the trained ids won 79% of
# those blocks.
# Margin = the best set's lowest share against any other set, minus one half. Measured on a draft
# trained on its own taps alone (the tiny-dflash fixture before it was trained against shifted taps;
# 36-60 blocks of 7 proposals), the trained ids beat their one-layer shifts on 75-89% of blocks
# (margin 0.25-0.39) although acceptance in GenAI did not move (418/500 at the trained ids, 419
# and 418 one layer off); on tiny-vlm, 97-98%. The fixtures as shipped lose every accepted token
# one layer off and the scan gives margin 0.5 (benchmarks/tap_shift.md). With no difference
# between two sets the share is 0.5 +- 0.5/sqrt(n) if blocks were independent: a margin of 0.15 (65%
# of blocks) is 2.3 such deviations at 60 blocks (one-sided chance ~1%) and 1.8 at 36 (~4%).
# Blocks of one prompt overlap, so chance is somewhat higher than that; 0.15 still sits well below
# every one-layer shift measured on the fixtures.
CLEAR_MARGIN = 0.15
# Below this many blocks chance reaches CLEAR_MARGIN too often (1.5 deviations, ~7%, at 24 blocks):
# the scan then only says it cannot tell.
MIN_BLOCKS = 24
# A draft whose best layer set agrees with the target's next token on fewer proposals than this
# predicts nothing anywhere (random weights, a broken export): which layers fit it least badly says
# nothing about its training, so the scan does not judge the ids. Trained fixture drafts reach
# 0.70-0.90 even one layer off.
MIN_TOP1 = 0.1
DEFAULT_NEW_TOKENS = 48
DEFAULT_BLOCKS_PER_PROMPT = 12

# verdicts
FITS, UNCLEAR, MISFIT, ALONE, NO_FIT = "fits", "unclear", "misfit", "alone", "no-fit"


@dataclass(frozen=True)
class TapSet:
    label: str                 # "configured", "shift -1", "named 1"
    ids: list[int]
    shift: int | None          # from the configured ids; None for a named set
    mean_logprob: float        # of the target's next token, per proposal
    top1: float                # share of proposals equal to the target's next token
    accepted: float            # mean leading matches per block
    top1_by_position: list[float]
    beats_configured: float    # share of blocks on which this set scores higher than the configured ids
    lowest_share: float        # its lowest share of blocks against any other set


@dataclass(frozen=True)
class TapScan:
    draft_dir: str
    target_dir: str
    configured: list[int]
    sets: list[TapSet]
    best: str                  # label of the set that beats every other on the most blocks
    best_ids: list[int]
    best_shift: int | None
    margin: float | None       # the best set's lowest share against another set, minus 0.5
    lag: float                 # the best set's share against the configured ids, minus 0.5 (0: they are the best)
    verdict: str               # fits | unclear | misfit | alone
    blocks: int
    proposals: int
    prompts: int
    seconds: float
    threshold: float = CLEAR_MARGIN
    skipped: list[str] = field(default_factory=list)  # shifts outside the target's layers

    def set(self, label: str) -> TapSet:
        return next(s for s in self.sets if s.label == label)

    @property
    def clear(self) -> bool:
        return self.verdict in (FITS, MISFIT)

    def finding(self, offset_used: int | None = None) -> str:
        """One sentence: what the scan says about the configured ids. `offset_used`: the
        --target-layer-offset the draft was made with (a GGUF source), to name the one that fits."""
        conf = self.set("configured")
        head = f"configured ids {self.configured}"
        if self.verdict == ALONE:
            return f"{head}: no other layer set inside the target to compare with ({', '.join(self.skipped)} out of range)"
        of = f"of {self.blocks} blocks"
        if self.verdict == NO_FIT:
            top = max(s.top1 for s in self.sets)
            return (f"{head}: the draft predicts the target's next token at no layer set (best top-1 {top:.3f} < "
                    f"{MIN_TOP1}): not a question of layers (untrained or broken draft?)")
        if self.verdict == FITS:
            return (f"{head} fit best: they beat every other set on at least {100 * conf.lowest_share:.0f}% {of} "
                    f"(margin {self.margin:.2f}, threshold {self.threshold})")
        best = self.set(self.best)
        if self.verdict == MISFIT:
            return (f"{head} are not the layers the draft was trained on: {self.best} {self.best_ids} beats them on "
                    f"{100 * (0.5 + self.lag):.0f}% {of} and every other set on at least {100 * best.lowest_share:.0f}%"
                    + (f"; {offset_hint(self.best_shift, offset_used)}" if self.best_shift is not None else ""))
        if self.best == "configured":
            return (f"{head} fit best, but beat another set on only {100 * conf.lowest_share:.0f}% {of} (margin "
                    f"{self.margin:.2f} < {self.threshold}): too close to tell"
                    + (" with this few blocks" if self.blocks < MIN_BLOCKS else ""))
        return (f"{head}: {self.best} {self.best_ids} beats them on {100 * (0.5 + self.lag):.0f}% {of}, too few to "
                f"tell (margin {self.margin:.2f}, threshold {self.threshold})")

    def tables(self) -> list[Table]:
        n = len(self.sets[0].top1_by_position) if self.sets else 0
        rows = [[s.label, s.ids, s.beats_configured if s.shift != 0 else None, s.lowest_share,
                 s.mean_logprob, s.top1, s.accepted, *s.top1_by_position] for s in self.sets]
        headers = ["layers", "ids", "beats configured", "lowest share", "mean log-prob", "top-1", "accepted/block"] + \
                  [f"pos {i + 1}" for i in range(n)]
        note = (f"{self.blocks} blocks of {self.proposals} proposals on the target's greedy text from {self.prompts} "
                f"prompt(s), {self.seconds:.1f} s. 'beats configured': share of blocks on which the set's mean "
                "log-probability of the target's next tokens is higher; 'lowest share': the same against its "
                "strongest rival; 'pos i': top-1 agreement of proposal i. Best: "
                f"{self.best} {self.best_ids}" + (f", margin {self.margin:.2f}" if self.margin is not None else "")
                + (f". Out of range: {', '.join(self.skipped)}" if self.skipped else ""))
        return [Table("Target layer tap scan", headers, rows, note)]

    def summary(self) -> list[str]:
        return [f"tap scan {self.verdict}: {self.finding()}"]


def offset_hint(shift: int, offset_used: int | None = None) -> str:
    if offset_used is None:
        return f"the ids {'+' if shift > 0 else '-'} {abs(shift)} fit (a GGUF: --target-layer-offset {shift:+d} from the one used)"
    return f"made with --target-layer-offset {offset_used}, the GGUF fits --target-layer-offset {offset_used + shift}"


def candidate_sets(configured, tappable, shifts=SHIFTS, named=()) -> tuple[dict[str, list[int]], list[str]]:
    """{label: ids} to score, and the labels of shifts left out because an id falls outside `tappable`."""
    tappable = set(tappable)
    sets = {"configured": list(configured)}
    skipped = []
    for s in shifts:
        ids = [i + s for i in configured]
        if s == 0:
            continue
        if all(i in tappable for i in ids):
            sets[f"shift {s:+d}"] = ids
        else:
            skipped.append(f"shift {s:+d}")
    items = named.items() if isinstance(named, dict) else ((f"named {k}", ids) for k, ids in enumerate(named, 1))
    for label, ids in items:
        ids = [int(i) for i in ids]
        if len(ids) != len(configured):
            raise Gguf2ovError(f"layer set {ids} has {len(ids)} ids; the draft reads {len(configured)}")
        if not all(i in tappable for i in ids):
            raise Gguf2ovError(f"layer set {ids} is outside the target's layers {min(tappable)}..{max(tappable)}")
        if ids not in sets.values():
            sets[label] = ids
    return sets, skipped


def score_sets(draft, target, prompts, sets: dict[str, list[int]],
               new_tokens: int = DEFAULT_NEW_TOKENS, blocks_per_prompt: int = DEFAULT_BLOCKS_PER_PROMPT):
    """Score every layer set of `draft` (a draft_ir.DraftIR) on the same blocks.

    Returns ([TapSet], blocks, proposals, prompts used)."""
    from .selector import accepted, continuations, draft_logits, log_softmax

    config = draft.config
    mask, block = config.mask_token_id, config.block_size
    layers = sorted({i for ids in sets.values() for i in ids})
    found = continuations(target, prompts, layers, block, new_tokens, blocks_per_prompt)
    if not found:
        raise Gguf2ovError("the prompts gave no target continuation to scan the draft's layers on")
    blocks = [(c, p) for c in found for p in c.anchors]
    embeds = [target.embed(c.rows(p, block, mask)) for c, p in blocks]
    truths = [c.truth(p, block) for c, p in blocks]
    # the target's part is done but for its head: its compiled model goes before the draft's comes,
    # so the scan peaks at the larger of the two, not at both (the next use compiles it again)
    target.release()
    # one run for all sets: each segment is compiled once
    rows = draft.run_blocks([(e, c.context(ids, p)) for ids in sets.values() for e, (c, p) in zip(embeds, blocks)])
    per_block, stats = {}, {}
    for k, label in enumerate(sets):
        logps, hits, lengths = [], [], []
        for out, truth in zip(rows[k * len(blocks):(k + 1) * len(blocks)], truths):
            logp = log_softmax(draft_logits(out, target, config, dtype=np.float32))
            top = logp.argmax(-1)
            logps.append(logp[np.arange(len(truth)), truth])
            hits.append(top == truth)
            lengths.append(accepted(top, truth))
        per_block[label] = np.array([x.mean() for x in logps])
        stats[label] = (float(np.mean(np.concatenate(logps))), np.stack(hits), float(np.mean(lengths)))
    scored = []
    for label, ids in sets.items():
        shares = {other: _share(per_block[label], per_block[other]) for other in sets if other != label}
        shift = 0 if label == "configured" else int(label.split()[1]) if label.startswith("shift ") else None
        mean_logprob, hits, length = stats[label]
        scored.append(TapSet(label, list(ids), shift, round(mean_logprob, 4), round(float(hits.mean()), 4),
                             round(length, 3), [round(float(x), 3) for x in hits.mean(0)],
                             round(shares.get("configured", 0.5), 3), round(min(shares.values(), default=0.5), 3)))
    return scored, len(blocks), block - 1, len(found)


def _share(a: np.ndarray, b: np.ndarray) -> float:
    """Share of blocks on which `a` scores higher than `b`, ties counting half."""
    return float(np.mean((a > b) + 0.5 * (a == b)))


def decide(scored: list[TapSet], blocks: int, threshold: float = CLEAR_MARGIN):
    """(best, margin, lag of the configured ids, verdict)."""
    best = max(scored, key=lambda s: (s.lowest_share, s.label == "configured"))
    if len(scored) == 1:
        return best, None, 0.0, ALONE
    margin = round(best.lowest_share - 0.5, 3)
    lag = 0.0 if best.label == "configured" else round(best.beats_configured - 0.5, 3)
    if max(s.top1 for s in scored) < MIN_TOP1:
        verdict = NO_FIT
    elif blocks < MIN_BLOCKS:
        verdict = UNCLEAR
    elif best.label == "configured":
        verdict = FITS if margin >= threshold else UNCLEAR
    else:
        verdict = MISFIT if margin >= threshold and lag >= threshold else UNCLEAR
    return best, margin, lag, verdict


def scan_taps(draft_dir, target, prompts=None, shifts=SHIFTS, named=(), configured=None,
              new_tokens: int = DEFAULT_NEW_TOKENS, blocks_per_prompt: int = DEFAULT_BLOCKS_PER_PROMPT,
              threshold: float = CLEAR_MARGIN) -> TapScan:
    """Scan the draft IR in `draft_dir` against `target` (a runtime.target.TargetIR).

    `configured` overrides the draft's own target_layer_ids (the ids its config states); `named` are
    further layer sets to score; `prompts` default to accept's.
    """
    from ..runtime.draft_ir import DraftIR
    from ..runtime.genai import DEFAULT_PROMPTS
    start = time.perf_counter()
    draft = DraftIR(draft_dir)
    configured = list(configured or draft.config.target_layer_ids)
    tappable = target.tap_layers
    if not tappable:
        raise Gguf2ovError(f"the target in {target.path} names no hidden-state layers to tap")
    if not all(i in tappable for i in configured):
        raise Gguf2ovError(f"the configured ids {configured} are not all inside the target's layers "
                           f"{tappable[0]}..{tappable[-1]}")
    sets, skipped = candidate_sets(configured, tappable, shifts, named)
    scored, blocks, proposals, used = score_sets(draft, target, prompts or DEFAULT_PROMPTS, sets, new_tokens,
                                                 blocks_per_prompt)
    best, margin, lag, verdict = decide(scored, blocks, threshold)
    return TapScan(str(draft_dir), str(target.path), configured, scored, best.label, best.ids, best.shift, margin,
                   lag, verdict, blocks, proposals, used, round(time.perf_counter() - start, 2), threshold, skipped)


# -- settling an ambiguous GGUF's layer offset by measurement --------------------------------------

@dataclass(frozen=True)
class OffsetDecision:
    """How the target layer offset of a GGUF whose layout is ambiguous was settled by the tap scan."""
    gguf: str
    declared: list[int]              # the file's dflash.target_layers
    why_ambiguous: list[str]
    choices: dict[int, list[int]]    # offset -> the HF ids it gives (valid ones only)
    invalid: dict[int, str]          # offset -> why it is out (ids below 0 or outside the target)
    offset: int
    ids: list[int]
    scan: TapScan

    def sets(self) -> list[TapSet]:
        """The scanned sets, each labelled by the offset that gives it."""
        import dataclasses

        first = next(iter(self.choices))
        return [dataclasses.replace(s, label=f"offset {first}") if s.label == "configured" else s for s in self.scan.sets]

    def summary(self) -> list[str]:
        shares = ", ".join(f"offset {o} {ids}" for o, ids in self.choices.items())
        lines = [f"target layer offset settled by measurement: {self.gguf} declares {self.declared}, ambiguous "
                 f"({'; '.join(self.why_ambiguous)}); scanned {shares} on the target"]
        if len(self.choices) == 1:
            lines.append(f"offset {self.offset} is the only choice inside the target "
                         f"({'; '.join(f'offset {o}: {w}' for o, w in self.invalid.items())}), and the scan does not "
                         f"contradict it ({self.scan.verdict})")
        else:
            best = next(s for s in self.sets() if s.label == f"offset {self.offset}")
            lines.append(f"chosen: --target-layer-offset {self.offset} -> target_layer_ids {self.ids}: higher "
                         f"log-probability of the target's next tokens on {100 * best.lowest_share:.0f}% of "
                         f"{self.scan.blocks} blocks (margin {self.scan.margin:.2f}, threshold {self.scan.threshold}); "
                         f"top-1 {best.top1:.3f} against "
                         + ", ".join(f"{s.top1:.3f} at {s.label}" for s in self.sets() if s is not best))
        return lines

    def tables(self) -> list[Table]:
        import dataclasses

        tables = dataclasses.replace(self.scan, sets=self.sets(), best=f"offset {self.offset}").tables()
        tables[0].title = "Target layer offset, measured"
        return tables

    def record(self) -> dict:
        """What provenance keeps of the decision."""
        return {"offset": self.offset, "ids": self.ids, "declared": self.declared, "why_ambiguous": self.why_ambiguous,
                "choices": {str(k): v for k, v in self.choices.items()}, "verdict": self.scan.verdict,
                "margin": self.scan.margin, "blocks": self.scan.blocks,
                "sets": {s.label: {"ids": s.ids, "lowest_share": s.lowest_share, "mean_logprob": s.mean_logprob,
                                   "top1": s.top1} for s in self.sets()}}


def settle_offset(gguf, amap, target, scan, progress: bool = True) -> OffsetDecision | None:
    """The target layer offset of a GGUF whose layout is ambiguous, measured against `target` (a
    runtime.target.TargetIR) with the tap scan; None when the file settles it. Refuses (Gguf2ovError)
    when the measurement cannot tell. `scan(offset, shifts, named) -> TapScan` scans the GGUF read with
    that offset (the job exports it to a temporary folder first)."""
    from ..maps.messages import flag_option
    from ..progress import step

    why = amap.metadata.flag_ambiguity(gguf, "target_layer_offset")
    if not why:
        return None
    hf_key, gguf_key = amap.metadata.flag_rule("target_layer_offset")
    rule = amap.config[hf_key]
    declared = list(gguf.metadata[gguf_key])
    tappable = set(target.tap_layers)
    choices, invalid = {}, {}
    for offset in rule.get("choices", {}):
        ids = [i + int(offset) for i in declared]
        if any(i < rule.get("min", 0) for i in ids):
            invalid[int(offset)] = f"ids {ids} below {rule.get('min', 0)}"
        elif not all(i in tappable for i in ids):
            invalid[int(offset)] = f"ids {ids} outside the target's layers"
        else:
            choices[int(offset)] = ids
    flag = flag_option(rule["flag"])
    if not choices:
        raise Gguf2ovError(f"{gguf.path}: no choice of {flag} puts {declared} inside the target "
                           f"({'; '.join(f'offset {o}: {w}' for o, w in invalid.items())})",
                           hint="is this the target the draft was made for?")
    first = next(iter(choices))
    step(f"{gguf.path.name}: target layer layout ambiguous; measuring offsets {sorted(choices)} against "
         f"{target.path}", progress)
    others = {f"offset {o}": ids for o, ids in choices.items() if o != first}
    single = not others
    result = scan(first, SHIFTS if single else (), others)
    labels = {"configured": first, **{f"offset {o}": o for o in choices}}
    if single:
        if result.verdict == MISFIT:
            raise Gguf2ovError(f"{gguf.path}: {flag} {first} is the only choice inside the target, but the tap "
                               f"scan says the draft fits other layers: {result.finding()}",
                               hint="is this the target the draft was made for?")
        return OffsetDecision(str(gguf.path), declared, why, choices, invalid, first, choices[first], result)
    if not result.clear:
        raise Gguf2ovError(f"{gguf.path}: the tap scan cannot tell which {flag} fits: {result.finding()}",
                           hint=f"pass {flag} explicitly (-1: the current llama.cpp converter, 0: its first one), "
                                "or scan with more prompts (--prompts)")
    offset = labels[result.best]
    return OffsetDecision(str(gguf.path), declared, why, choices, invalid, offset, choices[offset], result)

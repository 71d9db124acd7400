"""What a DFlash 2 draft's candidate selector would add, measured offline against the target.

OpenVINO GenAI proposes the top-1 of each block row (the draft's hidden state through the
target's lm_head). DFlash 2's selector instead walks the rows greedily over the top-k candidates,
scoring each by the draft logit plus a low-rank pairwise term with the previous pick:
`S_t(a, b) = U_t(b) + <A(a) * H(h_t), B(b)>` (z-lab's `CandidateSelector`). Both paths are valid
proposals; the selector's is accepted longer when it is trained. This module measures both on the
same blocks, against the target's own greedy continuation, so the cost of running without the
selector is a number instead of a guess.
"""

from dataclasses import dataclass

import numpy as np

from ..errors import Gguf2ovError
from ..report import Table
from ..runtime.genai import text_prompts

SELECTOR = "candidate_selector."
DEFAULT_TOP_K = 16


@dataclass(frozen=True)
class SelectorGain:
    blocks: int
    proposals: int            # rows proposed per block (block size - 1)
    top_k: int
    top1_accepted: float      # mean accepted tokens per block, GenAI's top-1 path
    selector_accepted: float  # the same for the selector's greedy path
    top1_by_position: list[float]
    selector_by_position: list[float]

    def table(self) -> Table:
        rows = [["top-1 (GenAI)", self.top1_accepted, *self.top1_by_position],
                ["selector path", self.selector_accepted, *self.selector_by_position]]
        headers = ["path", "mean accepted"] + [f"pos {i + 1}" for i in range(self.proposals)]
        note = (f"{self.blocks} blocks on the target's greedy continuation, {self.proposals} proposals each, "
                f"selector over the top {self.top_k}; 'pos i': share of blocks that accept proposal i. "
                "The selector is not part of the IR: GenAI runs the top-1 path.")
        return Table("DFlash 2 selector, offline", headers, rows, note)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def draft_logits(hidden: np.ndarray, target, config, dtype=np.float64) -> np.ndarray:
    """The draft's logits U_t: the target's lm_head on the rows (`target.head_logits`, the weight as
    stored, as GenAI grafts it), then the draft's own multiplier and softcap when its config has them
    (they reorder nothing for top-1 but change the selector's sums)."""
    logits = target.head_logits(hidden).astype(dtype, copy=False)
    scale = config.logit_scale
    if scale:
        logits = logits * float(scale)
    cap = config.final_logit_softcapping
    if cap:
        logits = float(cap) * np.tanh(logits / float(cap))
    return logits


def selector_walk(logits: np.ndarray, hidden: np.ndarray, anchor: int, weights: dict, top_k: int) -> list[int]:
    """The selector's greedy path over the rows: logits [T, V], hidden [T, H] (final-normed rows)."""
    gate = hidden.astype(np.float64) @ weights["hidden_projection.weight"].T.astype(np.float64)  # [T, R]
    before, after = weights["predecessor_codebook"], weights["successor_codebook"]
    k = min(top_k, logits.shape[1])
    picked, previous = [], anchor
    for t in range(logits.shape[0]):
        candidates = np.argsort(-logits[t], kind="stable")[:k]
        scores = logits[t, candidates] + (before[previous] * gate[t]) @ after[candidates].T
        previous = int(candidates[int(np.argmax(scores))])
        picked.append(previous)
    return picked


def accepted(proposal, truth) -> int:
    """How many leading proposals the target's greedy text accepts."""
    n = 0
    for p, t in zip(proposal, truth):
        if p != t:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Continuation:
    """One prompt followed by the target's own greedy text, with the target's hidden states at
    `layers` over it and the block anchors chosen in it.

    A block anchored at position p is what GenAI feeds the draft there: the rows [sequence[p], mask
    x (block - 1)], the context of the states at positions 0..p-1, and the target's next tokens
    sequence[p+1 : p+block] as the truth its proposals are accepted against.
    """
    prompt_len: int
    sequence: np.ndarray
    layers: list[int]
    states: np.ndarray   # [len(layers), T, H]
    anchors: list[int]

    def context(self, layer_ids, p: int) -> np.ndarray:
        """The draft's hidden_states input for a block at `p`: the states at `layer_ids`, concatenated."""
        return np.concatenate([self.states[self.layers.index(i), :p] for i in layer_ids], axis=-1)

    def rows(self, p: int, block: int, mask_token_id: int) -> np.ndarray:
        rows = np.full(block, mask_token_id, dtype=np.int64)
        rows[0] = self.sequence[p]  # the last token the target committed
        return rows

    def truth(self, p: int, block: int) -> np.ndarray:
        return self.sequence[p + 1:p + block]


def continuations(target, prompts, layers, block: int, new_tokens: int = 48,
                  blocks_per_prompt: int = 12) -> list[Continuation]:
    """Per text prompt: the target's greedy continuation, one pass for its states at every one of
    `layers`, and up to `blocks_per_prompt` anchors spread from the prompt's end to the last
    position whose block rows all have a true next token."""
    layers = list(layers)
    found = []
    for text in text_prompts(prompts):
        prompt = target.tokenize(text)
        if len(prompt) < 1:
            continue
        sequence = target.greedy(prompt, new_tokens)
        last = len(sequence) - block
        starts = np.unique(np.linspace(len(prompt) - 1, last, num=max(1, min(blocks_per_prompt, last - len(prompt) + 2))).astype(int))
        anchors = [int(p) for p in starts if p >= 1]
        if anchors:
            found.append(Continuation(len(prompt), sequence, layers, target.layer_states(sequence, layers), anchors))
    return found


def selector_gain(draft, draft_dir, target, prompts, new_tokens: int = 48, blocks_per_prompt: int = 12) -> SelectorGain:
    """Top-1 path against the selector's, on blocks anchored in the target's greedy continuation.

    `draft` is the opened DraftSource (its selector tensors), `draft_dir` its exported fp32 IR (the
    rows both paths read), `target` a `runtime.target.TargetIR`.
    """
    from ..runtime.draft_ir import DraftIR

    config = draft.config
    names = [n for n in draft.ignored if n.startswith(SELECTOR)]
    if len(names) < 3:
        raise Gguf2ovError(f"{draft.path} carries no candidate selector to measure")
    weights = {n[len(SELECTOR):]: draft.f32(n) for n in names}
    top_k = config.selector_top_k or DEFAULT_TOP_K
    block = config.block_size
    ids = config.target_layer_ids
    embeds, contexts, anchors, truths = [], [], [], []
    for c in continuations(target, prompts, ids, block, new_tokens, blocks_per_prompt):
        for p in c.anchors:
            embeds.append(target.embed(c.rows(p, block, config.mask_token_id)))
            contexts.append(c.context(ids, p))
            anchors.append(int(c.sequence[p]))
            truths.append(c.truth(p, block))
    if not embeds:
        raise Gguf2ovError("the prompts gave no target continuation to measure the selector on")
    outputs = DraftIR(draft_dir).run_blocks(list(zip(embeds, contexts)))
    top1, walked = [], []
    for out, anchor, truth in zip(outputs, anchors, truths):
        logits = draft_logits(out, target, config)
        top1.append(accepted(logits.argmax(-1), truth))
        walked.append(accepted(selector_walk(logits, out, anchor, weights, top_k), truth))
    proposals = block - 1

    def by_position(counts):
        return [round(float(np.mean([c > i for c in counts])), 3) for i in range(proposals)]

    return SelectorGain(blocks=len(top1), proposals=proposals, top_k=int(top_k),
                        top1_accepted=round(float(np.mean(top1)), 3), selector_accepted=round(float(np.mean(walked)), 3),
                        top1_by_position=by_position(top1), selector_by_position=by_position(walked))

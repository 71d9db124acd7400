"""The DFlash 2 selector's offline measurement: its walk, the accepted length, the target's greedy text."""

from types import SimpleNamespace

import numpy as np

from gguf2ov.checks.selector import accepted, draft_logits, selector_walk
from gguf2ov.draft.config import draft_config
from gguf2ov.runtime.target import TargetIR

# a valid draft config: the multiplier and softcap live under dflash_config, as a DFlash 2 config holds them
CONFIG = {"model_type": "qwen3", "hidden_size": 2, "num_hidden_layers": 1, "num_attention_heads": 1,
          "num_key_value_heads": 1, "intermediate_size": 4,
          "dflash_config": {"target_layer_ids": [0], "mask_token_id": 0}}


def test_the_walk_follows_the_pairwise_term_over_the_top_k():
    # 2 rows, vocabulary 4, rank 1. Row 0's logits prefer token 1, row 1's token 2.
    logits = np.array([[0.0, 2.0, 1.9, -5.0], [0.0, 1.0, 1.5, 9.0]])
    hidden = np.ones((2, 3))
    weights = {"hidden_projection.weight": np.array([[1.0, 0.0, 0.0]]),          # H(h_t) = 1
               "predecessor_codebook": np.array([[1.0], [0.0], [1.0], [3.0]]),  # A(a)
               "successor_codebook": np.array([[0.0], [0.0], [0.5], [0.0]])}    # B(b)
    # row 0, predecessor = anchor 0 (A = 1): token 2 scores 1.9 + 0.5, above token 1's 2.0
    # row 1, predecessor 2 (A = 1), top-2 are tokens 3 (9.0) and 2 (1.5 + 0.5): token 3
    assert selector_walk(logits, hidden, anchor=0, weights=weights, top_k=2) == [2, 3]
    # top-1 of 4 in row 1 would still be 3; with top_k=1 the walk is the plain top-1 path
    assert selector_walk(logits, hidden, anchor=0, weights=weights, top_k=1) == [1, 3]
    # a zero pairwise term leaves the top-1 path
    weights["successor_codebook"] = np.zeros((4, 1))
    assert selector_walk(logits, hidden, anchor=0, weights=weights, top_k=4) == list(logits.argmax(-1))


def test_accepted_counts_the_leading_matches_only():
    assert accepted([5, 6, 7], [5, 6, 7]) == 3
    assert accepted([5, 9, 7], [5, 6, 7]) == 1
    assert accepted([9, 6, 7], [5, 6, 7]) == 0


def test_draft_logits_apply_the_drafts_multiplier_and_softcap():
    hidden, weight = np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    head = SimpleNamespace(head_logits=lambda rows: rows @ weight.T)  # a target's lm_head
    plain = draft_logits(hidden, head, SimpleNamespace(logit_scale=None, final_logit_softcapping=None))
    np.testing.assert_allclose(plain, [[1.0, 2.0]])
    config = draft_config({**CONFIG, "dflash_config": {**CONFIG["dflash_config"], "output_multiplier": 10.0,
                                                      "final_logit_softcapping": 5.0}}, "config")
    capped = draft_logits(hidden, head, config)
    np.testing.assert_allclose(capped, 5.0 * np.tanh(np.array([[10.0, 20.0]]) / 5.0))


def test_greedy_continuation_is_the_targets_own_next_token_at_every_step(fixtures_dir):
    """Decoding with the KV state gives the tokens a full forward pass over the sequence predicts."""
    target = TargetIR.open(fixtures_dir / "target")
    prompt = target.tokenize("The history of the printing press begins")
    sequence = target.greedy(prompt, 12)
    assert len(sequence) == len(prompt) + 12 and list(sequence[:len(prompt)]) == list(prompt)
    logits = target.logits(sequence)
    assert list(logits[len(prompt) - 1:-1].argmax(-1)) == list(sequence[len(prompt):])


def test_the_walk_is_the_pytorch_references_walk():
    import torch

    from gguf2ov.tools.dflash2_torch import CandidateSelector

    torch.manual_seed(0)
    selector = CandidateSelector(hidden_size=32, rank=6, vocab_size=50, top_k=5)
    with torch.no_grad():
        for p in selector.parameters():
            p.normal_()
    weights = {n: p.detach().numpy().astype(np.float64) for n, p in selector.named_parameters()}
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        logits, hidden = torch.randn(7, 50, generator=g) * 3, torch.randn(7, 32, generator=g)
        ours = selector_walk(logits.numpy().astype(np.float64), hidden.numpy(), anchor=seed, weights=weights, top_k=5)
        assert ours == selector.select(logits, hidden, torch.tensor(seed)).tolist()

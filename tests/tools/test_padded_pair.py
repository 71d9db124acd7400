"""The fixture pair padded to a bigger geometry computes the fixture's functions (benchmarks/padded_pair.py).

Checked at the small geometries the module keeps for this (hidden 512, 6 layers, 8 heads of 128 in groups of 4
with an untied head as Qwen3-8B, in groups of 2 with a tied head as Qwen3-1.7B, vocabulary 1024): the padded
target against the fixture's in transformers' own forward (float64, so that only the construction differs:
norm weights rescaled in float32 are the one rounding left, 1e-7 relative), the draft's outputs through the
NumPy reference on what each target gives it, and (slow) gguf2ov's target built from the padded checkpoint and
the pair in GenAI.
"""

import json

import numpy as np
import pytest

from benchmark_scripts import benchmark
from gguf2ov.errors import Gguf2ovError

pp = benchmark("padded_pair")
SMALL = ["small", "small-tied"]
TOLERANCE = 1e-5  # float64 forwards; observed 1.7e-6 on logits up to 15, from the norm weights' float32 rounding
NEW_TOKENS = 30


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """The small padded pairs, written once: geometry name -> folder with target-hf and draft-hf."""
    folders = {}
    for name in SMALL:
        folders[name] = tmp_path_factory.mktemp(name)
        pp.write_padded_pair(pp.GEOMETRIES[name], folders[name])
    return folders


def _model(path, dtype):
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), output_loading_info=True)
    # from_pretrained keeps random values for a key it does not find: every key must be there
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def _ids(prompt):
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pp.FIXTURE / "target-hf"))
    return tokenizer(prompt, return_tensors="pt").input_ids.to(torch.long)


@pytest.mark.parametrize("name", SMALL)
def test_padded_target_computes_the_fixture_target_in_transformers(name, padded):
    import torch

    geom = pp.GEOMETRIES[name]
    fixture_config = json.loads((pp.FIXTURE / "target-hf" / "config.json").read_text())
    pad = pp.padding_of(fixture_config, geom)
    vocab, h = fixture_config["vocab_size"], fixture_config["hidden_size"]
    fixture, target = _model(pp.FIXTURE / "target-hf", "float64"), _model(padded[name] / "target-hf", "float64")
    assert target.config.hidden_size == geom.hidden and target.config.num_hidden_layers == geom.layers
    assert target.model.embed_tokens.weight.shape == (geom.vocab, geom.hidden)
    fixture_taps = pp.read_fixture().draft_config["dflash_config"]["target_layer_ids"]
    taps = pp.draft_taps(fixture_taps, geom, fixture_config["num_hidden_layers"])
    for prompt in pp.prompts():
        ids = _ids(prompt)
        with torch.no_grad():
            a, b = fixture(ids, output_hidden_states=True), target(ids, output_hidden_states=True)
        # the real vocabulary's logits up to one constant a position (0 with an untied head; a tied head reads
        # the embedding's constant channel), and no padded token anywhere near them
        diff = b.logits[0, :, :vocab] - a.logits[0]
        shift = diff.mean(-1, keepdim=True)
        assert float((diff - shift).abs().max()) < TOLERANCE
        assert float(shift.abs().max()) < (0.01 if geom.tied else TOLERANCE)
        assert float(b.logits[0, :, vocab:].max()) < float(a.logits[0].min()) - 50
        # what the draft reads: the fixture's hidden states times beta, the constant channel, zeros
        for k, k2 in taps.items():
            t, t2 = fixture_taps[k], geom.taps[k2]
            state, padded_state = a.hidden_states[t + 1][0], b.hidden_states[t2 + 1][0]
            assert float((padded_state[:, :h] / pad.beta - state).abs().max()) < TOLERANCE
            assert torch.all(padded_state[:, pad.channel] == pad.constant)
            assert not padded_state[:, pad.channel + 1:].any()
    assert float(a.logits.abs().max()) > 5  # the model computes something to compare

    fixture, target = _model(pp.FIXTURE / "target-hf", "float32"), _model(padded[name] / "target-hf", "float32")
    for prompt in pp.prompts()[:1]:  # all five in OpenVINO (slow, below)
        ids = _ids(prompt)
        greedy = [m.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False) for m in (fixture, target)]
        assert greedy[0].shape[1] == ids.shape[1] + NEW_TOKENS and greedy[0].equal(greedy[1])


@pytest.mark.parametrize("name", SMALL)
def test_padded_draft_computes_the_fixture_draft(name, padded):
    """The NumPy reference of each draft (optimum-intel's class, tests/draft) on what its own target gives it: the
    embeddings of a block and the hidden states at its taps; the same logits on the real vocabulary."""
    import torch

    from gguf2ov.draft.reference import reference_outputs
    from gguf2ov.draft.source import open_draft_checkpoint
    from gguf2ov.runtime.draft_ir import block_feeds

    geom = pp.GEOMETRIES[name]
    fx = pp.read_fixture()
    vocab, block, mask = (fx.target_config["vocab_size"], fx.draft_config["dflash_config"]["block_size"],
                          fx.draft_config["dflash_config"]["mask_token_id"])
    runs = [(_model(pp.FIXTURE / "target-hf", "float32"), open_draft_checkpoint(pp.FIXTURE / "draft-ref"),
             fx.draft_config["dflash_config"]["target_layer_ids"]),
            (_model(padded[name] / "target-hf", "float32"), open_draft_checkpoint(padded[name] / "draft-hf"),
             geom.taps)]
    assert runs[1][1].config.num_layers == geom.draft_layers
    for prompt in pp.prompts():
        ids = _ids(prompt)
        tokens = np.array([int(ids[0, -1])] + [mask] * (block - 1))
        logits = []
        for model, draft, taps in runs:
            with torch.no_grad():
                states = model(ids, output_hidden_states=True).hidden_states
            context = np.concatenate([states[t + 1][0].numpy() for t in taps], -1)
            embeds = model.model.embed_tokens.weight.detach().numpy()
            rows = reference_outputs(draft, [block_feeds(embeds[tokens], context)])[0][0]
            logits.append(rows @ model.lm_head.weight.detach().numpy().T)
        diff = logits[1][:, :vocab] - logits[0]
        assert float(np.abs(diff - diff.mean(-1, keepdims=True)).max()) < 1e-4  # float32
        assert (logits[1].argmax(-1) == logits[0].argmax(-1)).all()
        assert logits[1][:, vocab:].max() < logits[0].min() - 50


def test_the_real_geometries_pad_consistently():
    """Qwen3-8B's and Qwen3-1.7B's: beta 4 (2 would need c^2 < 0), the head norms' epsilon within 1% of the
    fixture's, and the fixture's taps read by the padded draft's third and fourth."""
    fx = pp.read_fixture()
    for name in ("padded-8b", "padded-1.7b"):
        geom = pp.GEOMETRIES[name]
        pad = pp.padding_of(fx.target_config, geom)
        assert pad.beta == 4 and pad.constant > 0.04 and pad.eps_padded > 0
        assert abs(pad.record()["head_norm_eps"] / pad.eps - 1) < 0.01
        assert pp.draft_taps(fx.draft_config["dflash_config"]["target_layer_ids"], geom, 4) == {0: 2, 1: 3}


def test_a_geometry_that_cannot_hold_the_fixture_is_refused():
    from dataclasses import replace

    fx = pp.read_fixture()
    small = pp.GEOMETRIES["small"]
    with pytest.raises(Gguf2ovError, match="no tap of"):  # no tap reads fixture layer 2's output (padded 3-4)
        pp.draft_taps([1, 2], replace(small, taps=(0, 2, 5)), 4)
    with pytest.raises(Gguf2ovError, match="cannot hold 4/2"):
        pp.padding_of(fx.target_config, replace(small, heads=8, kv_heads=8))
    with pytest.raises(Gguf2ovError, match="RoPE's pairs"):
        pp.padding_of(fx.target_config, replace(small, head_dim=96))
    with pytest.raises(Gguf2ovError, match="positions"):
        pp.padding_of(fx.target_config, replace(small, positions=(0, 2, 2, 5)))


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL)
def test_padded_pair_runs_in_openvino_and_genai_like_the_fixture_pair(name, padded, tmp_path):
    """gguf2ov's target built from each checkpoint (f32): the same greedy text and real-vocabulary logits; the
    pairs in GenAI: the same text, and the same tokens accepted."""
    from opened import build_target
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job, Options
    from gguf2ov.runtime.genai import GenerationSettings, read_prompts
    from gguf2ov.runtime.target import TargetIR
    from gguf2ov.stages.accept import run_acceptance

    vocab = pp.read_fixture().target_config["vocab_size"]
    folders = {"fixture": (pp.FIXTURE / "target-hf", pp.FIXTURE / "draft-ref"),
               "padded": (padded[name] / "target-hf", padded[name] / "draft-hf")}
    pairs = {}
    for label, (target_hf, draft_hf) in folders.items():
        build_target(target_hf, tmp_path / f"{label}-target", weight_format="fp32")
        draft = Job.of(draft_hf, None, Options(progress=False)).export(tmp_path / f"{label}-draft",
                                                                         parse_variant("fp32")).out_dir
        pairs[label] = (TargetIR.open(tmp_path / f"{label}-target"), draft)
    fixture, target = pairs["fixture"][0], pairs["padded"][0]
    for prompt in pp.prompts():
        ids = fixture.tokenize(prompt)
        assert np.array_equal(fixture.greedy(ids, NEW_TOKENS), target.greedy(ids, NEW_TOKENS))
        diff = target.logits(ids)[..., :vocab] - fixture.logits(ids)
        assert float(np.abs(diff - diff.mean(-1, keepdims=True)).max()) < 1e-4
    settings = GenerationSettings(max_new_tokens=40, num_assistant_tokens=7)
    runs = [run_acceptance(t, d, read_prompts(pp.FIXTURE / "prompts.txt"), settings, progress=False)
            for t, d in pairs.values()]
    for a, b in zip(runs[0].prompts, runs[1].prompts):
        assert a.text_target == a.text_draft == b.text_target == b.text_draft
    assert runs[0].overall.accepted_tokens == runs[1].overall.accepted_tokens > runs[0].overall.generated_tokens // 2

"""The target graph built with OpenVINO's opset equals optimum-intel's `text-generation-with-past` export.

optimum-intel's export of the same checkpoint is the reference, on the fixture target (qwen3, tied,
fp16 weights) and on random geometries of each architecture (target_builders.GEOMETRIES): the same
inputs, outputs and state variables, the rt_info GenAI reads, the hidden-state locators optimum's
convention gives, the same logits and hidden states at every locator over two stateful steps
(within 1e-5 relative in float32), and the same conversion by SDPAToPagedAttention (what GenAI
runs on a target with a draft attached): per layer the scale, sliding window and head geometry.
The graph is also held to transformers' PyTorch model directly, which covers gemma3, whose optimum
export needs its version limit lifted.
"""

import numpy as np
import pytest
import target_builders as tb

from gguf2ov.targets.graph import build_target_ir, target_forms
from opened import open_target
from gguf2ov.ir.variants import parse_variant
from gguf2ov.ir.weights import save_ir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["fixture", *tb.GEOMETRIES])
def pair(request, tmp_path_factory):
    """(checkpoint folder, our IR, optimum's IR) for one geometry."""
    work = tmp_path_factory.mktemp(request.param)
    if request.param == "fixture":
        hf = tb.FIXTURE_TARGET
    else:
        hf = tb.write_target_checkpoint(work / "hf", tb.GEOMETRIES[request.param], seed=3)
    theirs = tb.optimum_export(hf, work / "optimum")
    return hf, tb.target_ir(hf, work / "ours"), theirs / "openvino_model.xml"


def test_interface_equals_optimums(pair):
    _, ours, theirs = pair
    assert tb.interface(ours) == tb.interface(theirs)


def test_rt_info_and_locators_follow_optimum(pair):
    import openvino as ov

    hf, ours, theirs = pair
    a, b = ov.Core().read_model(str(ours)), ov.Core().read_model(str(theirs))
    # what GenAI reads: the locators (optimum writes them for qwen3 only) and the runtime options
    assert tb.locators(ours) == tb.optimum_locators(hf, theirs)
    for key in ("ACTIVATIONS_SCALE_FACTOR", "KV_CACHE_PRECISION"):
        assert str(a.get_rt_info(["runtime_options", key])) == str(b.get_rt_info(["runtime_options", key]))
    # optimum describes its trace (the PyTorch frontend's conversion_parameters and Runtime_version,
    # optimum's versions); we name the variant instead
    keys = lambda m: set(m.get_rt_info().keys())  # noqa: E731
    assert keys(b) - keys(a) == {"conversion_parameters", "optimum", "Runtime_version"}
    assert keys(a) - keys(b) <= {"gguf2ov", "hidden_states_decoder_layers"}


def test_logits_and_hidden_states_over_two_steps_equal_optimums(pair):
    hf, ours, theirs = pair
    vocab = tb.config_of(hf)["vocab_size"]
    steps = tb.steps(vocab)  # 7 then 3 tokens: past every sliding window of the geometries
    a = tb.run_steps(ours, steps, tb.locators(ours))
    b = tb.run_steps(theirs, steps, tb.optimum_locators(hf, theirs))
    for (logits_a, hidden_a), (logits_b, hidden_b) in zip(a, b):
        assert logits_a.shape == logits_b.shape
        assert tb.relative(logits_a, logits_b) <= 1e-5
        assert hidden_a.keys() == hidden_b.keys()
        for i in hidden_a:
            assert tb.relative(hidden_a[i], hidden_b[i]) <= 1e-5, f"layer {i}"


def test_paged_attention_converts_it_as_optimums(pair):
    _, ours, theirs = pair
    a, b = tb.paged_summary(ours), tb.paged_summary(theirs)
    assert a == b
    assert len(a["attention"]) == len(tb.locators(ours))


def test_logits_and_hidden_states_equal_transformers(pair):
    """The whole sequence in one PyTorch forward against the two stateful steps: transformers' own
    forward (HF hidden_states[i + 1] is layer i's output, the last one after the final norm). The
    IR's rt_info asks for an f16 K/V cache, as optimum's does (3e-4 off in the second step): here
    it is kept in f32."""
    import torch
    from transformers import AutoModelForCausalLM

    hf, ours, _ = pair
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    steps = tb.steps(model.config.vocab_size)
    with torch.no_grad():
        ref = model(torch.tensor(np.concatenate(steps))[None], output_hidden_states=True)
    runs = tb.run_steps(ours, steps, tb.locators(ours), properties={"KV_CACHE_PRECISION": "f32"})
    logits = np.concatenate([r[0] for r in runs], axis=1)
    assert tb.relative(logits, ref.logits.numpy()) <= 1e-4
    for i in runs[0][1]:
        hidden = np.concatenate([r[1][i] for r in runs], axis=1)
        assert tb.relative(hidden, ref.hidden_states[i + 1].numpy()) <= 1e-4, f"layer {i}"


def test_a_wrong_window_is_seen(tmp_path):
    """The sliding window is live: the same weights with every layer attending fully compute something else."""
    geometry = tb.GEOMETRIES["gemma3-sliding-softcap"]
    sliding = tb.write_target_checkpoint(tmp_path / "sliding", geometry, seed=3)
    full = tb.write_target_checkpoint(tmp_path / "full", {**geometry, "layer_types": ["full_attention"] * 3}, seed=3)
    outs = []
    for hf in (sliding, full):
        (hf / "ir").mkdir()
        forms = target_forms(open_target(hf), parse_variant("fp32"))
        save_ir(build_target_ir(forms), hf / "ir", forms)
        outs.append(tb.run_steps(hf / "ir" / "openvino_model.xml", tb.steps(tb.VOCAB))[-1][0])
    assert tb.relative(outs[0], outs[1]) > 1e-3

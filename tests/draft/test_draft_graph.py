"""The draft graph built with OpenVINO's opset equals optimum-intel's trace of its DFlash class.

optimum-intel's `Qwen3DFlashForCausalLM`, traced by its own exporter, is the reference: on the
fixture and on random geometries (other GQA ratios, head_dim != hidden / heads, 1 and 5 target
layers, sliding-window layers) both IRs must have the same interface (names, shapes and types of
inputs, outputs and state variables), the same DFlash rt_info, and the same outputs over two
stateful steps in float32.
"""

import json

import dflash_builders as b
import numpy as np
import pytest

from gguf2ov.job import Job, Options
from gguf2ov.draft.graph import build_draft_ir
from gguf2ov.draft.reference import reference_outputs
from opened import open_draft
from gguf2ov.ir.variants import parse_variant
from gguf2ov.ir.weights import save_ir
from gguf2ov.runtime.draft_ir import block_feeds, run_draft
from gguf2ov.tools.optimum_trace import trace_optimum

pytestmark = pytest.mark.slow

GEOMETRIES = {
    # GQA 3, head_dim 24 != 96 / 6, one target layer
    "gqa3-one-tap": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, head_dim=24,
                         dflash_config={"target_layer_ids": [3], "mask_token_id": 1, "block_size": 4}),
    # GQA 8, head_dim 32 != 64 / 8, five target layers, a sliding layer with a window shorter than the context
    # (and not shorter than the block, where optimum's one-sided window and z-lab's two-sided one differ)
    "gqa8-five-taps-sliding": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
                                   num_key_value_heads=1, head_dim=32, use_sliding_window=True, sliding_window=6,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   is_causal=False,  # optimum's class attends both ways in every layer
                                   dflash_config={"target_layer_ids": [0, 1, 2, 4, 6], "mask_token_id": 3,
                                                  "block_size": 6}),
}


def _steps(config, block: int, contexts=(5, 3), seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    h, n = config.hidden_size, len(config.target_layer_ids)
    steps, past = [], 0
    for ctx in contexts:
        steps.append(block_feeds(rng.standard_normal((block, h), dtype=np.float32),
                                 rng.standard_normal((ctx, n * h), dtype=np.float32), past))
        past += ctx
    return steps


def _interface(model) -> dict:
    def ports(ps):
        return [(sorted(p.get_names()), str(p.get_partial_shape()), p.get_element_type().get_type_name()) for p in ps]

    variables = sorted((v.get_info().variable_id, str(v.get_info().data_shape), v.get_info().data_type.get_type_name())
                       for v in model.get_variables())
    rt = {k: model.get_rt_info(list(k)).astype(str) for k in (("dflash_mode",), ("dflash", "mask_token_id"),
                                                              ("dflash", "target_layer_ids"))}
    return {"inputs": ports(model.inputs), "outputs": ports(model.outputs), "variables": variables, "rt_info": rt}


@pytest.fixture(scope="module", params=["fixture", *GEOMETRIES])
def pair(request, tmp_path_factory, fixtures_dir):
    """(draft source, our IR folder, optimum's IR folder) for one geometry."""
    import openvino as ov

    from gguf2ov.draft.graph import set_dflash_rt_info

    work = tmp_path_factory.mktemp(request.param)
    if request.param == "fixture":
        draft = open_draft(fixtures_dir / "draft-Q4_K_M.gguf")
    else:
        config = {**b.DRAFT_CONFIG, **GEOMETRIES[request.param]}
        draft = open_draft(b.write_checkpoint(work / "ckpt", config, seed=7))
    ours, theirs = work / "ours", work / "optimum"
    ours.mkdir()
    theirs.mkdir()
    model, _ = build_draft_ir(draft, parse_variant("fp32"), progress=False)
    save_ir(model, ours)
    (work / "trace").mkdir()
    traced = trace_optimum(draft, work / "trace" / "openvino_model.xml")
    set_dflash_rt_info(traced, draft.config)  # what the export writes on top of optimum's own
    ov.save_model(traced, str(theirs / "openvino_model.xml"), compress_to_fp16=False)
    return draft, ours, theirs


def test_interface_and_rt_info_equal_optimums(pair):
    import openvino as ov

    _, ours, theirs = pair
    core = ov.Core()
    assert _interface(core.read_model(str(ours / "openvino_model.xml"))) == \
        _interface(core.read_model(str(theirs / "openvino_model.xml")))


def test_outputs_over_two_steps_equal_optimums(pair):
    draft, ours, theirs = pair
    steps = _steps(draft.config, draft.config.block_size or 16)
    a = run_draft(ours / "openvino_model.xml", steps)
    ref = run_draft(theirs / "openvino_model.xml", steps, segmented=False)
    assert a.cache == ref.cache == [[5], [8]]
    for x, y in zip(a.outputs, ref.outputs):
        assert x.shape == y.shape == (1, (draft.config.block_size or 16) - 1, draft.config.hidden_size)
        assert np.abs(x - y).max() <= 1e-5 * np.abs(y).max()
    # and the NumPy reference verify uses (one layer loaded at a time) agrees with both
    for x, y in zip(a.outputs, reference_outputs(draft, steps)):
        assert np.abs(x - y).max() <= 1e-5 * max(1.0, np.abs(y).max())


def test_layer_by_layer_run_equals_the_whole_graph(pair):
    draft, ours, _ = pair
    steps = _steps(draft.config, draft.config.block_size or 16, contexts=(7, 2, 4), seed=3)
    whole = run_draft(ours / "openvino_model.xml", steps, segmented=False)
    layered = run_draft(ours / "openvino_model.xml", steps)
    assert (whole.segments, layered.segments) == (1, draft.config.num_layers + 1)
    assert whole.cache == layered.cache == [[7], [9], [13]]
    for x, y in zip(whole.outputs, layered.outputs):
        assert np.array_equal(x, y)


def test_a_wrong_window_is_seen(tmp_path):
    """The sliding window is live: the same weights with full attention compute something else."""
    config = {**b.DRAFT_CONFIG, **GEOMETRIES["gqa8-five-taps-sliding"]}
    ckpt = b.write_checkpoint(tmp_path / "ckpt", config, seed=7)
    full = b.write_checkpoint(tmp_path / "full", {**config, "layer_types": ["full_attention"] * 3}, seed=7)
    outs = []
    for source in (ckpt, full):
        draft = open_draft(source)
        model, _ = build_draft_ir(draft, parse_variant("fp32"), progress=False)
        (tmp_path / source.name / "ir").mkdir()
        save_ir(model, tmp_path / source.name / "ir")
        outs.append(run_draft(tmp_path / source.name / "ir" / "openvino_model.xml", _steps(draft.config, 6)).outputs[-1])
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


def _export_and_run(tmp_path, name, config, steps):
    draft = open_draft(b.write_checkpoint(tmp_path / name, config, seed=7))
    model, _ = build_draft_ir(draft, parse_variant("fp32"), progress=False)
    (tmp_path / name / "ir").mkdir()
    save_ir(model, tmp_path / name / "ir")
    ours = run_draft(tmp_path / name / "ir" / "openvino_model.xml", steps).outputs
    for x, y in zip(ours, reference_outputs(draft, steps)):
        assert np.abs(x - y).max() <= 1e-5 * max(1.0, np.abs(y).max())
    return draft, ours


def _changed_last_row(steps):
    changed = [dict(s) for s in steps]
    changed[-1]["inputs_embeds"] = changed[-1]["inputs_embeds"].copy()
    changed[-1]["inputs_embeds"][:, -1] += 1.0
    return changed


def test_sliding_layers_of_a_config_without_is_causal_attend_causally(tmp_path):
    """z-lab's reference makes sliding layers causal when the config does not state is_causal;
    optimum-intel's class attends both ways. The export follows the reference and says so."""
    config = {**b.DRAFT_CONFIG, **GEOMETRIES["gqa8-five-taps-sliding"], "layer_types": ["sliding_attention"] * 3}
    del config["is_causal"]
    steps = _steps(open_draft(b.write_checkpoint(tmp_path / "probe", config, seed=7)).config, 6)
    draft, ours = _export_and_run(tmp_path, "causal", config, steps)
    assert draft.config.causal_layers == [True, True, True]
    _, changed = _export_and_run(tmp_path, "causal2", config, _changed_last_row(steps))
    # the first proposal row never sees the block's last row ...
    np.testing.assert_array_equal(ours[-1][0, 0], changed[-1][0, 0])
    assert np.abs(ours[-1][0, -1] - changed[-1][0, -1]).max() > 1e-3
    # ... while optimum's trace of the same weights lets it
    trace = tmp_path / "trace"
    trace.mkdir()
    import openvino as ov

    ov.save_model(trace_optimum(draft, trace / "t.xml"), str(trace / "openvino_model.xml"), compress_to_fp16=False)
    theirs = run_draft(trace / "openvino_model.xml", steps, segmented=False).outputs
    assert np.abs(theirs[-1] - ours[-1]).max() > 1e-3
    result = Job.of(tmp_path / "causal", None, Options(progress=False)).export(tmp_path / "out")
    assert result.causal_layers == [0, 1, 2]
    assert any("attend causally inside the block" in line for line in result.summary())


def test_a_window_shorter_than_the_block_hides_rows_on_both_sides(tmp_path):
    """is_causal false and a window of 2 in a block of 6: a row sees its neighbours only, in both
    directions, so over three layers the first proposal row cannot feel the last row."""
    config = {**b.DRAFT_CONFIG, **GEOMETRIES["gqa8-five-taps-sliding"], "sliding_window": 2,
              "layer_types": ["sliding_attention"] * 3}
    steps = _steps(open_draft(b.write_checkpoint(tmp_path / "probe", config, seed=7)).config, 6)
    _, ours = _export_and_run(tmp_path, "window", config, steps)
    _, changed = _export_and_run(tmp_path, "window2", config, _changed_last_row(steps))
    np.testing.assert_array_equal(ours[-1][0, 0], changed[-1][0, 0])
    assert np.abs(ours[-1][0, 3] - changed[-1][0, 3]).max() > 1e-3  # a neighbour's neighbour's neighbour does


def test_a_v1_draft_scales_its_block_embeddings_as_its_config_and_its_gguf_say(tmp_path):
    """A draft trained on Gemma's scaled embedding states the scale (dflash_config.input_embedding_scale,
    in the GGUF dflash.embedding_scale as llama.cpp's converter writes it); GenAI feeds the draft the
    target table's rows, so the export multiplies them: the draft on rows x equals the unscaled draft
    on s * x, from the checkpoint and from its GGUF alike."""
    from gguf import GGUFReader

    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    scale = 5.656854
    plain = {**b.DRAFT_CONFIG, **GEOMETRIES["gqa3-one-tap"]}
    scaled = json.loads(json.dumps(plain))
    scaled["dflash_config"]["input_embedding_scale"] = scale
    steps = _steps(open_draft(b.write_checkpoint(tmp_path / "probe", plain, seed=7)).config, 4)
    times = [{**s, "inputs_embeds": s["inputs_embeds"] * np.float32(scale)} for s in steps]
    _, want = _export_and_run(tmp_path, "plain", plain, times)
    draft, ours = _export_and_run(tmp_path, "scaled", scaled, steps)
    assert draft.config.input_embedding_scale == pytest.approx(scale)
    for x, y in zip(ours, want):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * max(1.0, np.abs(y).max()))
    gguf = write_dflash_gguf(tmp_path / "scaled", tmp_path / "scaled.gguf", mix="F32").path
    field = GGUFReader(gguf).fields["dflash.embedding_scale"]
    assert float(field.parts[field.data[0]][0]) == pytest.approx(scale)
    assert open_draft(gguf).config.input_embedding_scale == pytest.approx(scale)

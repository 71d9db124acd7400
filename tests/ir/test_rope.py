"""RoPE tables computed in NumPy (gguf2ov/ir/rope.py) against transformers' own rotary embeddings.

The reference is each model type's RotaryEmbedding (llama, qwen2, qwen3, gemma3) run by transformers
5.5.4 on the same config, with one kernel changed: torch's float32 power on CPU is SLEEF's SIMD powf
on whole vectors and libm's powf on the rest, both within 1 ULP but neither correctly rounded, and
rope.py takes the correctly rounded power. `_rounded_power` gives transformers that power (float64,
rounded once to float32); every other step is transformers' own float32 arithmetic, and the tables
must equal it bit for bit, the attention scaling exactly. Unpatched, they are within a few ULP.

The call sites are held to it too: `target_config` (its tables per layer type) and `DraftConfig.rope()`
(a config.json dict, resolved as Qwen3Config resolves it); and neither imports torch or a
`transformers.models.*.modeling_*` module.
"""

import contextlib
import copy
import importlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from gguf2ov.errors import Gguf2ovError
from gguf2ov.draft.config import draft_config, hf_config
from gguf2ov.ir.rope import rope_table
from gguf2ov.targets.source import target_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ROTARY = {"llama": ("llama", "LlamaRotaryEmbedding"), "qwen2": ("qwen2", "Qwen2RotaryEmbedding"),
           "qwen3": ("qwen3", "Qwen3RotaryEmbedding"), "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding")}

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
# bounds 64 / 3 and 64 / 7 are not float32 numbers: transformers compares the wavelengths in float32
LLAMA3_ODD = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 3.0, "high_freq_factor": 7.0,
              "original_max_position_embeddings": 64}
LLAMA3_SMALL = {"rope_type": "llama3", "factor": 2.5, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
                "original_max_position_embeddings": 1000}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
YARN_VARIANTS = {
    "yarn": YARN,
    "yarn-4096": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "yarn-no-truncate": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                         "truncate": False},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
                              "attention_factor": 1.3},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                    "mscale": 1.0, "mscale_all_dim": 0.707},
    "yarn-mscale-only": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 1024,
                         "mscale": 0.8},
    "yarn-betas": {"rope_type": "yarn", "factor": 2.5, "original_max_position_embeddings": 512,
                   "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    # factor 1: no attention scaling; equal correction bounds: transformers' 0.001 guard
    "yarn-factor-1": {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 100000,
                      "beta_fast": 1.0, "beta_slow": 1.0, "truncate": False},
}
ROPES = {"default": None, "linear-2": {"rope_type": "linear", "factor": 2.0},
         "linear-3.7": {"rope_type": "linear", "factor": 3.7}, "linear-legacy-type": {"type": "linear", "factor": 8.0},
         "llama3": LLAMA3, "llama3-odd-bounds": LLAMA3_ODD, "llama3-small": LLAMA3_SMALL, **YARN_VARIANTS}
# (model type, geometry): head_dim as stated or hidden / heads; 24 != 96 / 6 and 16 != 64 / 8
HEADS = {
    "qwen3-128": ("qwen3", dict(hidden_size=512, num_attention_heads=8, head_dim=128)),
    "qwen3-24": ("qwen3", dict(hidden_size=96, num_attention_heads=6, head_dim=24)),
    "qwen3-256": ("qwen3", dict(hidden_size=256, num_attention_heads=4, head_dim=256)),
    "llama-16": ("llama", dict(hidden_size=64, num_attention_heads=8, head_dim=16)),
    "llama-hidden-over-heads": ("llama", dict(hidden_size=768, num_attention_heads=12)),
    "qwen2-hidden-over-heads": ("qwen2", dict(hidden_size=96, num_attention_heads=6)),
    "qwen2-80": ("qwen2", dict(hidden_size=320, num_attention_heads=4, head_dim=80)),
}
BASES = (10000, 500000.0, 1e6, 123456.789)


@contextlib.contextmanager
def _rounded_power():
    """transformers' `base ** exponents` (a Python number to a float32 tensor), correctly rounded."""
    import torch

    power = torch.Tensor.__rpow__

    def rounded(self, other):
        # torch casts the base to float32; the power taken in float64 and rounded once to float32
        return (torch.tensor(other, dtype=torch.float32).double() ** self.double()).float()

    torch.Tensor.__rpow__ = rounded
    try:
        yield
    finally:
        torch.Tensor.__rpow__ = power


def transformers_tables(hf, rounded: bool = True) -> dict:
    """{layer type: (inv_freq, attention scaling)} from the model type's RotaryEmbedding."""
    package, name = _ROTARY[hf.model_type]
    rotary_class = getattr(importlib.import_module(f"transformers.models.{package}.modeling_{package}"), name)
    with _rounded_power() if rounded else contextlib.nullcontext():
        rotary = rotary_class(copy.deepcopy(hf))  # the rope functions standardize the config in place
    tables = {}
    for layer_type in set(getattr(hf, "layer_types", None) or ["full_attention"]):
        if hasattr(rotary, f"{layer_type}_inv_freq"):  # Gemma 3: one table per layer type
            tables[layer_type] = (getattr(rotary, f"{layer_type}_inv_freq").numpy(),
                                  getattr(rotary, f"{layer_type}_attention_scaling"))
        else:
            tables[layer_type] = (rotary.inv_freq.numpy(), rotary.attention_scaling)
    return tables


def _target_raw(model_type: str, geometry: dict, rope: dict | None, base=None, **extra) -> dict:
    raw = dict(model_type=model_type, intermediate_size=64, num_hidden_layers=2, vocab_size=300,
               max_position_embeddings=131072, **geometry, **extra)
    raw["num_key_value_heads"] = raw["num_attention_heads"]
    if base is not None:
        raw["rope_theta"] = base
    if rope is not None:
        raw["rope_scaling"] = dict(rope)
    return raw


def _hf(raw: dict):
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[raw["model_type"]].from_dict(copy.deepcopy(raw))


def assert_same_tables(ours: dict, theirs: dict):
    assert set(ours) == set(theirs)
    for layer_type, (inv_freq, scaling) in ours.items():
        their_inv_freq, their_scaling = theirs[layer_type]
        assert inv_freq.dtype == np.float32 and their_inv_freq.dtype == np.float32
        assert np.array_equal(inv_freq, their_inv_freq), (layer_type, np.nonzero(inv_freq != their_inv_freq))
        assert scaling == their_scaling, layer_type


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("rope", ROPES)
@pytest.mark.parametrize("heads", HEADS)
def test_a_targets_tables_are_transformers_own(heads, rope, base):
    model_type, geometry = HEADS[heads]
    raw = _target_raw(model_type, geometry, ROPES[rope], base)
    assert_same_tables(target_config(raw, "config.json").rope, transformers_tables(_hf(raw)))


GEMMA3 = dict(model_type="gemma3_text", hidden_size=96, intermediate_size=64, num_hidden_layers=6, vocab_size=300,
              num_attention_heads=6, num_key_value_heads=2, head_dim=24, max_position_embeddings=131072)
GEMMA3_ROPES = {
    # transformers' defaults: 1e6 for full attention, 1e4 (rope_local_base_freq) for sliding
    "defaults": {},
    "bases": {"rope_theta": 500000.0, "rope_local_base_freq": 12345.6},
    # Gemma 3 4B and larger: linear scaling on the full-attention layers only
    "legacy-linear": {"rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_local_base_freq": 10000.0},
    "legacy-llama3": {"rope_scaling": dict(LLAMA3_SMALL, original_max_position_embeddings=512)},
    # transformers 5's own form: one dict per layer type
    "keyed": {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "keyed-llama3-sliding": {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 75000.0},
        "sliding_attention": dict(LLAMA3_ODD, rope_theta=10000.0)}},
    "head-dim-256": {"head_dim": 256, "query_pre_attn_scalar": 256},
}


@pytest.mark.parametrize("rope", GEMMA3_ROPES)
def test_gemma3_has_one_table_per_layer_type(rope):
    raw = {**GEMMA3, **copy.deepcopy(GEMMA3_ROPES[rope])}
    ours = target_config(raw, "config.json").rope
    assert set(ours) == {"full_attention", "sliding_attention"}  # the default pattern: 5 sliding, 1 full
    assert_same_tables(ours, transformers_tables(_hf(raw)))
    # and only the layer types the model has
    raw["layer_types"] = ["full_attention"] * 6
    assert_same_tables(target_config(raw, "config.json").rope, transformers_tables(_hf(raw)))


@pytest.mark.parametrize("factor", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("rope", ["default", "linear-3.7", "llama3", "yarn-4096", "yarn-no-truncate"])
def test_partial_rotary_tables_are_transformers_own(rope, factor):
    """The target refuses a partial rotary embedding; the table it would need is still transformers'
    (the rotary dim int(head_dim * factor); the default RoPE ignores the factor)."""
    raw = _target_raw("qwen3", HEADS["qwen3-24"][1], ROPES[rope], 1e6, partial_rotary_factor=factor)
    hf = _hf(raw)
    ours = rope_table(hf, "full_attention")
    assert_same_tables({"full_attention": ours}, transformers_tables(hf))
    if rope != "default":
        with pytest.raises(Gguf2ovError, match="partial rotary embeddings are not supported"):
            target_config(raw, "config.json")


def test_llama3_compares_the_wavelengths_in_float32():
    """A low-frequency bound a quarter ULP below a wavelength: above it in float64, equal to it in
    float32, as torch compares a float32 tensor with a Python float."""
    import torch

    raw = _target_raw("llama", HEADS["llama-16"][1], None, 10000.0)
    inv_freq = torch.from_numpy(transformers_tables(_hf(raw))["full_attention"][0])
    wavelen = float((2 * math.pi / inv_freq)[4])
    bound = wavelen - float(np.spacing(np.float32(wavelen))) / 4
    low = 8192 / bound
    assert np.float32(8192 / low) == np.float32(wavelen) and 8192 / low < wavelen
    raw["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": low, "high_freq_factor": 4 * low,
                           "original_max_position_embeddings": 8192}
    assert_same_tables(target_config(raw, "config.json").rope, transformers_tables(_hf(raw)))


def test_yarn_without_a_factor_takes_the_ratio_of_the_context_lengths():
    raw = _target_raw("llama", HEADS["llama-16"][1], {"rope_type": "yarn", "factor": None,
                                                      "original_max_position_embeddings": 4096})
    hf = _hf(raw)
    ours = rope_table(hf)
    assert ours[1] == 0.1 * math.log(131072 / 4096) + 1
    assert_same_tables({"full_attention": ours}, transformers_tables(hf))


def test_within_a_few_ulp_of_transformers_as_it_runs():
    """Without the correctly rounded power, torch's tables differ only where its power rounds the
    other way (2 ULP at most measured on this grid)."""
    for heads in HEADS:
        for rope in ROPES:
            model_type, geometry = HEADS[heads]
            raw = _target_raw(model_type, geometry, ROPES[rope], 1e6)
            ours = target_config(raw, "config.json").rope
            for layer_type, (inv_freq, scaling) in transformers_tables(_hf(raw), rounded=False).items():
                mine = ours[layer_type][0].view(np.int32).astype(np.int64)
                ulp = np.abs(mine - inv_freq.view(np.int32).astype(np.int64)).max()
                assert ulp <= 4 and ours[layer_type][1] == scaling, (heads, rope, ulp)


DRAFT = dict(model_type="qwen3", hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=96,
             dflash_config={"target_layer_ids": [0], "mask_token_id": 5})
LEFT_OUT = object()
DRAFT_ROPES = {
    # z-lab's drafts: a top-level base, no scaling
    "z-lab": {"rope_theta": 1000000.0, "rope_scaling": None, "max_position_embeddings": 40960},
    "no-base": {},
    # Qwen3Config's head_dim 128 (here hidden / heads too)
    "no-head-dim": {"head_dim": LEFT_OUT, "hidden_size": 512, "rope_theta": 1e6},
    "transformers-5": {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}},
    "int-base": {"rope_theta": 500000},
    "linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
    "legacy-type-yarn": {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
                         "max_position_embeddings": 16384, "rope_theta": 1e6},
    # original_max_position_embeddings from max_position_embeddings, or Qwen3Config's 32768
    "yarn-from-max-positions": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "max_position_embeddings": 2048},
    "yarn-from-qwen3-default": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    # a top-level original_max_position_embeddings wins over the dict's (transformers' Phi 3 rule)
    "yarn-top-level-original": {"rope_scaling": dict(YARN_VARIANTS["yarn-mscale"]),
                                "original_max_position_embeddings": 1024},
    "llama3": {"rope_scaling": dict(LLAMA3_ODD), "rope_theta": 500000.0},
    "partial-rotary-linear": {"rope_scaling": {"rope_type": "linear", "factor": 3.0}, "partial_rotary_factor": 0.5},
    "partial-rotary-default": {"partial_rotary_factor": 0.5, "rope_theta": 1e6},
}


@pytest.mark.parametrize("rope", DRAFT_ROPES)
def test_a_drafts_rope_is_qwen3s_own(rope):
    raw = {k: v for k, v in {**DRAFT, **DRAFT_ROPES[rope]}.items() if v is not LEFT_OUT}
    draft = draft_config(copy.deepcopy(raw), "config.json")
    theirs = transformers_tables(hf_config(draft))
    assert_same_tables({"full_attention": draft.rope()}, theirs)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_a_rope_type_that_changes_with_the_sequence_length_is_refused(kind):
    rope = {"rope_type": kind, "factor": 2.0}
    if kind == "longrope":
        rope |= {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 64}
    with pytest.raises(Gguf2ovError, match=f"config.json: RoPE type '{kind}' is not supported") as e:
        target_config(_target_raw("llama", HEADS["llama-16"][1], rope), "config.json")
    assert "supported: default, linear, llama3, yarn" in e.value.hint
    gemma = {**GEMMA3, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                           "sliding_attention": dict(rope, rope_theta=1e4)}}
    with pytest.raises(Gguf2ovError, match=f"RoPE type '{kind}' is not supported"):
        target_config(gemma, "config.json")
    draft = draft_config({**DRAFT, "rope_scaling": rope}, "config.json")
    with pytest.raises(Gguf2ovError, match=f"the draft config: RoPE type '{kind}' is not supported"):
        draft.rope()


# Built in a fresh interpreter: the target configs of each architecture and a draft's RoPE, printed.
_BUILD = """
import json, re, sys
{block}
from gguf2ov.draft.config import draft_config
from gguf2ov.targets.source import target_config
targets, draft = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tables = {{name: {{t: [v.tolist(), s] for t, (v, s) in target_config(raw, name).rope.items()}}
          for name, raw in targets.items()}}
inv_freq, scaling = draft_config(draft, "draft").rope()
tables["draft"] = {{"full_attention": [inv_freq.tolist(), scaling]}}
modeling = sorted(m for m in sys.modules if re.match(r"transformers\\.models\\.[^.]+\\.modeling_", m))
print(json.dumps({{"tables": tables, "modeling": modeling, "torch": sys.modules.get("torch") is not None,
                  "transformers": "transformers" in sys.modules}}))
"""


def _build_elsewhere(targets: dict, draft: dict, block_torch: bool) -> dict:
    # sys.modules["torch"] = None: importlib finds no torch (transformers' is_torch_available is
    # False, as without the `reference` extra) and `import torch` raises ModuleNotFoundError
    block = 'sys.modules["torch"] = None' if block_torch else ""
    result = subprocess.run([sys.executable, "-c", _BUILD.format(block=block), json.dumps(targets), json.dumps(draft)],
                            capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_neither_call_site_imports_torch_or_a_modeling_module():
    targets = {"llama3": _target_raw("llama", HEADS["llama-16"][1], LLAMA3),
               "yarn": _target_raw("qwen3", HEADS["qwen3-24"][1], YARN_VARIANTS["yarn-mscale"]),
               "qwen2": _target_raw("qwen2", HEADS["qwen2-hidden-over-heads"][1], ROPES["linear-3.7"]),
               "gemma3": {**GEMMA3, **GEMMA3_ROPES["legacy-linear"]}}
    draft = {**DRAFT, "rope_scaling": dict(YARN)}
    found = _build_elsewhere(targets, draft, block_torch=True)
    assert found["modeling"] == [] and found["torch"] is False and found["transformers"]
    # the same tables as in this process, where transformers has torch
    for name, raw in targets.items():
        expected = {t: [v.tolist(), s] for t, (v, s) in target_config(raw, name).rope.items()}
        assert found["tables"][name] == expected, name
    inv_freq, scaling = draft_config(draft, "draft").rope()
    assert found["tables"]["draft"] == {"full_attention": [inv_freq.tolist(), scaling]}
    # a draft's RoPE alone, torch installed and not blocked, imports neither torch nor transformers
    found = _build_elsewhere({}, draft, block_torch=False)
    assert found["torch"] is False and found["transformers"] is False and found["modeling"] == []

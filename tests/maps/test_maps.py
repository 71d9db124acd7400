import numpy as np
import pytest
from gguf import GGUFValueType
from ggufs import (DRAFT, decoder_kv, decoder_tensors, merged, model_from_map, write_checkpoint_folder, write_dflash,
                   write_gguf)

from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf.read import open_gguf
from gguf2ov.maps.load import MAPS_ENV, load_map, map_for, open_mapped, supported_arches
from gguf2ov.maps.rules import OPS, apply_ops, config_get

DECODER = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def llama_cpp_permute(w, n_head):
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.fixture
def draft(tmp_path):
    path = tmp_path / "draft.gguf"
    tensors = write_dflash(path)
    return open_gguf(path), tensors


def test_every_shipped_yaml_is_a_supported_arch_or_one_refused():
    """A map either converts its architecture or only names it and refuses every file (not_run without
    `when`): the latter is known, not supported, and never listed as supported."""
    from importlib import resources

    from gguf2ov.maps.load import known_arches

    files = sorted(p.name[:-5] for p in resources.files("gguf2ov.tensor_maps").iterdir()
                   if p.name.endswith(".yaml") and not p.name.startswith("_"))
    assert known_arches() == files
    refused = [arch for arch in files if load_map(arch).refuses_every_file]
    assert refused == ["gemma4-assistant"]
    assert supported_arches() == [arch for arch in files if arch not in refused]
    for arch in files:
        assert load_map(arch).arch == arch


def _round_trip(tmp_path, arch):
    """A random model built from the map's own entries, written as a GGUF with the map run backwards:
    (the GGUF path, the HF config, the HF tensors)."""
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    config, state, extra = model_from_map(load_map(arch), np.random.default_rng(7))
    write_checkpoint_folder(tmp_path / "hf", config, state)
    path = tmp_path / f"{arch}.gguf"
    write_from_checkpoint(tmp_path / "hf", path, arch, mix="F32", extra_metadata=extra)
    return path, config, state


def _assert_same_model(amap, config, state, converted_config, converted):
    assert set(converted) == set(state)
    inexact = {rule.hf_name(n) for rule in amap.rules if rule.hf and not all(OPS[op].exact for op, _ in rule.ops)
               for n in range(config_get(config, "num_hidden_layers"))}
    for name, values in state.items():
        if name in inexact:  # an op computed through float64 (exp, log), rounded to float32 each way
            np.testing.assert_allclose(converted[name], values, rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(converted[name], values, err_msg=name)
    for key in amap.config:
        if (value := config_get(config, key)) is not None:
            assert config_get(converted_config, key) == value, key
    for key, value in amap.hf.items():
        if all(key not in fields for fields in amap.group_hf.values()):
            # a fixed dict holds what the file does not state; the rules add the rest (Gemma 4's RoPE bases,
            # gpt-oss's rope_parameters.truncate beside the keys the file states)
            have = converted_config[key]
            assert (merged(have, value) if isinstance(value, dict) else value) == have, key


@pytest.mark.parametrize("arch", supported_arches())
def test_every_map_round_trips_a_model_built_from_it(tmp_path, arch):
    """Every tensor and config rule of the map, HF -> GGUF (the map backwards) -> HF, exactly."""
    path, config, state = _round_trip(tmp_path, arch)
    mapped = open_mapped(path)
    assert mapped.amap.arch == arch
    converted = {hf: x for hf, x, _, _ in mapped.tensors()}
    _assert_same_model(mapped.amap, config, state, mapped.config, converted)


NEW_ARCH = """
# A decoder the package has never heard of: one YAML file, no Python.
arch: tinydec
extends: _decoder.yaml
hf:
  architectures: [TinyDecForCausalLM]
  model_type: tinydec
tensors:
  blk.{N}.attn_q.weight:
    to: model.layers.{N}.self_attn.q_proj.weight
    ops: [unpermute_qk: {heads: num_attention_heads}]
  blk.{N}.ffn_norm.weight:
    to: model.layers.{N}.post_attention_layernorm.weight
    ops: [add: -1.0]
  blk.{N}.attn_q_norm.weight: model.layers.{N}.self_attn.q_norm.weight
# no layer kinds build it (no `target:`): the map states the shapes `convert` checks
shapes:
  model.embed_tokens.weight: [vocab_size, hidden_size]
  model.layers.{N}.self_attn.q_proj.weight: [num_attention_heads * head_dim, hidden_size]
  model.layers.{N}.self_attn.q_norm.weight: [head_dim]
"""


def test_a_new_architecture_is_one_yaml_file_in_a_maps_folder(tmp_path, monkeypatch, capsys):
    """Drop a YAML in a folder named by GGUF2OV_MAPS: `gguf2ov convert` converts that architecture."""
    import json

    from safetensors.numpy import load_file

    from gguf2ov.cli import main

    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "tinydec.yaml").write_text(NEW_ARCH)
    assert "tinydec" not in supported_arches() and "tinydec" in supported_arches(maps_dir=maps)
    monkeypatch.setenv(MAPS_ENV, str(maps))
    assert "tinydec" in supported_arches()
    path, config, state = _round_trip(tmp_path, "tinydec")
    out = tmp_path / "out"
    assert main(["convert", str(path), "-o", str(out), "--dtype", "f32"]) == 0, capsys.readouterr().err
    amap = load_map("tinydec")
    assert amap.path == str(maps / "tinydec.yaml")
    converted_config = json.loads((out / "config.json").read_text())
    _assert_same_model(amap, config, state, converted_config, load_file(str(out / "model.safetensors")))
    # the map was applied, not only its names: the file holds q permuted and the norm + 1
    gguf = open_gguf(path)
    assert not np.array_equal(gguf.load("blk.0.attn_q.weight"), state["model.layers.0.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(gguf.load("blk.0.ffn_norm.weight"),
                                  state["model.layers.0.post_attention_layernorm.weight"] + 1)


def test_a_maps_folder_never_replaces_a_shipped_map(tmp_path):
    (tmp_path / "dflash.yaml").write_text("arch: dflash\ntensors: {a.weight: b.weight}\n")
    assert load_map("dflash", maps_dir=tmp_path).path == "tensor_maps/dflash.yaml"


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3", "qwen2"])
def test_decoder_maps_read_what_llama_cpp_writes(tmp_path, arch):
    """What llama.cpp writes for these decoders (Gemma norms as w + 1, llama q/k permuted, Qwen2's
    q/k/v biases), written by hand rather than by the map itself."""
    names = DECODER + {"qwen3": ["attn_q_norm", "attn_k_norm"], "llama": [],
                       "gemma3": ["attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"],
                       "qwen2": ["attn_q.bias", "attn_k.bias", "attn_v.bias"]}[arch]
    rng = np.random.default_rng(1)
    path = tmp_path / f"{arch}.gguf"
    tensors = decoder_tensors(rng, names)
    write_gguf(path, arch, decoder_kv(arch), tensors)
    gguf = open_gguf(path)
    amap = map_for(gguf)
    config = amap.metadata.hf_config(gguf)
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 40 and config["tie_word_embeddings"]
    plan = amap.tensors.plan(gguf, config)
    assert len(plan) == len(tensors) and all(e.hf_name.startswith("model.") for e in plan)
    out = {hf: x for hf, x, _, _ in amap.tensors.iter_tensors(gguf, plan, config)}
    if arch == "gemma3":  # llama.cpp stored Gemma norms as w + 1
        np.testing.assert_array_equal(out["model.layers.1.pre_feedforward_layernorm.weight"],
                                      tensors["blk.1.ffn_norm.weight"].astype(np.float32) - 1)
    if arch == "qwen2":
        np.testing.assert_array_equal(out["model.layers.1.self_attn.k_proj.bias"],
                                      tensors["blk.1.attn_k.bias"].astype(np.float32))
    if arch == "llama":
        q = tensors["blk.0.attn_q.weight"].astype(np.float32)
        np.testing.assert_array_equal(llama_cpp_permute(out["model.layers.0.self_attn.q_proj.weight"], 4), q)
        k = tensors["blk.0.attn_k.weight"].astype(np.float32)
        np.testing.assert_array_equal(llama_cpp_permute(out["model.layers.0.self_attn.k_proj.weight"], 2), k)


def test_dflash_config(draft):
    gguf, _ = draft
    config = load_map("dflash").metadata.hf_config(gguf)
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"block_size": 16, "mask_token_id": 151669,
                                       "target_layer_ids": DRAFT["target_layers"]}
    assert config["tie_word_embeddings"] is False
    assert config["head_dim"] == 16 and config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 1e6
    assert "sliding_window" not in config and "layer_types" not in config


def test_dflash_sliding_window_and_block_size_default(tmp_path):
    path = tmp_path / "swa.gguf"
    kv = {"dflash.attention.sliding_window": 128,
          "dflash.attention.sliding_window_pattern": ([True, False], GGUFValueType.ARRAY)}
    write_dflash(path, kv_extra=kv)
    gguf = open_gguf(path)
    del gguf.metadata["dflash.block_size"]
    config = load_map("dflash").metadata.hf_config(gguf)
    assert config["sliding_window"] == 128 and config["use_sliding_window"] is True
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["dflash_config"]["block_size"] == 16


def test_dflash_mask_token_first_key_wins(tmp_path):
    path = tmp_path / "both.gguf"
    write_dflash(path, kv_extra={"dflash.mask_token_id": 7})
    gguf = open_gguf(path)
    config = load_map("dflash").metadata.hf_config(gguf, target_layer_offset=-1)
    assert config["dflash_config"]["mask_token_id"] == 151669


@pytest.mark.parametrize("case", ["legacy", "zero_layer", "both_mask_keys"])
def test_old_layout_signs_need_the_flag(tmp_path, case):
    path = tmp_path / f"{case}.gguf"
    if case == "legacy":
        write_dflash(path, legacy=True)
    elif case == "zero_layer":
        write_dflash(path, target_layers=[-1, 4])  # the file then says [0, 5]
    else:
        write_dflash(path, kv_extra={"dflash.mask_token_id": 151669})
    gguf = open_gguf(path)
    amap = load_map("dflash")
    with pytest.raises(Gguf2ovError) as e:
        amap.metadata.hf_config(gguf)
    message = e.value.message
    assert "--target-layer-offset -1" in message and "--target-layer-offset 0" in message
    assert "--target-layer-offset" in e.value.hint
    declared = gguf.metadata["dflash.target_layers"]
    assert amap.metadata.hf_config(gguf, target_layer_offset=0)["dflash_config"]["target_layer_ids"] == declared


def test_negative_layer_id_is_refused(tmp_path):
    path = tmp_path / "zero.gguf"
    write_dflash(path, target_layers=[-1, 4])
    with pytest.raises(Gguf2ovError, match="below 0"):
        load_map("dflash").metadata.hf_config(open_gguf(path), target_layer_offset=-1)


def _dflash2_tensors(kernel=3, rank=8, vocab=50):
    """The DFlash 2 tensors (and a token embedding) for a draft of ggufs.DRAFT's geometry."""
    rng = np.random.default_rng(3)
    h = DRAFT["hidden"]
    extra = {"selector_predecessor.weight": (rng.standard_normal((vocab, rank)), None),
             "selector_successor.weight": (rng.standard_normal((vocab, rank)), None),
             "selector_hidden.weight": (rng.standard_normal((rank, h)), None),
             "token_embd.weight": (rng.standard_normal((vocab, h)), None)}
    for n in range(DRAFT["layers"]):
        for part in ("attn", "ffn"):
            extra[f"blk.{n}.{part}_conv_base"] = (rng.standard_normal((2, kernel, h)), None)
            extra[f"blk.{n}.{part}_conv_proj.weight"] = (rng.standard_normal((kernel, h)), None)
    return extra


def test_dflash2_group_and_optional(tmp_path):
    h, kernel, rank, vocab = DRAFT["hidden"], 3, 8, 50
    extra = _dflash2_tensors(kernel, rank, vocab)
    path = tmp_path / "v2.gguf"
    write_dflash(path, tensors_extra=extra, kv_extra={"dflash.conv_kernel_size": kernel})
    gguf = open_gguf(path)
    amap = load_map("dflash")
    assert gguf.tensors["blk.0.attn_conv_base"].ne == (h, kernel, 2)
    config = amap.metadata.hf_config(gguf)
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    plan = {e.gguf_name: e for e in amap.tensors.plan(gguf, config)}
    assert plan["blk.1.ffn_conv_base"].hf_name == "layers.1.mlp_conv.base_kernel"
    assert plan["blk.1.ffn_conv_base"].shape == (2, kernel, h)
    assert plan["selector_successor.weight"].hf_name == "candidate_selector.successor_codebook"
    assert plan["selector_successor.weight"].shape == (vocab, rank)
    assert plan["token_embd.weight"].hf_name is None  # accepted, not written
    # the group is all or none
    del gguf.tensors["blk.1.attn_conv_base"]
    with pytest.raises(Gguf2ovError, match=r"incomplete tensor group, missing: blk\.1\.attn_conv_base"):
        amap.tensors.plan(gguf, config)
    # once the file states the group size and the rank, the projections' shapes are checked:
    # [2 * kernel * hidden // group_size, hidden] and [rank, hidden]
    path = tmp_path / "v2-shapes.gguf"
    write_dflash(path, tensors_extra=extra, kv_extra={"dflash.conv_kernel_size": kernel, "dflash.conv_group_size": 16,
                                                      "dflash.selector_rank": rank + 1})
    with pytest.raises(Gguf2ovError) as e:
        amap.tensors.plan(open_gguf(path))
    assert "blk.0.attn_conv_proj.weight is [3, 64], expected [24, 64]" in e.value.message
    assert "selector_hidden.weight is [8, 64], expected [9, 64]" in e.value.message


@pytest.mark.parametrize("causal", [False, True])
def test_a_v1_draft_follows_its_causal_key(tmp_path, causal):
    """llama.cpp's converter writes the config's is_causal as dflash.attention.causal, and its
    runtime follows it: so does the config read back."""
    write_dflash(tmp_path / "v1.gguf", kv_extra={"dflash.attention.causal": causal})
    config = load_map("dflash").metadata.hf_config(open_gguf(tmp_path / "v1.gguf"))
    assert config["is_causal"] is causal and config["architectures"] == ["DFlashDraftModel"]


def test_a_dflash2_draft_that_says_causal_is_refused(tmp_path, capsys):
    """DFlash 2 is trained with both-way block attention: a file holding its tensors that says
    dflash.attention.causal = true contradicts them, and is one error line, not a causal draft."""
    from gguf2ov.cli import main

    kv = {"dflash.conv_kernel_size": 3, "dflash.attention.causal": False}
    write_dflash(tmp_path / "v2.gguf", tensors_extra=_dflash2_tensors(), kv_extra=kv)
    assert load_map("dflash").metadata.hf_config(open_gguf(tmp_path / "v2.gguf"))["is_causal"] is False
    write_dflash(tmp_path / "causal.gguf", tensors_extra=_dflash2_tensors(), kv_extra=kv | {"dflash.attention.causal": True})
    assert main(["convert", str(tmp_path / "causal.gguf"), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.splitlines()) == 2 and "Traceback" not in err
    assert ("dflash.attention.causal is True (it sets is_causal), but the file holds the dflash2 tensors, and the dflash "
            "map (tensor_maps/dflash.yaml) makes such a model DFlash2DraftModel with is_causal = False") in err
    assert err.splitlines()[1].startswith("hint: the file contradicts itself")
    assert not (tmp_path / "out").exists()
    # a causal key that is not a bool is the usual type error
    write_dflash(tmp_path / "odd.gguf", tensors_extra=_dflash2_tensors(), kv_extra=kv | {"dflash.attention.causal": 1})
    with pytest.raises(Gguf2ovError, match=r"dflash.attention.causal is 1, not true or false \(it sets is_causal\)"):
        load_map("dflash").metadata.hf_config(open_gguf(tmp_path / "odd.gguf"))


def test_group_hf_must_name_a_group(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arch: x\ntensors: {a.weight: a.weight}\ngroups: {g: {b.weight: b.weight}}\n"
                   "group_hf: {other: {architectures: [X]}}\n")
    with pytest.raises(Gguf2ovError, match="group_hf names 'other'"):
        load_map(path=bad)
    bad.write_text("arch: x\ntensors: {a.weight: a.weight}\ngroups: {g: {b.weight: b.weight}}\n"
                   "group_hf: {g: [X]}\n")
    with pytest.raises(Gguf2ovError, match="group_hf g must be a mapping"):
        load_map(path=bad)


def test_plan_lists_every_breach_in_one_error(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "bad.gguf"
    write_dflash(path, drop=["blk.1.ffn_up.weight", "output_norm.weight"],
                 tensors_extra={"blk.0.mystery.weight": (rng.standard_normal(4), None),
                                "blk.5.attn_q.weight": (rng.standard_normal((64, 64)), None),
                                "blk.0.attn_k.weight": (rng.standard_normal((8, 64)), None)})
    gguf = open_gguf(path)
    with pytest.raises(Gguf2ovError) as e:
        load_map("dflash").tensors.plan(gguf)
    message = e.value.message
    assert str(path) in message and "tensor_maps/dflash.yaml" in message
    for needle in ("tensors the map does not know: blk.0.mystery.weight",
                   "missing tensors: output_norm.weight, blk.1.ffn_up.weight",
                   "beyond block_count 2: blk.5.attn_q.weight",
                   "blk.0.attn_k.weight is [8, 64], expected [32, 64]"):
        assert needle in message


def test_unknown_arch_lists_supported(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_gguf(path, "mamba", {}, {"w": np.zeros(4, np.float32)})
    with pytest.raises(Gguf2ovError, match=f"no map for architecture 'mamba'; supported: {', '.join(supported_arches())} "):
        map_for(open_gguf(path))


def test_map_arch_must_match_the_file(draft, tmp_path):
    gguf, _ = draft
    other = tmp_path / "m.yaml"
    other.write_text("arch: qwen3\ntensors: {a.weight: b.weight}\n")
    with pytest.raises(Gguf2ovError, match="is 'dflash' but the map"):
        map_for(gguf, other)


@pytest.mark.parametrize("body, needle", [
    ("arch: x\ntensors: {a.weight: {to: b.weight, ops: [frobnicate: 1]}}", "unknown op 'frobnicate'"),
    ("arch: x\ntensors: {a.weight: {to: b.weight, ops: [add: yes]}}", "op add takes a number"),
    ("arch: x\ntensors: {'blk.{M}.a': 'b.{M}'}", "bad template"),
    ("arch: x\ntensors: {'blk.{N}.a': b.weight}", "{N} must appear in both"),
    ("arch: x\nconfig: {hidden_size: {add: 1}}", "config hidden_size"),
    ("arch: x\nconfig: {h: {from: k, frob: 1}}", "unknown rule keys ['frob']"),
    ("arch: x\ntensorz: {}", "unknown sections"),
    ("tensors: {}", "`arch` must name"),
    ("arch: x\ntensors: {a.weight: b.weight}\nshapes: {b.weight: ['__import__(1)']}", "shape of b.weight"),
    ("arch: x\ntensors: [", "cannot read tensor map"),
    ("arch: x\nconfig: {f: {from: k, type: int, widened_last: {count: n, factor: 1, sets: w}}}",
     "widened_last must hold count"),
    ("arch: x\nconfig: {f: {from: k, type: int, widened_last: {count: n, sets: w}}}", "widened_last must hold count"),
    ("arch: x\nconfig: {h: {from: 5, type: int}}", "from names a GGUF key or a list of them"),
    ("arch: x\nconfig: {h: {from: k, type: int, map: [1, 2]}}", "map must be a mapping"),
])
def test_invalid_maps_name_the_yaml_file(tmp_path, body, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(Gguf2ovError) as e:
        load_map(path=path)
    assert str(path) in e.value.message and needle in e.value.message


def _gemma4_mmproj() -> dict:
    from gguf2ov.maps.load import map_data

    return map_data("gemma4")["mmproj"]


@pytest.mark.parametrize("change, needle", [
    (lambda m: m.update(projector=m.pop("projector_type")), "mmproj: unknown keys ['projector']"),
    (lambda m: m.pop("tokens"), "mmproj: missing ['tokens']"),
    (lambda m: m.update(tensors=list(m["tensors"])), "mmproj tensors must hold GGUF template -> HF name"),
    (lambda m: m["tensors"].update({"v.blk.{M}.x.weight": "model.vision_tower.x"}), "mmproj tensors must hold"),
    (lambda m: m["defaults"].update(rope_theta=[100.0]), "mmproj defaults must hold"),
    (lambda m: m.update(required_tokens=["boi_token_id", "image_tokn_id"]),
     "mmproj required_tokens: ['image_tokn_id'] not in tokens"),
], ids=["unknown key", "missing key", "tensors not a mapping", "bad template", "bad default", "required token"])
def test_an_invalid_mmproj_section_is_one_line_naming_the_map(tmp_path, change, needle):
    """The `mmproj:` section is validated where the map is read, like the others: a VLM build never meets
    a section it cannot read (the shipped one passes, as every shipped map loads)."""
    import yaml

    mmproj = _gemma4_mmproj()
    change(mmproj)
    path = tmp_path / "vlm.yaml"
    path.write_text(yaml.safe_dump({"arch": "x", "tensors": {"a.weight": "b.weight"}, "mmproj": mmproj}))
    with pytest.raises(Gguf2ovError) as e:
        load_map(path=path)
    assert e.value.message.startswith(f"tensor map {path}: ") and needle in e.value.message
    assert "\n" not in e.value.message


def test_extends_merges_a_skeleton(tmp_path):
    (tmp_path / "base.yaml").write_text("config: {hidden_size: {from: x.h, type: int}}\ntensors: {a.weight: b.weight}\n")
    (tmp_path / "child.yaml").write_text("arch: x\nextends: base.yaml\ntensors: {c.weight: d.weight}\n")
    amap = load_map(path=tmp_path / "child.yaml")
    assert [r.gguf for r in amap.rules] == ["a.weight", "c.weight"] and "hidden_size" in amap.config


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_reverses(name):
    """Each op on its examples, against a config where `n` is 4 (a head count)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4 * 8, 6)).astype(np.float32)
    x = OPS[name].domain(x) if OPS[name].domain is not None else x
    assert OPS[name].examples
    for arg in OPS[name].examples:
        assert OPS[name].check(arg), arg
        ops = ((name, arg),)
        there = apply_ops(ops, x, {"n": 4})
        assert not np.array_equal(there, x)
        np.testing.assert_allclose(apply_ops(ops, there, {"n": 4}, reverse=True), x, rtol=0, atol=1e-6)


def test_unpermute_qk_undoes_llama_cpp_permute():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2 * 16, 24)).astype(np.float32)
    permuted = llama_cpp_permute(w, 2)
    np.testing.assert_array_equal(apply_ops((("unpermute_qk", {"heads": "h"}),), permuted, {"h": 2}), w)
    np.testing.assert_array_equal(apply_ops((("unpermute_qk", {"heads": "h"}),), w, {"h": 2}, reverse=True), permuted)


def test_reverse_names_and_metadata(draft):
    gguf, _ = draft
    amap = load_map("dflash")
    config = amap.metadata.hf_config(gguf)
    assert amap.writer.gguf_name_for("layers.3.mlp.down_proj.weight") == ("blk.3.ffn_down.weight", ())
    assert amap.writer.gguf_name_for("hidden_norm.weight")[0] == "enc.output_norm.weight"
    with pytest.raises(Gguf2ovError, match="lm_head.weight"):
        amap.writer.gguf_name_for("lm_head.weight")
    back = amap.writer.gguf_metadata(config)
    for key, value in back.items():
        assert gguf.metadata[key] == value, key
    assert set(gguf.metadata) - {"general.architecture"} <= set(back)
    legacy = amap.writer.gguf_metadata(config, legacy=True)
    assert legacy["dflash.target_layers"] == DRAFT["target_layers"] and "dflash.mask_token_id" in legacy
    assert "tokenizer.ggml.mask_token_id" not in legacy


def test_metadata_of_the_wrong_kind_is_an_error(tmp_path):
    path = tmp_path / "odd.gguf"
    write_dflash(path, kv_extra={"dflash.target_layers": "3,6,9",
                                 "dflash.attention.sliding_window": 64,
                                 "dflash.attention.sliding_window_pattern": ([2, 3], GGUFValueType.ARRAY)})
    gguf = open_gguf(path)
    amap = load_map("dflash")
    with pytest.raises(Gguf2ovError, match=r"sliding_window_pattern is \[2, 3\], not a list of true/false values"):
        amap.metadata.hf_config(gguf, target_layer_offset=-1)
    del gguf.metadata["dflash.attention.sliding_window_pattern"]
    with pytest.raises(Gguf2ovError, match="dflash.target_layers is '3,6,9', not a list of integers"):
        amap.metadata.hf_config(gguf, target_layer_offset=-1)


def test_the_architecture_name_from_a_file_only_selects_shipped_maps():
    from gguf2ov.errors import Gguf2ovError
    from gguf2ov.maps.load import load_map

    for arch in ("../../../tmp/evil", "_decoder", 7):
        with pytest.raises(Gguf2ovError, match="no map for architecture"):
            load_map(arch)


@pytest.mark.parametrize("key, value, message", [
    ("dflash.block_count", "two", "dflash.block_count is 'two', not an integer (it sets num_hidden_layers)"),
    ("dflash.attention.head_count", 0, "num_attention_heads would be 0 (from dflash.attention.head_count = 0), below 1"),
    ("dflash.target_layers", (["a", "b"], GGUFValueType.ARRAY),
     "dflash.target_layers is ['a', 'b'], not a list of integers"),
    # an epsilon stored as an integer type was written as rms_norm_eps = 0 (exit 0)
    ("dflash.attention.layer_norm_rms_epsilon", (0, GGUFValueType.UINT32),
     "dflash.attention.layer_norm_rms_epsilon is 0, not a finite float (GGUF F32 or F64) (it sets rms_norm_eps)"),
    ("dflash.attention.layer_norm_rms_epsilon", 0.0,
     "rms_norm_eps would be 0.0 (from dflash.attention.layer_norm_rms_epsilon = 0.0), not above 0"),
    ("dflash.attention.layer_norm_rms_epsilon", 1.0,
     "rms_norm_eps would be 1.0 (from dflash.attention.layer_norm_rms_epsilon = 1.0), not below 1"),
    ("dflash.logit_scale", -1.0, "logit_scale would be -1.0 (from dflash.logit_scale = -1.0), below 0"),
    ("dflash.rope.freq_base", (10000, GGUFValueType.INT32),
     "dflash.rope.freq_base is 10000, not a finite float (GGUF F32 or F64) (it sets rope_theta)")])
def test_metadata_of_the_wrong_type_is_one_error_line(tmp_path, capsys, key, value, message):
    """convert and check both stop at the bad key (check against a real reference, so that the
    metadata is what it reaches)."""
    from gguf2ov.cli import main

    write_dflash(tmp_path / "good.gguf")
    assert main(["convert", str(tmp_path / "good.gguf"), "-o", str(tmp_path / "ref")]) == 0
    capsys.readouterr()
    write_dflash(tmp_path / "bad.gguf", kv_extra={key: value})
    for cmd in (["convert", str(tmp_path / "bad.gguf"), "-o", str(tmp_path / "out")],
                ["check", str(tmp_path / "bad.gguf"), "--reference", str(tmp_path / "ref")]):
        assert main(cmd) == 1
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and "Traceback" not in err

def _float_rules():
    """(arch, HF key, GGUF key) of every rule of every shipped map that reads a float."""
    return [(amap.arch, key, rule["from"][0]) for amap in map(load_map, supported_arches())
            for key, rule in amap.config.items() if rule.get("type") == "float"]


def _file_with(tmp_path, arch, gguf_key, value):
    """A GGUF of a random model built from the map, with `gguf_key` written as `value` (an int as
    UINT32, a float as F32, as llama.cpp writes counts and hyperparameters)."""
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    config, state, extra = model_from_map(load_map(arch), np.random.default_rng(7))
    write_checkpoint_folder(tmp_path / "hf", config, state)
    path = tmp_path / f"{arch}.gguf"
    write_from_checkpoint(tmp_path / "hf", path, arch, mix="F32", extra_metadata=extra | {gguf_key: value})
    return path


def test_every_float_rule_is_checked():
    found = {(arch, key.split(".")[-1]) for arch, key, _ in _float_rules()}  # Gemma 4's are per layer type
    assert {(arch, key) for arch in supported_arches() for key in ("rms_norm_eps", "rope_theta")} <= found
    assert {("dflash", "logit_scale"), ("dflash", "final_logit_softcapping")} <= found


@pytest.mark.parametrize("arch, hf_key, gguf_key", _float_rules())
def test_every_float_rule_refuses_an_integer_type(tmp_path, arch, hf_key, gguf_key):
    """A float rule takes F32/F64 values only: the same number stored as an integer type is refused,
    naming the key (llama.cpp refuses a key of the wrong type)."""
    with pytest.raises(Gguf2ovError) as e:
        open_mapped(_file_with(tmp_path, arch, gguf_key, 1))
    assert f"{gguf_key} is 1, not a finite float (GGUF F32 or F64) (it sets {hf_key})" in e.value.message
    assert e.value.hint


def _epsilon_rules():
    return [(arch, key, gguf) for arch, key, gguf in _float_rules() if "eps" in key or "eps" in gguf]


@pytest.mark.parametrize("arch, hf_key, gguf_key", _epsilon_rules())
@pytest.mark.parametrize("value, bound", [(0.0, "not above 0"), (-1e-6, "not above 0"), (1.0, "not below 1"),
                                          (2.5, "not below 1")])
def test_every_epsilon_is_small_and_positive(tmp_path, arch, hf_key, gguf_key, value, bound):
    with pytest.raises(Gguf2ovError) as e:
        open_mapped(_file_with(tmp_path, arch, gguf_key, value))
    assert f"{hf_key} would be {value} (from {gguf_key} = {value}), {bound}" in e.value.message
    assert e.value.hint


def test_every_map_has_an_epsilon_rule_and_takes_a_usual_one(tmp_path):
    assert {arch for arch, _, _ in _epsilon_rules()} == set(supported_arches())
    for arch, hf_key, gguf_key in _epsilon_rules():
        assert open_mapped(_file_with(tmp_path / arch, arch, gguf_key, 1e-6)).config[hf_key] == 1e-6


def test_a_float_rule_writes_a_float_from_an_integer_in_the_config(tmp_path):
    """A config may say rope_theta: 10000: the GGUF written from it holds F32 10000.0, which reads back."""
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    config, state, extra = model_from_map(load_map("qwen3"), np.random.default_rng(7))
    config["rope_theta"] = 10000
    write_checkpoint_folder(tmp_path / "hf", config, state)
    write_from_checkpoint(tmp_path / "hf", tmp_path / "q.gguf", "qwen3", mix="F32", extra_metadata=extra)
    mapped = open_mapped(tmp_path / "q.gguf")
    assert mapped.config["rope_theta"] == 10000.0 and isinstance(mapped.gguf.metadata["qwen3.rope.freq_base"], float)


@pytest.mark.parametrize("rule, needle", [("{from: k, type: float, below: [1]}", "below names another config key or is a number"),
                                          ("{from: k, type: float, below: other}", "below: other is not a config key")])
def test_below_is_a_number_or_a_config_key(tmp_path, rule, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(f"arch: x\nconfig: {{eps: {rule}}}\ntensors: {{a.weight: b.weight}}\n")
    with pytest.raises(Gguf2ovError, match=needle):
        load_map(path=path)

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from ggufs import DRAFT, write_dflash, write_gguf
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file as load_torch

from gguf2ov.cli import main
from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf.read import open_gguf
from gguf2ov.hf.write import to_bf16_bits
from gguf2ov.job import Job, Options

Q = GGMLQuantizationType


@pytest.fixture
def draft(tmp_path):
    path = tmp_path / "draft.gguf"
    write_dflash(path, qtype=Q.Q8_0)
    return path


def _hf_values(gguf_path, name):
    return open_gguf(gguf_path).load(name)


def test_convert_f32_equals_dequantized_values(draft, tmp_path):
    out = tmp_path / "hf"
    result = Job.of(draft, None, Options(progress=False)).convert(out, dtype="f32")
    assert result.n_tensors == 3 + 11 * DRAFT["layers"]
    assert result.target_layer_ids_declared == [i + 1 for i in DRAFT["target_layers"]]
    assert result.target_layer_ids_written == DRAFT["target_layers"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "gguf2ov.json", "model.safetensors"]
    tensors = load_numpy(out / "model.safetensors")
    gguf = open_gguf(draft)
    np.testing.assert_array_equal(tensors["layers.1.self_attn.o_proj.weight"], gguf.load("blk.1.attn_output.weight"))
    np.testing.assert_array_equal(tensors["hidden_norm.weight"], gguf.load("enc.output_norm.weight"))
    assert tensors["fc.weight"].shape == (DRAFT["hidden"], 3 * DRAFT["hidden"])
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == DRAFT["target_layers"]
    provenance = json.loads((out / "gguf2ov.json").read_text())
    assert provenance["sources"]["gguf"]["path"] == str(draft) and provenance["options"]["dtype"] == "f32"
    assert any("target layers: the file declares dflash.target_layers = [3, 6, 9]" in s for s in result.summary())


@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16), ("f16", torch.float16)])
def test_convert_half_dtypes_match_torch_casts(draft, tmp_path, monkeypatch, dtype, torch_dtype):
    monkeypatch.setattr("gguf2ov.hf.write.ENCODE_CHUNK", 1000)  # tensors are then written in several slices
    out = tmp_path / dtype
    Job.of(draft, None, Options(progress=False)).convert(out, dtype=dtype)
    tensors = load_torch(out / "model.safetensors")
    expected = torch.from_numpy(_hf_values(draft, "blk.0.ffn_up.weight")).to(torch_dtype)
    got = tensors["layers.0.mlp.up_proj.weight"]
    assert got.dtype == torch_dtype and torch.equal(got, expected)


def test_bf16_rounding_matches_torch():
    rng = np.random.default_rng(0)
    scaled = (rng.standard_normal(10000) * 10.0 ** rng.integers(-30, 30, 10000)).astype(np.float32)
    x = np.concatenate([
        scaled,
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45, 1.00390625, 1.01171875],
                 dtype=np.float32),
        rng.integers(0, 2**32, 10000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # every bit pattern
    ])
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = to_bf16_bits(x)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], expected[~nan])
    assert np.isnan(torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).float().numpy()[nan]).all()


def test_sharding_with_a_tiny_limit(draft, tmp_path):
    out = tmp_path / "sharded"
    result = Job.of(draft, None, Options(progress=False)).convert(out, dtype="f32", max_shard_size=40_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert all(f in result.files for f in shards)
    merged = {}
    for shard in shards:
        part = load_numpy(out / shard)
        assert all(index["weight_map"][k] == shard for k in part)
        merged |= part
    assert len(merged) == result.n_tensors == len(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in merged.values())
    single = load_numpy(Job.of(draft, None, Options(progress=False)).convert(tmp_path / "single", dtype="f32").out_dir + "/model.safetensors")
    for k, v in single.items():
        np.testing.assert_array_equal(merged[k], v)


def test_done_when_checkpoint_loads_strictly_into_optimum_draft(draft, tmp_path):
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from transformers import AutoConfig

    out = tmp_path / "hf"
    assert main(["convert", str(draft), "-o", str(out), "--dtype", "f32", "--quiet"]) == 0
    config = AutoConfig.from_pretrained(out)
    assert config.dflash_config == {"block_size": 16, "mask_token_id": 151669,
                                    "target_layer_ids": DRAFT["target_layers"]}
    model = Qwen3DFlashForCausalLM(config)
    state = load_torch(out / "model.safetensors")
    assert set(state) == set(model.state_dict())  # rotary inv_freq is a non-persistent buffer
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not missing and not unexpected
    assert torch.equal(model.fc.weight, state["fc.weight"])


def test_legacy_file_needs_the_flag_via_cli(tmp_path, capsys):
    path = tmp_path / "old.gguf"
    write_dflash(path, legacy=True)
    assert main(["convert", str(path), "-o", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--target-layer-offset 0" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()
    assert main(["convert", str(path), "-o", str(tmp_path / "a"), "--target-layer-offset", "0"]) == 0
    out = capsys.readouterr().out
    assert "declares dflash.target_layers = [2, 5, 8]" in out and "target_layer_ids = [2, 5, 8]" in out
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == DRAFT["target_layers"]


def _cli_error(argv, capsys) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    return lines[0]


def test_cli_errors_name_the_offending_thing(draft, tmp_path, capsys):
    rng = np.random.default_rng(0)
    unmapped, missing, shape = tmp_path / "unmapped.gguf", tmp_path / "missing.gguf", tmp_path / "shape.gguf"
    write_dflash(unmapped, tensors_extra={"blk.0.extra.weight": (rng.standard_normal(8), None)})
    write_dflash(missing, drop=["blk.0.attn_v.weight"])
    write_dflash(shape, tensors_extra={"fc.weight": (rng.standard_normal((64, 64)), None)})
    unknown = tmp_path / "unknown.gguf"
    write_gguf(unknown, "mamba", {}, {"w": np.zeros(4, np.float32)})
    out = str(tmp_path / "o")
    assert "blk.0.extra.weight" in _cli_error(["convert", str(unmapped), "-o", out], capsys)
    assert "missing tensors: blk.0.attn_v.weight" in _cli_error(["convert", str(missing), "-o", out], capsys)
    assert "fc.weight is [64, 64], expected [64, 192]" in _cli_error(["convert", str(shape), "-o", out], capsys)
    assert "'mamba'" in _cli_error(["convert", str(unknown), "-o", out], capsys)
    assert not (tmp_path / "o").exists()
    assert main(["convert", str(draft), "-o", out, "--quiet"]) == 0
    assert f"output {out} already exists" in _cli_error(["convert", str(draft), "-o", out], capsys)
    assert main(["convert", str(draft), "-o", out, "--quiet", "--overwrite"]) == 0
    assert "does not apply to qwen3" in _cli_error(
        ["convert", str(_qwen3(tmp_path)), "-o", str(tmp_path / "q"), "--target-layer-offset", "0"], capsys)


def _qwen3(tmp_path):
    from ggufs import decoder_kv, decoder_tensors

    path = tmp_path / "qwen3.gguf"
    names = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
             "attn_q_norm", "attn_k_norm"]
    write_gguf(path, "qwen3", decoder_kv("qwen3"), decoder_tensors(np.random.default_rng(0), names))
    return path


def test_json_report(draft, tmp_path):
    report = tmp_path / "report.json"
    assert main(["convert", str(draft), "-o", str(tmp_path / "hf"), "--quiet", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["arch"] == "dflash" and data["target_layer_ids_written"] == DRAFT["target_layers"]
    assert {t["gguf_name"] for t in data["tensors"]} == set(open_gguf(draft).tensors)


def test_convert_refuses_an_unknown_dtype(draft, tmp_path):
    with pytest.raises(Gguf2ovError, match="unknown dtype"):
        Job.of(draft).convert(tmp_path / "x", dtype="int4")

"""Checkpoint folders read with NumPy alone: every dtype as the safetensors library writes it,
bfloat16 exactly, row ranges, and damaged files refused with one error naming the file."""

import json
import struct

import numpy as np
import pytest

from gguf2ov.errors import Gguf2ovError
from gguf2ov.hf.checkpoint import Checkpoint


def test_values_equal_what_torch_reads(tmp_path):
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(3, 4, generator=g).half(),
        "f32": torch.randn(6, generator=g),
        "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "flag": torch.tensor([True, False]),
        "empty": torch.zeros(0, 4),
    }
    tensors["bf16"][0, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))

    ckpt = Checkpoint(tmp_path)
    assert ckpt.shapes == {k: tuple(v.shape) for k, v in tensors.items()} and ckpt.config["model_type"] == "qwen3"
    for name, t in tensors.items():
        got = ckpt.load(name)
        want = t.float().numpy() if t.is_floating_point() else t.numpy()
        assert got.dtype == want.dtype and got.flags.writeable, name
        np.testing.assert_array_equal(got, want)  # NaN where NaN, bit-exact elsewhere
        assert ckpt.dtype(name) == {"bf16": "BF16", "f16": "F16", "f32": "F32", "f64": "F64", "i64": "I64",
                                    "i8": "I8", "flag": "BOOL", "empty": "F32"}[name]
    np.testing.assert_array_equal(ckpt.load_rows("bf16", 2, 4), tensors["bf16"][2:4].float().numpy())
    np.testing.assert_array_equal(ckpt.load_rows("i64", 1, 2), tensors["i64"][1:2].numpy())


def test_a_sharded_checkpoint_reads_each_tensor_from_its_shard(tmp_path):
    from safetensors.numpy import save_file

    save_file({"a": np.ones((2, 2), np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": np.full(3, 2, np.float16)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ckpt = Checkpoint(tmp_path)
    assert ckpt.shapes == {"a": (2, 2), "b": (3,)}
    np.testing.assert_array_equal(ckpt.load("b"), np.full(3, 2, np.float32))


def _raw(tmp_path, header, data: bytes = b"", length=None):
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return tmp_path


@pytest.mark.parametrize("header, data, length, message", [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "do not hold F32"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, None, "do not hold F32"),
    ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, None, "no dtype, shape and data_offsets"),
    ({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "does not read"),
    ({}, b"", 1 << 40, "header of"),
    ([1, 2], b"", None, "not a JSON object"),
])
def test_a_damaged_file_is_refused_naming_it(tmp_path, header, data, length, message):
    folder = _raw(tmp_path, header, data, length)
    with pytest.raises(Gguf2ovError, match=message) as e:
        Checkpoint(folder)
    assert "model.safetensors" in str(e.value)


def test_a_file_shorter_than_its_header_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\1\2")
    with pytest.raises(Gguf2ovError, match="shorter than its header"):
        Checkpoint(tmp_path)

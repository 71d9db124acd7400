import json

import numpy as np
from ggufs import write_dflash, write_gguf

from gguf2ov.cli import main
from gguf2ov.report import render
from gguf2ov.stages.inspect import inspect


def test_inspect_text_and_json(tmp_path, capsys):
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"tokenizer.ggml.tokens": [f"tok{i}" for i in range(1000)]}, mask=7)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "[1000 x str] first: 'tok0', 'tok1', 'tok2'" in text
    assert "blk.1.attn_q.weight" in text and "layers.1.self_attn.q_proj.weight" in text
    assert "tensor_maps/dflash.yaml consumes every tensor" in text
    assert main(["inspect", str(path), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arch"] == "dflash" and data["map_fits"] is True and data["type_counts"] == {"F32": 25}
    q = next(t for t in data["tensors"] if t["gguf_name"] == "blk.0.attn_output.weight")
    assert q["ne"] == [64, 64] and q["shape"] == [64, 64] and q["n_bytes"] == 64 * 64 * 4
    fc = next(t for t in data["tensors"] if t["gguf_name"] == "fc.weight")
    assert fc["ne"] == [192, 64] and fc["shape"] == [64, 192]


def test_inspect_reports_a_map_that_does_not_fit(tmp_path):
    path = tmp_path / "draft.gguf"
    write_dflash(path, drop=["blk.0.ffn_up.weight"],
                 tensors_extra={"odd.weight": (np.zeros(4, np.float32), None)})
    result = inspect(path)
    assert result.map_fits is False
    assert any("odd.weight" in p for p in result.map_problems)
    assert any("blk.0.ffn_up.weight" in p for p in result.map_problems)
    assert "does not fit" in render(result, "text")
    assert "| odd.weight |" in render(result, "markdown")


def test_inspect_unknown_arch_still_lists_tensors(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_gguf(path, "mamba", {"mamba.block_count": 1}, {"w": np.zeros((2, 32), np.float32)})
    result = inspect(path)
    assert result.map_path is None and result.map_fits is None
    assert "no map for architecture 'mamba'" in result.map_problems[0]
    assert result.tensors[0].ne == [32, 2] and result.tensors[0].shape == [2, 32]

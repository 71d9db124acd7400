import json

import numpy as np
from ggufs import decoder_kv, decoder_tensors, write_dflash, write_gguf

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


def test_inspect_holds_a_targets_shapes_to_its_layer_kinds(tmp_path):
    """A target map states no shapes: inspect asks its kinds, as `gguf2ov target` does (here the file
    says 3 key/value heads, its K and V have 2)."""
    names = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
             "attn_q_norm", "attn_k_norm"]
    tensors = decoder_tensors(np.random.default_rng(1), names)
    write_gguf(tmp_path / "fits.gguf", "qwen3", decoder_kv("qwen3"), tensors)
    assert inspect(tmp_path / "fits.gguf").map_fits is True
    write_gguf(tmp_path / "q.gguf", "qwen3", decoder_kv("qwen3") | {"qwen3.attention.head_count_kv": 1}, tensors)
    result = inspect(tmp_path / "q.gguf")
    assert result.map_fits is False
    assert result.map_problems[0].startswith("wrong shapes: blk.0.attn_k.weight is [32, 64], expected [16, 64] for "
                                             "model.layers.0.self_attn.k_proj.weight")


def test_inspect_unknown_arch_still_lists_tensors(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_gguf(path, "mamba", {"mamba.block_count": 1}, {"w": np.zeros((2, 32), np.float32)})
    result = inspect(path)
    assert result.map_path is None and result.map_fits is None
    assert "no map for architecture 'mamba'" in result.map_problems[0]
    assert result.tensors[0].ne == [32, 2] and result.tensors[0].shape == [2, 32]


def _with_a_duplicate_key(path):
    """A draft whose metadata states tokenizer.ggml.bos_token_id twice (0, then 5): gguf-py's writer
    keeps one value per key, so the second key is written under another name of the same length and
    renamed in the file's bytes."""
    write_dflash(path, kv_extra={"tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.bos_token_iX": 5})
    data = path.read_bytes()
    assert data.count(b"tokenizer.ggml.bos_token_iX") == 1
    path.write_bytes(data.replace(b"tokenizer.ggml.bos_token_iX", b"tokenizer.ggml.bos_token_id"))


def test_inspect_warns_about_a_duplicate_key(tmp_path, capsys):
    """llama.cpp's loader and gguf-py's reader refuse a file that states a key twice; inspect shows
    it and warns, every other command refuses it in one error line."""
    path = tmp_path / "dup.gguf"
    _with_a_duplicate_key(path)
    warning = ("warning: metadata key tokenizer.ggml.bos_token_id appears 2 times (0, 5); shown: the first. llama.cpp "
               "and gguf-py refuse such a file, as every other gguf2ov command does")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr()
    assert warning in out.out and out.err == ""
    assert main(["inspect", str(path), "--json", "-"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["metadata"]["tokenizer.ggml.bos_token_id"] == "0" and data["warnings"] == [warning[len("warning: "):]]
    assert out.err.strip() == warning  # stdout is the document: the warning goes to stderr
    assert main(["inspect", str(path), "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == warning  # --quiet: warnings still show
    assert main(["convert", str(path), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: metadata key tokenizer.ggml.bos_token_id appears 2 times; llama.cpp and "
                          "gguf-py refuse such a file\nhint: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_inspect_of_a_file_without_duplicates_has_no_warning(tmp_path):
    write_dflash(tmp_path / "draft.gguf")
    result = inspect(tmp_path / "draft.gguf")
    assert result.warnings == [] and "warning" not in render(result, "text")

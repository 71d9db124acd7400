"""Big weights made in a scratch file beside the IR while it is written (ir/spill.py), and the .bin flushed
to disk as it is written (outputs.written_back): the IR is the one made in memory, byte for byte."""

import re

import numpy as np
import pytest
import target_builders as tb

from gguf2ov import outputs
from gguf2ov.gguf import transcode
from gguf2ov.ir import spill
from gguf2ov.ir.spill import SPILL_ENV, Spill, constant_bytes
from opened import build_target

# Gemma 4 (31B-like: tied head, global layers with their own head size) wide enough for K-quant super-blocks:
# Q4_K_M makes the tied table and the Linears Q4_K, and some attn_v and ffn_down Q6_K
GEMMA4 = dict(model_type="gemma4_text", hidden_size=256, intermediate_size=256, num_hidden_layers=3,
              num_attention_heads=2, num_key_value_heads=1, head_dim=128, global_head_dim=256,
              attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=0,
              layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=4,
              final_logit_softcapping=30.0, hidden_size_per_layer_input=0)


def test_each_type_a_grid_stores_comes_back_from_a_scratch_file_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setenv(SPILL_ENV, "0")
    constants = Spill()
    constants.directory = tmp_path
    kinds = {"codes6": ("u6", [4, 3, 16]), "codes4": ("u4", [4, 8, 32]), "codes8": ("u8", [4, 2, 16]),
             "i8": ("i8", [4, 32]), "mxfp4": ("f4e2m1", [4, 32]), "e8m0": ("f8e8m0", [4, 1]),
             "scale": ("f32", [4, 8, 1]), "d": ("f16", [4, 1])}
    rng = np.random.default_rng(0)
    written = {name: rng.integers(0, 256, constant_bytes(*kind), dtype=np.uint8) for name, kind in kinds.items()}
    scratch = constants.file(kinds)
    for name, data in written.items():  # in two chunks, the second first
        half = data.size // 2
        scratch.write(name, half, data[half:])
        scratch.write(name, 0, data[:half])
    tensors = scratch.tensors()
    assert list(tmp_path.iterdir()) == []  # unlinked once mapped
    for name, (kind, dims) in kinds.items():
        t = tensors[name]
        assert (t.element_type.get_type_name(), list(t.shape)) == (kind, dims)
        assert np.asarray(t.data).view(np.uint8).reshape(-1)[:written[name].size].tobytes() == written[name].tobytes()
    constants.release()


def test_under_the_threshold_or_outside_a_save_nothing_spills(tmp_path, monkeypatch):
    kinds = {"codes": ("u8", [1024, 1024])}
    constants = Spill()
    assert constants.file(kinds) is None  # no folder: not while an IR is written
    constants.directory = tmp_path
    monkeypatch.setenv(SPILL_ENV, str(1 << 20))
    assert constants.file(kinds) is None  # exactly 1 MiB: not over
    monkeypatch.setenv(SPILL_ENV, str((1 << 20) - 1))
    assert constants.file(kinds) is not None


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    from gguf2ov.tools.gguf_writer import write_gguf

    work = tmp_path_factory.mktemp("spill")
    hf = tb.write_target_checkpoint(work / "hf", GEMMA4, seed=11, vocab=512)  # the fixture tokenizer's
    path = work / "g.gguf"
    write_gguf(hf, path, "gemma4", mix="Q4_K_M", extra_metadata={"gemma4.vocab_size": 512})
    return path


def test_a_target_whose_every_weight_spills_is_the_same_ir_and_passes_its_checks(tmp_path, monkeypatch, q4_k_m,
                                                                                fixtures_dir):
    """Every grid weight decoded into a scratch file (the threshold at 0): the tied table (the 31B file's memory
    peak), the Q4_K Linears (u4 codes, f32 scale and zero point) and the Q6_K ones (u8 codes, f32 scale) give
    the IR made in memory, byte for byte, with the target's checks passed (the embedding and head found where
    GenAI finds them) and no scratch file left in the folder."""
    from gguf2ov.gguf.read import open_gguf

    types = {name: t.qtype.name for name, t in open_gguf(q4_k_m).tensors.items()}
    assert {"Q4_K", "Q6_K"} <= set(types.values()) and "output.weight" not in types
    kw = dict(weight_format="gguf", grid="folded", tokenizer_dir=fixtures_dir / "target-hf")
    build_target(q4_k_m, tmp_path / "memory", **kw)

    spilled = []
    real_file = Spill.file

    def file(self, kinds):
        made = real_file(self, kinds)
        if made is not None:
            spilled.append(sorted(kinds))
        return made

    monkeypatch.setattr(spill.Spill, "file", file)
    monkeypatch.setenv(SPILL_ENV, "0")
    monkeypatch.setattr(transcode, "_CHUNK_BYTES", 2000)  # a few rows a chunk, as a real table has thousands of chunks
    monkeypatch.setattr(spill, "FLUSH_BYTES", 4096)
    monkeypatch.setattr(outputs, "WRITEBACK_BYTES", 4096)  # the .bin flushed while it is written
    result = build_target(q4_k_m, tmp_path / "spilled", **kw)
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    grids = sum(t not in ("F32", "F16") for t in types.values())
    assert len(spilled) == grids
    assert ["codes", "scale"] in spilled and ["codes", "scale", "zero_point"] in spilled
    spilled_ir, memory_ir = tmp_path / "spilled" / "openvino_model", tmp_path / "memory" / "openvino_model"
    assert spilled_ir.with_suffix(".bin").read_bytes() == memory_ir.with_suffix(".bin").read_bytes()
    assert _numbered(spilled_ir.with_suffix(".xml")) == _numbered(memory_ir.with_suffix(".xml"))
    assert not list((tmp_path / "spilled").glob(".spill-*"))


def _numbered(xml) -> str:
    """The .xml with OpenVINO's own node names (`Constant_1676`: a counter over the process) left out."""
    return re.sub(r'name="([A-Za-z]+)_[0-9]+"', r'name="\1"', xml.read_text())


def test_a_scratch_file_closes_its_descriptor_once(tmp_path, monkeypatch):
    """The decoder closes a scratch file after it is mapped (`tensors`, then `close` on the way out): its
    descriptor was closed twice, the second time another file's, opened meanwhile under the freed number (the
    .bin's flushing thread lost its descriptor while a target whose weights spilled was written)."""
    import os

    monkeypatch.setenv(SPILL_ENV, "0")
    constants = Spill()
    constants.directory = tmp_path
    scratch = constants.file({"codes": ("u8", [4, 16])})
    scratch.write("codes", 0, np.arange(64, dtype=np.uint8))
    scratch.tensors()
    other = os.open(tmp_path / "other", os.O_CREAT | os.O_RDONLY)  # the lowest free number: the one just freed
    try:
        scratch.close()
        os.fstat(other)  # still open
    finally:
        os.close(other)
        constants.release()

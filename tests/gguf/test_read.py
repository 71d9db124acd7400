import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize as gguf_dequantize
from ggufs import write_gguf

from gguf2ov.cli import main
from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf.read import open_gguf, summarise

Q = GGMLQuantizationType
V = GGUFValueType

METADATA = {
    "t.u8": (200, V.UINT8), "t.i8": (-100, V.INT8), "t.u16": (60000, V.UINT16), "t.i16": (-30000, V.INT16),
    "t.u32": (4_000_000_000, V.UINT32), "t.i32": (-2_000_000_000, V.INT32),
    "t.u64": (2**63 + 5, V.UINT64), "t.i64": (-(2**62), V.INT64),
    "t.f32": (1e-6, V.FLOAT32), "t.f64": (0.1, V.FLOAT64), "t.bool": (True, V.BOOL), "t.false": (False, V.BOOL),
    "t.str": ("héllo", V.STRING),
    "t.ints": ([1, -2, 3], V.ARRAY), "t.floats": ([0.5, -1.25], V.ARRAY),
    "t.strs": (["a", "bc", ""], V.ARRAY), "t.bools": ([True, False, True], V.ARRAY),
}


@pytest.fixture
def sample(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "wide.weight": rng.standard_normal((3, 5)).astype(np.float32),           # Linear(5 -> 3)
        "q8.weight": (rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0),  # Linear(64 -> 4)
        "half.weight": (rng.standard_normal((2, 3, 32)).astype(np.float32), Q.F16),
        "ids": (np.arange(6, dtype=np.int64), Q.I64),
    }
    path = tmp_path / "sample.gguf"
    write_gguf(path, "testarch", METADATA, tensors)
    return path, tensors


def test_metadata_every_form(sample):
    gguf = open_gguf(sample[0])
    assert gguf.arch == "testarch"
    for key, (value, _) in METADATA.items():
        got = gguf.metadata[key]
        assert got == value and type(got) is type(value), key
    assert gguf.metadata["t.f32"] == 1e-6  # the float32 shown by its shortest decimal


def test_metadata_agrees_with_gguf_reader(sample):
    gguf, reader = open_gguf(sample[0]), GGUFReader(sample[0])
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        expected = field.contents()
        got = gguf.metadata[name]
        if field.types[-1] == V.FLOAT32:
            np.testing.assert_allclose(got, expected, rtol=1e-7)
        else:
            assert got == expected, name
    for t in reader.tensors:
        info = gguf.tensors[t.name]
        assert info.ne == tuple(int(d) for d in t.shape) and info.offset == t.data_offset
        assert info.n_bytes == t.n_bytes and info.qtype == t.tensor_type
        np.testing.assert_array_equal(gguf.raw(t.name), t.data)
        assert gguf.raw(t.name).shape == t.data.shape


def test_non_square_orientation_and_values(sample):
    path, tensors = sample
    gguf = open_gguf(path)
    wide = gguf.tensors["wide.weight"]
    assert wide.ne == (5, 3) and wide.shape == (3, 5)
    np.testing.assert_array_equal(gguf.load("wide.weight"), tensors["wide.weight"])
    q8 = gguf.load("q8.weight")
    assert q8.shape == (4, 64) and q8.dtype == np.float32
    np.testing.assert_array_equal(q8, gguf_dequantize(gguf.raw("q8.weight"), Q.Q8_0))
    assert np.corrcoef(q8.ravel(), tensors["q8.weight"][0].ravel())[0, 1] > 0.999
    np.testing.assert_array_equal(gguf.load("half.weight"), tensors["half.weight"][0].astype(np.float16))
    assert gguf.load("ids").dtype == np.int64


def test_summarise_long_arrays():
    text = summarise([f"tok{i}" for i in range(262144)])
    assert text.startswith("[262144 x str] first: 'tok0', 'tok1', 'tok2'")
    assert summarise([1, 2]) == "[1, 2]"


def _error(path) -> str:
    with pytest.raises(Gguf2ovError) as e:
        open_gguf(path)
    assert str(path) in e.value.message
    return e.value.message


def test_bad_magic(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    assert "not a GGUF file" in _error(path)


def test_too_small_and_missing(tmp_path):
    path = tmp_path / "small.gguf"
    path.write_bytes(b"GGUF")
    assert "only 4 bytes" in _error(path)
    assert "no such file" in _error(tmp_path / "absent.gguf")


def test_truncated_tensor_data_names_the_tensor(sample):
    path, _ = sample
    data = path.read_bytes()
    gguf = open_gguf(path)
    last = max(gguf.tensors.values(), key=lambda t: t.offset)
    path.write_bytes(data[: last.offset + 3])
    message = _error(path)
    assert "truncated" in message and last.gguf_name in message


def test_mxfp4_tensors_are_sized_by_their_17_byte_blocks(tmp_path):
    """MXFP4: 32 values in 17 bytes. The reader's views, sizes and checks use that block, as gguf-py's do."""
    rng = np.random.default_rng(1)
    path = tmp_path / "mxfp4.gguf"
    write_gguf(path, "testarch", {}, {"experts.weight": (rng.standard_normal((3, 4, 96)).astype(np.float32), Q.MXFP4),
                                      "last.weight": (rng.standard_normal((2, 64)).astype(np.float32), Q.MXFP4)})
    gguf, reader = open_gguf(path), GGUFReader(path)
    info = gguf.info("experts.weight")
    assert info.n_bytes == 3 * 4 * 3 * 17 and gguf.raw("experts.weight").shape == (3, 4, 51)
    stored = next(t for t in reader.tensors if t.name == "experts.weight")
    np.testing.assert_array_equal(gguf.load("experts.weight"), gguf_dequantize(stored.data, Q.MXFP4))
    np.testing.assert_array_equal(gguf.load_rows("experts.weight", 1, 2), gguf.load("experts.weight")[1:2])
    data = path.read_bytes()
    path.write_bytes(data[:gguf.info("last.weight").offset + 2 * 2 * 17 - 1])  # one byte short of 4 blocks
    message = _error(path)
    assert "last.weight (MXFP4, ne [64, 2]) needs bytes" in message and "truncated" in message
    # a row that is no whole number of blocks: ne[0] 48 for 32-value blocks
    header = bytearray(data)
    at = header.index(b"last.weight") + len(b"last.weight") + 4  # after the name and the dimension count
    struct.pack_into("<Q", header, at, 48)
    path.write_bytes(bytes(header))
    assert "ne[0]=48, not a multiple of the MXFP4 block size 32" in _error(path)


def test_truncated_header(sample):
    path, _ = sample
    path.write_bytes(path.read_bytes()[:200])
    assert "needs" in _error(path)


def test_absurd_array_length_is_refused_before_allocating(tmp_path):
    path = tmp_path / "huge.gguf"
    write_gguf(path, "testarch", {"t.ints": ([1, 2, 3], V.ARRAY)}, {"w": np.zeros(4, np.float32)})
    data = bytearray(path.read_bytes())
    key = b"t.ints"
    at = data.index(key) + len(key) + 4 + 4  # after the key, the value type and the item type
    struct.pack_into("<Q", data, at, 2**60)
    path.write_bytes(bytes(data))
    assert "t.ints" in _error(path)


def test_absurd_tensor_count(tmp_path):
    path = tmp_path / "count.gguf"
    write_gguf(path, "testarch", {}, {"w": np.zeros(4, np.float32)})
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, 8, 2**62)
    path.write_bytes(bytes(data))
    assert "tensor infos" in _error(path)


def test_corrupt_file_via_cli(tmp_path, capsys):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + b"\xff" * 20)
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


LARGE = {
    "big.strs": ([f"tok{i}é" for i in range(300)], V.ARRAY), "big.f32": ([i / 8 for i in range(300)], V.ARRAY),
    "big.ints": ([i * 1000 for i in range(300)], V.ARRAY), "big.bools": ([i % 3 == 0 for i in range(300)], V.ARRAY),
}


def test_large_metadata_arrays_stay_compact_and_agree_with_gguf_reader(tmp_path):
    from gguf2ov.gguf.read import COMPACT_ARRAY, StringArray

    path = tmp_path / "big.gguf"
    write_gguf(path, "testarch", LARGE, {"w": np.zeros(32, np.float32)})
    gguf, reader = open_gguf(path), GGUFReader(path)
    strs = gguf.metadata["big.strs"]
    assert isinstance(strs, StringArray) and len(strs) == 300 > COMPACT_ARRAY
    assert strs[0] == "tok0é" and strs[-1] == "tok299é" and strs[10:12] == ["tok10é", "tok11é"]
    assert strs == reader.fields["big.strs"].contents() and list(strs) == LARGE["big.strs"][0]
    assert strs.nbytes < 300 * 32  # the encoded bytes and one offset per string, not 300 str objects
    for key in ("big.f32", "big.ints", "big.bools"):
        value = gguf.metadata[key]
        assert isinstance(value, np.ndarray) and not value.flags.writeable
        assert value.tolist() == reader.fields[key].contents() == LARGE[key][0], key
    assert summarise(strs) == "[300 x str] first: 'tok0é', 'tok1é', 'tok2é', ..."
    assert summarise(gguf.metadata["big.bools"]) == "[300 x bool] first: True, False, False, ..."
    with pytest.raises(IndexError):
        strs[300]


def test_invalid_utf8_in_a_large_string_array_is_a_corrupt_file(tmp_path):
    path = tmp_path / "big.gguf"
    write_gguf(path, "testarch", {"big.strs": ([f"tok{i:03d}" for i in range(300)], V.ARRAY)}, {})
    data = bytearray(path.read_bytes())
    at = data.index(b"tok150")
    data[at:at + 2] = b"\xff\xfe"
    path.write_bytes(bytes(data))
    with pytest.raises(Gguf2ovError, match="metadata big.strs is not valid UTF-8"):
        open_gguf(path)


def test_a_large_array_read_by_a_config_rule_is_plain_python(tmp_path):
    from ggufs import write_dflash

    from gguf2ov.maps.load import load_map

    path = tmp_path / "draft.gguf"
    pattern = [i % 2 == 0 for i in range(100)]
    write_dflash(path, layers=100, kv_extra={"dflash.attention.sliding_window": 64,
                                             "dflash.attention.sliding_window_pattern": (pattern, V.ARRAY),
                                             "tokenizer.ggml.tokens": [f"t{i}" for i in range(200000)]})
    gguf = open_gguf(path)
    config = load_map("dflash").metadata.hf_config(gguf)
    assert config["layer_types"][:3] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert type(config["layer_types"]) is list and config["vocab_size"] == 200000


# --- llama.cpp's rules for the layout (ggml/src/gguf.cpp) -----------------------------------------

def _rewritten(sample, tmp_path, change) -> tuple:
    """The sample rewritten by the fuzzer's own GGUF model after `change(model)`: laid out at the
    alignment the file states, as llama.cpp's writer lays it out."""
    from benchmark_scripts import benchmark

    fuzz = benchmark("fuzz_gguf")
    model = fuzz.parse(sample[0].read_bytes())
    change(model, fuzz)
    path = tmp_path / "rewritten.gguf"
    path.write_bytes(fuzz.serialise(model)[0])
    return path, fuzz


@pytest.mark.parametrize("alignment", [1, 2, 4, 8, 64])
def test_any_power_of_two_alignment_is_read_as_llama_cpp_reads_it(sample, tmp_path, alignment):
    """llama.cpp and gguf-py take any non-zero power of two, not only multiples of 8: tensors then sit
    at offsets rounded to it (and float32 data may be unaligned in memory)."""
    path, tensors = sample

    def change(model, fuzz):  # every tensor at the previous one's end, rounded up to `alignment`
        original = open_gguf(path)
        model.kv.insert(0, ["general.alignment", fuzz.T_U32, alignment])
        data = bytearray()
        for t in model.tensors:
            t.offset = len(data)
            data += original.raw(t.name).tobytes()
            data += bytes(-len(data) % alignment)
        model.data = bytes(data)

    rewritten, _ = _rewritten(sample, tmp_path, change)
    gguf = open_gguf(rewritten)
    assert GGUFReader(rewritten).alignment == alignment
    for name in tensors:
        assert np.array_equal(gguf.load(name), open_gguf(path).load(name)), name


@pytest.mark.parametrize("vtype, value", [("T_BOOL", True), ("T_I32", 32), ("T_U64", 32), ("T_U16", 32)])
def test_general_alignment_of_another_type_than_uint32_is_refused(sample, tmp_path, vtype, value):
    """gguf.cpp refuses a general.alignment that is not UINT32, and gguf-py's reader too: a BOOL true
    was read as an alignment of 1."""
    path, fuzz = _rewritten(sample, tmp_path, lambda model, fuzz: model.kv.insert(
        0, ["general.alignment", getattr(fuzz, vtype), value]))
    message = _error(path)
    assert f"general.alignment is {value} (" in message and "not a UINT32: llama.cpp refuses any other type" in message


@pytest.mark.parametrize("key, value, needle", [
    ("general.architecture", ("T_U32", 7), "general.architecture is 7 (UINT32), not a string"),
    ("split.count", ("T_U32", 2), "split.count is 2 (UINT32), not a UINT16"),
    ("split.no", ("T_STR", "0"), "split.no is '0' (STRING), not a UINT16")])
def test_every_key_the_reader_reads_has_llama_cpps_type(sample, tmp_path, key, value, needle):
    def change(model, fuzz):
        model.kv = [kv for kv in model.kv if kv[0] != key] + [[key, getattr(fuzz, value[0]), value[1]]]

    path, _ = _rewritten(sample, tmp_path, change)
    assert needle in _error(path)


@pytest.mark.parametrize("case", ["another tensor's data", "one byte on", "out of order"])
def test_a_tensor_whose_data_is_not_where_llama_cpp_expects_it_is_refused(sample, tmp_path, case):
    """gguf.cpp requires each tensor's data at the previous one's end, rounded up to the alignment: a
    norm's offset pointing at another tensor was read as that tensor, with exit 0."""
    def change(model, fuzz):
        a, b = model.tensors[0], model.tensors[1]
        if case == "another tensor's data":
            b.offset = a.offset
        elif case == "one byte on":
            b.offset += 1
        else:
            model.tensors[0], model.tensors[1] = b, a

    path, _ = _rewritten(sample, tmp_path, change)
    message = _error(path)
    assert "has its data at offset" in message and "where llama.cpp expects" in message

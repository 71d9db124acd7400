"""Hostile GGUF input (from a fuzzing report): each class ends in one `error:` line, quickly."""

import time

import pytest
from gguf import GGUFValueType
from ggufs import write_dflash

from gguf2ov.cli import main


def _one_error(argv, capsys, code: int = 1) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("blocks", [10**5, 10**6, 2**32 - 1])
def test_huge_block_count_is_stated_once(tmp_path, capsys, blocks):
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"dflash.block_count": blocks})
    start = time.monotonic()
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert f"dflash.block_count is {blocks} but the file holds tensors for layers 0..1 only" in line
    assert len(line) < 1000
    assert main(["inspect", str(path), "--json", "-"]) == 0
    out = capsys.readouterr().out
    assert f"dflash.block_count is {blocks}" in out and len(out) < 50_000
    assert time.monotonic() - start < 5


def test_error_listings_are_capped(tmp_path, capsys):
    import numpy as np

    extra = {f"junk.{i}.weight": (np.zeros(4, np.float32), None) for i in range(30)}
    path = tmp_path / "draft.gguf"
    write_dflash(path, tensors_extra=extra)
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert "junk.0.weight" in line and "junk.29.weight" not in line and "... and 20 more" in line


@pytest.mark.parametrize("value", ["ab", (["a", "b"], GGUFValueType.ARRAY), True])
def test_shape_expressions_read_only_integers(tmp_path, capsys, value):
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"dflash.attention.head_count": value, "dflash.attention.key_length": 10**9})
    start = time.monotonic()
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert "dflash.attention.head_count is" in line and "not an integer (it sets num_attention_heads)" in line
    assert line.count("not an integer") == 1
    assert time.monotonic() - start < 5


def test_a_layer_index_of_thousands_of_digits_is_an_unknown_tensor(tmp_path, capsys):
    import numpy as np

    name = "blk." + "7" * 5000 + ".attn_norm.weight"
    path = tmp_path / "draft.gguf"
    write_dflash(path, tensors_extra={name: (np.zeros(64, np.float32), None)})
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert "tensors the map does not know: blk.777" in line and "(5021 chars)" in line and len(line) < 1000
    assert main(["inspect", str(path)]) == 0
    assert "does not fit" in capsys.readouterr().out


def _set_dims(path, name: str, dims) -> None:
    import struct

    data = bytearray(path.read_bytes())
    key = name.encode()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == len(dims)
    struct.pack_into(f"<{len(dims)}Q", data, at + 4, *dims)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("dims, needle", [((0, 2**63), "has a dimension of 0"), ((2**63, 0), "has a dimension of 0"),
                                          ((64, 2**63), "needs bytes"), ((2**64 - 1, 2**64 - 1), "needs bytes")])
def test_absurd_dimensions_are_a_corrupt_file(tmp_path, capsys, dims, needle):
    path = tmp_path / "draft.gguf"
    write_dflash(path)
    _set_dims(path, "blk.0.attn_q.weight", dims)
    for cmd in (["convert", str(path), "-o", str(tmp_path / "out")], ["inspect", str(path), "--json", "-"]):
        line = _one_error(cmd, capsys)
        assert "corrupt or truncated GGUF: tensor blk.0.attn_q.weight" in line and needle in line


def test_the_input_check_says_what_is_wrong(tmp_path, capsys):
    import os

    os.mkfifo(tmp_path / "fifo.gguf")
    os.symlink(tmp_path / "loop.gguf", tmp_path / "loop.gguf")
    (tmp_path / "dir.gguf").mkdir()
    for name, needle in (("dir.gguf", "is a directory"), ("fifo.gguf", "not a regular file"),
                         ("loop.gguf", "symbolic links")):
        line = _one_error(["inspect", str(tmp_path / name)], capsys)
        assert needle in line and "no such file" not in line, line


def test_unreadable_input_is_one_error_line(tmp_path, capsys, monkeypatch):
    import errno
    import os

    from gguf2ov.gguf import read

    path = tmp_path / "draft.gguf"
    write_dflash(path)

    def denied(file, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))

    monkeypatch.setattr(read, "open", denied, raising=False)  # root can read a chmod 000 file
    line = _one_error(["inspect", str(path)], capsys)
    assert f"{path}: cannot open: Permission denied" in line


def test_a_report_path_that_cannot_be_written_leaves_no_checkpoint(tmp_path, capsys):
    path = tmp_path / "draft.gguf"
    write_dflash(path)
    (tmp_path / "report").mkdir()
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet",
                       "--json", str(tmp_path / "report")], capsys)
    assert f"cannot write {tmp_path / 'report'}: it is a folder, not a regular file" in line
    (tmp_path / "file").write_text("")
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet",
                       "--json", str(tmp_path / "file" / "report.json")], capsys)
    assert f"{tmp_path / 'file'} is a file, not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.gguf", "file", "report"]


def test_a_report_that_fails_while_written_leaves_no_checkpoint(tmp_path, capsys, monkeypatch):
    import errno
    import os

    from gguf2ov import outputs

    path = tmp_path / "draft.gguf"
    write_dflash(path)
    real_replace = os.replace

    def disk_full(src, dst):
        if str(dst).endswith("report.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", disk_full)
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet",
                       "--json", str(tmp_path / "report.json")], capsys)
    assert f"cannot write {tmp_path / 'report.json'}: No space left on device" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.gguf"]


@pytest.mark.parametrize("kind", ["char device", "fifo", "socket"])
@pytest.mark.parametrize("command", ["convert", "check"])
def test_a_special_file_as_report_path_is_refused(tmp_path, capsys, fixtures_dir, kind, command):
    import os
    import socket
    import stat

    path = tmp_path / "draft.gguf"
    write_dflash(path)
    if kind == "char device":
        report = tmp_path / "null"
        os.symlink("/dev/null", report)
    elif kind == "fifo":
        report = tmp_path / "fifo"
        os.mkfifo(report)
    else:
        report = tmp_path / "sock"
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(report))
    before = sorted(p.name for p in tmp_path.iterdir())
    if command == "convert":
        argv = ["convert", str(path), "-o", str(tmp_path / "out"), "--quiet", "--json", str(report)]
    else:
        argv = ["check", str(fixtures_dir / "draft-Q4_K_M.gguf"), "--reference", str(fixtures_dir / "draft-ref"),
                "--markdown", str(report)]
    line = _one_error(argv, capsys)
    word = {"char device": "a character device", "fifo": "a FIFO", "socket": "a socket"}[kind]
    assert f"cannot write {report}: it is {word}, not a regular file" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if kind == "char device":
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # not replaced by a regular file
    assert stat.S_ISLNK(os.lstat(report).st_mode) or not stat.S_ISREG(os.lstat(report).st_mode)


def test_a_symlinked_report_writes_the_file_it_names(tmp_path, capsys):
    import json
    import os

    path = tmp_path / "draft.gguf"
    write_dflash(path)
    (tmp_path / "real.json").write_text("old")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    assert main(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet", "--json",
                 str(tmp_path / "link.json")]) == 0
    assert os.path.islink(tmp_path / "link.json")
    assert json.loads((tmp_path / "real.json").read_text())["n_tensors"] == 25


def test_file_size_limit_while_writing_is_one_error_line(tmp_path):
    import os
    import resource
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "draft.gguf"
    write_dflash(path)
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    proc = subprocess.run(
        [sys.executable, "-m", "gguf2ov", "convert", str(path), "-o", str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, env=env, timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "model.safetensors: File too large" in lines[0], proc.stderr
    assert "hint: the file-size limit" in proc.stderr


def test_an_ascii_terminal_gets_escaped_text(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"general.name": "héllo ✓"})
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONIOENCODING="ascii")
    proc = subprocess.run([sys.executable, "-m", "gguf2ov", "inspect", str(path)], capture_output=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"h\\xe9llo \\u2713" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "gguf2ov", "inspect", str(tmp_path / "é.gguf")],
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert proc.stderr.count(b"error:") == 1 and b"\\xe9.gguf: no such file" in proc.stderr


def test_ctrl_c_during_start_up_is_one_error_line(capsys, monkeypatch):
    from gguf2ov.cli import app

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "build_parser", interrupted)
    assert "interrupted" in _one_error(["inspect", "x.gguf"], capsys, code=130)


def test_untrusted_names_cannot_forge_lines_or_escape_sequences(tmp_path, capsys):
    import numpy as np

    evil = "evil\nhint: run rm -rf ~\x1b[31m\u202e"
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"general.name": evil},
                 tensors_extra={evil: (np.zeros(4, np.float32), None)})
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert "evil\\nhint: run rm -rf ~\\x1b[31m\\u202e" in line
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and not any(l.startswith("hint:") for l in out.splitlines())
    assert "evil\\nhint: run rm -rf ~\\x1b[31m\\u202e" in out


# --- class 10: values that cannot be right are refused where the metadata enters ---------------------

@pytest.mark.parametrize("kv, needle", [
    ({"tokenizer.ggml.mask_token_id": "../../x"},
     "tokenizer.ggml.mask_token_id is '../../x', not an integer (it sets dflash_config.mask_token_id)"),
    ({"dflash.target_layers": ([float("nan"), 2.0], GGUFValueType.ARRAY)},
     "dflash.target_layers is [nan, 2.0], not a list of integers (it sets dflash_config.target_layer_ids)"),
    ({"dflash.vocab_size": (-1, GGUFValueType.INT32)}, "vocab_size would be -1 (from dflash.vocab_size = -1), below 1"),
    ({"dflash.block_count": True}, "dflash.block_count is True, not an integer"),
    ({"tokenizer.ggml.mask_token_id": (2**64 - 1, GGUFValueType.UINT64)}, "dflash_config.mask_token_id would be 18446744073709551615 (from tokenizer.ggml.mask_token_id = "
     "18446744073709551615), outside the 64-bit integer range"),
    ({"dflash.attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon is nan, not a finite float"),
    ({"dflash.rope.freq_base": float("inf")}, "dflash.rope.freq_base is inf, not a finite float"),
    ({"dflash.rope.freq_base": 0.0}, "rope_theta would be 0.0 (from dflash.rope.freq_base = 0.0), not above 0"),
    ({"dflash.block_size": 1}, "dflash_config.block_size would be 1 (from dflash.block_size = 1), below 2"),
    ({"tokenizer.ggml.tokens": [f"t{i}" for i in range(100)]},
     "dflash_config.mask_token_id would be 151669 (from tokenizer.ggml.mask_token_id), but vocab_size is 100 (from "
     "tokenizer.ggml.tokens): 151669 is out of range"),
    ({"dflash.attention.sliding_window": 64, "dflash.attention.sliding_window_pattern": ([True], GGUFValueType.ARRAY)},
     "layer_types has 1 entries (from dflash.attention.sliding_window_pattern), but num_hidden_layers is 2"),
    ({"dflash.attention.sliding_window": 64, "dflash.attention.sliding_window_pattern": ([1, 0], GGUFValueType.ARRAY)},
     "sliding_window_pattern is [1, 0], not a list of true/false values"),
])
def test_config_values_are_typed_and_bounded(tmp_path, capsys, kv, needle):
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra=kv)
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet"], capsys)
    assert needle in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["draft.gguf"]
    assert main(["inspect", str(path)]) == 0  # inspect shows the file and says why the map does not fit
    assert "does not fit" in capsys.readouterr().out


def test_every_config_rule_that_reads_metadata_declares_a_type(tmp_path):
    from gguf2ov.errors import Gguf2ovError
    from gguf2ov.maps.load import load_map, supported_arches

    for arch in supported_arches():
        amap = load_map(arch)
        assert all("type" in rule for rule in amap.config.values()
                   if rule.get("from") and "constant" not in rule), arch
    (tmp_path / "map.yaml").write_text("arch: x\nconfig: {hidden_size: x.h}\n")
    with pytest.raises(Gguf2ovError, match="config hidden_size: a rule that reads metadata needs a `type`"):
        load_map(path=tmp_path / "map.yaml")


def _nan_norm(tmp_path):
    import numpy as np

    norm = np.ones(64, np.float32)
    norm[[3, 9]] = [np.nan, np.inf]
    path = tmp_path / "draft.gguf"
    write_dflash(path, tensors_extra={"blk.1.ffn_norm.weight": (norm, None)})
    return path


def test_nonfinite_weights_are_an_error_naming_the_tensor(tmp_path, capsys):
    path = _nan_norm(tmp_path)
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet"], capsys)
    assert ("layers.1.post_attention_layernorm.weight (from blk.1.ffn_norm.weight, F32) holds 2 NaN or Inf values "
            "of 64") in line
    assert [p.name for p in tmp_path.iterdir()] == ["draft.gguf"]


def test_nonfinite_weights_with_allow_nonfinite_are_a_loud_warning(tmp_path, capsys):
    import json

    path = _nan_norm(tmp_path)
    assert main(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet", "--allow-nonfinite",
                 "--json", str(tmp_path / "report.json")]) == 0
    err = capsys.readouterr().err
    assert ("warning: layers.1.post_attention_layernorm.weight was written with 2 NaN or Inf values "
            "(--allow-nonfinite)") in err
    assert json.loads((tmp_path / "report.json").read_text())["nonfinite"] == {
        "layers.1.post_attention_layernorm.weight": 2}
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_quantized_block_with_an_inf_scale_is_an_error(tmp_path, capsys):
    import struct

    import numpy as np
    from gguf import GGMLQuantizationType

    from gguf2ov.gguf.read import open_gguf

    path = tmp_path / "draft.gguf"
    write_dflash(path, qtype=GGMLQuantizationType.Q8_0)
    info = open_gguf(path).tensors["blk.0.ffn_up.weight"]
    data = bytearray(path.read_bytes())
    struct.pack_into("<e", data, info.offset + 34 * 5, np.inf)  # the f16 scale of the 6th Q8_0 block
    path.write_bytes(bytes(data))
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet"], capsys)
    assert "layers.0.mlp.up_proj.weight (from blk.0.ffn_up.weight, Q8_0) holds" in line
    assert "quantization scales" in line


def test_values_beyond_f16_are_an_error_with_dtype_f16(tmp_path, capsys):
    import numpy as np

    path = tmp_path / "draft.gguf"
    write_dflash(path, tensors_extra={"output_norm.weight": (np.full(64, 1e6, np.float32), None)})
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet", "--dtype", "f16"], capsys)
    assert "norm.weight (from output_norm.weight, F32): 64 of its 64 values are too large for F16" in line
    assert main(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0  # bf16 holds them


# --- class 8: a signal during convert leaves nothing; a killed run's leftovers are cleared ---------

def _slow_convert(tmp_path, sig):
    """Start `convert` of a 33 MB draft in a subprocess, send `sig` while it writes its temporary
    folder, return (process, stderr)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from gguf import GGMLQuantizationType

    path = tmp_path / "draft.gguf"
    write_dflash(path, qtype=GGMLQuantizationType.F16, hidden=512, heads=8, head_dim=64, kv_heads=4, ffn=2048, layers=4)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-m", "gguf2ov", "convert", str(path), "-o", str(tmp_path / "out"),
                             "--quiet"], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(".out.partial-") for p in tmp_path.iterdir()):
        assert proc.poll() is None, "convert ended before its temporary folder was seen"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    time.sleep(0.05)  # into the tensor data
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert sig != signal.SIGKILL or proc.returncode == -signal.SIGKILL
    return proc, err


def test_sigterm_during_convert_leaves_nothing(tmp_path):
    import signal

    proc, err = _slow_convert(tmp_path, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == ["error: terminated by SIGTERM; no partial output was left in place"], err
    assert [p.name for p in tmp_path.iterdir()] == ["draft.gguf"]


def test_the_next_run_clears_what_a_killed_run_left(tmp_path, capsys):
    import os
    import signal

    _slow_convert(tmp_path, signal.SIGKILL)
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
    assert len(left) == 1 and left[0].is_dir()
    # a temporary folder of a run still going (this process) is not touched
    live = tmp_path / f".out.partial-{os.getpid()}-{left[0].name.split('-')[2]}-0123abcd"
    live.mkdir()
    assert main(["convert", str(tmp_path / "draft.gguf"), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    assert not left[0].exists() and live.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["draft.gguf", "out", live.name])


@pytest.mark.parametrize("value, shown", [(([False] * 100, GGUFValueType.ARRAY), "[100 x bool] first: False"),
                                          ((7, GGUFValueType.UINT32), "7")])
def test_an_architecture_that_is_not_a_string_is_a_corrupt_file(tmp_path, capsys, fixtures_dir, value, shown):
    import numpy as np
    from ggufs import dflash_kv, dflash_tensors, write_gguf

    path = tmp_path / "draft.gguf"
    write_gguf(path, None, {**dflash_kv(), "general.architecture": value}, dflash_tensors(np.random.default_rng(0)))
    for argv in (["inspect", str(path), "--json", "-"], ["convert", str(path), "-o", str(tmp_path / "out")],
                 ["check", str(path), "--reference", str(fixtures_dir / "draft-ref")]):
        line = _one_error(argv, capsys)
        assert f"corrupt or truncated GGUF: general.architecture is {shown}" in line and "not a string" in line
    assert [p.name for p in tmp_path.iterdir()] == ["draft.gguf"]


def test_a_huge_array_where_a_config_list_belongs_is_refused_before_it_becomes_python(tmp_path, capsys):
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"dflash.target_layers": ([3] * 100_000, GGUFValueType.ARRAY)})
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert "dflash.target_layers holds 100000 items, more than dflash_config.target_layer_ids can (at most 65536)" \
        in line


def test_names_of_any_length_from_the_file_are_clipped_in_error_lines(tmp_path, capsys):
    import struct

    import numpy as np
    from ggufs import dflash_kv, dflash_tensors, write_gguf

    path = tmp_path / "arch.gguf"
    write_gguf(path, None, {**dflash_kv(), "general.architecture": "a" * 5000}, dflash_tensors(np.random.default_rng(0)))
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert "no map for architecture 'aaaa" in line and len(line) < 1000
    # a corrupt key length: the key swallows the metadata that follows it
    path = tmp_path / "key.gguf"
    write_dflash(path, kv_extra={"tokenizer.ggml.tokens": [f"tok{i}" for i in range(100)]})
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.tokens"  # followed by ASCII tokens and small lengths: valid UTF-8
    struct.pack_into("<Q", data, data.index(struct.pack("<Q", len(key)) + key), 1000)
    path.write_bytes(bytes(data))
    line = _one_error(["inspect", str(path)], capsys)
    assert "corrupt or truncated GGUF: " in line and "chars)" in line and len(line) < 1000, line[:300]

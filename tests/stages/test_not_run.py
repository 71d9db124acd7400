"""Drafts llama.cpp writes that GenAI does not run: a Gemma 4 DSpark draft (dflash with a Markov and a confidence
head) and a Gemma 4 MTP assistant draft (gemma4-assistant). `inspect` names them; every command that converts,
checks or runs a draft refuses them in one error line, before it writes anything. The files are llama.cpp's own
converter's, from tiny configs (benchmarks/llamacpp/gemma4_drafts.py); beside them a DFlash draft of the same
Gemma 4 target, by the same converter, and the VLM fixture's Gemma 4 draft stay converted.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from ggufs import write_dflash

from gguf2ov.cli import main
from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf.read import open_gguf
from gguf2ov.maps.load import load_map, map_for
from gguf2ov.stages.inspect import inspect

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
DSPARK = DATA / "gemma4-dspark-llamacpp-F16.gguf"
ASSISTANT = DATA / "gemma4-assistant-llamacpp-F16.gguf"
GEMMA4_DFLASH = DATA / "gemma4-dflash-llamacpp-F16.gguf"
VLM = REPO / "fixtures" / "tiny-vlm"
KINDS = {DSPARK: "a DSpark draft of Gemma 4", ASSISTANT: "a Gemma 4 MTP assistant draft"}


def _one_error(argv, capsys) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err  # what to do instead is on the same line: no hint line
    return err.splitlines()[0]


def test_the_files_are_llama_cpps_own():
    """What llama.cpp's converter wrote, as its runtime tells the kinds apart (src/models/dflash.cpp loads
    the DSpark heads when markov_w1.weight is present; gemma4-assistant is its own architecture)."""
    dspark, assistant, dflash = open_gguf(DSPARK), open_gguf(ASSISTANT), open_gguf(GEMMA4_DFLASH)
    assert dspark.arch == dflash.arch == "dflash" and assistant.arch == "gemma4-assistant"
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight"} <= set(dspark.tensors)
    assert "blk.0.attn_v.weight" not in dspark.tensors  # attention_k_eq_v: K is read as V
    assert dspark.get("dflash.hidden_activation") == "gelu_pytorch_tanh"
    assert not any(name.startswith(("markov", "conf_proj")) for name in dflash.tensors)
    assert not any(".attn_k." in name or ".attn_v." in name for name in assistant.tensors)
    assert "nextn.pre_projection.weight" in assistant.tensors
    for gguf in (dspark, assistant, dflash):
        assert gguf.get("tokenizer.ggml.model") == "gemma4"


@pytest.mark.parametrize("path", [DSPARK, ASSISTANT], ids=["dspark", "assistant"])
def test_inspect_names_the_kind_and_what_genai_lacks(path, capsys):
    result = inspect(path)
    assert result.not_run.startswith(KINDS[path] + " (")
    assert "OpenVINO GenAI" in result.not_run and "llama.cpp" in result.not_run
    assert result.map_fits is None and result.map_problems == []
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"kind: {KINDS[path]} (" in out and "map:" not in out.split("Tensor types")[-1]
    assert main(["inspect", str(path), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["not_run"] == result.not_run


def test_inspect_says_what_the_dspark_heads_are():
    text = inspect(DSPARK).not_run
    assert "Markov head" in text and "markov_w1" in text and "conf_proj" in text and "DSpark path" in text
    assert "Gemma MTP" in inspect(ASSISTANT).not_run


def _commands(path: Path, out: Path) -> dict[str, list[str]]:
    target = str(VLM / "target")
    return {
        "convert": ["convert", str(path), "-o", str(out)],
        "export": ["export", str(path), "-o", str(out)],
        "check": ["check", str(path), "--reference", str(VLM / "draft-ref")],
        "drift": ["drift", str(path), "--target", target, "-o", str(out)],
        "run": ["run", str(path), "--target", target, "-o", str(out)],
        "target": ["target", str(path), "-o", str(out)],
    }


@pytest.mark.parametrize("command", ["convert", "export", "check", "drift", "run", "target"])
@pytest.mark.parametrize("path", [DSPARK, ASSISTANT], ids=["dspark", "assistant"])
def test_every_command_refuses_in_one_line_and_writes_nothing(path, command, tmp_path, capsys):
    out = tmp_path / "out"
    line = _one_error([*_commands(path, out)[command], "--quiet"], capsys)
    assert line.startswith(f"error: {path}: {KINDS[path]} (")
    assert "neither converts nor runs it" in line
    assert "instead" in line and "llama.cpp" in line
    assert list(tmp_path.iterdir()) == []


def test_a_dspark_draft_of_another_model_is_named_a_dspark_draft(tmp_path, capsys):
    """The entries are tried in order: without Gemma 4's tokenizer the Markov head still makes it DSpark."""
    path = tmp_path / "draft.gguf"
    write_dflash(path, tensors_extra={"markov_w1.weight": (np.zeros((40, 8), np.float32), None),
                                      "markov_w2.weight": (np.zeros((40, 8), np.float32), None)})
    assert inspect(path).not_run.startswith("a DSpark draft (")
    line = _one_error(["convert", str(path), "-o", str(tmp_path / "out")], capsys)
    assert line.startswith(f"error: {path}: a DSpark draft (")
    assert [p.name for p in tmp_path.iterdir()] == ["draft.gguf"]


def test_a_metadata_value_of_another_type_is_not_gemma4s_tokenizer(tmp_path):
    """A file's value is untrusted: a tokenizer.ggml.model that is a long array (numpy, compact) names no Gemma 4
    DSpark draft, and does not break the comparison."""
    path = tmp_path / "draft.gguf"
    write_dflash(path, kv_extra={"tokenizer.ggml.model": list(range(100))},
                 tensors_extra={"markov_w1.weight": (np.zeros((40, 8), np.float32), None)})
    assert inspect(path).not_run.startswith("a DSpark draft (")


@pytest.mark.parametrize("path", [GEMMA4_DFLASH, VLM / "draft-Q4_K_M.gguf"], ids=["llamacpp", "vlm-fixture"])
def test_a_gemma4_dflash_draft_is_still_converted(path, tmp_path, capsys):
    """A DFlash draft of Gemma 4, by llama.cpp's converter (Gemma 4's tokenizer, as the DSpark file) or the
    VLM fixture's (which GenAI runs beside its target: tests/test_vlm_fixture.py): named by no entry, fitted."""
    result = inspect(path)
    assert result.not_run is None and result.map_fits is True and result.model == "DFlashDraftModel"
    assert main(["convert", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    capsys.readouterr()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]


def test_a_map_passed_with_map_is_the_one_that_decides(tmp_path):
    """--map names the map: one without the dflash map's not_run entries reads the DSpark file's tensors (and
    says what it does not know), as a map written for such a draft would convert it."""
    gguf = open_gguf(DSPARK)
    with pytest.raises(Gguf2ovError, match="a DSpark draft of Gemma 4"):
        map_for(gguf)
    own = tmp_path / "dflash.yaml"
    own.write_text("arch: dflash\ntensors: {fc.weight: fc.weight}\n")
    assert map_for(gguf, own).not_run == ()


@pytest.mark.parametrize("section, why", [
    ("not_run: {what: x}", "not_run must list"),
    ("not_run: [{what: x, carries: y, genai: z}]", "each not_run entry holds"),
    ("not_run: [{what: x, carries: y, genai: z, instead: w, when: {tensor: a}}]", "not_run x: when holds"),
    ("not_run: [{what: x, carries: y, genai: z, instead: w, when: {tensors: a.weight}}]", "not_run x: when holds"),
])
def test_a_bad_not_run_section_is_one_error(tmp_path, section, why):
    path = tmp_path / "map.yaml"
    path.write_text(f"arch: x\n{section}\n")
    with pytest.raises(Gguf2ovError, match=f"tensor map {path}: {why}"):
        load_map(path=path)

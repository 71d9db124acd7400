"""`gguf2ov target --map`: the target takes everything from the map passed (its tensor names, its config
rules and its `target:` section: the layers' kinds, steps and options), for an architecture no shipped map
names too; the folder keeps the map, and what reopens the folder (verify --target, accept, run) builds its
layers from it."""

from pathlib import Path

import numpy as np
import pytest
import target_builders as tb
from benchmark_scripts import benchmark

from gguf2ov.cli import main
from gguf2ov.runtime.target import TargetIR

REPO = Path(__file__).resolve().parents[2]
QWEN3_MAP = (REPO / "tensor_maps" / "qwen3.yaml").read_text()


def _map(path: Path, arch: str = "qwen3", forward: str = "{qk_norm: true}") -> Path:
    """tensor_maps/qwen3.yaml (its `extends` and all) copied, saying `arch` and `forward`."""
    text = QWEN3_MAP.replace("arch: qwen3\n", f"arch: {arch}\n")
    text = text.replace("forward: {qk_norm: true}", f"forward: {forward}")
    assert text.count(f"arch: {arch}\n") == 1 and text.count(f"forward: {forward}") == 1
    path.write_text(text)
    return path


def _rewritten(gguf: Path, out: Path, arch: str | None = None, norms_less: float = 0.0) -> Path:
    """`gguf` with its architecture renamed `arch` (general.architecture and every key it prefixes), and every
    RMSNorm weight stored as w - `norms_less` (the fixture's norms are F32 in [0.94, 1.13], where w - 1 + 1
    is w exactly)."""
    fuzz = benchmark("fuzz_gguf")
    model = fuzz.parse(gguf.read_bytes())
    was = next(value for key, _, value in model.kv if key == "general.architecture")
    for entry in model.kv:
        if entry[0] == "general.architecture":
            entry[2] = arch or was
        elif entry[0].startswith(was + "."):
            entry[0] = (arch or was) + entry[0][len(was):]
    data = bytearray(model.data)
    for t in model.tensors:
        if t.name.endswith("norm.weight") and norms_less:
            assert t.gtype == fuzz.GGML_F32
            stop = t.offset + 4 * int(np.prod(t.dims))
            w = np.frombuffer(data[t.offset:stop], np.float32)
            data[t.offset:stop] = (w - np.float32(norms_less)).astype(np.float32).tobytes()
    model.data = bytes(data)
    out.write_bytes(fuzz.serialise(model)[0])
    return out


def _build(source: Path, out: Path, fixtures_dir, *extra) -> Path:
    assert main(["target", str(source), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf"), "--quiet",
                 *extra]) == 0
    return out


@pytest.fixture(scope="module")
def shipped(q4_k_m, fixtures_dir, tmp_path_factory) -> Path:
    """The target of the fixture's Q4_K_M file through the shipped qwen3 map."""
    return _build(q4_k_m, tmp_path_factory.mktemp("shipped") / "t", fixtures_dir)


def _same_model(folder: Path, shipped: Path) -> None:
    """The same weights, byte for byte, and the same logits over two stateful steps."""
    xml = "openvino_model.xml"
    assert (folder / "openvino_model.bin").read_bytes() == (shipped / "openvino_model.bin").read_bytes()
    steps = tb.steps(tb.VOCAB)
    for (a, _), (b, _) in zip(tb.run_steps(folder / xml, steps), tb.run_steps(shipped / xml, steps)):
        np.testing.assert_array_equal(a, b)


def test_a_file_of_an_architecture_no_shipped_map_names_is_built_through_its_map(tmp_path, q4_k_m, fixtures_dir,
                                                                                  shipped):
    """The fixture file renamed `qwen3x`, with a copy of the qwen3 map saying `arch: qwen3x`: the target of
    the shipped map's file, and the folder, reopened, is built as qwen3x (before: "no map for architecture
    'qwen3x'", the layers being looked up again by the architecture's name)."""
    import json

    renamed = _rewritten(q4_k_m, tmp_path / "qwen3x.gguf", arch="qwen3x")
    folder = _build(renamed, tmp_path / "t", fixtures_dir, "--map", str(_map(tmp_path / "qwen3x.yaml", "qwen3x")))
    _same_model(folder, shipped)
    assert json.loads((folder / "gguf2ov.json").read_text())["options"]["arch"] == "qwen3x"
    target = TargetIR.open(folder)
    assert target.built_as.arch == "qwen3x"
    assert all(f.status == "pass" for f in target.findings()), [(f.name, f.reason) for f in target.findings()]


def test_the_layers_kinds_steps_and_options_are_the_maps_passed(tmp_path, q4_k_m, fixtures_dir, shipped):
    """A map whose RMSNorms scale by (1 + w), on the file whose norm weights are stored less 1: the shipped
    map's target of the file, byte for byte (before: the kinds, steps and options came from the shipped
    qwen3 map, and the norms scaled by w - 1). The folder keeps the map, `extends` resolved
    (gguf2ov_map.yaml), and what reopens it (verify --target, accept, run: runtime.target.TargetIR) takes the
    layers from it, with no map passed again; a folder built through a shipped map keeps none, and is
    reopened through the map of its model type."""
    from gguf2ov.maps.load import load_map

    shifted = _rewritten(q4_k_m, tmp_path / "shifted.gguf", norms_less=1.0)
    offset = _map(tmp_path / "offset.yaml", forward="{qk_norm: true, norm_offset: 1.0}")
    folder = _build(shifted, tmp_path / "t", fixtures_dir, "--map", str(offset))
    _same_model(folder, shipped)
    kept = load_map(path=folder / "gguf2ov_map.yaml")
    assert kept.target["forward"] == {"qk_norm": True, "norm_offset": 1.0}
    assert "extends" not in (folder / "gguf2ov_map.yaml").read_text()
    target = TargetIR.open(folder)
    assert target.amap is kept and target.built_as.options["norm_offset"] == 1.0
    assert all(f.status == "pass" for f in target.findings())
    assert not (shipped / "gguf2ov_map.yaml").exists()
    assert TargetIR.open(shipped).built_as.options["norm_offset"] == 0.0


def test_a_vlm_of_an_architecture_no_shipped_map_names_is_built_through_its_map(tmp_path):
    """llama.cpp's Gemma 4 VLM text file renamed `gemma4x`, a copy of the gemma4 map saying so (its `mmproj:`
    section and all), and the file's mmproj: the shipped map's folder, model by model (before: "no map for
    architecture 'gemma4x'", and the `mmproj:` section was read again by the architecture's name)."""
    data = REPO / "tests" / "data"
    text, mmproj = data / "gemma4-vlm-llamacpp-F32.gguf", data / "gemma4-vlm-mmproj-llamacpp-F32.gguf"
    gemma4x = tmp_path / "gemma4x.yaml"
    gemma4x.write_text((REPO / "tensor_maps" / "gemma4.yaml").read_text().replace("arch: gemma4\n", "arch: gemma4x\n"))
    folders = []
    for name, source, extra in (("shipped", text, ()),
                                ("gemma4x", _rewritten(text, tmp_path / "x.gguf", "gemma4x"), ("--map", str(gemma4x)))):
        folders.append(tmp_path / name)
        assert main(["target", str(source), "--mmproj", str(mmproj), "-o", str(folders[-1]), "--quiet", *extra]) == 0
    shipped, ours = folders
    models = sorted(p.name for p in shipped.glob("*.bin"))
    assert len(models) == 6 and models == sorted(p.name for p in ours.glob("*.bin"))  # 4 models, the tokenizers
    for name in models:
        assert (ours / name).read_bytes() == (shipped / name).read_bytes(), name


@pytest.mark.slow
def test_genai_runs_a_folder_built_with_a_map_as_the_shipped_maps(tmp_path, q4_k_m, fixtures_dir, fixture_draft,
                                                                 shipped):
    """`accept` on the folder of the renamed file with its norms less 1, built through a qwen3x map scaling
    them by (1 + w): the shipped map's target's text and accepted tokens, prompt by prompt."""
    from gguf2ov.runtime.genai import GenerationSettings
    from gguf2ov.stages.accept import run_acceptance

    shifted = _rewritten(q4_k_m, tmp_path / "shifted.gguf", arch="qwen3x", norms_less=1.0)
    offset = _map(tmp_path / "offset.yaml", "qwen3x", forward="{qk_norm: true, norm_offset: 1.0}")
    folder = _build(shifted, tmp_path / "t", fixtures_dir, "--map", str(offset))
    prompts = [line.strip() for line in (fixtures_dir / "prompts.txt").read_text().splitlines() if line.strip()]
    settings = GenerationSettings(max_new_tokens=60, num_assistant_tokens=7)
    ours, theirs = (run_acceptance(TargetIR.open(f), fixture_draft, prompts, settings, progress=False)
                    for f in (folder, shipped))
    assert ours.overall.identical and ours.overall.accepted_tokens > 0
    for a, b in zip(ours.prompts, theirs.prompts, strict=True):
        assert (a.text_target, a.text_draft, a.accepted_tokens) == (b.text_target, b.text_draft, b.accepted_tokens)

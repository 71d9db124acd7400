"""`gguf2ov ovms`: the model repository OVMS serves, checked against the messages OVMS parses it into.

`ovms_proto` declares MediaPipe's graph messages and OVMS's `LLMCalculatorOptions` (names, numbers,
defaults); the written `graph.pbtxt` is parsed with protobuf's own `text_format`, so a field OVMS
does not know fails here as it would fail there.
"""

import json
import os
import shutil

import pytest
from dflash_builders import DFLASH_RT_INFO, rt_info_ir
from google.protobuf import text_format
from google.protobuf.message import EncodeError
from ovms_proto import POOL, LLMCalculatorOptions, llm_options, parse_graph

from gguf2ov.cli import main
from gguf2ov.stages import ovms
from gguf2ov.stages.ovms import calculator_options, graph_pbtxt, ovms_repository


@pytest.fixture(scope="module")
def inputs(fixtures_dir, tmp_path_factory):
    """The fixture target and a DFlash draft IR, on the file system the outputs are written to."""
    root = tmp_path_factory.mktemp("inputs")
    target = shutil.copytree(fixtures_dir / "target", root / "Qwen3-tiny-ov")
    draft = rt_info_ir(root / "tiny-dflash")
    return target, draft


def files_under(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def run(argv) -> int:
    return main([str(a) for a in argv])


def one_error(argv, capsys) -> str:
    assert run(argv) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.count("hint: ") <= 1 and "Traceback" not in err, err
    return errors[0]


def test_the_repository_ovms_serves(inputs, tmp_path):
    target, draft = inputs
    out = tmp_path / "models"
    result = ovms_repository(target, draft, out, name="org/Qwen3-tiny", progress=False)
    model = out / "org" / "Qwen3-tiny"

    # config.json: one model, served from its folder
    assert json.loads((out / "config.json").read_text()) == {
        "model_config_list": [{"config": {"name": "org/Qwen3-tiny", "base_path": "org/Qwen3-tiny"}}]}
    # the layout of OVMS's speculative-decoding demo: the target's files beside graph.pbtxt, the draft in a subfolder
    assert files_under(out) == ({"config.json", "gguf2ov.json", "org/Qwen3-tiny/graph.pbtxt"}
                                | {f"org/Qwen3-tiny/{f}" for f in files_under(target)}
                                | {f"org/Qwen3-tiny/tiny-dflash/{f}" for f in files_under(draft)})
    # the target's generation config, with the proposals per step GenAI sizes its pipeline for at load
    assert json.loads((model / "generation_config.json").read_text()) == \
        json.loads((target / "generation_config.json").read_text()) | {"num_assistant_tokens": 7}
    assert result.num_assistant_tokens == 7 and result.linear_attention_layers == 0
    for source, placed in [(target / f, model / f) for f in files_under(target) if f != "generation_config.json"] + \
                          [(draft / f, model / "tiny-dflash" / f) for f in files_under(draft)]:
        assert placed.read_bytes() == source.read_bytes()
        # weights share the input's bytes; configs are copies, so an edit in the repository stays there
        assert os.path.samefile(placed, source) == (source.suffix == ".bin"), placed
    assert {f.how for f in result.files if f.path.endswith(".bin")} == {"hard link"}

    graph = parse_graph((model / "graph.pbtxt").read_text())
    assert list(graph.input_stream) == ["HTTP_REQUEST_PAYLOAD:input"]
    assert list(graph.output_stream) == ["HTTP_RESPONSE_PAYLOAD:output"]
    (node,) = graph.node
    assert (node.name, node.calculator) == ("LLMExecutor", "HttpLLMCalculator")
    assert list(node.input_stream) == ["LOOPBACK:loopback", "HTTP_REQUEST_PAYLOAD:input"]
    assert list(node.output_stream) == ["LOOPBACK:loopback", "HTTP_RESPONSE_PAYLOAD:output"]
    assert list(node.input_side_packet) == ["LLM_NODE_RESOURCES:llm", "LLM_NODE_EXECUTION_CONTEXTS:llm_ctx"]
    (info,) = node.input_stream_info
    assert (info.tag_index, info.back_edge) == ("LOOPBACK:0", True)
    handler = node.input_stream_handler
    sync = handler.options.Extensions[POOL.FindExtensionByName("mediapipe.SyncSetInputStreamHandlerOptions.ext")]
    assert handler.input_stream_handler == "SyncSetInputStreamHandler"
    assert [list(s.tag_index) for s in sync.sync_set] == [["LOOPBACK:0"]]

    options = llm_options(node)
    assert node.node_options[0].type_url == "type.googleapis.com/mediapipe.LLMCalculatorOptions"
    assert (options.models_path, options.device, options.draft_models_path, options.draft_device) == \
        ("./", "CPU", "./tiny-dflash", "CPU")
    assert options.pipeline_type == LLMCalculatorOptions.PipelineType.Value("LM_CB")
    # DFlash refuses prefix caching: written, not left to the default
    assert options.HasField("enable_prefix_caching") and options.enable_prefix_caching is False
    assert not options.draft_eagle3_mode and not options.HasField("cache_size")  # OVMS's defaults
    # the paths, resolved as OVMS resolves them (against the graph's folder), hold the models GenAI loads
    assert (model / options.models_path / "openvino_model.xml").is_file()
    assert (model / options.models_path / "openvino_tokenizer.xml").is_file()
    assert (model / options.draft_models_path / "openvino_model.xml").is_file()

    record = json.loads((out / "gguf2ov.json").read_text())
    assert set(record["sources"]) == {"target", "draft"} and record["options"]["ovms"] == "2026.4"
    assert result.draft_rt_info == DFLASH_RT_INFO and result.draft_models_path == "./tiny-dflash"
    assert result.options == {"models_path": "./", "device": "CPU", "pipeline_type": "LM_CB",
                              "enable_prefix_caching": False, "draft_models_path": "./tiny-dflash",
                              "draft_device": "CPU"}


def test_a_misspelt_or_unknown_field_fails_the_parse(monkeypatch, inputs, tmp_path):
    text = graph_pbtxt(calculator_options("./draft", "GPU"))
    assert llm_options(parse_graph(text).node[0]).device == "GPU"
    for right, wrong in [("draft_models_path", "draft_model_path"), ("enable_prefix_caching", "prefix_caching"),
                         ("pipeline_type: LM_CB", "pipeline_type: LM_CBB"), ("input_side_packet", "input_side_packets"),
                         ("back_edge", "backedge"), ("SyncSetInputStreamHandlerOptions.ext", "SyncSetOptions.ext"),
                         ("mediapipe.LLMCalculatorOptions]", "mediapipe.LLMCalculatorOption]")]:
        with pytest.raises(text_format.ParseError):
            parse_graph(text.replace(right, wrong, 1))
    with pytest.raises(EncodeError, match="models_path"):  # a required field left out
        parse_graph(text.replace('models_path: "./"', "", 1))
    # and a writer that spells a field wrong writes a graph that fails the same check
    monkeypatch.setattr(ovms, "calculator_options", lambda path, device: {"models_path": "./", "draft_model": path})
    ovms_repository(*inputs, tmp_path / "models", progress=False)
    with pytest.raises(text_format.ParseError, match='no field named "draft_model"'):
        parse_graph((tmp_path / "models" / "Qwen3-tiny-ov" / "graph.pbtxt").read_text())


def test_the_command_and_its_defaults(inputs, tmp_path, capsys):
    target, draft = inputs
    out = tmp_path / "served"
    assert run(["ovms", "--target", target, "--draft", draft, "-o", out, "--json", tmp_path / "r.json"]) == 0
    text = capsys.readouterr().out
    assert "draft_models_path      \"./tiny-dflash\"" in text
    assert f"serve: ovms --rest_port 8000 --config_path {out / 'config.json'}" in text
    assert json.loads((out / "config.json").read_text())["model_config_list"][0]["config"]["name"] == "Qwen3-tiny-ov"
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["name"] == "Qwen3-tiny-ov" and data["options"]["pipeline_type"] == "LM_CB"
    assert one_error(["ovms", "--target", target, "--draft", draft, "-o", out], capsys) == \
        f"error: output {out} already exists"
    assert run(["ovms", "--target", target, "--draft", draft, "-o", out, "--overwrite", "--quiet",
                 "--device", "GPU.1"]) == 0
    assert "draft_device: \"GPU.1\"" in (out / "Qwen3-tiny-ov" / "graph.pbtxt").read_text()


def test_a_graph_of_the_targets_own_is_replaced_and_sampling_is_warned_about(inputs, tmp_path):
    target = shutil.copytree(inputs[0], tmp_path / "target")
    (target / "graph.pbtxt").write_text("# an earlier graph\n")
    config = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps(config | {"do_sample": True}))
    result = ovms_repository(target, inputs[1], tmp_path / "models", progress=False)
    assert result.skipped == ["graph.pbtxt"]
    parse_graph((tmp_path / "models" / "target" / "graph.pbtxt").read_text())
    assert any("sets do_sample" in w and "temperature 0" in w for w in result.warnings)


def test_refusals_are_one_line_before_anything_is_written(inputs, fixtures_dir, tmp_path, capsys):
    target, draft = inputs
    out = tmp_path / "models"
    plain = rt_info_ir(tmp_path / "plain", rt_info={})
    half = rt_info_ir(tmp_path / "half", rt_info={"dflash_mode": "True"})
    no_tokenizer = shutil.copytree(target, tmp_path / "no-tokenizer")
    (no_tokenizer / "openvino_tokenizer.xml").unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    clash = shutil.copytree(target, tmp_path / "clash")
    (clash / "tiny-dflash").mkdir()
    cases = [
        (["--target", target, "--draft", plain], f"error: {plain} is not a DFlash draft IR: openvino_model.xml has no "
                                                 "dflash_mode rt_info"),
        (["--target", target, "--draft", half], f"error: {half}: openvino_model.xml has dflash_mode but no "
                                                "dflash/mask_token_id, dflash/target_layer_ids rt_info"),
        (["--target", target, "--draft", empty], f"error: draft folder {empty} has no openvino_model.xml"),
        (["--target", no_tokenizer, "--draft", draft],
         f"error: target folder {no_tokenizer} has no openvino_tokenizer.xml"),
        (["--target", draft.parent, "--draft", draft],
         f"error: target folder {draft.parent} has no openvino_model.xml"),
        (["--target", fixtures_dir.parent / "tiny-vlm" / "target", "--draft", draft], "is a VLM"),
        (["--target", clash, "--draft", draft], f"error: the target folder {clash} already holds tiny-dflash"),
        (["--target", target, "--draft", draft, "--device", "NPU"], "GenAI does not run DFlash drafts on NPU"),
        (["--target", target, "--draft", draft, "--name", "../up"], "error: --name '../up' cannot name"),
        (["--target", target, "--draft", draft, "--name", 'a"b'], "cannot name an OVMS model folder"),
        (["--target", target, "--draft", draft, "--device", 'CPU"'], "is not an OpenVINO device name"),
    ]
    for args, needle in cases:
        error = one_error(["ovms", *args, "-o", out], capsys)
        assert error.startswith(needle) or needle in error, (needle, error)
        assert not out.exists()
    inside = target / "served"
    assert one_error(["ovms", "--target", target, "--draft", draft, "-o", inside], capsys) == \
        f"error: output {inside} is inside the input folder {target}"
    assert not inside.exists()


@pytest.mark.slow
def test_genai_loads_the_repository_from_the_paths_the_graph_names(fixtures_dir, fixture_draft, tmp_path):
    """What OVMS's LM_CB servable does with the graph, done with GenAI (OVMS itself is not run): the
    target from models_path, the draft from draft_models_path, prefix caching as the graph sets it.
    The exported fixture draft attaches as DFlash, is accepted, and the text stays the target's."""
    # before export_draft's verify creates the process's one ov.Core (numerics.core()): openvino_tokenizers
    # adds its ops only to a Core made after it is imported, and later tests that tokenize with that Core fail
    import openvino_genai as ov_genai
    import openvino_tokenizers  # noqa: F401

    from gguf2ov.runtime.genai import properties

    ovms_repository(fixtures_dir / "target", fixture_draft, tmp_path / "models", name="org/tiny", progress=False)
    model = tmp_path / "models" / "org" / "tiny"
    options = llm_options(parse_graph((model / "graph.pbtxt").read_text()).node[0])
    props = properties("f32", options.device)
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = options.enable_prefix_caching

    def pipeline(**extra):
        return ov_genai.LLMPipeline(str(model / options.models_path), options.device, scheduler_config=scheduler,
                                    **extra, **props)

    speculative = pipeline(draft_model=ov_genai.draft_model(str(model / options.draft_models_path),
                                                            options.draft_device, **props))
    config = speculative.get_generation_config()
    assert config.num_assistant_tokens == 7  # the repository's generation_config.json, read at load
    config.max_new_tokens, config.do_sample, config.num_assistant_tokens = 24, False, 5
    prompt = (fixtures_dir / "prompts.txt").read_text().splitlines()[0]
    with_draft = speculative.generate([prompt], config)
    assert with_draft.extended_perf_metrics.get_num_accepted_tokens() > 0
    config.num_assistant_tokens = 0
    assert with_draft.texts == pipeline().generate([prompt], config).texts

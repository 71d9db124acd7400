"""fixtures/tiny-hybrid and fixtures/tiny-moe: trained targets (a Qwen3.5 hybrid and a Qwen3-MoE) with
their DFlash drafts, optimum-intel's exports and llama.cpp's GGUFs, and gguf2ov on them.

The fast tests check what the fixtures are: configs and shapes, the checkpoints as transformers saved
them, the committed IRs open and compute, and their folders are targets as committed, the GGUFs read
with gguf-py in llama.cpp's layout (the V heads reordered, the router kept in F32), and the figures
the builders recorded (GenAI greedy text with and without the draft, acceptance, llama.cpp's greedy
text, expert use). The slow tests repeat the builders' closing check for the reference draft. Below
them, the targets gguf2ov builds from each checkpoint and GGUF are held to transformers', optimum's
and llama.cpp's, and `gguf2ov run` to the pairs.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import benchmark
from dflash_builders import draft_model

REPO = Path(__file__).resolve().parents[1]
FIXTURES_ROOT = REPO / "fixtures"
HYBRID, MOE = "tiny-hybrid", "tiny-moe"
MAX_BYTES = {HYBRID: 2_100_000, MOE: 1_450_000}
MIN_ACCEPTANCE = 0.6  # accepted / generated in GenAI, reference and GGUF drafts
ARCH = {HYBRID: "qwen35", MOE: "qwen3moe"}
NEED = ["prompts.txt", "fixture.json", "draft-Q4_K_M.gguf", "target-Q4_K_M.gguf", "draft-ref/config.json",
        "draft-ref/model.safetensors", "target-hf/config.json", "target-hf/model.safetensors",
        "target-hf/tokenizer.json", "target/config.json", "target/openvino_model.xml", "target/openvino_model.bin",
        "target/openvino_tokenizer.xml", "target/openvino_detokenizer.xml"]


def _size(p: Path) -> int:  # what is committed: Python's bytecode caches are not
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts)


def _dir(name: str) -> Path:
    path = FIXTURES_ROOT / name
    if not path.exists():
        pytest.fail(f"fixture missing at {path}: run python fixtures/make_fixtures.py --{name.removeprefix('tiny-')}")
    return path


def _json(name: str, file: str) -> dict:
    return json.loads((_dir(name) / file).read_text())


def _field(reader, key):
    return reader.fields[key].contents()


def _experts(cfg: dict) -> int:
    return cfg.get("num_experts", cfg.get("num_local_experts"))  # transformers 5 saves num_local_experts


def _assert_files_as_built(name):
    """The fixture holds exactly the files its fixture.json lists, each of the size it was built with."""
    d = _dir(name)
    sizes = _json(name, "fixture.json")["sizes_bytes"]  # every file but fixture.json, as built
    assert sizes == {k: (d / k).stat().st_size for k in sizes}
    assert set(sizes) | {"fixture.json"} == {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_files_budget_tokenizer_and_prompts(name):
    d = _dir(name)
    missing = [n for n in NEED if not (d / n).is_file()]
    assert not missing, f"fixture files missing: {missing}"
    assert _size(d) <= MAX_BYTES[name], _size(d)
    source = FIXTURES_ROOT / "tiny-dflash"
    assert (d / "prompts.txt").read_text() == (source / "prompts.txt").read_text()
    assert (d / "target-hf/tokenizer.json").read_bytes() == (source / "target-hf/tokenizer.json").read_bytes()
    _assert_files_as_built(name)


def test_hybrid_config():
    cfg = _json(HYBRID, "target-hf/config.json")
    assert cfg["model_type"] == "qwen3_5_text" and cfg["architectures"] == ["Qwen3_5ForCausalLM"]
    types = cfg["layer_types"]
    assert types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    assert cfg["num_hidden_layers"] == len(types)
    assert cfg["linear_num_key_heads"] < cfg["linear_num_value_heads"]  # llama.cpp reorders the value heads
    assert cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"] == 0
    assert cfg["linear_key_head_dim"] == cfg["linear_value_head_dim"]  # llama.cpp's qwen35 assumes it
    assert cfg["num_attention_heads"] > cfg["num_key_value_heads"]  # GQA in the full layers
    rope = cfg["rope_parameters"]
    assert rope["partial_rotary_factor"] == 0.25
    assert 2 * sum(rope["mrope_section"]) == int(cfg["head_dim"] * rope["partial_rotary_factor"])
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 512


def test_moe_config():
    cfg = _json(MOE, "target-hf/config.json")
    assert cfg["model_type"] == "qwen3_moe" and cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    assert _experts(cfg) >= 8 and cfg["num_experts_per_tok"] == 2
    assert cfg["norm_topk_prob"] is True  # llama.cpp's qwen3moe renormalises the top-k weights
    assert cfg["decoder_sparse_step"] == 1 and not cfg["mlp_only_layers"]  # every layer is MoE
    assert cfg["output_router_logits"] is False
    assert cfg["num_attention_heads"] > cfg["num_key_value_heads"]
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 512


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_checkpoint_as_transformers_saved_it(name):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    d = _dir(name) / "target-hf"
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    cfg = _json(name, "target-hf/config.json")
    if name == HYBRID:
        assert all(k.startswith("model.language_model.") for k in keys)
        info = _json(name, "fixture.json")["checkpoint_keys"]
        assert info["written_by"] == {"5.5.4": "model.language_model.", "5.2.0": "model.language_model."}
        assert info["same_tensors"]
    else:
        assert all(k.startswith("model.") for k in keys)
        n, e = cfg["num_hidden_layers"], _experts(cfg)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert {f"model.layers.{i}.mlp.experts.{j}.{proj}.weight" for i in range(n) for j in range(e)} <= keys
    model, loading = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    assert not any(loading.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
    assert type(model).__name__ == cfg["architectures"][0]


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_committed_export_opens_and_computes(name):
    import openvino as ov
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gguf2ov.numerics import EXACT

    d = _dir(name)
    cfg = _json(name, "target-hf/config.json")
    model = ov.Core().read_model(d / "target/openvino_model.xml")
    layers = json.loads(model.get_rt_info()["hidden_states_decoder_layers"].value)["layers"]
    assert sorted(map(int, layers)) == list(range(cfg["num_hidden_layers"]))
    states = sorted(op.get_variable_id() for op in model.get_ops() if op.get_type_name() == "ReadValue")
    if name == HYBRID:
        n_linear = cfg["layer_types"].count("linear_attention")
        n_full = len(cfg["layer_types"]) - n_linear
        want = {"conv": n_linear, "ssm": n_linear, "key": n_full, "value": n_full}
    else:
        want = {"key": cfg["num_hidden_layers"], "value": cfg["num_hidden_layers"]}
    got = {}
    for s in states:  # optimum's ids: cache_params.past.conv.0cache_params.present.conv.0, past_key_values.0.key...
        kind = s.split(".")[2] if s.startswith("cache_params.") else s.split(".")[-1]
        got[kind] = got.get(kind, 0) + 1
    assert got == want, states
    assert "i8" in {op.get_element_type().get_type_name() for op in model.get_ops() if op.get_type_name() == "Constant"}

    # the IR's next token after a prompt is transformers' (prefill of the whole prompt, f32)
    tok = AutoTokenizer.from_pretrained(d / "target-hf")
    prompt = (d / "prompts.txt").read_text().splitlines()[0]
    ids = np.array([tok(prompt, add_special_tokens=False).input_ids], dtype=np.int64)
    compiled = ov.Core().compile_model(model, "CPU", EXACT)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None],
            "beam_idx": np.zeros(1, dtype=np.int32)}
    names = {n for p in compiled.inputs for n in p.get_names()}
    logits = compiled.create_infer_request().infer({k: v for k, v in feed.items() if k in names})["logits"]
    assert logits.shape == (1, ids.shape[1], cfg["vocab_size"])
    hf = AutoModelForCausalLM.from_pretrained(d / "target-hf", dtype=torch.float32).eval()
    with torch.no_grad():
        want_logits = hf(input_ids=torch.tensor(ids)).logits[0].numpy()
    assert (logits[0].argmax(-1) == want_logits.argmax(-1)).mean() > 0.9


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_the_committed_target_folder_is_a_target(name):
    """`--target fixtures/tiny-*/target` names the committed folder as it is, an OpenVINO target
    (not a model to build one from), whose locators give every layer."""
    from gguf2ov.job import Job, Options
    from gguf2ov.sources import TargetFolder

    d = _dir(name)
    job = Job.of(d / "draft-Q4_K_M.gguf", d / "target", Options(progress=False))
    assert isinstance(job.target_spec, TargetFolder) and job.target.path == d / "target"
    assert sorted(job.target.locators) == list(range(_json(name, "target-hf/config.json")["num_hidden_layers"]))


def test_a_gzipped_target_ir_is_named_with_the_command_that_unpacks_it(tmp_path, capsys):
    """A target folder whose XML was gzipped (as these fixtures once committed it) is refused in one
    line that says what is there and how to unpack it, before anything is written."""
    import gzip
    import shutil

    from gguf2ov.cli import main

    d = _dir(MOE)
    target = shutil.copytree(d / "target", tmp_path / "target")
    xml = target / "openvino_model.xml"
    xml.with_name(xml.name + ".gz").write_bytes(gzip.compress(xml.read_bytes()))
    xml.unlink()
    for argv in (["run", d / "draft-Q4_K_M.gguf", "--target", target, "-o", tmp_path / "run"],
                 ["verify", tmp_path / "no-draft", "--target", target]):
        assert main([str(a) for a in argv]) == 1
        error, hint = capsys.readouterr().err.splitlines()
        assert error == (f"error: target folder {target} holds openvino_model.xml.gz but no openvino_model.xml: "
                         "the IR's XML is gzipped, and OpenVINO reads it unpacked"), error
        assert hint == f"hint: unpack it in place: gunzip -k {target / 'openvino_model.xml.gz'}", hint
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_draft_matches_its_target(name):
    from safetensors import safe_open

    d = _dir(name)
    cfg, target = _json(name, "draft-ref/config.json"), _json(name, "target-hf/config.json")
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["hidden_size"] == target["hidden_size"] and cfg["vocab_size"] == target["vocab_size"]
    dc = cfg["dflash_config"]
    assert cfg["num_target_layers"] == target["num_hidden_layers"]
    assert all(0 <= i < target["num_hidden_layers"] - 1 for i in dc["target_layer_ids"])
    if name == HYBRID:  # taps on both layer types, as the real Qwen3.5 drafts have
        assert {target["layer_types"][i] for i in dc["target_layer_ids"]} == {"linear_attention", "full_attention"}
    tok = json.loads((d / "target-hf/tokenizer.json").read_text())
    assert {t["content"]: t["id"] for t in tok["added_tokens"]}["<|mask|>"] == dc["mask_token_id"]
    with safe_open(str(d / "draft-ref/model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    assert keys == set(draft_model(cfg).state_dict())


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_ggufs_read_with_gguf_py(name):
    from gguf import GGUFReader
    from safetensors.torch import load_file

    d = _dir(name)
    hf = load_file(str(d / "target-hf/model.safetensors"))
    info = _json(name, "fixture.json")
    cfg, dcfg = _json(name, "target-hf/config.json"), _json(name, "draft-ref/config.json")

    draft = GGUFReader(d / "draft-Q4_K_M.gguf")
    assert _field(draft, "general.architecture") == "dflash"
    assert _field(draft, "dflash.target_layers") == [i + 1 for i in dcfg["dflash_config"]["target_layer_ids"]]
    assert _field(draft, "tokenizer.ggml.pre") == "gpt-2"

    r = GGUFReader(d / "target-Q4_K_M.gguf")
    arch = ARCH[name]
    assert _field(r, "general.architecture") == arch
    assert _field(r, "tokenizer.ggml.pre") == "gpt-2"
    assert len(_field(r, "tokenizer.ggml.tokens")) == cfg["vocab_size"]
    assert _field(r, f"{arch}.block_count") == cfg["num_hidden_layers"]  # no MTP layer
    assert _field(r, f"{arch}.embedding_length") == cfg["hidden_size"]
    assert _field(r, f"{arch}.attention.head_count_kv") == cfg["num_key_value_heads"]
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    assert counts == info["target_gguf"]["types_Q4_K_M"]
    tensors = {t.name: t for t in r.tensors}
    assert "output.weight" not in tensors  # tied: llama.cpp reads token_embd twice
    h = cfg["hidden_size"]
    if name == HYBRID:
        nk, nv, dk = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"]
        assert _field(r, f"{arch}.ssm.group_count") == nk and _field(r, f"{arch}.ssm.time_step_rank") == nv
        assert _field(r, f"{arch}.ssm.state_size") == dk and _field(r, f"{arch}.ssm.inner_size") == nv * dk
        assert _field(r, f"{arch}.rope.dimension_count") == int(cfg["head_dim"] * 0.25)
        assert _field(r, f"{arch}.rope.dimension_sections")[:3] == cfg["rope_parameters"]["mrope_section"]
        assert _field(r, f"{arch}.attention.recurrent_layers") == [t == "linear_attention" for t in cfg["layer_types"]]
        linear = [i for i, t in enumerate(cfg["layer_types"]) if t == "linear_attention"]
        full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
        assert list(tensors[f"blk.{linear[0]}.attn_qkv.weight"].shape) == [h, 2 * nk * dk + nv * dk]
        q_rows = 2 * cfg["num_attention_heads"] * cfg["head_dim"]  # queries and their gates
        assert list(tensors[f"blk.{full[0]}.attn_q.weight"].shape) == [h, q_rows]
        # ssm_a (F32) is -exp(A_log) with the value heads in llama.cpp's tiled order (head k*r+j -> j*nk+k)
        a_log = hf[f"model.language_model.layers.{linear[0]}.linear_attn.A_log"]
        grouped = -np.exp(a_log.float().numpy())
        tiled = grouped.reshape(nk, nv // nk).T.reshape(-1)
        got = np.asarray(tensors[f"blk.{linear[0]}.ssm_a"].data, dtype=np.float32)
        np.testing.assert_allclose(got, tiled, rtol=1e-6)
        assert not np.allclose(got, grouped)
    else:
        e, i_moe = _experts(cfg), cfg["moe_intermediate_size"]
        assert _field(r, f"{arch}.expert_count") == e and _field(r, f"{arch}.expert_used_count") == 2
        assert list(tensors["blk.0.ffn_gate_exps.weight"].shape) == [h, i_moe, e]
        assert list(tensors["blk.0.ffn_down_exps.weight"].shape) == [i_moe, h, e]
        router = tensors["blk.0.ffn_gate_inp.weight"]
        assert router.tensor_type.name == "F32" and list(router.shape) == [h, e]
        want = hf["model.layers.0.mlp.gate.weight"].float().numpy()
        np.testing.assert_array_equal(np.asarray(router.data).reshape(e, h), want)


@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_recorded_figures(name):
    info = _json(name, "fixture.json")
    acc = info["acceptance"]
    if name == HYBRID:  # optimum's int8 export of the MoE target quantizes its routers too, which picks
        # other experts for some tokens: its text leaves transformers' on 3 of the 5 prompts (gguf2ov's
        # targets keep the router in float32 and give transformers' text: the tests above)
        assert all(acc["target_alone_equals_transformers_greedy"])
    for draft in ("draft-ref", "draft-Q4_K_M.gguf"):
        r = acc[draft]
        assert r["identical"] and r["accepted"] >= MIN_ACCEPTANCE * r["generated"], (draft, r)
    assert acc["random"]["identical"] and acc["random"]["accepted"] < 0.05 * acc["random"]["generated"]
    if name == HYBRID:
        assert acc["settings"]["num_linear_attention_blocks"] >= acc["settings"]["num_assistant_tokens"] + 2
    greedy = info["greedy_llamacpp_vs_transformers"]
    for gguf in ("target-F32.gguf", "target-Q4_K_M.gguf"):
        assert all(greedy["prompt_ids_equal"][gguf])
    assert all(greedy["target-F32.gguf"]["equal_to_transformers"]), greedy["target-F32.gguf"]
    taps = info["target_ir_taps"]  # each locator gives its own layer's state
    assert all(a * 4 < b for a, b in zip(taps["own_layer"], taps["nearest_other_layer"]))
    if name == MOE:  # the trained router uses every expert in every layer
        use = info["expert_use"]["per_layer"]
        assert len(use) == _json(name, "target-hf/config.json")["num_hidden_layers"]
        assert all(layer["min_share"] > 0 for layer in use.values()), use


@pytest.mark.slow
@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_reference_draft_is_accepted(name):
    """The builders' closing check for the reference draft: GenAI greedy text with the draft attached
    (exported by gguf2ov) equals the target's alone, and most tokens come from the draft."""
    if str(FIXTURES_ROOT) not in sys.path:
        sys.path.insert(0, str(FIXTURES_ROOT))
    import target_fixtures as tf

    d = _dir(name)
    prompts = (d / "prompts.txt").read_text().splitlines()
    blocks = tf.K + 2 if name == HYBRID else None
    r = tf.genai_check(d, prompts, blocks, [""] * len(prompts), lambda m: None, drafts=("draft-ref",))["draft-ref"]
    assert r["identical"], r
    assert r["generated"] == tf.MAX_NEW_TOKENS * len(prompts)
    assert r["accepted"] >= MIN_ACCEPTANCE * r["generated"], r


# --- gguf2ov on the fixture pairs ------------------------------------------------------------------
# What a user runs: the target built from the checkpoint against optimum's export, the target built
# from llama.cpp's Q4_K_M file against llama.cpp's own text, and `gguf2ov run` on the pair.

RELATIVE = 1e-5  # f32, two stateful steps: logits and every locator


def _gguf2ov(*argv) -> None:
    from gguf2ov.cli import main

    code = main([str(a) for a in argv] + ["--quiet"])
    assert code == 0, argv


# A decode step of these 0.1-0.2M-parameter targets takes about a millisecond: a draft cannot pay for
# itself there, and acceptance says SLOW on a fast core ("too light"), PASS where the step is slower.
# What the pair must show either way: identical text, most proposals accepted, the best K named.
TOO_LIGHT = "the target is too light for the draft's overhead to pay off"


def _run(out: Path, *argv, min_acceptance: float = MIN_ACCEPTANCE) -> dict:
    """`gguf2ov run ARGV -o OUT`: every stage passes, and each acceptance gives identical text with
    `min_acceptance` of the tokens from the draft, PASS or SLOW (too light), with the verdict's exit code."""
    from gguf2ov.cli import main
    from gguf2ov.cli.output import verdict_code

    code = main(["run", *(str(a) for a in argv), "-o", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] in ("PASS", "SLOW") and code == verdict_code(report["verdict"]), report["stages"]
    assert all(s["status"] in ("pass", "warn", "skip") for s in report["stages"]), report["stages"]
    for stage, result in report["results"].items():
        if stage.startswith("accept:"):
            assert result["verdict"] == "PASS" or TOO_LIGHT in " ".join(result["reasons"]), (stage, result["reasons"])
            assert result["identical"], stage
            assert result["accepted_tokens"] >= min_acceptance * result["overall"]["generated_tokens"], stage
            assert result["best_num_assistant_tokens"] in {d["k"] for d in result["draft_lengths"]}
    assert "proposals per step that pay best on this device" in (out / "report.md").read_text()
    return report


def _greedy(target_dir: Path, prompts: list[str], new_tokens: int) -> list[str]:
    """GenAI's greedy text of each prompt on a target folder, in exact arithmetic (f32, no dynamic
    quantization, a float32 KV cache), with the scheduler every gguf2ov pipeline runs with."""
    from gguf2ov.numerics import EXACT
    from gguf2ov.runtime.genai import Prompt, generate, generation_config, make_pipeline
    from gguf2ov.runtime.target import TargetIR

    pipe = make_pipeline(TargetIR.open(target_dir), "CPU", EXACT)
    cfg = generation_config(pipe, new_tokens, None)
    return [generate(pipe, Prompt(p), cfg, False).text for p in prompts]


def _two_steps(xml: Path, vocab: int):
    import target_builders as tb

    return tb.run_steps(xml, tb.steps(vocab), tb.locators(xml))


def _assert_same_function(ours, reference, tolerance: float = RELATIVE):
    import target_builders as tb

    for step, ((logits, hidden), (want_logits, want_hidden)) in enumerate(zip(ours, reference)):
        assert tb.relative(logits, want_logits) <= tolerance, (step, tb.relative(logits, want_logits))
        assert hidden.keys() == want_hidden.keys()
        for layer in hidden:
            assert tb.relative(hidden[layer], want_hidden[layer]) <= tolerance, (step, layer)


def test_the_hybrid_target_built_from_the_checkpoint_is_optimums_export(tmp_path):
    """`gguf2ov target target-hf --weight-format int8 --sym` against the committed optimum-intel export
    (transformers 5.2.0, int8 symmetric): every MatMul's and the embedding's int8 codes are optimum's,
    and the function over two stateful steps (logits, every locator, the linear layers' too) is within
    what NNCF's int8 rounding of the six conv1d kernels in optimum's export moves it (1.3e-3 measured):
    gguf2ov keeps those kernels (4 taps a channel) in float. Equality within 1e-5 in f32 is held
    against transformers (tests/targets/test_hybrid_target.py) and the fixture checkpoint's greedy text
    below."""
    import openvino as ov

    from gguf2ov.ir.irweights import weight_constants

    d = _dir(HYBRID)
    out = tmp_path / "target"
    _gguf2ov("target", d / "target-hf", "-o", out, "--weight-format", "int8", "--sym")
    ours_xml, theirs_xml = out / "openvino_model.xml", d / "target/openvino_model.xml"

    def optimum_name(name: str) -> str:  # optimum's 16-bit-era names for the same MatMuls
        return name.replace("__module.model.model.", "__module.model.").replace(
            "__module.model.lm_head", "__module.lm_head").replace("ov_ext::", "aten::")

    ours = weight_constants(ov.Core().read_model(str(ours_xml)))
    theirs = {optimum_name(k): v for k, v in weight_constants(ov.Core().read_model(str(theirs_xml))).items()}
    assert ours.keys() == theirs.keys()
    for name, constant in ours.items():
        assert np.array_equal(constant.get_data(), theirs[name].get_data()), name
    vocab = _json(HYBRID, "target-hf/config.json")["vocab_size"]
    steps_ours, steps_theirs = _two_steps(ours_xml, vocab), _two_steps(theirs_xml, vocab)
    assert len(steps_ours[0][1]) == _json(HYBRID, "target-hf/config.json")["num_hidden_layers"]
    _assert_same_function(steps_ours, steps_theirs, tolerance=3e-3)


@pytest.mark.slow
def test_the_moe_target_built_from_the_checkpoint_computes_optimums_export(tmp_path):
    """The committed export keeps optimum's int8 router, which gguf2ov keeps in float32 in every format;
    the function is compared in fp32, against optimum-intel's fp32 export of the same checkpoint."""
    import target_builders as tb

    d = _dir(MOE)
    out = tmp_path / "target"
    _gguf2ov("target", d / "target-hf", "-o", out, "--weight-format", "fp32")
    reference = tb.optimum_export(d / "target-hf", tmp_path / "optimum")
    vocab = _json(MOE, "target-hf/config.json")["vocab_size"]
    _assert_same_function(_two_steps(out / "openvino_model.xml", vocab),
                          tb.run_steps(reference / "openvino_model.xml", tb.steps(vocab),
                                       tb.optimum_locators(d / "target-hf", reference / "openvino_model.xml")))
    layers = _json(MOE, "target-hf/config.json")["num_hidden_layers"]
    for paged in (False, True):  # the experts run as GatherMatmul, nothing of the dense trace left
        kinds, _ = tb.runtime_kinds(out / "openvino_model.xml", paged, {"INFERENCE_PRECISION_HINT": "f32"})
        assert kinds["GatherMatmul"] == 3 * layers and kinds["Tile"] == kinds["ScatterElementsUpdate"] == 0, paged


@pytest.mark.slow
@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_the_target_built_from_the_checkpoint_generates_transformers_text(name, tmp_path):
    d = _dir(name)
    out = tmp_path / "target"
    _gguf2ov("target", d / "target-hf", "-o", out)
    want = _json(name, "fixture.json")["transformers_greedy"]
    prompts = (d / "prompts.txt").read_text().splitlines()
    assert _greedy(out, prompts, want["max_new_tokens"]) == want["texts"]


# The fixture drafts are trained on the fixture corpus: on run's default prompts (prose of another kind)
# they are accepted less than on prompts.txt (107-112 of 300 tokens measured, against 322-367 of 500).
DEFAULT_PROMPTS_ACCEPTANCE = 0.25


@pytest.mark.slow
@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_run_with_its_defaults_builds_the_target_from_llama_cpps_file_and_passes(name, tmp_path):
    """`gguf2ov run draft-Q4_K_M.gguf --target target-Q4_K_M.gguf` and nothing else: the target built
    from llama.cpp's file in its own grid generates llama.cpp's greedy text (llama-simple, recorded by
    the builder) on most prompts, and the draft attached to it gives the same text with its tokens
    accepted; the report names the number of proposals that pays best on this device. The drafts are
    32 wide: the default variants at group 128 cannot apply, and are skipped with the reason named."""
    d = _dir(name)
    out = tmp_path / "run"
    report = _run(out, d / "draft-Q4_K_M.gguf", "--target", d / "target-Q4_K_M.gguf",
                  min_acceptance=DEFAULT_PROMPTS_ACCEPTANCE)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["target"]["status"] == "pass" and stages["check"]["status"] == "skip"
    assert "7 variants (int4_sym_g128, int4_asym_g128 skipped: this draft cannot take them)" in \
        stages["drift"]["reason"]
    assert {"accept:gguf", "accept:int4_asym_g16"} <= set(report["results"])  # SLOW stops nothing
    skipped = report["results"]["drift"]["skipped"]
    assert list(skipped) == ["int4_sym_g128", "int4_asym_g128"]
    md = (out / "report.md").read_text()
    for variant, why in skipped.items():
        assert "group size 128 does not divide the input width of" in why and f"- skipped {variant}: {why}" in md
    assert report["provenance"]["options"]["skipped_variants"] == skipped
    llama = _json(name, "fixture.json")["greedy_llamacpp_vs_transformers"]
    prompts = (d / "prompts.txt").read_text().splitlines()
    ours = _greedy(out / "target", prompts, llama["new_tokens"])
    same = [a == b for a, b in zip(ours, llama["target-Q4_K_M.gguf"]["texts"])]
    assert sum(same) > len(prompts) / 2, (same, ours)


@pytest.mark.slow
@pytest.mark.parametrize("name", [MOE])
def test_run_on_optimums_export_passes(name, tmp_path):
    """The same pair against optimum-intel's export of the target, the fixture's target/ folder as
    committed; the hybrid one fails its positions check
    (`test_run_on_optimums_hybrid_export_names_its_rope_positions`)."""
    d = _dir(name)
    report = _run(tmp_path / "run", d / "draft-Q4_K_M.gguf", "--target", d / "target", "--prompts", d / "prompts.txt",
                  "--variants", "gguf", "--requant", "gguf")
    assert "accept:gguf" in report["results"]


@pytest.mark.parametrize("offset, fit", [(-1, "fits"), (0, "misfit")])
def test_verify_reports_the_mixed_taps_and_the_scan_finds_the_trained_ones(tmp_path, offset, fit):
    """The hybrid draft taps linear and full layers, as the real Qwen3.5 drafts do: `layer-types`
    reports the mixed set and passes; the tap scan is what fails a draft exported with taps it was not
    trained on (the first converter's offset, every tap one layer up)."""
    from gguf2ov.job import Job, Options
    from gguf2ov.runtime.target import TargetIR
    from gguf2ov.stages.verify import verify_draft

    d = _dir(HYBRID)
    draft = tmp_path / "draft"
    Job.of(d / "draft-Q4_K_M.gguf", None, Options(target_layer_offset=offset, progress=False)).export(draft)
    result = verify_draft(draft, target=TargetIR.open(d / "target"))
    types = result.finding("layer-types")
    assert types.status == "pass", types.reason
    if fit == "fits":  # [1, 3, 5]: linear, full, linear (shifted, [2, 4, 6] are all linear)
        assert "a mixed set" in types.reason and "full_attention" in types.reason, types.reason
    assert result.taps is not None and result.taps.verdict == fit, result.finding("layer-fit").reason
    assert result.finding("layer-fit").status == ("pass" if fit == "fits" else "fail")


@pytest.mark.slow
@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_run_builds_the_target_from_the_checkpoint_and_passes(name, tmp_path):
    """`gguf2ov run draft-Q4_K_M.gguf --target target-hf/`: the target built in fp32 from the checkpoint
    (hub keys under model.language_model. for the hybrid), the same text with the draft attached."""
    d = _dir(name)
    report = _run(tmp_path / "run", d / "draft-Q4_K_M.gguf", "--target", d / "target-hf", "--reference",
                  d / "draft-ref", "--prompts", d / "prompts.txt", "--variants", "gguf", "--requant", "gguf")
    stages = {s["name"]: s["status"] for s in report["stages"]}
    assert stages["target"] == stages["check"] == "pass"  # the GGUF draft against its reference weights
    assert "accept:gguf" in report["results"]


# --- optimum's hybrid export: RoPE positions once paged ------------------------------------------------
# optimum-intel 2.2.0 exports qwen3_5_text without position_ids: its RoPE counts positions from the key
# cache, and after the paged conversion GenAI runs with a draft attached, every token of a step is
# turned as the step's last one (benchmarks/optimum_qwen35_rope.md). A prompt from the fixture's corpus
# whose greedy text parts with the draft attached within 8 tokens (1 of 40 prompts x 300 tokens parted
# with a random draft, 2 with the trained one; none on gguf2ov's target or with the one edit below):
PARTING_PROMPT = ("past the cave, the bear growls loudly. At night the bear sleeps in the cave and dreams about "
                  "honey. Every child knows that")
PARTING_TOKENS = 8


@pytest.fixture(scope="module")
def hybrid_folders(tmp_path_factory):
    """{label: target folder}: optimum's export as committed; the same IR with one edit, RoPE's
    positions read from position_ids (the reproducer's control); gguf2ov's target built from the same
    checkpoint, int8 symmetric as optimum's; and the fixture draft exported from its GGUF."""
    from gguf2ov.job import Job, Options

    d, work = _dir(HYBRID), tmp_path_factory.mktemp("hybrid-positions")
    edited = benchmark("optimum_qwen35_rope").read_position_ids(d / "target", work / "edited")
    _gguf2ov("target", d / "target-hf", "-o", work / "ours", "--weight-format", "int8", "--sym")
    Job.of(d / "draft-Q4_K_M.gguf", None, Options(progress=False)).export(work / "draft")
    return {"optimum": d / "target", "edited": edited, "ours": work / "ours", "draft": work / "draft"}


def _verify(draft: Path, target: Path, out: Path) -> tuple[int, dict]:
    from gguf2ov.cli import main

    code = main(["verify", str(draft), "--target", str(target), "--no-tap-scan", "--json", str(out), "--quiet"])
    return code, {c["name"]: c for c in json.loads(out.read_text())["checks"]}


def test_verify_finds_optimums_hybrid_rope_positions_before_any_run(hybrid_folders, tmp_path):
    """`verify --target` on optimum's hybrid folder fails `target-positions`, naming the cause (positions
    counted from the key cache, position_ids unread: after the paged conversion a 4-token step is
    turned as its last position) and the fix; the same IR reading position_ids, and gguf2ov's target
    from the same checkpoint, pass it."""
    f = hybrid_folders
    code, checks = _verify(f["draft"], f["optimum"], tmp_path / "optimum.json")
    positions = checks["target-positions"]
    assert code != 0 and positions["status"] == "fail", positions
    for said in ("the length of state cache_params.past.key.0", "position_ids is not read",
                 "positions 5-8 every token is turned as position 8", "gguf2ov target CHECKPOINT_OR_GGUF"):
        assert said in positions["reason"], positions["reason"]
    assert checks["target-paged"]["status"] == "pass"  # the conversion itself is fine
    for label in ("edited", "ours"):
        code, checks = _verify(f["draft"], f[label], tmp_path / f"{label}.json")
        assert code == 0 and checks["target-positions"]["status"] == "pass", (label, checks["target-positions"])
        assert "RoPE from position_ids" in checks["target-positions"]["reason"]


def test_accept_looks_for_the_cause_of_a_mismatch_in_the_target_graph(hybrid_folders):
    """What `accept` names when the texts part: the failing positions check of optimum's folder, nothing
    for a target whose RoPE reads position_ids (the reason then stays the pipeline's)."""
    from gguf2ov.stages.accept import target_cause
    from gguf2ov.runtime.target import TargetIR

    cause = target_cause(TargetIR.open(hybrid_folders["optimum"]))
    assert cause is not None and cause.name == "target-positions" and cause.status == "fail"
    assert target_cause(TargetIR.open(hybrid_folders["ours"])) is None
    assert target_cause(TargetIR.open(hybrid_folders["edited"])) is None


def _greedy_with_draft(target_dir: Path, draft_dir: Path, prompts: list[str], new_tokens: int) -> list[str]:
    """As `_greedy`, with the draft attached (K=7)."""
    from gguf2ov.numerics import EXACT
    from gguf2ov.runtime.genai import Prompt, generate, generation_config, make_pipeline
    from gguf2ov.runtime.target import TargetIR

    pipe = make_pipeline(TargetIR.open(target_dir), "CPU", EXACT, draft_dir, 7)
    cfg = generation_config(pipe, new_tokens, 7)
    return [generate(pipe, Prompt(p), cfg, True).text for p in prompts]


@pytest.mark.slow
def test_accept_names_the_rope_positions_when_optimums_hybrid_text_changes(hybrid_folders, tmp_path):
    """`accept` on optimum's folder: MISMATCH (also in exact arithmetic), and the reason is the target's
    positions, not a token the pipeline wrongly accepted. The same IR reading position_ids, and
    gguf2ov's target from the same checkpoint, give the same text with the draft attached as alone."""
    from gguf2ov.cli import main

    f = hybrid_folders
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PARTING_PROMPT + "\n")
    out = tmp_path / "accept.json"
    code = main(["accept", "--target", str(f["optimum"]), "--draft", str(f["draft"]), "--prompts", str(prompts),
                 "--max-new-tokens", str(PARTING_TOKENS), "--json", str(out), "--quiet"])
    result = json.loads(out.read_text())
    assert code != 0 and result["verdict"] == "MISMATCH" and result["identical_exact"] is False, result["reasons"]
    reason = " ".join(result["reasons"])
    assert "(target-positions): RoPE positions come from the length of state" in reason, reason
    assert "gguf2ov target CHECKPOINT_OR_GGUF" in reason and "would not have produced" not in reason, reason
    for label in ("edited", "ours"):
        alone = _greedy(f[label], [PARTING_PROMPT], PARTING_TOKENS)
        assert _greedy_with_draft(f[label], f["draft"], [PARTING_PROMPT], PARTING_TOKENS) == alone, label


@pytest.mark.slow
def test_run_on_optimums_hybrid_export_names_its_rope_positions(tmp_path):
    """`run` against optimum's hybrid folder stops where the target is checked (every draft variant's
    verify), its report naming the cause and the fix once."""
    from gguf2ov.cli import main

    d = _dir(HYBRID)
    out = tmp_path / "run"
    code = main(["run", str(d / "draft-Q4_K_M.gguf"), "--target", str(d / "target"), "--prompts",
                 str(d / "prompts.txt"), "--variants", "gguf", "--requant", "gguf", "-o", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    failed = report["stages"][-1]
    assert code != 0 and report["verdict"] == f"FAILED at {failed['name']}", report["verdict"]
    assert "target-positions: RoPE positions come from" in failed["reason"], failed["reason"]
    assert failed["reason"].count("gguf2ov target CHECKPOINT_OR_GGUF") == 1
    assert "gguf2ov target CHECKPOINT_OR_GGUF" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", [HYBRID, MOE])
def test_run_on_the_widened_target_passes_where_the_device_allows(name, tmp_path):
    """`gguf2ov widen-target target-hf` (its defaults: a hybrid's MLPs padded and 8 layers appended,
    a mixture of experts 24 layers deeper with experts of 512) makes a target that computes the same
    function and is heavy enough for the draft to pay on a CPU: the run's verdict is PASS there. On a
    shared CPU the speed is the device's, so SLOW (too light) is let through here; the text and the
    acceptance are held exactly as on the fixture target (test_reference_draft_is_accepted)."""
    from gguf2ov.cli.widen import widen_target

    d = _dir(name)
    wide = widen_target(d / "target-hf", tmp_path / "wide", progress=False)
    assert wide.parameters[1] > 30 * wide.parameters[0] and max(wide.max_abs_diff.values()) < 1e-4
    report = _run(tmp_path / "run", d / "draft-Q4_K_M.gguf", "--target", tmp_path / "wide", "--prompts",
                  d / "prompts.txt", "--variants", "gguf", "--requant", "gguf")
    assert report["results"]["accept:gguf"]["overall"]["generated_tokens"] == 500
    want = _json(name, "fixture.json")["transformers_greedy"]  # the checkpoint's own text, in exact arithmetic
    prompts = (d / "prompts.txt").read_text().splitlines()
    assert _greedy(tmp_path / "wide", prompts, want["max_new_tokens"]) == want["texts"]

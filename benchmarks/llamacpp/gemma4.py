"""llama.cpp's own converter and greedy decoding on gemma4_text checkpoints, recorded for the tests.

    python -m benchmarks.llamacpp.gemma4        # tests/data/gemma4-llamacpp-{F32,Q4_K_M}.gguf, gemma4-llamacpp.json
    python -m benchmarks.llamacpp.gemma4 --moe  # tests/data/gemma4-moe-llamacpp-F32.gguf, gemma4-moe-llamacpp.json
    python -m benchmarks.llamacpp.gemma4 --ple  # tests/data/gemma4-ple-llamacpp-F32.gguf, gemma4-ple-llamacpp.json
    python -m benchmarks.llamacpp.gemma4 --e2b  # tests/data/gemma4-e2b-llamacpp-F32.gguf, gemma4-e2b-llamacpp.json

Needs llama.cpp built by benchmarks/llamacpp/tools.py (0c1e570: its convert_hf_to_gguf.py and gguf-py,
llama-tokenize, llama-simple, llama-quantize). The checkpoints are tests/gemma4_data.py's: its CONFIG (shared KV,
attention_k_eq_v), with `ple` its PLE_CONFIG (per-layer embeddings, E2B/E4B's kind) and with `e2b` its E2B_CONFIG
(those and E2B's double-wide MLPs in the shared-KV layers, a feed_forward_length per layer in the file). Gemma 4's converter reads a
SentencePiece-style BPE tokenizer (byte fallback, spaces as U+2581): one of 384 tokens is trained here on
the prompts below (pad, eos, bos, unk, the 256 byte tokens, then merges) and the converter writes its
vocabulary into the file. The file is F32: llama.cpp then computes in float32, as the target does.
llama-quantize makes a Q4_K_M file of it (rows of 64 are too narrow for K-quants: its mix falls back to
Q5_0 and Q8_0), on which llama.cpp quantizes activations to 8 bits and the target does not (the dense checkpoint's
file only).

The JSON records, per prompt, llama-tokenize's ids (BOS first, as llama.cpp adds it for Gemma 4) and
llama-simple's greedy continuation on each file; tests/targets/test_gemma4_target.py decodes the target's greedy
tokens with the file's own vocabulary and compares.

With --moe, the same for gemma4_data.MOE_CONFIG (the dense MLP and experts beside it, as Gemma 4 26B-A4B),
F32 only (tests/targets/test_gemma4_moe_target.py).
"""

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.llamacpp.tools import convert, quantize, tool
from tests import gemma4_data

PROMPTS = ("The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def main():", "Hello world")
NEW_TOKENS = 24
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
CORPUS = ("the quick brown fox jumps over the lazy dog", "a time of day in the city of the north",
          "one two three four five six seven", "print the main value of the list", "hello there, how are you?",
          "in the capital there is a river", "upon the hill stood a house") * 10


def write_tokenizer(folder: Path) -> None:
    """A SentencePiece-style BPE tokenizer of CONFIG's vocabulary size, trained on a few sentences (not the
    prompts, which it then splits into several tokens)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    alphabet = sorted(set("".join(PROMPTS).replace(" ", "\u2581")) | set("abcdefghijklmnopqrstuvwxyz0123456789"))
    trainer = trainers.BpeTrainer(vocab_size=gemma4_data.CONFIG["vocab_size"], show_progress=False,
                                  special_tokens=SPECIALS + [f"<0x{b:02X}>" for b in range(256)],
                                  initial_alphabet=alphabet)
    text = [s.replace(" ", "\u2581") for s in CORPUS]
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}))


def tokenize(gguf: Path, prompt: str) -> list[int]:
    out = subprocess.run([str(tool("llama-tokenize")), "-m", str(gguf), "-p", prompt, "--ids", "--log-disable"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def simple(gguf: Path, prompt: str) -> str:
    """llama-simple's greedy continuation (it echoes the prompt's pieces, a BOS piece first, then the new ones)."""
    out = subprocess.run([str(tool("llama-simple")), "-m", str(gguf), "-n", str(NEW_TOKENS), prompt],
                         capture_output=True, check=True).stdout.decode("utf-8", "replace")
    i = out.find(prompt)
    if i < 0:
        raise SystemExit(f"llama-simple did not echo the prompt {prompt!r}: {out[:200]!r}")
    return out[i + len(prompt):].removesuffix("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moe", action="store_true", help="the mixture-of-experts checkpoint (MOE_CONFIG)")
    parser.add_argument("--ple", action="store_true", help="the per-layer-embeddings checkpoint (PLE_CONFIG)")
    parser.add_argument("--e2b", action="store_true", help="PLE_CONFIG with E2B's double-wide MLPs (E2B_CONFIG)")
    args = parser.parse_args()
    if args.moe:
        return moe()
    if args.ple:
        return record_f32(gemma4_data.PLE_CONFIG, gemma4_data.LLAMACPP_PLE_FILE, gemma4_data.LLAMACPP_PLE_GREEDY)
    if args.e2b:
        return record_f32(gemma4_data.E2B_CONFIG, gemma4_data.LLAMACPP_E2B_FILE, gemma4_data.LLAMACPP_E2B_GREEDY)
    with tempfile.TemporaryDirectory() as work:
        hf = gemma4_data.write_checkpoint(Path(work) / "hf")
        write_tokenizer(hf)
        convert(hf, gemma4_data.LLAMACPP_FILE, "f32")
    gguf, quantized = gemma4_data.LLAMACPP_FILE, gemma4_data.LLAMACPP_Q4_K_M
    quantize(gguf, quantized, "Q4_K_M")
    for path in (gguf, quantized):
        print(f"{path.relative_to(REPO)}: {path.stat().st_size} bytes")
    record = {"llama.cpp": "0c1e570", "new_tokens": NEW_TOKENS,
              "prompts": [{"prompt": p, "ids": tokenize(gguf, p), "text": simple(gguf, p),
                           "text_Q4_K_M": simple(quantized, p)} for p in PROMPTS]}
    gemma4_data.LLAMACPP_GREEDY.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    for p in record["prompts"]:
        print(json.dumps(p, ensure_ascii=False))


def moe() -> None:
    with tempfile.TemporaryDirectory() as work:
        hf = gemma4_data.write_checkpoint(Path(work) / "hf", gemma4_data.MOE_CONFIG)
        write_tokenizer(hf)
        convert(hf, gemma4_data.MOE_FILE, "f32")
    gguf = gemma4_data.MOE_FILE
    print(f"{gguf.relative_to(REPO)}: {gguf.stat().st_size} bytes")
    record = {"llama.cpp": "0c1e570", "new_tokens": NEW_TOKENS,
              "prompts": [{"prompt": p, "ids": tokenize(gguf, p), "text": simple(gguf, p)} for p in PROMPTS]}
    gemma4_data.MOE_GREEDY.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def record_f32(config: dict, gguf: Path, greedy: Path) -> None:
    """The F32 file of the checkpoint of `config` (gemma4_data's PLE_CONFIG or E2B_CONFIG) and llama-simple's greedy
    text on it."""
    with tempfile.TemporaryDirectory() as work:
        hf = gemma4_data.write_checkpoint(Path(work) / "hf", config)
        write_tokenizer(hf)
        convert(hf, gguf, "f32")
    print(f"{gguf.relative_to(REPO)}: {gguf.stat().st_size} bytes")
    record = {"llama.cpp": "0c1e570", "new_tokens": NEW_TOKENS,
              "prompts": [{"prompt": p, "ids": tokenize(gguf, p), "text": simple(gguf, p)} for p in PROMPTS]}
    greedy.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    for p in record["prompts"]:
        print(json.dumps(p, ensure_ascii=False))


if __name__ == "__main__":
    main()

"""llama.cpp's own gpt-oss GGUF and greedy text, recorded for tests/targets/test_gpt_oss_target.py.

    python -m benchmarks.llamacpp.gpt_oss      # writes tests/data/gpt-oss-tiny/ and tests/data/gpt-oss-llamacpp.json

Needs llama.cpp built by benchmarks/llamacpp/tools.py (0c1e570: its convert_hf_to_gguf.py and gguf-py,
llama-quantize, llama-simple). The tests read what this writes and run without llama.cpp:

- `gpt-oss-tiny/`: a tiny GptOssForCausalLM (tests/gpt_oss_data.py's GPT_OSS geometry: 3 layers sliding /
  full / sliding with a window of 4, 4 experts top 2, YaRN), trained briefly on the fixture corpus with the
  fixture tokenizer so that its greedy text is decisive, saved by transformers in float16 (the
  training rounds its weights to fp16, so nothing is lost), with the tokenizer files;
- `gpt-oss-tiny/llamacpp-MXFP4_MOE.gguf`: llama.cpp's converter (F32) then `llama-quantize MXFP4_MOE`;
- `gpt-oss-llamacpp.json`: llama-simple's greedy continuation of each fixture prompt on that file.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import REPO, TEST_DATA
from benchmarks.llamacpp.tools import COMMIT, convert, quantize, tool
from fixtures import fixture_training as ft
from tests.gpt_oss_data import GPT_OSS

OUT = TEST_DATA / "gpt-oss-tiny"
RECORD = TEST_DATA / "gpt-oss-llamacpp.json"
NEW_TOKENS = 24
STEPS = 300
PARAGRAPHS = 400


def train(out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, GptOssConfig, GptOssForCausalLM

    ft.setup_torch()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(REPO / "fixtures" / "tiny-dflash" / "target-hf" / name, out / name)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok.backend_tokenizer.encode(ft.make_corpus(PARAGRAPHS)).ids
    geometry = {k: v for k, v in GPT_OSS.items() if k != "model_type"}
    cfg = GptOssConfig(vocab_size=len(tok), max_position_embeddings=ft.MAX_POSITIONS, bos_token_id=tok.eos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **geometry)
    model = ft.train_target(cfg, ids, STEPS, batch=16, seq=128, log=print, model_class=GptOssForCausalLM)
    model.to(torch.float16).save_pretrained(out)
    return out


def llama_simple(gguf: Path, prompt: str) -> str:
    out = subprocess.run([str(tool("llama-simple")), "-m", str(gguf), "-n", str(NEW_TOKENS), prompt],
                         capture_output=True, check=True, timeout=300).stdout.decode("utf-8", "replace")
    i = out.find(prompt)  # llama-simple prints the prompt's pieces, then the new ones
    if i < 0:
        raise SystemExit(f"llama-simple did not echo the prompt {prompt!r}: {out[:200]!r}")
    return out[i + len(prompt):].removesuffix("\n")


def main() -> int:
    hf = train(OUT)
    gguf = OUT / "llamacpp-MXFP4_MOE.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        f32 = convert(hf, Path(tmp) / "f32.gguf", "f32")
        quantize(f32, gguf, "MXFP4_MOE")
    prompts = ft.PROMPTS
    record = {"llama.cpp": COMMIT,
              "made": "convert_hf_to_gguf.py --outtype f32 (pre-tokenizer named qwen2), llama-quantize MXFP4_MOE, "
                      f"llama-simple -n {NEW_TOKENS} (greedy) on each prompt",
              "new_tokens": NEW_TOKENS, "prompts": prompts, "texts": [llama_simple(gguf, p) for p in prompts]}
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["texts"][:3], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

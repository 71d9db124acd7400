"""llama.cpp's own converter on the tiny Gemma 4 VLM checkpoint: its text GGUF and its mmproj, for the tests.

    python benchmarks/llamacpp_gemma4_vlm.py    # writes tests/data/gemma4-vlm-llamacpp-{F32,Q4_K_M}.gguf,
                                                #        tests/data/gemma4-vlm-mmproj-llamacpp-F32.gguf

Needs llama.cpp built by benchmarks/llamacpp.py (0c1e570: its convert_hf_to_gguf.py, conversion/gemma.py's
Gemma4Model and Gemma4VisionAudioModel, and llama-quantize). The checkpoint is fixtures/tiny-vlm/target-hf (a
Gemma4ForConditionalGeneration with a vision tower and no audio tower):

    convert_hf_to_gguf.py target-hf --outtype f32 --outfile TEXT.gguf            # the language model
    convert_hf_to_gguf.py target-hf --outtype f32 --outfile MMPROJ.gguf --mmproj # vision tower + embed_vision
    llama-quantize TEXT.gguf TEXT-Q4_K_M.gguf Q4_K_M

The fixture's tokenizer is a byte-level BPE (GPT-2's pre-tokenizer), which Gemma 4's `set_vocab` (made for
Gemma's SentencePiece-style BPE) refuses. The converter is run with Gemma4Model.set_vocab replaced by the
converter's own GPT-2 vocabulary writer (`_set_vocab_gpt2`, pre-tokenizer `gpt-2`), the rest unchanged: the
file's `tokenizer.ggml.model` is then `gpt2`, and it tokenizes as the fixture's tokenizer.json does.
Both files are F32 (the checkpoint's float16 values, exactly), so the built target computes what
transformers computes, within float32 rounding.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from llamacpp import quantize, source_dir  # noqa: E402

CHECKPOINT = REPO / "fixtures" / "tiny-vlm" / "target-hf"
DATA = REPO / "tests" / "data"
TEXT_F32 = DATA / "gemma4-vlm-llamacpp-F32.gguf"
TEXT_Q4_K_M = DATA / "gemma4-vlm-llamacpp-Q4_K_M.gguf"
MMPROJ_F32 = DATA / "gemma4-vlm-mmproj-llamacpp-F32.gguf"

# llama.cpp's converter, with the fixture's byte-level tokenizer written as a GPT-2 vocabulary (see above)
CONVERT_SHIM = (
    "import runpy, sys\nsrc = sys.argv[1]; sys.path[:0] = [src, src + '/gguf-py']\n"
    "import conversion.base as base, conversion.gemma as gemma\n"
    "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
    "gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
    "sys.argv = [src + '/convert_hf_to_gguf.py', *sys.argv[2:]]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


def convert(out: Path, *flags: str) -> Path:
    src = source_dir()
    env = dict(os.environ, PYTHONPATH=str(src.parent / "pydeps"))
    done = subprocess.run([sys.executable, "-c", CONVERT_SHIM, str(src), str(CHECKPOINT), "--outtype", "f32",
                           "--outfile", str(out), *flags], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return out


def main() -> None:
    convert(TEXT_F32)
    convert(MMPROJ_F32, "--mmproj")
    quantize(TEXT_F32, TEXT_Q4_K_M, "Q4_K_M")
    for path in (TEXT_F32, TEXT_Q4_K_M, MMPROJ_F32):
        print(f"{path.relative_to(REPO)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()

"""llama.cpp's own converter on the tiny Gemma 4 VLM checkpoint: its text GGUF and its mmproj, for the tests.

    python -m benchmarks.llamacpp.gemma4_vlm    # writes tests/data/gemma4-vlm-llamacpp-{F32,Q4_K_M}.gguf,
                                                #        tests/data/gemma4-vlm-mmproj-llamacpp-F32.gguf

Needs llama.cpp built by benchmarks/llamacpp/tools.py (0c1e570: its convert_hf_to_gguf.py, conversion/gemma.py's
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

llama.cpp's own answer on the fixture image is recorded too (tests/data/gemma4-vlm-llamacpp.json), by
llama-mtmd-cli (built here into llama.cpp's build folder when missing) on the F32 pair, greedy:

    llama-mtmd-cli -m TEXT.gguf --mmproj MMPROJ.gguf --image image.png -p "<__media__>PROMPT" -n 100 --temp 0
        --jinja --chat-template "{% for m in messages %}{{ m['content'] }}{% endfor %}"   # the prompt as it is
        --image-min-tokens 70 --image-max-tokens 70

It wraps the image in <|image> ... <image|> before the prompt, as VLMPipeline does; its own resize makes 81
soft tokens of the 96 x 96 image (432 x 432), where transformers' processor makes 64.
"""

import json
import re
import subprocess
from pathlib import Path

from benchmarks.common import REPO, TEST_DATA
from benchmarks.llamacpp import tools
from benchmarks.llamacpp.tools import cache_dir, quantize

CHECKPOINT = REPO / "fixtures" / "tiny-vlm" / "target-hf"
TEXT_F32 = TEST_DATA / "gemma4-vlm-llamacpp-F32.gguf"
TEXT_Q4_K_M = TEST_DATA / "gemma4-vlm-llamacpp-Q4_K_M.gguf"
MMPROJ_F32 = TEST_DATA / "gemma4-vlm-mmproj-llamacpp-F32.gguf"
ANSWER = TEST_DATA / "gemma4-vlm-llamacpp.json"
IMAGE = REPO / "fixtures" / "tiny-vlm" / "image.png"
IMAGE_PROMPT = "The red fox lives in the forest. It likes to eat"  # fixtures/tiny-vlm's image prompt
NEW_TOKENS = 100
IMAGE_TOKENS = 70
RAW_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

# llama.cpp's converter, with the fixture's byte-level tokenizer written as a GPT-2 vocabulary (see above)
CONVERT_SHIM = (
    "import runpy, sys\nsrc = sys.argv[1]; sys.path[:0] = [src, src + '/gguf-py']\n"
    "import conversion.base as base, conversion.gemma as gemma\n"
    "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
    "gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
    "sys.argv = [src + '/convert_hf_to_gguf.py', *sys.argv[2:]]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


def convert(out: Path, *flags: str) -> Path:
    return tools.convert(CHECKPOINT, out, "f32", *flags, shim=CONVERT_SHIM)


def mtmd_cli() -> Path:
    """llama-mtmd-cli, built into llama.cpp's build folder when missing (not among benchmarks/llamacpp/tools.py's targets)."""
    path = cache_dir() / "build" / "bin" / "llama-mtmd-cli"
    if not path.exists():
        subprocess.run(["cmake", "--build", str(cache_dir() / "build"), "-j", "2", "--target", "llama-mtmd-cli"],
                       check=True, capture_output=True)
    return path


def mtmd_answer() -> dict:
    """llama-mtmd-cli's greedy answer to the image prompt on the F32 pair, and the image's soft tokens."""
    done = subprocess.run([str(mtmd_cli()), "-m", str(TEXT_F32), "--mmproj", str(MMPROJ_F32), "--image", str(IMAGE),
                           "-p", "<__media__>" + IMAGE_PROMPT, "-n", str(NEW_TOKENS), "--temp", "0", "--jinja",
                           "--chat-template", RAW_TEMPLATE, "--image-min-tokens", str(IMAGE_TOKENS),
                           "--image-max-tokens", str(IMAGE_TOKENS), "-t", "2", "--no-warmup", "-v"],
                          capture_output=True, check=True)
    tokens = re.search(r"output embedding shape \[\d+, (\d+), 1\]", done.stderr.decode("utf-8", "replace"))
    # it prints a newline before the answer and two after it
    text = done.stdout.decode("utf-8", "replace").removeprefix("\n").removesuffix("\n\n")
    return {"llama.cpp": "0c1e570", "prompt": IMAGE_PROMPT, "image": "fixtures/tiny-vlm/image.png",
            "new_tokens": NEW_TOKENS, "image_max_tokens": IMAGE_TOKENS,
            "image_soft_tokens": int(tokens.group(1)) if tokens else None, "text": text}


def main() -> None:
    convert(TEXT_F32)
    convert(MMPROJ_F32, "--mmproj")
    quantize(TEXT_F32, TEXT_Q4_K_M, "Q4_K_M")
    for path in (TEXT_F32, TEXT_Q4_K_M, MMPROJ_F32):
        print(f"{path.relative_to(REPO)}: {path.stat().st_size} bytes")
    record = mtmd_answer()
    ANSWER.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(record, ensure_ascii=False))


if __name__ == "__main__":
    main()

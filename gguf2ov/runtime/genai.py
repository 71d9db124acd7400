"""OpenVINO GenAI as every stage runs it: the pipeline for a text or a VLM target, with or without
a DFlash draft, the greedy generation config, and a generate that counts what the draft did.

What GenAI 2026.4.1 needs for DFlash (measured):
- a scheduler config with prefix caching off, on `LLMPipeline` and `VLMPipeline` alike (the VLM
  default turns it on, and DFlash's paged-attention path refuses it);
- greedy decoding, one sequence, `assistant_confidence_threshold` 0;
- `INFERENCE_PRECISION_HINT=f32` on both models for byte-identical text with and without the
  draft (the CPU's default bf16 can part the multi-token verify pass from single-token decoding);
- on GPU, the paged-attention backend (`ATTENTION_BACKEND=PA`), as the DFlash recipe sets it.
Counting, where `get_num_draft_tokens()` returns 0 in the DFlash path: target steps are the
entries of the main model's `m_batch_sizes` (each step emits accepted + 1 tokens), draft
candidates the sum of the draft model's.
"""

import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Gguf2ovError
from ..numerics import F32_HINT
from ..work import count

PRECISIONS = ("f32", "auto")
PIPELINES = {"llm": "LLMPipeline", "vlm": "VLMPipeline"}


@dataclass(frozen=True)
class GenerationSettings:
    """How every GenAI generation of a job runs: greedy, `max_new_tokens` per prompt, `num_assistant_tokens`
    proposals per step with a draft, on `device` at `precision` (f32: byte-comparable text), `repeats`
    timed runs per prompt."""

    max_new_tokens: int = 100
    num_assistant_tokens: int = 7
    device: str = "CPU"
    precision: str = "f32"
    repeats: int = 1
    apply_chat_template: bool = False

    def check(self) -> "GenerationSettings":
        """Refuse settings no run can take, before the minutes the target alone costs."""
        if self.repeats < 1 or self.max_new_tokens < 1 or self.num_assistant_tokens < 1:
            raise Gguf2ovError("--repeats, --max-new-tokens and --num-assistant-tokens must be at least 1")
        properties(self.precision)
        return self

    def alone(self) -> "GenerationSettings":
        """What the target's own run depends on: everything but the draft's proposals."""
        return dataclasses.replace(self, num_assistant_tokens=0)

    def record(self) -> dict:
        return {"device": self.device, "precision": self.precision, "max_new_tokens": self.max_new_tokens,
                "num_assistant_tokens": self.num_assistant_tokens, "repeats": self.repeats}


@dataclass(frozen=True)
class Prompt:
    """A prompt: text, and the images a VLM target sees with it."""

    text: str
    images: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "image" if self.images else "text"


# A prompts-file line `[image=cat.png] What is in the picture?` is an image prompt (the path is
# relative to the file; several tags give several images).
IMAGE_TAG = re.compile(r"\[image=([^\]]+)\]\s*")
IMAGE_PROMPT_TEXT = "Describe this image."


def parse_prompt(line: str, base_dir=None) -> Prompt:
    images = []
    while m := IMAGE_TAG.match(line):
        path = Path(m.group(1).strip())
        images.append(str(path if path.is_absolute() or base_dir is None else Path(base_dir) / path))
        line = line[m.end():]
    return Prompt(line, tuple(images))


def as_prompts(items) -> list[Prompt]:
    """Prompts from strings or Prompts."""
    return [p if isinstance(p, Prompt) else Prompt(p) for p in items]


def text_prompts(items) -> list[str]:
    """The texts of the prompts that have no image (what a draft's offline contexts are built from)."""
    return [p.text for p in as_prompts(items) if not p.images]


# --- prompts from the command line ----------------------------------------------------------------

# Used when no prompt file is given: plain English openings any text model can continue.
DEFAULT_PROMPTS = [
    "The history of the printing press begins",
    "Here is a short story about a lighthouse keeper:",
    "Water boils at a lower temperature on a mountain because",
]


def read_prompts(path, images=()) -> list[Prompt]:
    """One prompt per line (`[image=FILE] text` for an image prompt), then one image prompt per file
    in `images` (`--image`)."""
    prompts = []
    if path is not None:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise Gguf2ovError(f"cannot read prompts file {path}: {e.strerror}") from e
        prompts = [parse_prompt(line, path.parent) for line in lines if line.strip()]
        if not prompts:
            raise Gguf2ovError(f"prompts file {path} has no prompts", hint="write one prompt per line")
    prompts += [Prompt(IMAGE_PROMPT_TEXT, (str(image),)) for image in images]
    for image in (i for p in prompts for i in p.images):
        if not Path(image).is_file():
            raise Gguf2ovError(f"image {image} does not exist", hint="image paths in a prompts file are relative to it")
    return prompts


def given_prompts(prompts_file, images=(), default=DEFAULT_PROMPTS) -> list[Prompt] | None:
    """The prompts a command is given (`--prompts FILE`, `--image FILE`...), or `default` (None:
    the stage's own). Images alone come after the default text prompts."""
    if prompts_file is None and not images:
        return None if default is None else as_prompts(default)
    prompts = read_prompts(prompts_file, images)
    if prompts_file is None:
        prompts = as_prompts(DEFAULT_PROMPTS) + prompts
    return prompts


# --- the pipeline -------------------------------------------------------------------------------------

def properties(precision: str, device: str = "CPU") -> dict:
    if precision not in PRECISIONS:
        raise Gguf2ovError(f"unknown precision {precision!r}", hint=f"use one of {', '.join(PRECISIONS)}")
    # what users run: the f32 hint for byte-identical text, the plugin's dynamic quantization as it
    # is (runtime.arithmetic measures what the compiled models run, for the report)
    props = dict(F32_HINT) if precision == "f32" else {}
    if device.upper().startswith("GPU"):
        props["ATTENTION_BACKEND"] = "PA"
    return props


# One request at a time: what DFlash's paged path admits ("DFlash CB/PA POC supports only one active request").
LIVE_SEQUENCES = 1


def describe_layer_types(types) -> str:
    """" (6 linear_attention, 2 full_attention)": a target's kinds of layer, when it has several."""
    from collections import Counter

    if len(set(types)) < 2:
        return ""
    return " (" + ", ".join(f"{n} {kind}" for kind, n in Counter(types).items()) + ")"


def recurrent_layers(target) -> int:
    """How many layers of a target keep a recurrent (linear-attention) state, as the kinds its map names
    for their layer types say (`LayerKind.RECURRENT`): what GenAI's scheduler must make room for.
    `target`: a runtime.target.TargetIR, whose map (`TargetIR.amap`: the one it was built through) names
    the kinds; a model type no map builds is read by every target map's kinds."""
    from ..targets.config import target_maps
    from ..targets.layers import REGISTRY

    maps = [target.amap] if target.amap is not None else target_maps()
    recurrent = {t for m in maps for t, kind in m.target["mixers"].items()
                 if kind in REGISTRY and REGISTRY[kind].RECURRENT}
    return sum(t in recurrent for t in layer_types(target.config))


def layer_types(config: dict) -> list[str]:
    """The layer types a target's config states (a VLM's text_config); [] when it states none."""
    types = config.get("layer_types") or []
    return [str(t) for t in types] if isinstance(types, list) else []


def scheduler(linear_attention: bool = False, num_assistant_tokens: int | None = None):
    """The SchedulerConfig every pipeline runs with: prefix caching off (DFlash with the paged-attention
    backend rejects it, and so does GenAI's linear-attention verifier) and, with a draft of
    `num_assistant_tokens` proposals per step, room for its verify pass:
    - `max_num_batched_tokens` >= K + 1 (the block the target verifies);
    - on a target with linear-attention states, `num_linear_attention_blocks` >= live sequences + 1 + K:
      GenAI 2026.4.1 keeps one committed recurrent-state row per live sequence plus 1 + K borrowed scratch
      rows in one pool, and its automatic size (K at construction + 2, K = 5 unless set) refuses a larger K
      ("The borrowed speculative linear-attention window needs ..."). The pool is not set on other targets:
      GenAI refuses it on a model without linear-attention inputs."""
    import openvino_genai as ov_genai

    s = ov_genai.SchedulerConfig()
    s.enable_prefix_caching = False
    if num_assistant_tokens:
        s.max_num_batched_tokens = max(s.max_num_batched_tokens, num_assistant_tokens + 1)
        if linear_attention:
            s.num_linear_attention_blocks = max(s.num_linear_attention_blocks,
                                                LIVE_SEQUENCES + 1 + num_assistant_tokens)
    return s


def make_pipeline(target, device: str, props: dict, draft_dir=None, num_assistant_tokens: int | None = None):
    """`LLMPipeline` or `VLMPipeline` (by the target's kind) on `target` (a runtime.target.TargetIR), with the
    DFlash draft attached when given, its scheduler sized for up to `num_assistant_tokens` proposals per step."""
    import openvino_genai as ov_genai

    count("target compiles (GenAI pipelines)")
    cls = ov_genai.VLMPipeline if target.kind == "vlm" else ov_genai.LLMPipeline
    extra = {} if draft_dir is None else {"draft_model": ov_genai.draft_model(str(draft_dir), device, **props)}
    s = scheduler(recurrent_layers(target) > 0, num_assistant_tokens if draft_dir is not None else None)
    return cls(str(target.path), device, scheduler_config=s, **extra, **props)


def generation_config(pipe, max_new_tokens: int, num_assistant_tokens: int | None, apply_chat_template: bool = False):
    cfg = pipe.get_generation_config()
    cfg.max_new_tokens = max_new_tokens
    cfg.do_sample = False
    cfg.num_beams = 1
    cfg.num_return_sequences = 1
    if hasattr(cfg, "apply_chat_template"):
        cfg.apply_chat_template = apply_chat_template
    if num_assistant_tokens is not None:
        cfg.num_assistant_tokens = num_assistant_tokens
        cfg.assistant_confidence_threshold = 0.0
    return cfg


@dataclass
class Generation:
    """One greedy generation, and what the draft did in it."""

    text: str
    seconds: float
    generated: int
    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    emitted_per_step: tuple[int, ...] = ()   # target: accepted + 1 per step (the first is the prefill)
    drafted_per_call: tuple[int, ...] = ()   # draft: candidates per call, one call per later step


def load_image(path):
    """An image file as the uint8 [1, H, W, 3] tensor VLMPipeline takes."""
    import numpy as np
    import openvino as ov
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as e:
        raise Gguf2ovError(f"cannot read image {path}: {e}", hint="pass a PNG or JPEG file") from e
    return ov.Tensor(pixels[None].copy())


def generate(pipe, prompt: Prompt, cfg, speculative: bool) -> Generation:
    if prompt.images:
        images = [load_image(p) for p in prompt.images]
        start = time.perf_counter()
        r = pipe.generate(prompt.text, images=images, generation_config=cfg)
    elif type(pipe).__name__ == "VLMPipeline":
        start = time.perf_counter()
        r = pipe.generate(prompt.text, generation_config=cfg)
    else:
        start = time.perf_counter()
        r = pipe.generate([prompt.text], cfg)  # a list gives DecodedResults with the metrics
    seconds = time.perf_counter() - start
    run = Generation(text=r.texts[0], seconds=seconds, generated=int(r.perf_metrics.get_num_generated_tokens()))
    if speculative:
        m = r.extended_perf_metrics
        run.accepted = int(m.get_num_accepted_tokens())
        run.emitted_per_step = tuple(int(x) for x in m.main_model_metrics.raw_metrics.m_batch_sizes)
        run.drafted_per_call = tuple(int(x) for x in m.draft_model_metrics.raw_metrics.m_batch_sizes)
        run.steps = len(run.emitted_per_step)
        run.drafted = sum(run.drafted_per_call)
    return run

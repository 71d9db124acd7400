"""The memory a target holds where GenAI runs it, and a draft beside it, planned before anything is built.

What a pipeline holds on the CPU (OpenVINO and GenAI 2026.4.1, measured):
- every MatMul weight, repacked into private memory at the first inference, at its form's run-time bits
  (`ir.variants.Format.runtime_bits`, from benchmarks/runtime_bytes.py): the exact grid of a Q4_K_M file
  at 6 bits a Q4_K weight and 10 a Q6_K one, NNCF's int4 at group 128 at 4.5, f16 and f32 at 32;
- an embedding table read by a Gather stays in the mapped file; a tied head is a MatMul on it, repacked;
- the KV cache, GenAI's paged blocks allocated as the sequence grows: per token, each paged attention
  the layer kinds name (`LayerKind.paged`: its key/value heads and head size; a layer that shares
  another's cache holds none) keeps keys and values at the cache's precision (u8 by default on x86, with
  an f32 scale and zero point per head and token; f16 where the target's runtime_options ask);
- a linear-attention layer's state tables (`paged`'s "table" entries), one row for the sequence and, with
  a draft, 1 + K more for its verify pass (runtime.genai.scheduler);
- a draft: its own weights at their run-time bits, and where it holds no embedding and head of its own,
  GenAI's copies of the target's table and head as stored, the head repacked once more as the draft
  compiles (docs/real-size.md, "The 8B pair, part by part");
- a VLM folder's vision model, in float32;
- the pipeline itself: GenAI's buffers and the libraries' resident pages (`PIPELINE_BYTES`,
  `DRAFT_PIPELINE_BYTES`, measured on the fixture pairs).
Held against what this machine has available (MemAvailable, and a cgroup's limit where one is set), one
line says whether the form fits and, if not, which other would.
"""

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..report import Table, human_bytes

# gguf2ov's process running a target in LLMPipeline, its weights aside: private memory (GenAI's and the plugin's
# buffers), 61-67 MiB at its peak for each fixture target alone (tiny-dflash, tiny-moe, tiny-hybrid, tiny-gemma4,
# tiny-gptoss: their weights under 1 MiB), and the libraries' resident pages, which depend on the machine (the
# kernels its CPU takes): 108 MiB on a Zen 4 with AVX512-VNNI, 137 MiB on the CI's machine. The plan takes an
# allowance that covers both. A draft attached adds 14-38 MiB beside its own weights (benchmarks/memory_plan.py's
# child, one 16-token generation).
PIPELINE_PRIVATE_BYTES = 62 << 20
LIBRARY_BYTES = 144 << 20
PIPELINE_BYTES = PIPELINE_PRIVATE_BYTES + LIBRARY_BYTES
DRAFT_PIPELINE_BYTES = 24 << 20
# The KV cache's bytes a value, and its per-head, per-token extra: u8 with an f32 scale and zero point.
CACHE_BYTES = {"u8": (1, 8), "f16": (2, 0), "bf16": (2, 0), "f32": (4, 0)}
# GenAI's default cache precision on x86 CPUs for a target whose weights are compressed; optimum's targets
# in fp16/fp32 ask for f16 in their runtime_options.
DEFAULT_CACHE = "u8"
# A run's context when the command has none: the prompt and the generation of an interactive turn.
DEFAULT_CONTEXT = 4096
# Room left beside the plan: what else the machine runs, and the plan's own error (within 15% at real
# size: benchmarks/memory_plan.py).
MARGIN = 0.10


@dataclass(frozen=True)
class FormMemory:
    """What one form of the target holds at run time, in bytes."""

    form: str                   # the target's form: "gguf (folded grid)", "int4_asym_g128", ...
    weights: int                # the target's weights as the plugin repacks them
    cache: int                  # its KV cache and state tables for the context
    draft: int = 0              # the draft beside it: its weights, GenAI's copies, its cache
    vision: int = 0             # a VLM folder's vision model
    pipeline: int = PIPELINE_BYTES
    refused: str | None = None  # why this form cannot be built from the source (no plan then)

    @property
    def total(self) -> int:
        return self.weights + self.cache + self.draft + self.vision + self.pipeline


@dataclass(frozen=True)
class MemoryPlan:
    """The run-time memory of the target in each of its forms, against what this machine has available."""

    device: str
    available: int              # bytes
    context: int                # tokens of context the cache is planned for
    chosen: str                 # the form this command builds or runs
    forms: tuple[FormMemory, ...]
    with_draft: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def of(self, form: str) -> FormMemory:
        return next(f for f in self.forms if f.form == form)

    def fits(self, f: FormMemory) -> bool:
        return f.refused is None and self.needed(f) <= self.available

    @property
    def fits_chosen(self) -> bool:
        return self.fits(self.of(self.chosen))

    def alternative(self) -> FormMemory | None:
        """The form that fits with the most memory to spare, when the chosen one does not."""
        fitting = [f for f in self.forms if self.fits(f) and f.form != self.chosen]
        return min(fitting, key=lambda f: f.total) if fitting else None

    def flag(self, form: str, command: str = "target") -> str:
        """How `command` (target or run) builds `form`: "--weight-format int4", "--grid split", ..."""
        if form.startswith("gguf"):
            grid = form.split("(")[1].split()[0]
            return "--grid " + grid if command == "target" else f"gguf2ov target --grid {grid}, then run on its folder"
        option = "--weight-format" if command == "target" else "--target-format"
        return f"{option} {form.split('_')[0]}" + (f" --group-size {form.split('_g')[1]}" if "_g" in form and
                                                    command == "target" and not form.endswith("_g128") else "")

    def line(self) -> str:
        """One line: what the chosen form needs where GenAI runs it, and whether it fits here."""
        f = self.of(self.chosen)
        what = "the pair" if self.with_draft else "the target"
        head = (f"run-time memory: {what} in GenAI ({f.form}, {self.context} tokens of context) needs about "
                f"{human_bytes(f.total)}; {human_bytes(self.available)} available on this {self.device}")
        if self.fits_chosen:
            return head + ": fits"
        # the margin named where it alone decides, so that a need below what is available does not read as a fit
        within = f" with the {MARGIN:.0%} kept for the plan's error" if f.total <= self.available else ""
        other = self.alternative()
        if other:
            return head + (f": does not fit{within}; {other.form} would ({human_bytes(other.total)}: "
                           f"{self.flag(other.form)})")
        text = dataclasses.replace(f, vision=0)
        return head + (f": does not fit{within}, nor does any other form; it needs {human_bytes(self.needed(f))} "
                       "available" + (f"; the text model alone would ({human_bytes(text.total)}: without --mmproj)"
                                      if f.vision and self.fits(text) else ""))

    def needed(self, f: FormMemory) -> int:
        """The memory available under which the plan says `f` fits."""
        return int(f.total * (1 + MARGIN))

    def table(self) -> Table:
        rows = [[f.form + (" *" if f.form == self.chosen else ""),
                 *(["-"] * 5 if f.refused else [human_bytes(f.weights), human_bytes(f.cache), human_bytes(f.draft),
                                                human_bytes(f.total), "yes" if self.fits(f) else "no"]),
                 f.refused or ""] for f in self.forms]
        return Table("Run-time memory (planned)", ["form", "weights", "KV cache and state", "draft", "total", "fits",
                                                   "note"], rows,
                     note=f"where GenAI runs the target{' and the draft' if self.with_draft else ''} on {self.device}, "
                          f"{self.context} tokens of context; {human_bytes(self.available)} available here, "
                          f"{MARGIN:.0%} kept aside; * the form chosen" + "".join(f"; {n}" for n in self.notes))

    def record(self) -> dict:
        """`run_time_memory` in a JSON report: bytes per form and whether each fits."""
        return {"device": self.device, "available_bytes": self.available, "context_tokens": self.context,
                "chosen": self.chosen, "fits": self.fits_chosen, "with_draft": self.with_draft,
                "forms": {f.form: {**{k: v for k, v in dataclasses.asdict(f).items() if k != "form"},
                                   "total": f.total, "fits": self.fits(f)} for f in self.forms}}


# --- what this machine has ------------------------------------------------------------------------------

# Plans against this many bytes instead of this machine's available memory (a target prepared here for a
# smaller machine): GGUF2OV_MEMORY_AVAILABLE=16G (a number of bytes, or with K, M, G or T).
AVAILABLE_ENV = "GGUF2OV_MEMORY_AVAILABLE"


def available_bytes() -> int:
    """Memory a new process can take here: MemAvailable, or less where a cgroup limit leaves less; or what
    AVAILABLE_ENV says."""
    if given := os.environ.get(AVAILABLE_ENV):
        return _parse_bytes(given)
    available = _meminfo("MemAvailable")
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            available = min(available, int(limit) - usage)
        break
    return max(0, available)


def _parse_bytes(text: str) -> int:
    from ..errors import Gguf2ovError

    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise Gguf2ovError(f"{AVAILABLE_ENV}={text!r} is not an amount of memory", hint="write it as 16G, 800M or bytes") \
            from None


def _meminfo(key: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# --- the target's parts -----------------------------------------------------------------------------------

def _kernel(forms, name: str) -> str:
    source = forms.source
    if forms.gather(name):
        return "gather"
    return "experts" if name in source.batched else "fc"


def weights_bytes(forms) -> int:
    """The bytes a model's weights (a target's or a draft's WeightForms) hold at run time: each tensor at its
    format's run-time bits for the kernel that reads it, a tied head's table read twice (a Gather on the mapped
    file and a MatMul repacked), the float32 weights kept out of compression (a router) and 1-D tensors as
    float32."""
    import numpy as np

    fmt, source = forms.variant.format, forms.source
    total = 0.0
    for name, shape in source.expected.items():
        n = int(np.prod(shape, dtype=np.int64))
        if len(shape) < 2 and name not in source.batched:
            total += 4 * n
            continue
        kernel = _kernel(forms, name)
        bits = 32 if name in source.kept else fmt.runtime_bits(forms, name, kernel)
        if kernel == "gather" and source.last_matmul_shared and name == source.embeddings[0]:
            bits += fmt.runtime_bits(forms, name, "fc")  # the tied head's MatMul on the table
        total += bits * n / 8
    return int(total)


def cache_bytes(config, tokens: int, precision: str = DEFAULT_CACHE, draft_tokens: int = 0) -> int:
    """The KV cache of `tokens` tokens and the state tables of a target (targets.config.TargetConfig), as its
    layer kinds say GenAI pages them; state tables take one row for the sequence and `draft_tokens` + 1 more
    for a draft's verify pass."""
    import numpy as np

    from ..targets.decoder import layer_kinds

    per_value, per_head = CACHE_BYTES.get(precision, (2, 0))
    total = 0
    for i, kind in layer_kinds(config):
        for op in kind.paged(config, i):
            if "heads" in op and op.get("cache", i) == i:  # a layer reading another's cache holds none
                heads, size = op["heads"]
                window = op.get("window") or 0
                kept = min(tokens, window) if window else tokens
                total += 2 * kept * heads * (size * per_value + per_head)
            elif "table" in op:
                rows = 1 + (draft_tokens + 1 if draft_tokens else 0)
                total += 4 * rows * int(np.prod(op["table"][1][1:], dtype=np.int64))
    return total


def cache_precision(forms) -> str:
    """The KV cache precision the target will run with: f16 where its rt_info asks (uncompressed weights, as
    optimum writes them), else the CPU plugin's default."""
    return "f16" if forms.variant.format.compressed is False else DEFAULT_CACHE


@dataclass(frozen=True)
class DraftPlan:
    """A draft beside the target: its WeightForms for the variant it runs in (a GGUF's `gguf` variant in the
    compact grid, as `export` writes it), and how it holds the target's embedding and head
    (draft.head.HeadChoice: GenAI's graft, or its own; None: the graft's cost unknown, nothing counted)."""

    forms: object
    head: object = None


def draft_bytes(draft: DraftPlan, tokens: int, draft_tokens: int) -> int:
    """The draft's part of a pair: its weights, the target's table and head as the draft holds them (GenAI's
    copies as stored and the head compiled again, or its own: `HeadChoice`'s figures), its KV cache (its
    layers attend over the context too) and its pipeline share."""
    c = draft.forms.source.config
    head = 0 if draft.head is None else draft.head.graft_bytes if draft.head.form == "graft" else draft.head.own_bytes
    per_value, per_head = CACHE_BYTES[DEFAULT_CACHE]
    cache = 2 * (tokens + draft_tokens + 1) * c.num_layers * c.num_kv_heads * (c.head_dim * per_value + per_head)
    return weights_bytes(draft.forms) + head + cache + DRAFT_PIPELINE_BYTES


def plan_memory(candidates: dict, chosen: str, context: int = DEFAULT_CONTEXT, draft: tuple[DraftPlan, ...] = (),
                draft_tokens: int = 7, vision: int = 0, device: str = "CPU", available: int | None = None) -> MemoryPlan:
    """The plan for a target whose forms are `candidates` ({form label: WeightForms, or the reason it cannot be
    built}), `chosen` the one the command builds or runs; with the drafts `draft` beside it, one at a time
    (the heaviest counts), proposing `draft_tokens` a step; `vision` the bytes of a VLM folder's vision
    model."""
    from ..numerics import plugin_default

    forms = []
    for label, target in candidates.items():
        if isinstance(target, str):
            forms.append(FormMemory(label, 0, 0, refused=target))
            continue
        config = target.source.config
        cache = cache_bytes(config, context, cache_precision(target), draft_tokens if draft else 0)
        forms.append(FormMemory(label, weights_bytes(target), cache, vision=vision,
                                draft=max((draft_bytes(d, context, draft_tokens) for d in draft), default=0)))
    name = plugin_default(device)["device_name"] or device
    return MemoryPlan(device=name, available=available_bytes() if available is None else available, context=context,
                      chosen=chosen, forms=tuple(forms), with_draft=bool(draft))


# --- the forms a target can take --------------------------------------------------------------------------

def form_label(forms) -> str:
    """A target's form as the plan names it: the variant, and for the file's own grid its form."""
    return f"gguf ({forms.grid} grid)" if forms.variant.format.needs_gguf else forms.variant.name


def target_candidates(chosen_forms) -> dict:
    """{form label: WeightForms, or why it cannot be built} for the form a command builds (`chosen_forms`) and
    the others its source can take: from a GGUF its exact grid folded and split, and NNCF's int4 at group 128
    (the lean form) and int8; from a checkpoint int4, int8, fp16 and fp32."""
    from ..errors import Gguf2ovError
    from ..ir.variants import TARGET_GROUP_FALLBACK, TARGET_GROUP_SIZE, Variant
    from ..targets.graph import target_forms

    source = chosen_forms.source
    others = [("gguf", "folded"), ("gguf", "split")] if source.kind == "gguf" else [("fp32", None), ("fp16", None)]
    others += [("int8", None), ("int4", None)]
    candidates = {form_label(chosen_forms): chosen_forms}
    for weight_format, grid in others:
        # int4 as `target --weight-format int4` builds it: the lean form, a smaller group where 128 does not divide
        variant = Variant(weight_format, TARGET_GROUP_SIZE, group_fallback=TARGET_GROUP_FALLBACK) \
            if weight_format == "int4" else Variant(weight_format)
        try:
            forms = target_forms(source, variant, grid or "folded")
        except Gguf2ovError as e:  # the reason, without the list of weights it names
            candidates.setdefault(variant.name, e.message.split(": ", 1)[-1].split(": ")[0])
            continue
        candidates.setdefault(form_label(forms), forms)
    return candidates


def plan_target(forms, vision=None, draft=(), context=None, available: int | None = None) -> MemoryPlan:
    """The run-time memory of the target `forms` builds, in its form and the others its source can take, with a
    VLM folder's vision model (`vision`: its targets.vision.VisionSource) and drafts (`DraftPlan`s) beside it,
    against `available` bytes (None: what this machine has)."""
    from ..targets.vision import vision_ir_bytes

    return plan_memory(target_candidates(forms), form_label(forms), context or DEFAULT_CONTEXT, draft=draft,
                       vision=vision_ir_bytes(vision) if vision is not None else 0, available=available)

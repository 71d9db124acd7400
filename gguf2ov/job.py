"""The job a command runs, opened once: its draft, its target and its options.

mlx-lm's `convert()` opens its model once and runs straight through; transformers turns a GGUF into
one parsed object that every later step reads. A `Job` is that object here. It is frozen over what
the command line names, resolved once into typed specs (`sources.py`), and its options; what it
opens it keeps in its own cache:

- the draft: the memory-mapped GGUF through its map (or a checkpoint folder), opened once, with its
  target layer offset settled (by the tap scan, for a file that cannot tell);
- the target: an OpenVINO folder, or a model the job builds one from first (`build_target`, `run`'s
  target stage, which returns the job on the folder built); its config, locators, embedding, head and
  tokenizer, compiled at most once, and its greedy baseline in GenAI made once for every draft's
  acceptance run;
- the options every stage shares, the generation settings among them.

Stages (`gguf2ov/stages/`) take what a job holds and return results; no stage runs another. The
job composes the few pieces several commands need (the tap scan of a source, verify against the
source and the target, acceptance with the shared baseline), and `run` and the command line
compose the stages.
"""

import dataclasses
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .errors import Gguf2ovError
from .runtime.genai import GenerationSettings
from .sources import CheckpointSpec, GgufSpec, TargetBuild, TargetFolder


@dataclass(frozen=True)
class Options:
    map_path: Path | None = None
    target_layer_offset: int | None = None
    prompts: tuple | None = None  # Prompts; None: each stage's own
    generation: GenerationSettings = GenerationSettings()
    progress: bool = True
    draft_head: str = "auto"  # how a draft exported for the target holds its embedding and lm_head (draft/head.py)

    def record(self) -> dict:
        """The options as provenance keeps them."""
        return {"map": str(self.map_path) if self.map_path else None, "target_layer_offset": self.target_layer_offset,
                **self.generation.record(), "draft_head": self.draft_head}


@dataclass(frozen=True)
class Job:
    """`draft_spec`: the draft (a GGUF or a checkpoint folder); `target_spec`: the target (an OpenVINO
    folder, or a model to build one from). Each is opened when first asked for."""

    draft_spec: GgufSpec | CheckpointSpec | None = None
    target_spec: TargetFolder | TargetBuild | None = None
    options: Options = Options()

    def __post_init__(self):
        o, draft = self.options, self.draft_spec
        if isinstance(draft, CheckpointSpec) and (o.map_path is not None or o.target_layer_offset is not None):
            raise Gguf2ovError("--map and --target-layer-offset apply to a GGUF source, not to a checkpoint folder",
                               hint="pass the GGUF file instead, or drop those options")

    @classmethod
    def of(cls, draft=None, target=None, options: Options | None = None, build=None) -> "Job":
        """A job from its arguments as a command names them (paths, hub names): the draft a GGUF or
        checkpoint folder, the target an OpenVINO folder, or (with `build`, which makes its
        TargetBuild from a model source) a model to build one from."""
        from .sources import model_source, target_spec

        return cls(model_source(draft, "draft") if draft is not None else None,
                   target_spec(target, build) if target is not None else None, options or Options())

    @classmethod
    def from_args(cls, args, source: str | None = "source", build=None) -> "Job":
        """The job the command line describes: its draft, target and options (each opened when used)."""
        from .runtime.genai import given_prompts

        quiet = getattr(args, "quiet", False)
        prompts = given_prompts(args.prompts, args.image, default=None) if hasattr(args, "prompts") else None
        generation = GenerationSettings(
            max_new_tokens=getattr(args, "max_new_tokens", 100),
            num_assistant_tokens=getattr(args, "num_assistant_tokens", 7),
            device=getattr(args, "device", "CPU"),
            precision=getattr(args, "precision", "f32"),
            repeats=getattr(args, "repeats", 1),
        )
        options = Options(
            map_path=Path(args.map) if getattr(args, "map", None) else None,
            target_layer_offset=getattr(args, "target_layer_offset", None),
            prompts=tuple(prompts) if prompts else None,
            generation=generation,
            progress=not quiet,
            draft_head=getattr(args, "draft_head", "auto"),
        )
        return cls.of(getattr(args, source) if source else None, getattr(args, "target", None), options, build)

    # --- the draft -----------------------------------------------------------------------------------

    @cached_property
    def gguf(self):
        """The draft GGUF, read once and memory-mapped (None for a checkpoint folder)."""
        return self.draft_spec.open() if isinstance(self.draft_spec, GgufSpec) else None

    @cached_property
    def draft_map(self):
        """The draft GGUF's map (maps.arch_map.ArchMap: --map's, else the one its architecture names), chosen
        once (None for a checkpoint folder); a file of a kind GenAI does not run is refused here."""
        from .maps.load import map_for

        return map_for(self.gguf, self.options.map_path) if self.gguf is not None else None

    @cached_property
    def offset_decision(self):
        """The tap scan that settles the target layer offset of a GGUF whose layout is ambiguous
        (None when the file settles it, an offset was given, or there is no target to measure on)."""
        if self.options.target_layer_offset is not None or self.gguf is None or self.target_spec is None:
            return None
        from .checks.taps import settle_offset

        def scan(offset, shifts, named):
            return self.scan(shifts=shifts, named=named, draft=self.read_draft(offset))

        return settle_offset(self.gguf, self.draft_map, self.target, scan, self.options.progress)

    @property
    def target_layer_offset(self) -> int | None:
        decision = self.offset_decision
        return decision.offset if decision is not None else self.options.target_layer_offset

    @cached_property
    def draft(self):
        """The DFlash draft, validated and ready to stream its weights (draft.source.DraftSource)."""
        if self.gguf is None:
            from .draft.source import open_draft_checkpoint

            return self.fitted(open_draft_checkpoint(self.draft_spec.path))
        return self.read_draft(self.target_layer_offset, self.offset_decision)

    def fitted(self, draft):
        """`draft` fitted to the embeddings the target's runtime feeds it (draft/embedding.py). A stated
        input_embedding_scale multiplies the target table's rows (GenAI grafts them onto the draft of an LLM
        target), but a VLM's drafts get the text embeddings model's output, Gemma's sqrt(hidden) in it already:
        the draft applies only what is left, not the scale twice, and records which form it was fitted for. A
        draft that states no scale takes what it is fed; without a target, a draft keeps the form its config
        states (the table's rows, unless it records another)."""
        if draft.config.trained_embedding_scale == 1.0 or self.target_spec is None or self.builds_target:
            return draft
        draft.config = draft.config.fitted(self.target.embeds_scale)
        return draft

    def read_draft(self, target_layer_offset: int | None, offset_decision=None):
        """The GGUF read as a draft with a given target layer offset (what the tap scan compares)."""
        from .draft.source import open_draft_gguf

        return self.fitted(open_draft_gguf(self.gguf, self.options.map_path, target_layer_offset, offset_decision))

    @cached_property
    def shaped_draft(self):
        """The draft as far as its shapes go: a draft.source.DraftSource, never measured. A GGUF is read with
        the target layer offset given, else its map's default: shapes, sizes and NNCF's plans do not depend on
        it, so what they decide is decided before the tap scan settles the offset of a file that cannot tell it
        (and `check` scans it, naming a shift rather than settling it)."""
        if self.gguf is None:
            return self.draft
        offset = self.options.target_layer_offset
        if offset is None:
            offset = self.draft_map.metadata.flag_add("target_layer_offset")
        return self.read_draft(offset)

    @cached_property
    def mapped(self):
        """The GGUF read through its map (maps.load.MappedGguf), for `convert`."""
        from .maps.load import open_mapped

        if self.gguf is None:
            raise Gguf2ovError(f"{self.draft_spec.path} is a folder; convert reads a GGUF file")
        return open_mapped(self.gguf, target_layer_offset=self.target_layer_offset, amap=self.draft_map)

    def ambiguous(self) -> list[str]:
        """Why the GGUF cannot tell how its target layer ids were written ([] when it can)."""
        if self.options.target_layer_offset is not None or self.gguf is None:
            return []
        try:
            return self.draft_map.metadata.flag_ambiguity(self.gguf, "target_layer_offset")
        except Gguf2ovError:
            return []  # an unreadable file: the stage that reads it says what is wrong

    # --- the target -----------------------------------------------------------------------------------

    @property
    def builds_target(self) -> bool:
        return isinstance(self.target_spec, TargetBuild)

    @cached_property
    def target(self):
        """The OpenVINO target as a draft sees it (runtime.target.TargetIR), or None without one: every
        stage takes it as opened here, once. A job that builds its target has it on `with_target`'s job."""
        from .runtime.target import TargetIR

        if self.target_spec is None:
            return None
        if self.builds_target:
            raise Gguf2ovError(f"the target is built from {self.target_spec.path} first (gguf2ov target)")
        return TargetIR(self.target_spec.path, self.target_spec.kind)

    @cached_property
    def target_source(self):
        """The model a target is built from (target.source.TargetSource), opened once."""
        spec = self.target_spec.source
        if isinstance(spec, GgufSpec):
            from .targets.source import open_target_gguf

            return open_target_gguf(spec.open(), self.target_spec.map_path)
        from .targets.source import open_target_checkpoint

        return open_target_checkpoint(spec.path)

    @cached_property
    def target_forms(self):
        """The form every weight of the target to build takes (ir.weights.WeightForms; NNCF's plan made,
        and refused here if NNCF would refuse it)."""
        from .targets.graph import target_forms

        build = self.target_spec
        return target_forms(self.target_source, build.variant, build.grid, build.allow_nonfinite)

    @cached_property
    def target_tokenizer(self):
        """Where the built target's tokenizer comes from: "gguf" (the file's vocabulary) or a folder;
        refused before any heavy work when there is none."""
        from .stages.target import tokenizer_source

        build = self.target_spec
        return tokenizer_source(build.path, isinstance(build.source, GgufSpec), build.tokenizer_dir)

    def require_target_build(self, out_dir, overwrite: bool = False):
        """What building the target needs, checked before any work: a free output folder and a
        tokenizer. Returns where the tokenizer comes from."""
        from .outputs import require_output_dir

        build = self.target_spec
        require_output_dir(Path(out_dir), overwrite, inputs=(build.path, build.map_path, build.tokenizer_dir,
                                                             build.mmproj))
        return self.target_tokenizer

    def target_bytes(self) -> int:
        """The bytes building the target writes."""
        from .stages.target import target_folder_bytes

        return target_folder_bytes(self.target_forms, self.target_tokenizer)

    def build_target(self, out_dir, overwrite: bool = False):
        """`gguf2ov target`, and `run`'s target stage: the target built into `out_dir` (its
        stages.target.TargetExportResult). `with_target(out_dir)` is then the job on it."""
        from .stages.target import export_target, open_vision

        build = self.target_spec
        tokenizer_from = self.require_target_build(out_dir, overwrite)
        vision = None if build.mmproj is None else open_vision(self.target_source, build.mmproj, build.allow_nonfinite)
        return export_target(self.target_forms, out_dir, tokenizer_from, overwrite=overwrite,
                             progress=self.options.progress,
                             sources={"tokenizer": build.tokenizer_dir} if build.tokenizer_dir else None,
                             vision=vision, image_max_tokens=build.image_max_tokens)

    def memory_plan(self, accepted=()):
        """The run-time memory of the target to build where GenAI runs it (runtime/memory.py), before anything
        is built: in its form and the others its source can take, with a VLM folder's vision model, and with the
        draft's `accepted` variants beside it (the heaviest counts), holding the target's table and head as the
        job plans them; the KV cache sized for the longest prompt and the generation (a byte a token at most)."""
        from .ir.variants import parse_variant
        from .ir.weights import WeightForms
        from .runtime.memory import DraftPlan, plan_target
        from .stages.target import open_vision
        from .draft.graph import draft_grid

        build, gen = self.target_spec, self.options.generation
        vision = None if build.mmproj is None else open_vision(self.target_source, build.mmproj, build.allow_nonfinite)
        head = self.planned_head() if accepted else None
        drafts = tuple(DraftPlan(WeightForms(self.shaped_draft, parse_variant(n), grid=draft_grid(None)), head)
                       for n in accepted)
        context = None
        if accepted:
            longest = max(len(p.text.encode()) for p in self.prompts())
            context = longest + gen.max_new_tokens + gen.num_assistant_tokens + 1
        return plan_target(self.target_forms, vision, drafts, context)

    def with_target(self, target_dir) -> "Job":
        """This job on the OpenVINO target folder `target_dir` (the one `build_target` wrote), opened here
        once: every later stage takes it as `target`. A new job, whose draft is opened again when first
        asked for (a memory map)."""
        from .runtime.target import TargetIR

        built = TargetIR.open(target_dir)
        return dataclasses.replace(self, target_spec=TargetFolder(built.path, built.kind))

    @cached_property
    def head(self):
        """How a draft exported for the target holds its embedding and lm_head (draft.head.HeadChoice),
        chosen once; None without a target."""
        from .draft.head import choose_head

        return choose_head(self.target, self.options.draft_head) if self.target_spec is not None else None

    def planned_head(self):
        """`head` before the target exists, for the disk check of a run that builds it: decided from what
        the build will store (draft.head.decide)."""
        if not self.builds_target:
            return self.head
        from .draft.head import decide
        from .targets.decoder import EMBEDDING, LM_HEAD

        forms = self.target_forms
        tied = forms.source.last_matmul_shared
        table = forms.variant.format.stored_bytes(forms, EMBEDDING)
        head = table if tied else forms.variant.format.stored_bytes(forms, LM_HEAD)
        return decide(self.options.draft_head, table, head, forms.source.expected[LM_HEAD if not tied else EMBEDDING],
                      tied)

    def release_target(self) -> None:
        """Free the target's compiled model and weights, before GenAI compiles it again: the CPU
        plugin holds the mapped IR and its repacked weights, ~2.2x the IR, per compiled copy."""
        if self.target_spec is not None and not self.builds_target:
            self.target.release()  # a target not read yet holds nothing

    # --- what several commands compose -----------------------------------------------------------------

    def prompts(self, default=None):
        from .runtime.genai import DEFAULT_PROMPTS, as_prompts

        return as_prompts(self.options.prompts or default or DEFAULT_PROMPTS)

    def scan(self, draft_dir=None, named=(), shifts=None, draft=None):
        """The tap scan of an exported draft folder, or of the source (`draft`, else the job's, exported
        to a temporary folder first: a GGUF in its own grid, 1.0x the file on disk, with its
        dequantized values exactly; a checkpoint in fp32)."""
        from .checks.taps import SHIFTS, scan_taps

        shifts = SHIFTS if shifts is None else shifts
        if draft_dir is not None:
            return scan_taps(draft_dir, self.target, prompts=self.prompts(), shifts=shifts, named=named)
        from .draft.graph import write_draft_ir
        from .ir.variants import parse_variant

        draft = draft or self.draft
        with tempfile.TemporaryDirectory(prefix="gguf2ov-taps-") as tmp:
            write_draft_ir(draft, tmp, parse_variant("gguf" if draft.kind == "gguf" else "fp32"), progress=False)
            return scan_taps(tmp, self.target, prompts=self.prompts(), shifts=shifts, named=named)

    def verify(self, draft_dir, tap_scan: bool = False, named=(), against_source: bool = True):
        """`verify` of an exported draft folder against the job's source (checkpoint-match) and target."""
        from .stages.verify import verify_draft

        reference = self.draft if against_source and self.draft_spec is not None else None
        return verify_draft(draft_dir, target=self.target, reference=reference, tap_scan=tap_scan,
                            prompts=self.options.prompts, named_layers=named)

    def validator(self, tap_scan: bool = False):
        """What export runs on a draft folder before it is put in place: verify against the source
        (and the target), raising when it fails so that nothing is written."""

        def validate(folder):
            result = self.verify(folder, tap_scan=tap_scan)
            if not result.ok:
                failed = "; ".join(f"{c.name}: {c.reason}" for c in result.checks if c.status == "fail")
                raise Gguf2ovError(f"the exported draft fails verification: {failed}",
                                   hint="nothing was written; rerun with --debug to inspect")
            return result

        return validate

    @cached_property
    def baseline(self):
        """The target alone in GenAI on the job's prompts: made once for every draft's acceptance run."""
        from .stages.accept import target_alone

        self.release_target()  # GenAI compiles its own copy
        return target_alone(self.target, self.prompts(), self.options.generation, self.options.progress)

    def accept(self, draft_dir, verified=None):
        """The acceptance run of a draft folder on the target, against the shared baseline; a BROKEN
        verdict names the verify findings that explain it, and any verdict a failing `embedding-scale`
        (`verified`: a VerifyResult already made)."""
        from .stages.accept import require_draft_dir, run_acceptance
        from .stages.verify import embedding_scale_of

        require_draft_dir(Path(draft_dir))  # before the minutes the target alone takes
        # a draft fitted for other embeddings than this target feeds is accepted less, whatever the verdict
        fit = verified.finding("embedding-scale") if verified is not None else \
            embedding_scale_of(draft_dir, self.target)

        def explain():
            return broken_reasons(verified if verified is not None else
                                  self.verify(draft_dir, tap_scan=True, against_source=False))

        result = run_acceptance(self.target, draft_dir, self.prompts(), self.options.generation,
                                baseline=self.baseline, explain=explain, progress=self.options.progress)
        reason = _reason(fit) if fit is not None and fit.status in ("fail", "warn") else None
        if reason is None or reason in result.reasons:
            return result
        return dataclasses.replace(result, reasons=(*result.reasons, reason))

    # --- the stages as the commands run them ----------------------------------------------------------

    def export(self, out_dir, variant=None, overwrite: bool = False):
        """`export`: the draft as `variant` (an ir.variants.Variant; None: fp32), verified against the source (with
        a target: against it too, tap scan included) before it is put in place; with a target, holding the
        target's embedding and lm_head as `head` chose."""
        from .stages.export import export_draft

        return export_draft(self.draft, out_dir, variant, validate=self.validator(tap_scan=self.target is not None),
                            overwrite=overwrite, progress=self.options.progress, head=self.head)

    def convert(self, out_dir, dtype: str = "bf16", overwrite: bool = False, before_commit=None, **options):
        """`convert`: the GGUF as a Hugging Face checkpoint (an ambiguous offset settled on the target)."""
        from .stages.convert import convert

        return convert(self.mapped, out_dir, dtype=dtype, overwrite=overwrite, progress=self.options.progress,
                       offset_decision=self.offset_decision, before_commit=before_commit, **options)

    def check(self, reference, min_corr: float = 0.99):
        """`check` of the source against reference weights; with a target, the tap scan of the source
        read as check reads it (an ambiguous GGUF with the map's default offset, so that the scan
        names a shift rather than settling it)."""
        from .stages.check import check, checkpoint_source, gguf_source

        scan = self.scan(draft=self.shaped_draft) if self.target is not None else None
        o = self.options
        source = gguf_source(self.gguf, o.map_path, o.target_layer_offset) if self.gguf is not None else \
            checkpoint_source(self.draft_spec.path)
        return check(source, reference, min_corr=min_corr, progress=o.progress, scan=scan)

    def drift(self, out_dir, variants=None, accept: bool = False, overwrite: bool = False):
        """`drift`: every variant built, measured and verified against the source and the target; with
        `accept`, each run on the target in GenAI."""
        from .stages.drift import drift

        return drift(self.draft, out_dir, variants=variants, target=self.target, prompts=self.options.prompts,
                     verify=self.verify, accept=self.accept if accept else None, overwrite=overwrite,
                     progress=self.options.progress)


def broken_reasons(verified) -> list[str]:
    """The `verify` findings that explain a draft that is never accepted."""
    failed = [_reason(c) for c in verified.checks if c.status in ("fail", "warn")]
    if failed:
        return failed
    return ["verify passes (interface, rt_info, seed-row slice, target geometry): the draft's weights do not "
            "predict this target; compare the GGUF with its reference weights (gguf2ov check) and confirm the "
            "target layer ids (--target-layer-offset) and that draft and target were trained together"]


def _reason(finding) -> str:
    return f"verify {finding.name}: {finding.reason}"

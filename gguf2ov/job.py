"""The job a command runs, opened once: its draft source, its target and its options.

mlx-lm's `convert()` opens its model once and runs straight through; transformers turns a GGUF into
one parsed object that every later step reads. A `Job` is that object here:

- the draft source: the memory-mapped GGUF through its map (or a checkpoint folder), opened once,
  with its target layer offset settled (by the tap scan, for a file that cannot tell);
- the target: config, locators, embedding, head and tokenizer, compiled at most once, and its
  greedy baseline in GenAI made once for every draft's acceptance run;
- the options every stage shares.

Stages (`gguf2ov/stages/`) take what a job holds and return results; no stage runs another. The
job composes the few pieces several commands need (the tap scan of a source, verify against the
source and the target, acceptance with the shared baseline), and `run` and the command line
compose the stages.
"""

import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .errors import Gguf2ovError
from .progress import step


@dataclass(frozen=True)
class Options:
    map_path: Path | None = None
    target_layer_offset: int | None = None
    prompts: tuple | None = None  # Prompts; None: each stage's own
    device: str = "CPU"
    precision: str = "f32"
    max_new_tokens: int = 100
    num_assistant_tokens: int = 7
    repeats: int = 1
    progress: bool = True

    def record(self) -> dict:
        """The options as provenance keeps them."""
        return {"map": str(self.map_path) if self.map_path else None, "target_layer_offset": self.target_layer_offset,
                "device": self.device, "precision": self.precision, "max_new_tokens": self.max_new_tokens,
                "num_assistant_tokens": self.num_assistant_tokens, "repeats": self.repeats}


@dataclass
class Job:
    """`source`: a draft GGUF, hub name or checkpoint folder (or an opened GgufFile/DraftSource);
    `target`: a target folder (or an opened Target). Each is opened when first asked for."""

    source: object = None
    target_spec: object = None
    options: Options = field(default_factory=Options)

    @classmethod
    def from_args(cls, args, source: str | None = "source") -> "Job":
        """The job the command line describes: its source, target and options (each opened when used)."""
        from .runtime.genai import given_prompts

        quiet = getattr(args, "quiet", False)
        prompts = given_prompts(args.prompts, args.image, default=None) if hasattr(args, "prompts") else None
        options = Options(
            map_path=Path(args.map) if getattr(args, "map", None) else None,
            target_layer_offset=getattr(args, "target_layer_offset", None),
            prompts=tuple(prompts) if prompts else None,
            device=getattr(args, "device", "CPU"),
            precision=getattr(args, "precision", "f32"),
            max_new_tokens=getattr(args, "max_new_tokens", 100),
            num_assistant_tokens=getattr(args, "num_assistant_tokens", 7),
            repeats=getattr(args, "repeats", 1),
            progress=not quiet,
        )
        return cls(getattr(args, source) if source else None, getattr(args, "target", None), options)

    # --- the draft source ---------------------------------------------------------------------------

    @cached_property
    def opened(self):
        """The source as opened: a GgufFile, or the Path of a checkpoint folder."""
        from .sources import open_source

        return open_source(self.source)

    @property
    def gguf(self):
        from .gguf.read import GgufFile

        return self.opened if isinstance(self.opened, GgufFile) else None

    @cached_property
    def offset_decision(self):
        """The tap scan that settles the target layer offset of a GGUF whose layout is ambiguous
        (None when the file settles it, an offset was given, or there is no target to measure on)."""
        if self.options.target_layer_offset is not None or self.gguf is None or self.target_spec is None:
            return None
        return self.settle_offset()

    @property
    def target_layer_offset(self) -> int | None:
        decision = self.offset_decision
        return decision.offset if decision is not None else self.options.target_layer_offset

    @cached_property
    def draft(self):
        """The DFlash draft, validated and ready to stream its weights (model.source.DraftSource)."""
        from .draft.source import DraftSource, open_draft

        if isinstance(self.source, DraftSource):
            return self.source
        return open_draft(self.opened, self.options.map_path, self.target_layer_offset, self.offset_decision)

    @cached_property
    def mapped(self):
        """The GGUF read through its map (maps.load.MappedGguf), for `convert`."""
        from .maps.load import open_mapped

        return open_mapped(self.gguf, self.options.map_path, self.target_layer_offset)

    def ambiguous(self) -> list[str]:
        """Why the GGUF cannot tell how its target layer ids were written ([] when it can)."""
        from .maps.load import map_for

        if self.options.target_layer_offset is not None or self.gguf is None:
            return []
        try:
            return map_for(self.gguf, self.options.map_path).flag_ambiguity(self.gguf, "target_layer_offset")
        except Gguf2ovError:
            return []  # an unreadable file: the stage that reads it says what is wrong

    # --- the target -----------------------------------------------------------------------------------

    @cached_property
    def target(self):
        """The opened target (runtime.target.Target), or None without one."""
        from .runtime.target import Target
        from .sources import open_target

        if self.target_spec is None or isinstance(self.target_spec, Target):
            return self.target_spec
        return open_target(self.target_spec)

    @property
    def target_dir(self) -> Path | None:
        return self.target.path if self.target is not None else None

    def release_target(self) -> None:
        """Free the target's compiled model and weights, before GenAI compiles it again: the CPU
        plugin holds the mapped IR and its repacked weights, ~2.2x the IR, per compiled copy."""
        if self.target is not None:
            self.target.release()

    # --- what several commands compose -----------------------------------------------------------------

    def prompts(self, default=None):
        from .runtime.genai import DEFAULT_PROMPTS, as_prompts

        return as_prompts(self.options.prompts or default or DEFAULT_PROMPTS)

    def read_draft(self, target_layer_offset: int | None):
        """The source read as a draft with another target layer offset (what the tap scan compares)."""
        from .draft.source import open_draft

        return open_draft(self.opened, self.options.map_path, target_layer_offset)

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

    def settle_offset(self):
        """The target layer offset of an ambiguous GGUF, measured against the target (the tap scan);
        None when the file settles it. Refuses (Gguf2ovError) when the measurement cannot tell."""
        from .checks.taps import MISFIT, SHIFTS, OffsetDecision
        from .maps.arch_map import flag_option
        from .maps.load import map_for

        gguf = self.gguf
        amap = map_for(gguf, self.options.map_path)
        why = amap.flag_ambiguity(gguf, "target_layer_offset")
        if not why:
            return None
        hf_key, gguf_key = amap.flag_rule("target_layer_offset")
        rule = amap.config[hf_key]
        declared = list(gguf.metadata[gguf_key])
        tappable = set(self.target.tap_layers)
        choices, invalid = {}, {}
        for offset in rule.get("choices", {}):
            ids = [i + int(offset) for i in declared]
            if any(i < rule.get("min", 0) for i in ids):
                invalid[int(offset)] = f"ids {ids} below {rule.get('min', 0)}"
            elif not all(i in tappable for i in ids):
                invalid[int(offset)] = f"ids {ids} outside the target's layers"
            else:
                choices[int(offset)] = ids
        flag = flag_option(rule["flag"])
        if not choices:
            raise Gguf2ovError(f"{gguf.path}: no choice of {flag} puts {declared} inside the target "
                               f"({'; '.join(f'offset {o}: {w}' for o, w in invalid.items())})",
                               hint="is this the target the draft was made for?")
        first = next(iter(choices))
        step(f"{gguf.path.name}: target layer layout ambiguous; measuring offsets {sorted(choices)} against "
             f"{self.target.path}", self.options.progress)
        others = {f"offset {o}": ids for o, ids in choices.items() if o != first}
        single = not others
        scan = self.scan(shifts=SHIFTS if single else (), named=others, draft=self.read_draft(first))
        labels = {"configured": first, **{f"offset {o}": o for o in choices}}
        if single:
            if scan.verdict == MISFIT:
                raise Gguf2ovError(f"{gguf.path}: {flag} {first} is the only choice inside the target, but the tap "
                                   f"scan says the draft fits other layers: {scan.finding()}",
                                   hint="is this the target the draft was made for?")
            return OffsetDecision(str(gguf.path), declared, why, choices, invalid, first, choices[first], scan)
        if not scan.clear:
            raise Gguf2ovError(f"{gguf.path}: the tap scan cannot tell which {flag} fits: {scan.finding()}",
                               hint=f"pass {flag} explicitly (-1: the current llama.cpp converter, 0: its first one), "
                                    "or scan with more prompts (--prompts)")
        offset = labels[scan.best]
        return OffsetDecision(str(gguf.path), declared, why, choices, invalid, offset, choices[offset], scan)

    def verify(self, draft_dir, tap_scan: bool = False, named=(), against_source: bool = True):
        """`verify` of an exported draft folder against the job's source (checkpoint-match) and target."""
        from .stages.verify import verify_draft

        return verify_draft(draft_dir, target=self.target, reference=self.draft if against_source else None,
                            tap_scan=tap_scan, prompts=self.options.prompts, named_layers=named)

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

        o = self.options
        self.release_target()  # GenAI compiles its own copy
        return target_alone(self.target_dir, self.prompts(), o.max_new_tokens, o.device, o.precision, o.repeats,
                            o.progress)

    def accept(self, draft_dir, verified=None):
        """The acceptance run of a draft folder on the target, against the shared baseline; a BROKEN
        verdict names the verify findings that explain it (`verified`: a VerifyResult already made)."""
        from .stages.accept import run_acceptance

        o = self.options

        def explain():
            return broken_reasons(verified if verified is not None else
                                  self.verify(draft_dir, tap_scan=True, against_source=False))

        return run_acceptance(self.target_dir, draft_dir, self.prompts(), max_new_tokens=o.max_new_tokens,
                              num_assistant_tokens=o.num_assistant_tokens, device=o.device, precision=o.precision,
                              repeats=o.repeats, progress=o.progress, baseline=self.baseline, explain=explain)


    # --- the stages as the commands run them ----------------------------------------------------------

    def export(self, out_dir, variant="fp32", overwrite: bool = False):
        """`export`: the draft as `variant`, verified against the source (with a target: against it
        too, tap scan included) before it is put in place."""
        from .ir.variants import parse_variant
        from .stages.export import export_draft

        variant = parse_variant(variant) if isinstance(variant, str) else variant  # before the source is read
        return export_draft(self.draft, out_dir, variant, validate=self.validator(tap_scan=self.target is not None),
                            overwrite=overwrite, progress=self.options.progress)

    def convert(self, out_dir, dtype: str = "bf16", overwrite: bool = False, before_commit=None, **options):
        """`convert`: the GGUF as a Hugging Face checkpoint (an ambiguous offset settled on the target)."""
        from .stages.convert import convert

        return convert(self.mapped, out_dir, dtype=dtype, overwrite=overwrite, progress=self.options.progress,
                       offset_decision=self.offset_decision, before_commit=before_commit, **options)

    def check(self, reference, min_corr: float = 0.99):
        """`check` of the source against reference weights; with a target, the tap scan of the source
        read as check reads it (an ambiguous GGUF with the map's default offset, so that the scan
        names a shift rather than settling it)."""
        from .maps.load import map_for
        from .stages.check import check

        scan = None
        if self.target is not None:
            offset = self.options.target_layer_offset
            if offset is None and self.gguf is not None:
                offset = map_for(self.gguf, self.options.map_path).flag_add("target_layer_offset")
            scan = self.scan(draft=self.read_draft(offset))
        return check(self.opened, reference, min_corr=min_corr, map_path=self.options.map_path,
                     target_layer_offset=self.options.target_layer_offset, progress=self.options.progress, scan=scan)

    def drift(self, out_dir, variants=None, accept: bool = False, overwrite: bool = False):
        """`drift`: every variant built, measured and verified against the source and the target; with
        `accept`, each run on the target in GenAI."""
        from .stages.drift import drift

        return drift(self.draft, out_dir, variants=variants, target=self.target, prompts=self.options.prompts,
                     verify=self.verify, accept=self.accept if accept else None, overwrite=overwrite,
                     progress=self.options.progress)


def broken_reasons(verified) -> list[str]:
    """The `verify` findings that explain a draft that is never accepted."""
    failed = [f"verify {c.name}: {c.reason}" for c in verified.checks if c.status in ("fail", "warn")]
    if failed:
        return failed
    return ["verify passes (interface, rt_info, seed-row slice, target geometry): the draft's weights do not "
            "predict this target; compare the GGUF with its reference weights (gguf2ov check) and confirm the "
            "target layer ids (--target-layer-offset) and that draft and target were trained together"]

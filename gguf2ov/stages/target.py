"""`gguf2ov target`: a DFlash-ready OpenVINO target from a GGUF or a Hugging Face checkpoint folder.

GenAI's own GGUF reader cannot drive a DFlash draft (its graph has no hidden-state locators and no
embedding Gather that the draft attaches to), and optimum-intel needs the full checkpoint in
PyTorch (6-9 GB for an 8B model). This stage builds the graph optimum-intel writes, with the
locators DFlash needs, weight by weight (targets/graph.py), and writes a folder GenAI's
LLMPipeline loads as a target: the IR, config.json, generation_config.json, the OpenVINO tokenizer
and detokenizer, and gguf2ov.json. Before the folder is put in place, the written IR is checked as `verify --target`
checks any target (`targets/checks.py`): interface, state variables, locators on live nodes of the
hidden width, the embedding and lm_head GenAI attaches a draft to, OpenVINO's paged conversion
making of every layer what its kind must become, and, where a kind expects it (a mixture of experts'
GatherMatmul), what the CPU plugin compiles it into (`targets/probe.py`).
"""

import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import Finding
from ..errors import Gguf2ovError
from ..names import (CONFIG_FILE, DETOKENIZER_IR, IR_XML, PROVENANCE_FILE, TARGET_MAP_FILE, TOKENIZER_IR,
                     VLM_LANGUAGE_MODEL, VLM_PER_LAYER_EMBEDDINGS, VLM_TEXT_EMBEDDINGS, VLM_VISION_EMBEDDINGS)
from ..outputs import atomic_dir, atomic_write_text, require_space, writing
from ..progress import step
from ..provenance import provenance
from ..report import Table, human_bytes

GENERATION_CONFIG = "generation_config.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"  # a VLM's image processor
# A Hugging Face tokenizer folder holds one of these; the other files are copied beside the IR too
TOKENIZER_MODEL_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER_FILES = TOKENIZER_MODEL_FILES + ("tokenizer_config.json", "special_tokens_map.json", "merges.txt",
                                           "added_tokens.json", "chat_template.jinja")


@dataclass(frozen=True)
class TargetExportResult:
    out_dir: str
    source: str
    source_kind: str  # "gguf" | "checkpoint"
    arch: str
    weight_format: str  # the variant's name
    hidden_size: int
    num_layers: int
    vocab_size: int
    tied_embeddings: bool
    sliding_layers: list[int]
    layer_kinds: dict[str, int]  # layer type -> how many layers are of it
    inputs: list[list[str]]  # [name, partial shape, element type]
    outputs: list[list[str]]
    state_variables: int
    locators: dict[str, str]  # layer id -> producer node
    rt_info: dict[str, str]
    tokenizer: str  # where the tokenizer came from
    files: dict[str, int]
    checks: list[Finding]
    transcoded: int = 0
    grid: str | None = None  # "split" | "folded" | "compact", when weights carry the GGUF's grid
    nncf_backup: list[str] = field(default_factory=list)
    nncf_backup_why: dict[str, str] = field(default_factory=dict)  # weight -> why NNCF keeps it in int8
    nonfinite: dict[str, int] = field(default_factory=dict)  # weight -> NaN/Inf values written (--allow-nonfinite)
    seconds: float = 0.0
    vision: dict | None = None  # a VLM folder's image encoder (targets/vision.py's vision_config, and its mmproj)
    nncf_groups: dict[int, int] = field(default_factory=dict)  # NNCF int4 group size -> weights compressed at it
    trade: str | None = None  # what the form trades against the GGUF's own grid (variants.Format.trade)
    alternative: str | None = None  # the other form it could take, by name (variants.Format.alternative)
    run_time_memory: dict | None = None  # the plan (runtime.memory.MemoryPlan.record): bytes per form, whether it fits
    memory_line: str = ""               # the plan's one line
    memory_table: Table | None = None

    def tables(self) -> list[Table]:
        io_rows = [["input", *row] for row in self.inputs] + [["output", *row] for row in self.outputs]
        return [
            Table("Target IR interface", ["kind", "name", "shape", "type"], io_rows,
                  note=f"{self.state_variables} state variables"),
            Table("Hidden-state locators", ["layer", "producer"], [[k, v] for k, v in self.locators.items()]),
            Table("Target rt_info", ["key", "value"], [[k, v] for k, v in self.rt_info.items()]),
            Table("Target checks", ["check", "status", "reason"], [[c.name, c.status, c.reason] for c in self.checks]),
            Table("Files", ["file", "size"], [[k, human_bytes(v)] for k, v in self.files.items()]),
        ] + ([self.memory_table] if self.memory_table is not None else [])

    def summary(self) -> list[str]:
        from ..ir.variants import parse_variant

        lines = [f"built {self.source} ({self.source_kind}, {self.arch}) -> {self.out_dir} as {self.weight_format} "
                 f"in {self.seconds:.1f} s",
                 f"target: {self.num_layers} layers, hidden {self.hidden_size}, vocab {self.vocab_size}, "
                 f"{'tied' if self.tied_embeddings else 'untied'} lm_head, tokenizer from {self.tokenizer}"]
        if len(self.layer_kinds) > 1:
            lines.append("layers: " + ", ".join(f"{n} {kind}" for kind, n in self.layer_kinds.items()))
        if self.sliding_layers:
            lines.append(f"sliding-window layers: {self.sliding_layers}")
        if self.vision:
            v = self.vision
            lines.append(f"vision (VLMPipeline folder) from {v['mmproj']}: {v['num_hidden_layers']} layers, hidden "
                         f"{v['hidden_size']}, patches of {v['patch_size']}, pooled {v['pooling_kernel_size']} x "
                         f"{v['pooling_kernel_size']}, images up to {v['max_soft_tokens']} soft tokens")
        if self.transcoded:
            lines.append(f"{self.transcoded} weights carry the GGUF's own grid ({self.grid})")
        if set(self.nncf_groups) - {parse_variant(self.weight_format).group_size}:
            lines.append("NNCF int4 groups (a smaller one where the group does not divide a weight's input width): "
                         + ", ".join(f"{g} for {n} weights" for g, n in sorted(self.nncf_groups.items(), reverse=True)))
        if self.nncf_backup:
            lines.append(f"kept in NNCF's backup int8: {_backup_text(self.nncf_backup, self.nncf_backup_why)}")
        if self.trade:
            lines.append(f"{self.weight_format}: {self.trade}")
        if self.alternative:
            lines.append(self.alternative)
        passed = sum(c.status == "pass" for c in self.checks)
        lines.append(f"target checks: {passed}/{len(self.checks)} pass")
        if self.memory_line:
            lines.append(self.memory_line)
        if self.nonfinite:
            lines.append(f"NaN or Inf values written (--allow-nonfinite) in {len(self.nonfinite)} weights")
        return lines


# --- the stage ------------------------------------------------------------------------------------


def export_target(forms, out_dir, tokenizer_from, overwrite: bool = False, progress: bool = True,
                  sources: dict | None = None, vision=None, image_max_tokens: int | None = None) -> TargetExportResult:
    """Build the OpenVINO target `forms` describe (target.graph.target_forms: its source, a GGUF through
    its map or a checkpoint folder, and the form of its weights: the variant, `gguf` weights folded or
    in the file's own factorisation) in `out_dir`.

    `tokenizer_from`: "gguf" (the file's vocabulary) or a folder (`tokenizer_source`). `sources`:
    further inputs provenance records (a --tokenizer folder). `vision`: a VLM's mmproj (`open_vision`), whose
    folder is then written (`write_vlm_target`), images taking `image_max_tokens` soft tokens at most (None:
    transformers' default, targets/vision.MAX_SOFT_TOKENS).
    """
    from ..runtime.memory import plan_target
    from ..targets.probe import compiled_check
    from ..targets.vision import MAX_SOFT_TOKENS, vision_config

    target, variant = forms.source, forms.variant
    image_max_tokens = image_max_tokens or MAX_SOFT_TOKENS
    if tokenizer_from == "gguf":
        _require_vocabulary(target)
    scratch = target_scratch_bytes(forms)
    require_space(out_dir, target_folder_bytes(forms, tokenizer_from, vision), f"the {variant.name} target" +
                  (f" (with {human_bytes(scratch)} of scratch files while its IR is written)" if scratch else ""),
                  hint="write to another folder (-o)" + (", or keep the file's own factorisation (--compact-grid: "
                                                         "~0.74x the folded IR)" if forms.transcoded and
                                                         forms.grid != "compact" else ""))

    plan = plan_target(forms, vision)  # from the source, before the build: what running it will take here
    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        if vision is None:
            write_target(tmp, forms, tokenizer_from, progress)
        else:
            write_vlm_target(tmp, forms, tokenizer_from, vision, image_max_tokens, progress)
            sources = {**(sources or {}), "mmproj": vision.gguf}
        options = {"weight_format": variant.weight_format, "variant": variant.name,
                   "map": str(target.map_path) if target.map_path else None, "source_kind": target.kind,
                   "arch": target.arch, "tokenizer": str(tokenizer_from), "transcoded": len(forms.transcoded),
                   "grid": _grid_form(forms), "nncf_backup": sorted(n for n, s in forms.plan.items() if s.backup),
                   "allow_nonfinite": forms.allow_nonfinite, "nonfinite": dict(forms.nonfinite),
                   "nncf_groups": _nncf_groups(forms)}
        atomic_write_text(tmp / PROVENANCE_FILE,
                          json.dumps(provenance({"source": target, **(sources or {})}, options), indent=2) + "\n")
        if target.map_path is not None:
            write_target_map(tmp, target.map_path)

        step("checking the written target", progress)
        checks, info = check_target_ir(tmp, target.config, vlm=vision is not None)
        if (compiled := compiled_check(tmp, target, forms)) is not None:  # what the CPU plugin makes of it
            checks.append(compiled)
        if failed := [c for c in checks if c.status == "fail"]:
            raise Gguf2ovError("the built target fails its checks: " + "; ".join(f"{c.name}: {c.reason}" for c in failed),
                               hint="nothing was written; rerun with --debug to inspect")
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    c = target.config
    return TargetExportResult(
        out_dir=str(out_dir), source=str(target.path), source_kind=target.kind, arch=target.arch,
        weight_format=variant.name, hidden_size=c.hidden_size, num_layers=c.num_layers, vocab_size=c.vocab_size,
        tied_embeddings=c.tie_word_embeddings,
        sliding_layers=[i for i, t in enumerate(c.layer_types) if t == "sliding_attention"],
        layer_kinds=dict(Counter(c.layer_types)), inputs=info["inputs"],
        outputs=info["outputs"], state_variables=info["state_variables"], locators=info["locators"],
        rt_info=info["rt_info"], tokenizer=str(tokenizer_from), files=files, checks=checks,
        transcoded=len(forms.transcoded), grid=options["grid"], nncf_backup=options["nncf_backup"],
        nncf_backup_why={n: forms.plan[n].reason.removeprefix("backup: ") for n in options["nncf_backup"]},
        nonfinite=dict(forms.nonfinite), seconds=time.perf_counter() - start,
        nncf_groups=options["nncf_groups"],
        trade=(variant.format.trade or None) if target.kind == "gguf" else None,
        alternative=(variant.format.alternative or None) if target.kind == "gguf" else None,
        vision=None if vision is None else {**vision_config(vision), "mmproj": str(vision.path),
                                            "max_soft_tokens": image_max_tokens},
        run_time_memory=plan.record(), memory_line=plan.line(), memory_table=plan.table())



# config.json, generation_config.json and gguf2ov.json
SMALL_FILES_BYTES = 12_000


def target_folder_bytes(forms, tokenizer_from, vision=None) -> int:
    """The disk `export_target` takes: the bytes it writes (the IR, the tokenizers and the small files), within a
    few percent (measured), and the scratch files held while the IR is written (`target_scratch_bytes`); a VLM
    folder (`vision`, its mmproj) adds the text embeddings model (a second copy of the table) and the float32
    vision embeddings model."""
    from ..targets.decoder import EMBEDDING
    from ..targets.graph import target_ir_bytes
    from ..targets.vision import vision_ir_bytes

    vlm = forms.tensor_bytes(EMBEDDING) + vision_ir_bytes(vision) if vision is not None else 0
    return (target_ir_bytes(forms) + tokenizer_bytes(tokenizer_from, forms.source) + SMALL_FILES_BYTES + vlm
            + target_scratch_bytes(forms))


def target_scratch_bytes(forms) -> int:
    """The disk the scratch files of the target's biggest weights (ir/spill.py) take beside the folder, in
    the same folder, while the IR is written: all of one IR's at once, freed when it is written. A VLM
    folder's text embeddings model, saved after the language model, spills no more than its table, which
    the language model's count holds."""
    return forms.scratch_bytes()


def tokenizer_bytes(tokenizer_from, target) -> int:
    """The tokenizer files a target folder gets: the Hugging Face files copied beside the IRs, and the
    OpenVINO tokenizer and detokenizer, ~1.6x tokenizer.json and 30 KB (measured, 512 to 151936 tokens)."""
    if tokenizer_from is None:
        return 0
    if tokenizer_from == "gguf":
        from ..maps.rules import is_array

        m = target.gguf.metadata  # an entry that is no array is refused when the tokenizer is built
        entries = [e for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges") if is_array(m.get(key))
                   for e in m[key]]
        return int(1.6 * sum(len(str(e).encode("utf-8")) + 8 for e in entries)) + 30_000
    folder = Path(tokenizer_from)
    copied = sum((folder / n).stat().st_size for n in TOKENIZER_FILES if (folder / n).is_file())
    if (folder / TOKENIZER_IR).is_file() and not _has_hf_tokenizer(folder):  # OpenVINO tokenizers copied as they are
        return sum(p.stat().st_size for n in (TOKENIZER_IR, DETOKENIZER_IR) for p in
                   ((folder / n), (folder / n).with_suffix(".bin")) if p.is_file())
    model = next((folder / n for n in TOKENIZER_MODEL_FILES if (folder / n).is_file()), None)
    return copied + int(1.6 * (model.stat().st_size if model else 0)) + 30_000


def _backup_text(names: list[str], why: dict[str, str]) -> str:
    """The weights NNCF keeps in int8, by reason: a few by name, many by count."""
    by_reason = {}
    for name in names:
        by_reason.setdefault(why.get(name, ""), []).append(name)
    parts = []
    for reason, group in by_reason.items():
        if len(group) > 2:
            parts.append(f"{len(group)} {reason or 'weights'}")
        else:
            parts.append(", ".join(group) + (f" ({reason})" if reason else ""))
    return "; ".join(parts)


def _nncf_groups(forms) -> dict[int, int]:
    """NNCF int4 group size -> how many weights take it (a smaller group where the variant's does not divide a
    weight's input width: nncf_weights.adjusted_group)."""
    return dict(sorted(Counter(s.group_size for s in forms.plan.values() if s.bits == 4).items()))


def _grid_form(forms) -> str | None:
    """How the GGUF's grid is carried, when any weight carries it."""
    if not forms.transcoded:
        return None
    return forms.grid


def write_target(folder: Path, forms, tokenizer_from, progress: bool = True) -> None:
    """The files of the target `forms` describe (targets.graph.target_forms: its source, variant and every
    weight's form) in `folder`: tokenizer (none when `tokenizer_from` is None), IR, config.json and
    generation_config.json."""
    from ..targets.graph import build_target_ir
    from ..ir.weights import save_ir

    target, variant = forms.source, forms.variant
    if tokenizer_from is not None:
        step("converting the tokenizer", progress)
        write_tokenizers(folder, tokenizer_from, target)
    step(f"building the {variant.name} target from {target.describe()}", progress)
    model = build_target_ir(forms, progress=(lambda m: step(f"{variant.name}: {m}", progress)) if progress else None)
    step(f"saving the {variant.name} IR (weights made as they are written)", progress)
    save_ir(model, folder, forms)  # a write that fails is one error naming the file (save_ir's `writing`)
    del model
    atomic_write_text(folder / CONFIG_FILE, json.dumps(target.config.raw, indent=2) + "\n")
    write_generation_config(folder, target)


def write_target_map(folder: Path, map_path) -> None:
    """The map a target is built through with --map, kept in its folder (TARGET_MAP_FILE) as one
    self-contained YAML (`extends` resolved): what reopens the folder (runtime.target.TargetIR.amap: verify
    --target, accept, run) takes the layers' kinds, steps and options from it, not from the shipped map of
    its model type, and no map need be passed again."""
    import yaml

    from ..maps.load import map_data

    atomic_write_text(folder / TARGET_MAP_FILE, f"# the tensor map this target was built through (--map {map_path})\n"
                      + yaml.safe_dump(map_data(None, path=map_path), sort_keys=False))


def open_vision(target, mmproj, allow_nonfinite: bool = False):
    """The mmproj of a VLM target, opened through the map of the text file's architecture and checked
    against it (targets/vision.py); its NaN and Inf values refused unless `allow_nonfinite`."""
    from ..targets.vision import mmproj_section, open_mmproj

    if target.kind != "gguf":
        raise Gguf2ovError("--mmproj applies to a GGUF target only")
    return open_mmproj(mmproj, target.config.hidden_size, mmproj_section(target.config.amap, mmproj), allow_nonfinite)


def write_vlm_target(folder: Path, forms, tokenizer_from, vision, image_max_tokens: int, progress: bool = True) -> None:
    """The VLM folder of the target `forms` describe, as optimum's image-text-to-text export writes it and
    VLMPipeline reads it: the language model (taking `inputs_embeds`), the text embeddings model (Gemma's
    scale in it), the per-layer embeddings model, the vision embeddings model (`vision`, the mmproj),
    config.json with the vision_config, preprocessor_config.json, generation_config.json and the tokenizers."""
    from ..targets.graph import (build_per_layer_embeddings_model, build_target_ir, build_text_embeddings_model,
                                 target_forms)
    from ..targets.vision import build_vision_model, preprocessor_config, vlm_config

    target, variant = forms.source, forms.variant
    section = target.config.amap.mmproj  # the map's, checked when the mmproj was opened (`open_vision`)
    # the config first: a vocabulary without the image's tokens is refused
    config = vlm_config(target.config.raw, vision, target.gguf.metadata.get("tokenizer.ggml.tokens"), section)
    if tokenizer_from is not None:
        step("converting the tokenizer", progress)
        # the placeholders VLMPipeline writes into the prompt, one token each as in the model's HF tokenizer
        write_tokenizers(folder, tokenizer_from, target, control_texts=tuple(section["tokens"].values()))
    step(f"building the {variant.name} language model from {target.describe()}", progress)
    model = build_target_ir(forms, inputs_embeds=True,
                            progress=(lambda m: step(f"{variant.name}: {m}", progress)) if progress else None)
    _save_as(model, folder, VLM_LANGUAGE_MODEL, forms)
    del model
    step("building the text, per-layer and vision embeddings models", progress)
    embedding = target_forms(target, variant, forms.grid, forms.allow_nonfinite)
    _save_as(build_text_embeddings_model(target.config, embedding.weight), folder, VLM_TEXT_EMBEDDINGS, embedding)
    _save_as(build_per_layer_embeddings_model(target.config), folder, VLM_PER_LAYER_EMBEDDINGS)
    _save_as(build_vision_model(vision), folder, VLM_VISION_EMBEDDINGS)
    # what --allow-nonfinite let through in the other models, reported with the language model's
    forms.nonfinite.update(embedding.nonfinite)
    forms.nonfinite.update(vision.nonfinite)
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    atomic_write_text(folder / PREPROCESSOR_CONFIG,
                      json.dumps(preprocessor_config(vision, image_max_tokens), indent=2) + "\n")
    write_generation_config(folder, target)


def _save_as(model, folder: Path, name: str, forms=None) -> None:
    """`model` saved as `name` (.xml and .bin) in `folder`: save_ir writes the IR's one name, then renamed."""
    from ..ir.weights import save_ir

    save_ir(model, folder, forms)
    for suffix in (".xml", ".bin"):
        (folder / IR_XML).with_suffix(suffix).rename((folder / name).with_suffix(suffix))


# --- tokenizer and generation config --------------------------------------------------------------

def tokenizer_source(source: Path, gguf: bool, tokenizer_dir) -> Path | str:
    """Where a target's tokenizer comes from: a folder (--tokenizer, or the checkpoint), or "gguf" (the
    file's vocabulary). Refused before any heavy work when there is none."""
    if tokenizer_dir is not None:
        folder = Path(tokenizer_dir)
        if not folder.is_dir() or not (_has_hf_tokenizer(folder) or (folder / TOKENIZER_IR).is_file()):
            raise Gguf2ovError(f"--tokenizer {folder} holds no tokenizer",
                               hint=f"give a folder with {' or '.join(TOKENIZER_MODEL_FILES)} (a Hugging Face "
                                    f"tokenizer), or one with {TOKENIZER_IR} and {DETOKENIZER_IR}")
        return folder
    if not gguf:
        if not _has_hf_tokenizer(source):
            raise Gguf2ovError(f"{source} holds no tokenizer ({', '.join(TOKENIZER_MODEL_FILES)})",
                               hint="pass --tokenizer DIR with the model's Hugging Face tokenizer files")
        return source
    return "gguf"


def _has_hf_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_MODEL_FILES)


def _require_vocabulary(target) -> None:
    if "tokenizer.ggml.tokens" not in target.gguf.metadata:
        raise Gguf2ovError(f"{target.path} holds no vocabulary (tokenizer.ggml.tokens) to make a tokenizer from",
                           hint="pass --tokenizer DIR with the model's Hugging Face tokenizer files")


def write_tokenizers(folder: Path, tokenizer_from, target, control_texts=()) -> None:
    """openvino_tokenizer.xml / openvino_detokenizer.xml (and the Hugging Face tokenizer files) in `folder`;
    `control_texts` as in `gguf.tokenizer.ov_tokenizers`, for a tokenizer made from the GGUF."""
    import openvino as ov

    if tokenizer_from == "gguf":
        from ..gguf.tokenizer import ov_tokenizers

        tokenizer, detokenizer = ov_tokenizers(target.gguf, control_texts)
    elif (Path(tokenizer_from) / TOKENIZER_IR).is_file() and not _has_hf_tokenizer(Path(tokenizer_from)):
        for name in (TOKENIZER_IR, DETOKENIZER_IR):
            for suffix in (".xml", ".bin"):
                path = (Path(tokenizer_from) / name).with_suffix(suffix)
                if path.is_file():
                    with writing(folder / path.name):
                        shutil.copy2(path, folder / path.name)
        return
    else:
        tokenizer, detokenizer = convert_hf_tokenizer(Path(tokenizer_from))
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).is_file():
                with writing(folder / name):
                    shutil.copy2(Path(tokenizer_from) / name, folder / name)
    for model, name in ((tokenizer, TOKENIZER_IR), (detokenizer, DETOKENIZER_IR)):
        with writing(folder / name):
            ov.save_model(model, str(folder / name))


def convert_hf_tokenizer(folder: Path):
    """(tokenizer, detokenizer) ov.Models of a Hugging Face tokenizer folder, as optimum-intel's
    export_tokenizer converts them for text generation (padding and truncation on the left)."""
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise Gguf2ovError(f"cannot read the tokenizer in {folder}: {' '.join(str(e).split())[:300]}") from e
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    try:
        return convert_tokenizer(tokenizer, with_detokenizer=True)
    except Exception as e:  # openvino_tokenizers' own errors for tokenizer types it cannot convert
        raise Gguf2ovError(f"openvino_tokenizers cannot convert the {type(tokenizer).__name__} in {folder}: {e}") from e


def write_generation_config(folder: Path, target) -> None:
    """A checkpoint's generation_config.json, else bos/eos/pad from the config (a GGUF's metadata)."""
    own = target.path / GENERATION_CONFIG if target.kind == "checkpoint" else None
    if own is not None and own.is_file():
        with writing(folder / GENERATION_CONFIG):
            shutil.copy2(own, folder / GENERATION_CONFIG)
        return
    c = target.config
    ids = {"bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id, "pad_token_id": c.pad_token_id}
    atomic_write_text(folder / GENERATION_CONFIG,
                      json.dumps({k: v for k, v in ids.items() if v is not None}, indent=2) + "\n")


# --- what was written -----------------------------------------------------------------------------

def check_target_ir(folder, config, vlm: bool = False) -> tuple[list[Finding], dict]:
    """The written target IR checked as GenAI will use it (target.checks.target_findings), and what
    the report shows of it. The model is read, its weights memory-mapped; only the rotary tables of its
    paged conversion are compiled (target.positions). `vlm`: a VLM folder, whose language model takes
    embeddings (the checks that need no token ids, and the paged conversion)."""
    import openvino as ov

    from ..targets.checks import paged_findings, target_findings
    from ..targets.ir import read_locators

    model = ov.Core().read_model(str(Path(folder) / (VLM_LANGUAGE_MODEL if vlm else IR_XML)))
    locators = read_locators(model) or {}
    info = {
        "inputs": [_port(p) for p in model.inputs], "outputs": [_port(p) for p in model.outputs],
        "state_variables": len(model.get_variables()),
        "locators": {str(i): v["producer"] for i, v in sorted(locators.items())}, "rt_info": _rt_info(model),
    }
    if vlm:
        embeddings = ov.Core().read_model(str(Path(folder) / VLM_TEXT_EMBEDDINGS))
        return (target_findings(model, None, num_layers=config.num_layers, embedding_model=embeddings)
                + paged_findings(model, config)), info
    return target_findings(model, config), info


def _port(p) -> list[str]:
    return [p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name()]


def _rt_info(model) -> dict[str, str]:
    keys = [("runtime_options", "ACTIVATIONS_SCALE_FACTOR"), ("runtime_options", "KV_CACHE_PRECISION"),
            ("runtime_options", "DYNAMIC_QUANTIZATION_GROUP_SIZE"),
            ("gguf2ov", "variant"), ("nncf", "weight_compression", "mode"), ("nncf", "weight_compression", "group_size")]
    return {"/".join(k): model.get_rt_info(list(k)).astype(str) for k in keys if model.has_rt_info(list(k))}

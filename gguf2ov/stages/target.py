"""`gguf2ov target`: a DFlash-ready OpenVINO target from a GGUF or a Hugging Face checkpoint folder.

GenAI's own GGUF reader cannot drive a DFlash draft (its graph has no hidden-state locators and no
embedding Gather that the draft attaches to), and optimum-intel needs the full checkpoint in
PyTorch (6-9 GB for an 8B model). This stage builds the graph optimum-intel writes, with the
locators DFlash needs, weight by weight (target_graph.py), and writes a folder GenAI's
LLMPipeline loads as a target: the IR, config.json, generation_config.json, the OpenVINO tokenizer
and detokenizer, and gguf2ov.json. Before the folder is put in place, the written IR is checked
statically (`check_target_ir`): interface, state variables, locators on live nodes of the hidden
width, the embedding and lm_head GenAI finds, and OpenVINO's SDPAToPagedAttention turning every
attention into paged attention with the config's sliding windows.
"""

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..checks.findings import Finding
from ..errors import Gguf2ovError
from ..names import CONFIG_FILE, DETOKENIZER_IR, IR_XML, PROVENANCE_FILE, TOKENIZER_IR
from ..outputs import atomic_dir, atomic_write_text, require_output_dir
from ..progress import step
from ..provenance import provenance
from ..report import Table, human_bytes

GENERATION_CONFIG = "generation_config.json"
# A Hugging Face tokenizer folder holds one of these; the other files are copied beside the IR too
TOKENIZER_MODEL_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER_FILES = TOKENIZER_MODEL_FILES + ("tokenizer_config.json", "special_tokens_map.json", "merges.txt",
                                           "added_tokens.json", "chat_template.jinja")
INPUTS = ("input_ids", "attention_mask", "position_ids", "beam_idx")


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
    inputs: list[list[str]]  # [name, partial shape, element type]
    outputs: list[list[str]]
    state_variables: int
    locators: dict[str, str]  # layer id -> producer node
    rt_info: dict[str, str]
    tokenizer: str  # where the tokenizer came from
    files: dict[str, int]
    checks: list[Finding]
    transcoded: int = 0
    grid: str | None = None  # "folded" | "compact", when weights carry the GGUF's grid
    nncf_backup: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def tables(self) -> list[Table]:
        io_rows = [["input", *row] for row in self.inputs] + [["output", *row] for row in self.outputs]
        return [
            Table("Target IR interface", ["kind", "name", "shape", "type"], io_rows,
                  note=f"{self.state_variables} state variables"),
            Table("Hidden-state locators", ["layer", "producer"], [[k, v] for k, v in self.locators.items()]),
            Table("Target rt_info", ["key", "value"], [[k, v] for k, v in self.rt_info.items()]),
            Table("Target checks", ["check", "status", "reason"], [[c.name, c.status, c.reason] for c in self.checks]),
            Table("Files", ["file", "size"], [[k, human_bytes(v)] for k, v in self.files.items()]),
        ]

    def summary(self) -> list[str]:
        lines = [f"built {self.source} ({self.source_kind}, {self.arch}) -> {self.out_dir} as {self.weight_format} "
                 f"in {self.seconds:.1f} s",
                 f"target: {self.num_layers} layers, hidden {self.hidden_size}, vocab {self.vocab_size}, "
                 f"{'tied' if self.tied_embeddings else 'untied'} lm_head, tokenizer from {self.tokenizer}"]
        if self.sliding_layers:
            lines.append(f"sliding-window layers: {self.sliding_layers}")
        if self.transcoded:
            lines.append(f"{self.transcoded} weights carry the GGUF's own grid ({self.grid})")
        if self.nncf_backup:
            lines.append(f"kept in NNCF's backup int8: {', '.join(self.nncf_backup)}")
        passed = sum(c.status == "pass" for c in self.checks)
        lines.append(f"target checks: {passed}/{len(self.checks)} pass")
        return lines


# --- the stage ------------------------------------------------------------------------------------


def export_target(source, out_dir, weight_format: str | None = None, group_size: int | None = None, sym: bool = False,
                  ratio: float | None = None, all_layers: bool = False, tokenizer_dir=None, map_path=None,
                  compact_grid: bool = False, overwrite: bool = False, progress: bool = True) -> TargetExportResult:
    """Build the OpenVINO target of `source` (a GGUF file or a checkpoint folder) in `out_dir`.

    `weight_format`: fp32 | fp16 | int8 | int4 | gguf (default: gguf for a GGUF source, fp32 for a
    checkpoint), with optimum-cli's NNCF flags and its int4 defaults for a model it has no preset
    for (asymmetric, group 128, ratio 1). `tokenizer_dir`: a Hugging Face tokenizer folder (or an
    OpenVINO target folder with openvino_tokenizer.xml) to use instead of the source's own.
    `compact_grid`: `gguf` weights in the file's own factorisation (IR 1.00x the GGUF's tensor bytes)
    instead of folded (~1.38x), which the CPU plugin runs in ~2/3 of the memory (gguf/transcode.py).
    """
    from ..gguf.read import is_gguf_file, open_gguf
    from ..target.source import open_target
    from ..ir.variants import TARGET_GROUP_SIZE, require_source_for, variant_from_flags

    spec, source, out_dir = source, Path(source), Path(out_dir)  # `spec`: a hub.HubFile keeps where it came from
    if not source.exists():
        raise Gguf2ovError(f"{source} does not exist")
    gguf = is_gguf_file(source)
    weight_format = weight_format or ("gguf" if gguf else "fp32")
    variant = variant_from_flags(weight_format, group_size, sym, ratio, all_layers, default_group_size=TARGET_GROUP_SIZE)
    require_source_for(variant, "gguf" if gguf else "checkpoint")
    require_output_dir(out_dir, overwrite, inputs=(source, map_path, tokenizer_dir))  # before the source is read
    tokenizer_from = _tokenizer_source(source, gguf, tokenizer_dir)
    target = open_target(open_gguf(spec) if gguf else source, map_path)
    if tokenizer_from == "gguf":
        _require_vocabulary(target)
    from ..target.graph import target_forms

    forms = target_forms(target, variant, compact_grid)  # NNCF's plan, refused here if NNCF would refuse it

    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        write_target(tmp, target, variant, tokenizer_from, progress, forms)
        options = {"weight_format": variant.weight_format, "variant": variant.name, "map": str(map_path) if map_path
                   else None, "source_kind": target.kind, "arch": target.arch, "tokenizer": str(tokenizer_from),
                   "transcoded": len(forms.transcoded), "grid": _grid_form(forms),
                   "nncf_backup": sorted(n for n, s in forms.plan.items() if s.backup)}
        sources = {"source": target, **({"tokenizer": Path(tokenizer_dir)} if tokenizer_dir else {})}
        atomic_write_text(tmp / PROVENANCE_FILE, json.dumps(provenance(sources, options), indent=2) + "\n")

        step("checking the written target", progress)
        checks, info = check_target_ir(tmp, target.config)
        if failed := [c for c in checks if c.status == "fail"]:
            raise Gguf2ovError("the built target fails its checks: " + "; ".join(f"{c.name}: {c.reason}" for c in failed),
                               hint="nothing was written; rerun with --debug to inspect")
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    c = target.config
    return TargetExportResult(
        out_dir=str(out_dir), source=str(source), source_kind=target.kind, arch=target.arch, weight_format=variant.name,
        hidden_size=c.hidden_size, num_layers=c.num_layers, vocab_size=c.vocab_size,
        tied_embeddings=c.tie_word_embeddings,
        sliding_layers=[i for i, t in enumerate(c.layer_types) if t == "sliding_attention"], inputs=info["inputs"],
        outputs=info["outputs"], state_variables=info["state_variables"], locators=info["locators"],
        rt_info=info["rt_info"], tokenizer=str(tokenizer_from), files=files, checks=checks,
        transcoded=len(forms.transcoded), grid=options["grid"], nncf_backup=options["nncf_backup"],
        seconds=time.perf_counter() - start)


def _grid_form(forms) -> str | None:
    """How the GGUF's grid is carried, when any weight carries it."""
    if not forms.transcoded:
        return None
    return "folded" if forms.folded_grid else "compact"


def write_target(folder: Path, target, variant, tokenizer_from, progress: bool = True, forms=None):
    """The target's files in `folder`: tokenizer (none when `tokenizer_from` is None), IR, config.json and
    generation_config.json. Returns the WeightForms that made the IR's weights (`forms`, if given, else
    `target_graph.target_forms`)."""
    from ..target.graph import build_target_ir
    from ..ir.weights import save_ir

    if tokenizer_from is not None:
        step("converting the tokenizer", progress)
        write_tokenizers(folder, tokenizer_from, target)
    step(f"building the {variant.name} target from {target.describe()}", progress)
    model, forms = build_target_ir(target, variant, forms=forms,
                                   progress=(lambda m: step(f"{variant.name}: {m}", progress)) if progress else None)
    step(f"saving the {variant.name} IR (weights made as they are written)", progress)
    save_ir(model, folder, forms)
    del model
    atomic_write_text(folder / CONFIG_FILE, json.dumps(target.config.raw, indent=2) + "\n")
    write_generation_config(folder, target)
    return forms


# --- tokenizer and generation config --------------------------------------------------------------

def _tokenizer_source(source: Path, gguf: bool, tokenizer_dir) -> Path | str:
    """Where the tokenizer comes from: a folder (--tokenizer, or the checkpoint), or "gguf" (the
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


def write_tokenizers(folder: Path, tokenizer_from, target) -> None:
    """openvino_tokenizer.xml / openvino_detokenizer.xml (and the Hugging Face tokenizer files) in `folder`."""
    import openvino as ov

    if tokenizer_from == "gguf":
        from ..gguf.tokenizer import ov_tokenizers

        tokenizer, detokenizer = ov_tokenizers(target.gguf)
    elif (Path(tokenizer_from) / TOKENIZER_IR).is_file() and not _has_hf_tokenizer(Path(tokenizer_from)):
        for name in (TOKENIZER_IR, DETOKENIZER_IR):
            for suffix in (".xml", ".bin"):
                path = (Path(tokenizer_from) / name).with_suffix(suffix)
                if path.is_file():
                    shutil.copy2(path, folder / path.name)
        return
    else:
        tokenizer, detokenizer = convert_hf_tokenizer(Path(tokenizer_from))
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy2(Path(tokenizer_from) / name, folder / name)
    ov.save_model(tokenizer, str(folder / TOKENIZER_IR))
    ov.save_model(detokenizer, str(folder / DETOKENIZER_IR))


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
        shutil.copy2(own, folder / GENERATION_CONFIG)
        return
    c = target.config
    ids = {"bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id, "pad_token_id": c.pad_token_id}
    atomic_write_text(folder / GENERATION_CONFIG,
                      json.dumps({k: v for k, v in ids.items() if v is not None}, indent=2) + "\n")


# --- what was written -----------------------------------------------------------------------------

def check_target_ir(folder, config) -> tuple[list[Finding], dict]:
    """Static checks of a written target IR against its config, and what the report shows of it.

    Nothing is compiled: the model is read (its weights memory-mapped) and transformed as GenAI
    will transform it when a draft is attached.
    """
    import openvino as ov

    from ..names import LOCATORS_KEY
    from ..runtime.target import read_locators

    model = ov.Core().read_model(str(Path(folder) / IR_XML))
    c = config
    checks = []

    def check(name, ok, reason):
        checks.append(Finding(name, "target-ir", "pass" if ok else "fail", reason))

    names = [p.get_any_name() for p in model.inputs]
    check("inputs", tuple(names) == INPUTS, ", ".join(names))
    out = model.outputs
    vocab = out[0].get_partial_shape()[-1] if out else None
    check("logits", len(out) == 1 and out[0].get_any_name() == "logits" and vocab.is_static
          and vocab.get_length() == c.vocab_size,
          f"{[o.get_any_name() for o in out]}, vocabulary {vocab} (config {c.vocab_size})")
    variables = sorted(v.get_info().variable_id for v in model.get_variables())
    expected = sorted(f"past_key_values.{i}.{k}present.{i}.{k}" for i in range(c.num_layers) for k in ("key", "value"))
    check("state", variables == expected, f"{len(variables)} state variables (2 x {c.num_layers} layers)")

    locators = read_locators(model) or {}
    live = {}
    for op in model.get_ordered_ops():
        live.setdefault(op.get_friendly_name(), []).append(op)
    bad = []
    for i in range(c.num_layers):
        loc = locators.get(i)
        nodes = live.get(loc["producer"], []) if loc else []
        shape = nodes[0].output(int(loc.get("output_index", 0))).get_partial_shape() if len(nodes) == 1 else None
        if shape is None or shape.rank.get_length() != 3 or not shape[2].is_static or shape[2].get_length() != c.hidden_size:
            bad.append(f"layer {i}: {loc['producer'] if loc else 'no locator'}")
    check("locators", not bad and len(locators) == c.num_layers,
          f"{LOCATORS_KEY}: {len(locators)} layers on live [.., .., {c.hidden_size}] outputs" if not bad
          else "; ".join(bad[:4]))
    checks.append(_genai_finders(model, c))
    checks.append(_paged_attention(model, c))
    info = {
        "inputs": [_port(p) for p in model.inputs], "outputs": [_port(p) for p in model.outputs],
        "state_variables": len(variables), "locators": {str(i): v["producer"] for i, v in sorted(locators.items())},
        "rt_info": _rt_info(model),
    }
    return checks, info


def _port(p) -> list[str]:
    return [p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name()]


def _rt_info(model) -> dict[str, str]:
    keys = [("runtime_options", "ACTIVATIONS_SCALE_FACTOR"), ("runtime_options", "KV_CACHE_PRECISION"),
            ("gguf2ov", "variant"), ("nncf", "weight_compression", "mode"), ("nncf", "weight_compression", "group_size")]
    return {"/".join(k): model.get_rt_info(list(k)).astype(str) for k in keys if model.has_rt_info(list(k))}


def _genai_finders(model, c) -> Finding:
    """The embedding Gather and the lm_head MatMul as GenAI finds them (eagle3_model_transforms.cpp
    find_embedding_gather, utils.cpp find_llm_matmul): the first Gather whose table has more than
    1000 rows or a name with embed_tokens / embedding; the MatMul feeding the first output,
    directly or through a Divide -> Tanh -> Multiply softcap."""
    gather = None
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Gather":
            continue
        data = op.input_value(0)
        ps = data.get_partial_shape()
        name = data.get_node().get_friendly_name()
        big = ps.rank.is_static and ps.rank.get_length() >= 2 and ps[0].is_static and ps[0].get_length() > 1000
        if big or "embed_tokens" in name or "embedding" in name:
            gather = op
            break
    head = model.output(0).get_node().input_value(0).get_node()
    if head.get_type_name() == "Multiply" and head.input_value(0).get_node().get_type_name() == "Tanh":
        head = head.input_value(0).get_node().input_value(0).get_node().input_value(0).get_node()
    embedding_ok = gather is not None and gather.get_friendly_name().endswith("aten::embedding/Gather")
    head_ok = head.get_type_name() == "MatMul" and head.get_friendly_name() == "__module.lm_head/aten::linear/MatMul"
    reason = (f"embedding {gather.get_friendly_name() if gather else 'not found'}, "
              f"lm_head {head.get_friendly_name()}")
    return Finding("genai-finders", "target-ir", "pass" if embedding_ok and head_ok else "fail", reason)


def _paged_attention(model, c) -> Finding:
    """What GenAI's SDPAToPagedAttention makes of the graph: one paged attention per layer, with the
    config's key/value heads, head size, scale and sliding window."""
    from openvino._offline_transformations import paged_attention_transformation

    paged = model.clone()
    try:
        paged_attention_transformation(paged)
    except RuntimeError as e:
        from ..errors import library_message

        return Finding("paged-attention", "target-ir", "fail", f"SDPAToPagedAttention failed: {library_message(e)}")
    found = [op for op in paged.get_ordered_ops() if op.get_type_name() == "PagedAttentionExtension"]
    wrong = []
    for i, op in enumerate(found):
        rt = op.get_rt_info()
        heads = [int(rt[k].astype(int)) for k in ("num_k_heads", "k_head_size")] if "num_k_heads" in rt else None
        window = _constant(op.input_value(10))
        expected = c.sliding_window if c.layer_types[i] == "sliding_attention" else 0
        if heads != [c.num_kv_heads, c.head_dim] or window != expected:
            wrong.append(f"layer {i}: heads {heads}, window {window} (expected {[c.num_kv_heads, c.head_dim]}, {expected})")
    ok = len(found) == c.num_layers and not wrong
    reason = (f"{len(found)} paged attentions for {c.num_layers} layers" +
              (f", sliding windows {c.sliding_window} where configured" if c.sliding_window else "") if ok
              else "; ".join(wrong[:3]) or f"{len(found)} paged attentions for {c.num_layers} layers")
    return Finding("paged-attention", "target-ir", "pass" if ok else "fail", reason)


def _constant(output):
    """The value of a small constant subgraph (a paged attention's sliding window)."""
    import openvino as ov
    from openvino.passes import ConstantFolding, Manager

    sub = ov.Model([ov.opset13.result(output)], [], "value").clone()
    manager = Manager()
    manager.register_pass(ConstantFolding())
    manager.run_passes(sub)
    node = sub.get_results()[0].input_value(0).get_node()
    return int(node.get_data().reshape(-1)[0]) if node.get_type_name() == "Constant" else None

"""`gguf2ov ovms`: a model repository OpenVINO Model Server serves as it is, a target with its DFlash draft.

OVMS (the 2026.4 line) serves an LLM as a MediaPipe graph. `config.json` lists the model; the
model's folder holds `graph.pbtxt`, one `HttpLLMCalculator` node whose `LLMCalculatorOptions`
name the model folder, the device, the continuous-batching pipeline (`LM_CB`) and the draft
(`draft_models_path`, `draft_device`). OVMS has no DFlash option: OpenVINO GenAI's `draft_model()`
recognises a DFlash draft by its rt_info (`dflash_mode`, `dflash/mask_token_id`,
`dflash/target_layer_ids`). The layout is the one OVMS's speculative-decoding demo shows:

    OUT/config.json          {"model_config_list": [{"config": {"name": NAME, "base_path": NAME}}]}
    OUT/gguf2ov.json         provenance
    OUT/NAME/graph.pbtxt
    OUT/NAME/...             the target's files (IR, tokenizer, detokenizer, configs)
    OUT/NAME/generation_config.json  the target's, with num_assistant_tokens set (below)
    OUT/NAME/DRAFT/...       the draft's files; draft_models_path "./DRAFT" is relative to the graph

The proposals per step: `LLMCalculatorOptions` has no field for them, nor for GenAI's
linear-attention state pool (`num_linear_attention_blocks`), which a hybrid (Gated DeltaNet) target
needs room in for 1 + K scratch rows beside each live sequence's. GenAI sizes that pool, when it is
not set, from the K of the GenerationConfig it loads with the pipeline: the model folder's
generation_config.json, K = 5 when it states none, the pool K + 2 (measured with GenAI 2026.4.1: a
hybrid target loaded with K = 9 in that file serves requests with 9 proposals, one loaded without it
refuses them: "The borrowed speculative linear-attention window needs ..."). So the repository's
generation_config.json states the K asked for (`--num-assistant-tokens`): requests get it by default,
and a request asking for more proposals on a hybrid target is refused by GenAI with its own message.

Weights are hard-linked where the file system allows it, everything else is copied. Field names,
numbers and defaults come from OVMS's `src/llm/llm_calculator.proto`; OVMS itself was not run.
"""

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Gguf2ovError, library_message
from ..hf.checkpoint import read_json_object
from ..names import CONFIG_FILE, IR_XML, PROVENANCE_FILE
from ..outputs import atomic_dir, atomic_write_text, free_bytes, require_output_dir, require_space, writing
from ..progress import step
from ..report import Table, human_bytes

OVMS_VERSION = "2026.4"
GRAPH_FILE = "graph.pbtxt"
GENERATION_CONFIG = "generation_config.json"
DFLASH_RT_INFO = ("dflash_mode", "dflash/mask_token_id", "dflash/target_layer_ids")  # what GenAI's draft_model() reads
# LLMCalculatorOptions.PipelineType: continuous batching, the only pipeline GenAI runs DFlash on
PIPELINE_TYPE = "LM_CB"
_ENUM_FIELDS = frozenset({"pipeline_type"})  # written bare, not quoted

# Names that end up inside quoted graph strings and folder names: nothing to escape.
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_NAME = re.compile(rf"{_SEGMENT}(/{_SEGMENT})*")
_DEVICE = re.compile(r"[A-Za-z0-9_.:,()-]+")


@dataclass(frozen=True)
class ServedFile:
    path: str     # relative to the output folder
    n_bytes: int
    how: str      # "hard link", "copy" or "written"


@dataclass(frozen=True)
class OvmsResult:
    out_dir: str
    name: str                         # the model's name in OVMS (and its folder under out_dir)
    target_dir: str
    draft_dir: str
    draft_models_path: str            # relative to the graph's folder
    device: str
    options: dict                     # the LLMCalculatorOptions written, in order
    draft_rt_info: dict[str, str]
    files: list[ServedFile]
    skipped: list[str]                # target files not carried over (a graph.pbtxt of its own)
    warnings: list[str]
    num_assistant_tokens: int = 5
    linear_attention_layers: int = 0   # a hybrid target's: its state pool admits at most num_assistant_tokens
    ovms_version: str = OVMS_VERSION
    seconds: float = 0.0

    def tables(self) -> list[Table]:
        return [
            Table(f"LLMCalculatorOptions ({self.name}/{GRAPH_FILE})", ["field", "value"],
                  [[k, _value_text(k, v)] for k, v in self.options.items()]),
            Table("Files", ["path", "bytes", "how"], [[f.path, f.n_bytes, f.how] for f in self.files]),
        ]

    def summary(self) -> list[str]:
        linked = sum(f.how == "hard link" for f in self.files)
        copied = sum(f.how == "copy" for f in self.files)
        rt = self.draft_rt_info
        lines = [f"OVMS model repository {self.out_dir}: model {self.name} on {self.device}, target {self.target_dir}, "
                 f"DFlash draft {self.draft_dir} in {self.name}/{self.draft_models_path.removeprefix('./')} "
                 f"(mask token {rt.get('dflash/mask_token_id')}, target layers {rt.get('dflash/target_layer_ids')})",
                 f"{len(self.files)} files, {human_bytes(sum(f.n_bytes for f in self.files))}: {linked} hard-linked, "
                 f"{copied} copied; layout and fields of OVMS {self.ovms_version} (OVMS itself was not run here)",
                 f"serve: ovms --rest_port 8000 --config_path {Path(self.out_dir) / CONFIG_FILE}",
                 "GenAI's DFlash serves one request at a time, greedy only (temperature 0), without "
                 "assistant_confidence_threshold",
                 f"proposals per step: {self.num_assistant_tokens} (in {self.name}/{GENERATION_CONFIG}, the "
                 "requests' default)"
                 + (f"; the target has {self.linear_attention_layers} linear-attention layers, whose state pool "
                    f"GenAI sizes for {self.num_assistant_tokens} at load: a request asking for more is refused"
                    if self.linear_attention_layers else "")]
        lines += [f"not carried over from the target: {name} (this {GRAPH_FILE} replaces it)" for name in self.skipped]
        return lines + [f"warning: {w}" for w in self.warnings]


def ovms_repository(target_dir, draft_dir, out_dir, name: str | None = None, device: str = "CPU",
                    num_assistant_tokens: int = 7, overwrite: bool = False, progress: bool = True) -> OvmsResult:
    """Write OUT (atomically) as a model repository OVMS serves: the target with the DFlash draft attached,
    `num_assistant_tokens` proposals per step (the most a hybrid target's state pool then admits)."""
    from ..runtime.genai import recurrent_layers

    start = time.perf_counter()
    target_dir, draft_dir, out_dir = Path(target_dir), Path(draft_dir), Path(out_dir)
    name = name or _safe_segment(target_dir.resolve().name)
    require_name(name)
    require_device(device)
    if num_assistant_tokens < 1:
        raise Gguf2ovError(f"--num-assistant-tokens must be at least 1, not {num_assistant_tokens}")
    target = require_serving_target(target_dir)
    subdir = draft_subdir(draft_dir, target_dir)
    require_output_dir(out_dir, overwrite, inputs=(target_dir, draft_dir))
    require_outside(out_dir, (target_dir, draft_dir))
    rt_info = require_dflash_draft(draft_dir)
    warnings = sampling_warnings(target_dir)
    draft_models_path = f"./{subdir}"
    options = calculator_options(draft_models_path, device)
    require_space(out_dir, placed_bytes(target_dir, out_dir) + placed_bytes(draft_dir, out_dir) + 64_000,
                  "the model repository (its weights hard-linked where the file system allows it)",
                  hint="write the repository on the file system of the target and the draft, where their weights "
                       "are hard-linked, or free some space")
    with atomic_dir(out_dir, overwrite=overwrite, inputs=(target_dir, draft_dir)) as tmp:
        model = tmp / name
        step(f"target {target_dir} -> {out_dir / name}", progress)
        files = place_tree(target_dir, model, tmp, skip={GRAPH_FILE, GENERATION_CONFIG})
        files.append(_write(tmp, f"{name}/{GENERATION_CONFIG}", generation_config(target_dir, num_assistant_tokens)))
        step(f"draft {draft_dir} -> {out_dir / name / subdir}", progress)
        files += place_tree(draft_dir, model / subdir, tmp)
        files += [_write(tmp, f"{name}/{GRAPH_FILE}", graph_pbtxt(options)),
                  _write(tmp, CONFIG_FILE, json.dumps(server_config(name), indent=2) + "\n"),
                  _write(tmp, PROVENANCE_FILE, json.dumps(_provenance(target_dir, draft_dir, name, options),
                                                          indent=2) + "\n")]
    return OvmsResult(
        out_dir=str(out_dir), name=name, target_dir=str(target_dir), draft_dir=str(draft_dir),
        draft_models_path=draft_models_path, device=device, options=options, draft_rt_info=rt_info,
        files=files, skipped=[GRAPH_FILE] if (target_dir / GRAPH_FILE).exists() else [], warnings=warnings,
        num_assistant_tokens=num_assistant_tokens, linear_attention_layers=recurrent_layers(target),
        seconds=time.perf_counter() - start)


# --- what is written --------------------------------------------------------------------------------

def calculator_options(draft_models_path: str, device: str) -> dict:
    """The `LLMCalculatorOptions` of the graph; the rest keep OVMS's defaults."""
    return {
        "models_path": "./",                  # the graph's own folder: the target's files sit beside it
        "device": device,
        "pipeline_type": PIPELINE_TYPE,
        # GenAI's DFlash refuses prefix caching ("DFlash CB/PA does not support
        # scheduler_config.enable_prefix_caching"). OVMS's default is false; stated so that it stays
        # false in a graph edited later.
        "enable_prefix_caching": False,
        "draft_models_path": draft_models_path,  # OVMS resolves a relative path against the graph's folder
        "draft_device": device,
    }


def generation_config(target_dir: Path, num_assistant_tokens: int) -> str:
    """The target's generation_config.json with `num_assistant_tokens`: what GenAI loads the pipeline
    with, and so what it sizes a hybrid target's linear-attention state pool for (K + 2 rows)."""
    config = read_json_object(target_dir / GENERATION_CONFIG, required=False) or {}
    return json.dumps({**config, "num_assistant_tokens": num_assistant_tokens}, indent=2) + "\n"


def graph_pbtxt(options: dict) -> str:
    """OVMS's LLM graph (as its graph export writes it) with `options` in the calculator's node."""
    fields = "\n".join(f"      {key}: {_value_text(key, value)}" for key, value in options.items())
    return f"""# OpenVINO Model Server graph: the target with its DFlash draft attached (written by gguf2ov ovms).
# GenAI recognises the draft as DFlash by its rt_info; it serves greedy requests, one at a time.
input_stream: "HTTP_REQUEST_PAYLOAD:input"
output_stream: "HTTP_RESPONSE_PAYLOAD:output"

node: {{
  name: "LLMExecutor"
  calculator: "HttpLLMCalculator"
  input_stream: "LOOPBACK:loopback"
  input_stream: "HTTP_REQUEST_PAYLOAD:input"
  input_side_packet: "LLM_NODE_RESOURCES:llm"
  input_side_packet: "LLM_NODE_EXECUTION_CONTEXTS:llm_ctx"
  output_stream: "LOOPBACK:loopback"
  output_stream: "HTTP_RESPONSE_PAYLOAD:output"
  input_stream_info: {{
    tag_index: "LOOPBACK:0"
    back_edge: true
  }}
  node_options: {{
    [type.googleapis.com/mediapipe.LLMCalculatorOptions]: {{
{fields}
    }}
  }}
  input_stream_handler {{
    input_stream_handler: "SyncSetInputStreamHandler"
    options {{
      [mediapipe.SyncSetInputStreamHandlerOptions.ext] {{
        sync_set {{
          tag_index: "LOOPBACK:0"
        }}
      }}
    }}
  }}
}}
"""


def _value_text(key: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if key in _ENUM_FIELDS:
        return str(value)
    return f'"{value}"'  # every string was checked to need no escaping (require_name, require_device)


def server_config(name: str) -> dict:
    """OVMS's config.json: one model, served from the folder of that name beside the file."""
    return {"model_config_list": [{"config": {"name": name, "base_path": name}}]}


def place_tree(src: Path, dst: Path, root: Path, skip=frozenset()) -> list[ServedFile]:
    """Every file under `src` (links followed) at the same place under `dst`.

    Weights (`.bin`) are hard-linked where the file system allows it: the same bytes, no second
    copy on disk. Everything else is copied: a hard link shares the file, and an edit made in place
    in the repository (generation_config.json, a chat template) would change the input too."""
    placed = []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        relative = path.relative_to(src)
        if relative.as_posix() in skip:
            continue
        target = dst / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        placed.append(ServedFile(target.relative_to(root).as_posix(), path.stat().st_size, _place(path, target)))
    return placed


def placed_bytes(src: Path, out_dir: Path) -> int:
    """The bytes `place_tree` writes for `src` into `out_dir`: every file but the weights a hard link
    shares (on the same file system)."""
    same = os.stat(free_bytes(out_dir)[1]).st_dev == os.stat(src).st_dev
    return sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not (same and p.suffix == ".bin"))


def _place(path: Path, target: Path) -> str:
    if path.suffix == ".bin":
        try:
            os.link(path.resolve(), target)
            return "hard link"
        except OSError:  # another file system, or one without hard links
            pass
    with writing(target):
        shutil.copy2(path, target)
    return "copy"


def _write(root: Path, relative: str, text: str) -> ServedFile:
    atomic_write_text(root / relative, text)
    return ServedFile(relative, len(text.encode("utf-8")), "written")


def _provenance(target_dir: Path, draft_dir: Path, name: str, options: dict) -> dict:
    from ..provenance import provenance

    return provenance(sources={"target": target_dir, "draft": draft_dir},
                      options={"name": name, "ovms": OVMS_VERSION, "llm_calculator_options": options})


# --- what is refused, before anything is written --------------------------------------------------------

def require_outside(out_dir: Path, inputs) -> None:
    """The repository is written beside its inputs, never into one of them."""
    for item in inputs:
        if out_dir.resolve().is_relative_to(item.resolve()):
            raise Gguf2ovError(f"output {out_dir} is inside the input folder {item}",
                               hint="write the model repository outside the target and draft folders")


def require_name(name: str) -> None:
    if not _NAME.fullmatch(name) or name in (CONFIG_FILE, PROVENANCE_FILE):
        raise Gguf2ovError(f"--name {name!r} cannot name an OVMS model folder",
                           hint="use letters, digits, '_', '.', '-', and '/' between parts (org/model), "
                                f"not {CONFIG_FILE} or {PROVENANCE_FILE}")


def require_device(device: str) -> None:
    if not _DEVICE.fullmatch(device):
        raise Gguf2ovError(f"--device {device!r} is not an OpenVINO device name", hint="e.g. CPU, GPU, GPU.1")
    if "NPU" in device.upper():
        # GenAI puts NPU on the stateful pipeline, and runs DFlash only with continuous batching
        raise Gguf2ovError(f"--device {device}: GenAI does not run DFlash drafts on NPU",
                           hint="serve on CPU or GPU")


def require_serving_target(target_dir: Path):
    """A text target with its IR, tokenizer and detokenizer (what OVMS's LM_CB servable loads), opened
    (runtime.target.TargetIR)."""
    from ..runtime.target import require_target_dir

    target = require_target_dir(target_dir)
    if target.kind != "llm":
        raise Gguf2ovError(f"target folder {target_dir} is a VLM: `gguf2ov ovms` writes OVMS's LM_CB graph for "
                           f"text targets ({IR_XML})",
                           hint="OVMS's VLM_CB servable with a DFlash draft was not checked; serve text targets")
    return target


def draft_subdir(draft_dir: Path, target_dir: Path) -> str:
    """The draft's folder beside the target's files, named after the draft folder (as OVMS's demo names it)."""
    subdir = _safe_segment(draft_dir.resolve().name) or "draft"
    if (target_dir / subdir).exists() or subdir == GRAPH_FILE:
        raise Gguf2ovError(f"the target folder {target_dir} already holds {subdir}, the name the draft's folder "
                           "takes beside the target's files",
                           hint="give the draft from a folder of another name (or move it out of the target folder)")
    return subdir


def _safe_segment(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name).lstrip(".-")


def require_dflash_draft(draft_dir: Path) -> dict[str, str]:
    """The draft's DFlash rt_info; one error when the folder is not a DFlash draft IR GenAI would take."""
    xml = draft_dir / IR_XML
    if not draft_dir.is_dir():
        raise Gguf2ovError(f"draft folder {draft_dir} does not exist")
    if not xml.is_file() or not xml.with_suffix(".bin").is_file():
        raise Gguf2ovError(f"draft folder {draft_dir} has no {IR_XML} with its .bin",
                           hint="export the draft with `gguf2ov export`, which verifies it")
    import openvino as ov

    from ..draft.graph import describe_ir

    try:
        rt_info = describe_ir(ov.Core().read_model(str(xml)))["rt_info"]
    except RuntimeError as e:
        raise Gguf2ovError(f"{xml} cannot be read by OpenVINO: {library_message(e)}") from None
    if rt_info.get("dflash_mode", "").lower() != "true":
        raise Gguf2ovError(f"{draft_dir} is not a DFlash draft IR: {IR_XML} has no dflash_mode rt_info "
                           "(GenAI recognises a DFlash draft by it)",
                           hint="export the draft with `gguf2ov export`, which writes and verifies it")
    missing = [key for key in DFLASH_RT_INFO if key not in rt_info]
    if missing:
        raise Gguf2ovError(f"{draft_dir}: {IR_XML} has dflash_mode but no {', '.join(missing)} rt_info, which "
                           "GenAI requires of a DFlash draft", hint="export the draft again with `gguf2ov export`")
    return rt_info


def sampling_warnings(target_dir: Path) -> list[str]:
    config = read_json_object(target_dir / GENERATION_CONFIG, required=False) or {}
    if config.get("do_sample"):
        return [f"the target's {GENERATION_CONFIG} sets do_sample: OVMS makes it the requests' default, and GenAI's "
                "DFlash refuses sampling; send temperature 0, or set do_sample false in that file"]
    return []

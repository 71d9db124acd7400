"""Export a DFlash draft checkpoint (or a dflash GGUF) to a stateful OpenVINO IR draft.

The draft is traced through optimum-intel's `Qwen3DFlashForCausalLM`, the one class whose forward
drops the seed row (`[:, 1:]`) so that the emitted hidden states line up with the candidate tokens
GenAI scores with the target's lm_head. Every export pitfall measured with optimum-intel 2.2.0
either cannot be reached from here or is turned into an error:

- `load_state_dict(strict=False)` silently keeps random weights for misnamed keys (a `model.`
  prefix): the keys and shapes are compared here first and any difference is an error;
- `patch_stateful` silently leaves a stateless graph when it finds no cache inputs: the traced IR
  must have `beam_idx`;
- optimum writes the dflash rt_info itself (for `architectures[0] == "DFlashDraftModel"`) but
  swallows any exception while doing so: the three keys GenAI reads are set again here.

`build_draft_ir()` returns the `ov.Model` before anything is saved, so a weight-compression step
can run between tracing and `save_draft_ir()`.
"""

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import read_json_object
from .errors import Gguf2ovError
from .outputs import atomic_dir, atomic_write_text, check_output_dir
from .progress import step
from .provenance import provenance
from .report import Table, human_bytes

WEIGHT_FORMATS = ("fp32", "fp16")
IR_XML = "openvino_model.xml"
IR_BIN = "openvino_model.bin"
PROVENANCE_FILE = "gguf2ov.json"

# Tensors a draft may carry that the OpenVINO draft does not use: GenAI feeds the target's
# embeddings in and grafts the target's lm_head on `last_hidden_state`.
IGNORED_KEYS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")

# What only a DFlash 2 draft has: per-layer convolutions and a candidate selector.
DFLASH2_KEY_MARKERS = ("candidate_selector.", ".attention_conv.", ".mlp_conv.")
DFLASH2_CONFIG_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass(frozen=True)
class DraftConfig:
    """The parts of a draft's config.json that the export and the checks depend on."""

    raw: dict
    hidden_size: int
    num_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int | None


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    source: str
    source_kind: str  # "gguf" | "checkpoint"
    weight_format: str
    hidden_size: int
    num_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    inputs: list[list[str]]  # [name, partial shape, element type]
    outputs: list[list[str]]
    state_variables: int
    rt_info: dict[str, str]
    files: dict[str, int]
    ignored_keys: list[str]
    seconds: float
    verify: object | None = field(default=None)  # VerifyResult

    def tables(self) -> list[Table]:
        io_rows = [["input", *row] for row in self.inputs] + [["output", *row] for row in self.outputs]
        tables = [
            Table("Draft IR interface", ["kind", "name", "shape", "type"], io_rows,
                  note=f"{self.state_variables} state variables"),
            Table("Draft rt_info", ["key", "value"], [[k, v] for k, v in self.rt_info.items()]),
            Table("Files", ["file", "size"], [[k, human_bytes(v)] for k, v in self.files.items()]),
        ]
        if self.verify is not None:
            tables += self.verify.tables()
        return tables

    def summary(self) -> list[str]:
        lines = [
            f"exported {self.source} ({self.source_kind}) -> {self.out_dir} as {self.weight_format} "
            f"in {self.seconds:.1f} s",
            f"draft: {self.num_layers} layers, hidden {self.hidden_size}, target layers "
            f"{self.target_layer_ids}, mask token {self.mask_token_id}",
        ]
        if self.ignored_keys:
            lines.append(f"not exported (GenAI uses the target's): {', '.join(self.ignored_keys)}")
        if self.verify is not None:
            lines += self.verify.summary()
        return lines


# --- reading and validating a draft checkpoint -------------------------------------------------


def read_draft_config(checkpoint_dir) -> DraftConfig:
    """Read and validate config.json of a DFlash draft checkpoint (before any heavy work)."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise Gguf2ovError(f"no config.json in {checkpoint_dir}",
                           hint="pass a folder written by `gguf2ov convert` or a DFlash draft checkpoint")
    raw = read_json_object(path)
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise Gguf2ovError(f"{path} has no dflash_config: not a DFlash draft",
                           hint="export targets with optimum-cli; this command exports DFlash drafts")
    refuse_dflash2(path, config=raw)
    if raw.get("model_type") != "qwen3":
        # Qwen3OpenVINOConfig raises the same later, after the model is built.
        raise Gguf2ovError(f"{path}: model_type is {raw.get('model_type')!r}; optimum-intel exports "
                           "DFlash drafts only as model_type 'qwen3'")
    ids = dflash.get("target_layer_ids")
    if not ids or not all(isinstance(i, int) for i in ids):
        raise Gguf2ovError(f"{path}: dflash_config.target_layer_ids must be a non-empty list of ints, got {ids!r}")
    if not isinstance(dflash.get("mask_token_id"), int):
        # GenAI refuses a draft without dflash/mask_token_id rt_info.
        raise Gguf2ovError(f"{path}: dflash_config.mask_token_id is missing",
                           hint="set it to the target tokenizer's mask token id")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(raw.get(key), int):
            raise Gguf2ovError(f"{path}: {key} is missing")
    return DraftConfig(raw=raw, hidden_size=raw["hidden_size"], num_layers=raw["num_hidden_layers"],
                       target_layer_ids=list(ids), mask_token_id=dflash["mask_token_id"],
                       block_size=dflash.get("block_size"))


def refuse_dflash2(where, config: dict | None = None, keys=()) -> None:
    found = [k for k in keys if any(m in f".{k}" for m in DFLASH2_KEY_MARKERS)][:3]
    if config is not None:
        scopes = (config, config.get("dflash_config") or {})
        found += [k for k in DFLASH2_CONFIG_KEYS if any(k in s for s in scopes)]
    if found:
        raise Gguf2ovError(
            f"{where} is a DFlash 2 draft ({', '.join(found)}): optimum-intel and OpenVINO GenAI cannot "
            "run DFlash 2 yet, so there is no OpenVINO draft to export",
            hint="the Hugging Face checkpoint written by `gguf2ov convert` stays available for PyTorch",
        )


def read_state_dict(checkpoint_dir) -> dict:
    from safetensors.torch import load_file

    from .checkpoint import safetensors_files

    state = {}
    for f in safetensors_files(checkpoint_dir):
        state.update(load_file(str(f)))
    return state


def check_keys(expected: dict, found: dict, where) -> list[str]:
    """Compare names and shapes exactly; return the ignorable keys that were found.

    `expected` and `found` map names to shapes. Any missing, unexpected or mis-shaped tensor is
    one error naming them, because `load_state_dict(strict=False)` would keep random weights.
    """
    ignored = sorted(k for k in found if k in IGNORED_KEYS)
    refuse_dflash2(where, keys=found)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected) - set(ignored))
    shapes = sorted(k for k in set(expected) & set(found) if tuple(expected[k]) != tuple(found[k]))
    if not (missing or unexpected or shapes):
        return ignored
    prefix = _common_prefix(unexpected, missing)
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_some(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({_some(unexpected)})")
    if shapes:
        parts.append("shape mismatch (" + _some([f"{k} {tuple(found[k])} != {tuple(expected[k])}" for k in shapes]) + ")")
    if prefix:
        # The silent failure: strict=False ignores these and keeps random weights.
        raise Gguf2ovError(
            f"{where}: checkpoint tensor names carry an extra {prefix!r} prefix ({_some(unexpected)}); "
            "loading them with strict=False would silently keep random weights",
            hint=f"strip the {prefix!r} prefix from the tensor names (or fix the tensor map) and convert again",
        )
    hint = "the checkpoint must hold exactly the tensors of optimum-intel's Qwen3DFlashForCausalLM"
    if "fc.weight" in shapes:
        hint = "fc.weight must be [hidden_size, len(target_layer_ids) * hidden_size]: check target_layer_ids"
    raise Gguf2ovError(f"{where}: checkpoint tensors do not match the draft model: " + "; ".join(parts), hint=hint)


def _common_prefix(unexpected: list[str], missing: list[str]) -> str | None:
    """The prefix (e.g. `model.`) that, stripped from every unexpected key, gives a missing one."""
    if not unexpected or not missing:
        return None
    heads = {k.split(".", 1)[0] + "." for k in unexpected if "." in k}
    if len(heads) != 1:
        return None
    head = heads.pop()
    return head if all(k[len(head):] in missing or k[len(head):] in IGNORED_KEYS for k in unexpected) else None


def _some(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")


def hf_config(draft: DraftConfig):
    """A transformers Qwen3Config for optimum's DFlash classes (never remote code)."""
    from transformers import Qwen3Config

    raw = {k: v for k, v in draft.raw.items() if k not in ("auto_map", "transformers_version")}
    config = Qwen3Config.from_dict(raw)
    # optimum's Qwen3OpenVINOConfig switches to the DFlash inputs and writes the dflash rt_info only
    # for this architecture name; z-lab checkpoints already carry it.
    config.architectures = ["DFlashDraftModel"]
    config.tie_word_embeddings = False
    config.use_cache = True
    return config


def load_draft_model(checkpoint_dir):
    """Build `Qwen3DFlashForCausalLM` in float32 with the checkpoint's weights, checked strictly.

    Returns (draft_config, model, ignored_keys).
    """
    import torch
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from safetensors import safe_open

    from .checkpoint import safetensors_files

    draft = read_draft_config(checkpoint_dir)
    found = {}
    for f in safetensors_files(checkpoint_dir):
        with safe_open(str(f), framework="pt") as sf:
            found.update({k: tuple(sf.get_slice(k).get_shape()) for k in sf.keys()})
    model = Qwen3DFlashForCausalLM(hf_config(draft)).to(torch.float32)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ignored = check_keys(expected, found, Path(checkpoint_dir))
    state = {k: v.to(torch.float32) for k, v in read_state_dict(checkpoint_dir).items() if k not in ignored}
    model.load_state_dict(state, strict=True)
    return draft, model.eval(), ignored


# --- tracing, rt_info, saving --------------------------------------------------------------------


def trace_draft(model, config, xml_path) -> None:
    """optimum-intel's stateful export with past key values in the inputs."""
    import logging

    from optimum.exporters.openvino.convert import export
    from optimum.exporters.openvino.model_configs import Qwen3OpenVINOConfig

    # optimum tries to annotate hidden-state locators on every qwen3 export and logs a warning when
    # a draft (which has no decoder stack of its own) has none: that is expected here.
    log = logging.getLogger("optimum.exporters.openvino.utils_annotations")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        export(
            model=model,
            # "text-generation-with-past" raises KeyError here; use_past_in_inputs=False gives a
            # graph that patch_stateful silently leaves stateless.
            config=Qwen3OpenVINOConfig(config, task="text-generation", use_past=True, use_past_in_inputs=True),
            output=Path(xml_path),
            stateful=True,
            # without it optimum infers the library from `model.model`, which a draft lacks
            library_name="transformers",
        )
    except Exception as e:
        raise Gguf2ovError(f"optimum-intel failed to export the draft: {type(e).__name__}: {e}",
                           hint="rerun with --debug for the traceback") from e
    finally:
        log.setLevel(level)


def set_dflash_rt_info(ov_model, draft: DraftConfig) -> None:
    # The keys GenAI's draft_model reads (as dflash_mode, dflash_mask_token_id,
    # dflash_target_layer_ids); optimum writes the same values but ignores failures.
    ov_model.set_rt_info("True", ["dflash_mode"])
    ov_model.set_rt_info(str(draft.mask_token_id), ["dflash", "mask_token_id"])
    ov_model.set_rt_info(",".join(map(str, draft.target_layer_ids)), ["dflash", "target_layer_ids"])


def build_draft_ir(checkpoint_dir, scratch_dir, progress: bool = True):
    """Trace the checkpoint into an `ov.Model` (not yet saved). Returns (ov_model, draft, ignored)."""
    import openvino as ov

    step(f"loading {checkpoint_dir}", progress)
    draft, model, ignored = load_draft_model(checkpoint_dir)
    step("tracing the draft with optimum-intel (stateful, past key values in the inputs)", progress)
    xml = Path(scratch_dir) / IR_XML
    trace_draft(model, hf_config(draft), xml)
    del model
    ov_model = ov.Core().read_model(str(xml))
    names = {n for i in ov_model.inputs for n in i.get_names()}
    if "beam_idx" not in names:
        raise Gguf2ovError(
            "optimum-intel produced a stateless draft (no beam_idx input): it would recompute its "
            "context every step and GenAI would reject its proposals",
            hint="this openvino build may lack stateful support; check `openvino` and `optimum-intel` versions",
        )
    set_dflash_rt_info(ov_model, draft)
    return ov_model, draft, ignored


def save_draft_ir(ov_model, out_dir, weight_format: str = "fp32") -> None:
    import openvino as ov

    ov.save_model(ov_model, str(Path(out_dir) / IR_XML), compress_to_fp16=weight_format == "fp16")


def describe_ir(ov_model) -> dict:
    def port(p):
        return [p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name()]

    rt = {}
    for key in (("dflash_mode",), ("dflash", "mask_token_id"), ("dflash", "target_layer_ids")):
        if ov_model.has_rt_info(list(key)):
            rt["/".join(key)] = ov_model.get_rt_info(list(key)).astype(str)
    return {
        "inputs": [port(p) for p in ov_model.inputs],
        "outputs": [port(p) for p in ov_model.outputs],
        "state_variables": len(ov_model.get_variables()),
        "rt_info": rt,
    }


# --- the stage ------------------------------------------------------------------------------------


def is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def export_draft(source, out_dir, weight_format: str = "fp32", overwrite: bool = False, progress: bool = True,
                 run_verify: bool = True, target_layer_offset: int | None = None, map_path=None,
                 group_size: int | None = None, sym: bool = False, ratio: float | None = None,
                 all_layers: bool = False) -> ExportResult:
    from .requantize import variant_from_flags

    source, out_dir = Path(source), Path(out_dir)
    variant = variant_from_flags(weight_format, group_size, sym, ratio, all_layers)
    if not source.exists():
        raise Gguf2ovError(f"{source} does not exist")
    gguf = is_gguf(source)
    if variant.weight_format == "gguf" and not gguf:
        raise Gguf2ovError("--weight-format gguf carries the GGUF's own quantization grid: the source must be a GGUF file")
    if not gguf and not source.is_dir():
        raise Gguf2ovError(f"{source} is neither a GGUF file nor a checkpoint folder")
    if not gguf:
        if target_layer_offset is not None:
            raise Gguf2ovError("--target-layer-offset applies to a GGUF source only",
                               hint="a checkpoint's config.json already holds the target layer ids")
        read_draft_config(source)  # refuse bad configs before importing torch and openvino
    check_output_dir(out_dir, overwrite, inputs=(source, map_path))

    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        # Scratch lives inside the output's temporary folder: same filesystem (drafts can be GBs)
        # and removed with it on any failure or Ctrl-C.
        scratch = tmp / ".scratch"
        checkpoint = source
        if gguf:
            from .convert import convert

            step(f"converting {source.name} to a Hugging Face checkpoint", progress)
            checkpoint = scratch / "checkpoint"
            # f32: the IR then holds exactly the dequantized GGUF values (bf16 would round them again)
            convert(source, checkpoint, dtype="f32", map_path=map_path, target_layer_offset=target_layer_offset,
                    progress=progress)
        ov_model, draft, ignored = build_draft_ir(checkpoint, scratch, progress)
        if variant.weight_format not in WEIGHT_FORMATS:
            from .requantize import apply_variant

            step(f"compressing weights: {variant.name}", progress)
            ov_model, _ = apply_variant(ov_model, variant, source if gguf else None, map_path)
        step(f"saving {variant.name} IR", progress)
        save_draft_ir(ov_model, tmp, "fp16" if variant.weight_format == "fp16" else "fp32")
        info = describe_ir(ov_model)
        del ov_model
        # GenAI needs only the .xml/.bin; config.json lets `verify` compare rt_info and geometry.
        atomic_write_text(tmp / "config.json", json.dumps(draft.raw, indent=2) + "\n")
        options = {"weight_format": weight_format, "variant": variant.name, "target_layer_offset": target_layer_offset,
                   "map": str(map_path) if map_path else None, "source_kind": "gguf" if gguf else "checkpoint"}
        atomic_write_text(tmp / PROVENANCE_FILE, json.dumps(provenance({"source": source}, options), indent=2) + "\n")

        verified = None
        if run_verify:
            from .verify import verify_draft

            step("verifying the exported draft", progress)
            verified = verify_draft(tmp, checkpoint_dir=checkpoint)
            if not verified.ok:
                failed = "; ".join(f"{c.name}: {c.reason}" for c in verified.checks if c.status == "fail")
                raise Gguf2ovError(f"the exported draft fails verification: {failed}",
                                   hint="nothing was written; rerun with --debug to inspect")
        shutil.rmtree(scratch, ignore_errors=True)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    return ExportResult(
        out_dir=str(out_dir), source=str(source), source_kind=options["source_kind"], weight_format=variant.name,
        hidden_size=draft.hidden_size, num_layers=draft.num_layers, target_layer_ids=draft.target_layer_ids,
        mask_token_id=draft.mask_token_id, inputs=info["inputs"], outputs=info["outputs"],
        state_variables=info["state_variables"], rt_info=info["rt_info"], files=files, ignored_keys=ignored,
        seconds=time.perf_counter() - start,
        verify=_relocated(verified, out_dir, None if gguf else source),
    )


def _relocated(verified, out_dir, checkpoint):
    """The verify result as seen from the final folder (the temporary paths are gone)."""
    import dataclasses

    if verified is None:
        return None
    return dataclasses.replace(verified, draft_dir=str(out_dir), checkpoint_dir=str(checkpoint) if checkpoint else None)


# --- command line ---------------------------------------------------------------------------------


def configure_parser(parser) -> None:
    parser.add_argument("source", help="a dflash GGUF, or a draft checkpoint folder (config.json + model.safetensors)")
    parser.add_argument("-o", "--output", required=True, help="output folder for the OpenVINO draft")
    parser.add_argument("--weight-format", choices=("fp32", "fp16", "int8", "int4", "gguf"), default="fp32",
                        help="fp32; fp16 (constants stored as fp16); int8 (per channel) or int4 (grouped) with "
                             "NNCF; gguf: the GGUF's own codes and scales carried into the IR")
    parser.add_argument("--group-size", type=int, help="int4 group size (default 16: a Q4_K sub-block holds two)")
    sym = parser.add_mutually_exclusive_group()
    sym.add_argument("--sym", action="store_true", help="symmetric int8/int4 (default asymmetric, as optimum-cli)")
    sym.add_argument("--asym", action="store_true", help="asymmetric int8/int4 (the default)")
    parser.add_argument("--ratio", type=float, help="int4: share of weights in int4, the rest int8 (default 1.0)")
    parser.add_argument("--all-layers", action="store_true",
                        help="int4: also the last MatMul, which NNCF otherwise keeps in int8")
    parser.add_argument("--map", help="tensor map YAML for a GGUF source (default: the shipped map)")
    parser.add_argument("--target-layer-offset", type=int, default=None,
                        help="GGUF only: offset applied to dflash.target_layers (see `gguf2ov convert`)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the result as Markdown")


def cli(args) -> int:
    from .report import render, write_reports

    result = export_draft(args.source, args.output, weight_format=args.weight_format, overwrite=args.overwrite,
                          progress=not args.json, target_layer_offset=args.target_layer_offset, map_path=args.map,
                          group_size=args.group_size, sym=args.sym, ratio=args.ratio, all_layers=args.all_layers)
    print(render(result, "text"), end="")
    write_reports(result, json_path=args.json, markdown_path=args.markdown, title="Draft export")
    return 0

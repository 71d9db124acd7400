"""A heavier copy of a Qwen3 target that computes the same function, for speed measurements.

Speculative decoding pays for itself only when a target step costs much more than the draft and
the pipeline around it: a tiny target is faster alone. To show the speedup a trained DFlash pair
gives without training a bigger pair, the target is widened so that it costs more per step but
still produces the same logits and the same hidden states at the layers the draft reads:

- every MLP's intermediate size is padded with zeros: the extra gate/up rows give silu(0) * 0 = 0
  and the extra down_proj columns are zero, so the padding adds exactly nothing;
- decoder layers are appended after the existing ones, copied from them (cyclically) but with
  o_proj and down_proj zeroed and their norms at 1: both of their residual branches output zero,
  so the residual stream, the final norm and the lm_head see what they saw before.

The draft's target layer ids keep pointing at the same tensors: ids 0..N-2 of the original are
decoder-layer residual outputs, which appended layers do not touch; only the last id (the
final-norm output) moves, to N'-1, and it holds the same values. The function is checked
numerically on the Hugging Face models before anything is exported.
"""

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Gguf2ovError
from ..hf.checkpoint import read_json_object
from ..names import DETOKENIZER_IR, IR_XML, PROVENANCE_FILE, TOKENIZER_IR
from ..outputs import atomic_dir, atomic_write_text, require_output_dir
from ..progress import step
from ..provenance import provenance
from ..report import Table, human_bytes

# Defaults measured on a 2-core CPU at f32 with the fixture pair (hidden 256, 4 layers -> 12 layers,
# intermediate 512 -> 3072: 2.5M -> 30.8M parameters, 44 MB, ~10 s to build): ~200 tok/s alone,
# ~2.7x with the trained draft at K=7. 40M (intermediate 4096) or 16 layers measured the same
# speedup within noise; smaller targets let the pipeline's overhead eat the gain.
DEFAULT_EXTRA_LAYERS = 8
DEFAULT_INTERMEDIATE_SIZE = 3072

# f32 on both sides: the only differences left are summation-order rounding (~1e-6).
TOLERANCE = 1e-4


@dataclass(frozen=True)
class WidenResult:
    out_dir: str
    source: str
    layers: tuple[int, int]  # original, widened
    intermediate_size: tuple[int, int]
    parameters: tuple[int, int]
    # widened vs original: HF "logits", "hidden_states[i]", "final norm"; "IR taps vs original" =
    # the exported IR at target layer ids 0..N-2 vs the original HF model
    max_abs_diff: dict[str, float]
    locators: int
    weight_types: dict[str, int]  # element type of the IR's weight constants -> count
    files: dict[str, int]
    seconds: float

    def tables(self) -> list[Table]:
        rows = [
            ["decoder layers", self.layers[0], self.layers[1]],
            ["intermediate size", self.intermediate_size[0], self.intermediate_size[1]],
            ["parameters", self.parameters[0], self.parameters[1]],
        ]
        return [
            Table("Heavy target: original vs widened", ["", "original", "widened"], rows,
                  note="appended layers write zeros to the residual stream; MLP padding is zero"),
            Table("Same function (widened vs original, f32)", ["output", "max |diff|"],
                  [[k, v] for k, v in self.max_abs_diff.items()], note=f"tolerance {TOLERANCE:g}"),
            Table("Files", ["file", "size"], [[k, human_bytes(v)] for k, v in self.files.items()]),
        ]

    def summary(self) -> list[str]:
        size = sum(self.files.values())
        return [
            f"widened {self.source} -> {self.out_dir} in {self.seconds:.1f} s: {self.layers[0]} -> {self.layers[1]} "
            f"layers, intermediate {self.intermediate_size[0]} -> {self.intermediate_size[1]}, "
            f"{self.parameters[0] / 1e6:.1f}M -> {self.parameters[1] / 1e6:.1f}M parameters, {human_bytes(size)}",
            f"same function: max |diff| {max(self.max_abs_diff.values()):.2e} (tolerance {TOLERANCE:g}); "
            f"{self.locators} hidden-state locators",
        ]


def widened_config(config: dict, extra_layers: int, intermediate_size: int) -> dict:
    """The HF config of the widened model (plain dict in, plain dict out)."""
    n = int(config["num_hidden_layers"])
    if extra_layers < 0:
        raise Gguf2ovError(f"extra_layers must be >= 0, got {extra_layers}")
    if intermediate_size < int(config["intermediate_size"]):
        raise Gguf2ovError(f"intermediate_size {intermediate_size} is smaller than the target's "
                           f"{config['intermediate_size']}: widening can only pad")
    new = dict(config)
    new["num_hidden_layers"] = n + extra_layers
    new["intermediate_size"] = int(intermediate_size)
    # Per-layer lists (attention type) must cover the new layers; each copy keeps its source's kind.
    if isinstance(new.get("layer_types"), list):
        types = list(new["layer_types"])
        new["layer_types"] = types + [types[i % n] for i in range(extra_layers)]
    return new


def widen_state_dict(state: dict, n_layers: int, extra_layers: int, intermediate_size: int) -> dict:
    """The widened weights: padded MLPs everywhere, appended layers whose output projections are zero."""
    import torch

    def pad_rows(w, size):  # gate/up: [intermediate, hidden]
        return torch.cat([w, w.new_zeros(size - w.shape[0], *w.shape[1:])], dim=0)

    def pad_cols(w, size):  # down: [hidden, intermediate]
        return torch.cat([w, w.new_zeros(w.shape[0], size - w.shape[1])], dim=1)

    out = {}
    layer_prefix = "model.layers."
    for name, value in state.items():
        if not name.startswith(layer_prefix):
            out[name] = value.clone()
            continue
        rest = name[len(layer_prefix):]
        if rest.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            value = pad_rows(value, intermediate_size)
        elif rest.endswith(("mlp.gate_proj.bias", "mlp.up_proj.bias")):
            value = torch.cat([value, value.new_zeros(intermediate_size - value.shape[0])])
        elif rest.endswith("mlp.down_proj.weight"):
            value = pad_cols(value, intermediate_size)
        out[name] = value.contiguous()

    for j in range(extra_layers):
        src, dst = j % n_layers, n_layers + j
        src_prefix, dst_prefix = f"{layer_prefix}{src}.", f"{layer_prefix}{dst}."
        for name in [k for k in out if k.startswith(src_prefix)]:
            rest = name[len(src_prefix):]
            value = out[name].clone()
            if rest.startswith(("self_attn.o_proj.", "mlp.down_proj.")):
                value.zero_()  # the two residual branches: zero output makes the layer a no-op
            elif rest.endswith("norm.weight"):
                value.fill_(1.0)
            out[dst_prefix + rest] = value
    return out


def widen_model(model, extra_layers: int, intermediate_size: int):
    """A new f32 Qwen3ForCausalLM computing the same function as `model`, with more layers and wider MLPs."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base = model.config.to_dict()
    config = Qwen3Config.from_dict(widened_config(base, extra_layers, intermediate_size))
    state = widen_state_dict({k: v.float() for k, v in model.state_dict().items()},
                             int(base["num_hidden_layers"]), extra_layers, intermediate_size)
    wide = Qwen3ForCausalLM(config)  # not on "meta": the rotary buffers are not in the state dict
    # strict: a key the widening missed would otherwise keep the constructor's random values.
    wide.load_state_dict(state, strict=True)
    if config.tie_word_embeddings:
        wide.tie_weights()
    return wide.float().eval()


def forward_all(model, input_ids):
    import torch

    with torch.no_grad():
        return model(input_ids, output_hidden_states=True)


def compare_function(a, b, n_layers: int) -> dict[str, float]:
    """max |diff| between two HF forward outputs: logits and every hidden state the original has."""
    diffs = {"logits": float((a.logits - b.logits).abs().max())}
    # [1..N-1] are decoder-layer residual outputs (target layer ids 0..N-2); the last HF entry is the
    # final-norm output in both models (id N-1 before, N'-1 after).
    for i in range(1, n_layers):
        diffs[f"hidden_states[{i}]"] = float((a.hidden_states[i] - b.hidden_states[i]).abs().max())
    diffs["final norm"] = float((a.hidden_states[-1] - b.hidden_states[-1]).abs().max())
    return diffs


def ir_tap_diff(ir_dir: Path, reference, input_ids, n_layers: int) -> float:
    """max |diff| between the exported IR's taps at ids 0..N-2 and the original HF hidden states.

    These are what the draft reads: the check covers the export and its locators, not only the
    widening.
    """
    import numpy as np

    from ..runtime.target import Target

    ids = list(range(n_layers - 1))
    taps = Target.open(ir_dir).hidden_states(input_ids[0].numpy().astype(np.int64), ids)
    ref = np.concatenate([reference.hidden_states[i + 1][0].numpy() for i in ids], axis=-1)
    return float(np.abs(taps - ref).max())


def _check_input_ids(config: dict, length: int = 48):
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(0, int(config["vocab_size"]), (1, length), generator=g)


def _ir_summary(xml_path: Path) -> tuple[int, dict[str, int]]:
    import openvino as ov

    from ..runtime.target import read_locators

    model = ov.Core().read_model(str(xml_path))
    locators = read_locators(model) or {}
    types: dict[str, int] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant" and op.get_output_partial_shape(0).rank.get_length() >= 2:
            t = op.get_output_element_type(0).get_type_name()
            types[t] = types.get(t, 0) + 1
    return len(locators), types


def widen_target(
    target_hf_dir,
    out_dir,
    extra_layers: int = DEFAULT_EXTRA_LAYERS,
    intermediate_size: int = DEFAULT_INTERMEDIATE_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> WidenResult:
    """Widen an HF Qwen3 target, check it computes the same function, export it for OpenVINO GenAI.

    `out_dir` gets openvino_model.xml/.bin (fp32, with hidden_states_decoder_layers), the OpenVINO
    tokenizer and detokenizer, config.json and gguf2ov.json (provenance).
    """
    target_hf_dir, out_dir = Path(target_hf_dir), Path(out_dir)
    if not (target_hf_dir / "config.json").is_file():
        raise Gguf2ovError(f"{target_hf_dir} is not a Hugging Face checkpoint folder: config.json is missing")
    source_config = read_json_object(target_hf_dir / "config.json")
    if source_config.get("model_type") != "qwen3":
        raise Gguf2ovError(f"{target_hf_dir} is a {source_config.get('model_type')!r} model; only qwen3 targets "
                           "can be widened")
    require_output_dir(out_dir, overwrite, inputs=(target_hf_dir,))

    import openvino as ov
    import torch
    from openvino_tokenizers import convert_tokenizer
    from optimum.exporters.openvino import main_export
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        step(f"widening {target_hf_dir}: +{extra_layers} layers, intermediate {intermediate_size}", progress)
        # f32 whatever the checkpoint holds (the fixture's is fp16): fp16 -> f32 is exact, and the
        # exported IR keeps f32 constants, which GenAI's f32 runs need for byte-identical output.
        # safetensors only: a checkpoint is never unpickled
        original = Qwen3ForCausalLM.from_pretrained(str(target_hf_dir), dtype=torch.float32, use_safetensors=True).eval()
        widened = widen_model(original, extra_layers, intermediate_size)
        input_ids = _check_input_ids(source_config)
        reference = forward_all(original, input_ids)
        n_layers = original.config.num_hidden_layers
        diffs = compare_function(reference, forward_all(widened, input_ids), n_layers)
        worst = max(diffs.values())
        if not worst < TOLERANCE:
            bad = ", ".join(f"{k} {v:.2e}" for k, v in diffs.items() if not v < TOLERANCE)
            raise Gguf2ovError(f"the widened target does not compute the original's function: {bad}")
        params = (sum(p.numel() for p in original.parameters()), sum(p.numel() for p in widened.parameters()))
        sizes = ((original.config.num_hidden_layers, widened.config.num_hidden_layers),
                 (original.config.intermediate_size, widened.config.intermediate_size))
        del original

        scratch = tmp / ".scratch"
        hf = scratch / "hf"
        widened.config.dtype = torch.float32  # what main_export loads it as (the source said float16)
        widened.save_pretrained(str(hf))
        del widened
        tokenizer = AutoTokenizer.from_pretrained(str(target_hf_dir))
        tokenizer.save_pretrained(str(hf))
        gen_cfg = target_hf_dir / "generation_config.json"
        if gen_cfg.is_file():
            shutil.copy(gen_cfg, hf / "generation_config.json")

        step("exporting the widened target with optimum-intel", progress)
        main_export(str(hf), str(tmp), task="text-generation-with-past")
        step("converting the tokenizer", progress)
        tok, detok = convert_tokenizer(tokenizer, with_detokenizer=True)
        ov.save_model(tok, str(tmp / TOKENIZER_IR))
        ov.save_model(detok, str(tmp / DETOKENIZER_IR))
        shutil.copy(hf / "config.json", tmp / "config.json")  # the widened config (main_export writes it too)
        shutil.rmtree(scratch, ignore_errors=True)

        n_locators, weight_types = _ir_summary(tmp / IR_XML)
        if n_locators != sizes[0][1]:
            raise Gguf2ovError(f"the exported target has {n_locators} hidden-state locators for {sizes[0][1]} layers",
                               hint="optimum-intel could not annotate hidden_states_decoder_layers; the draft "
                                    "would read a fallback")
        diffs["IR taps vs original"] = ir_tap_diff(tmp, reference, input_ids, n_layers)
        if not diffs["IR taps vs original"] < TOLERANCE:
            raise Gguf2ovError(f"the exported target's hidden states at layer ids 0..{n_layers - 2} differ from the "
                               f"original's by {diffs['IR taps vs original']:.2e}")
        if set(weight_types) - {"f32"} - {"i64", "i32"}:
            raise Gguf2ovError(f"the exported target's weights are {weight_types}, not f32",
                               hint="optimum-intel compressed the weights; f32 runs would not be exact")

        options = {"extra_layers": extra_layers, "intermediate_size": intermediate_size,
                   "task": "text-generation-with-past", "max_abs_diff": diffs}
        atomic_write_text(tmp / PROVENANCE_FILE,
                          json.dumps(provenance({"target_hf": target_hf_dir}, options), indent=2) + "\n")
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    return WidenResult(
        out_dir=str(out_dir), source=str(target_hf_dir), layers=sizes[0], intermediate_size=sizes[1],
        parameters=params, max_abs_diff=diffs, locators=n_locators, weight_types=weight_types, files=files,
        seconds=time.perf_counter() - start,
    )

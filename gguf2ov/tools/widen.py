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
final-norm output) moves, to N'-1, and it holds the same values.

This module works on the checkpoint in NumPy (`write_widened_checkpoint`) and compares two built
targets (`same_function`); `gguf2ov widen-target` (cli/widen.py) builds both with the target stage.
"""

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..hf.checkpoint import Checkpoint, read_json_object
from ..names import CONFIG_FILE, PROVENANCE_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX
from ..report import Table, human_bytes

# Defaults measured on a 2-core CPU at f32 with the fixture pair (hidden 256, 4 layers -> 12 layers,
# intermediate 512 -> 3072: 2.5M -> 30.8M parameters, 124 MB, seconds to build): the trained draft
# at K=7 makes the pair several times faster than the target alone (benchmarks/bench_speedup.py).
# 40M (intermediate 4096) or 16 layers measured the same speedup within noise; smaller targets let
# the pipeline's overhead eat the gain.
DEFAULT_EXTRA_LAYERS = 8
DEFAULT_INTERMEDIATE_SIZE = 3072

# f32 on both sides: the only differences left are summation-order rounding (~1e-6).
TOLERANCE = 1e-4
CHECK_TOKENS = 48  # random token ids the two targets are compared on
LAYER_PREFIX = "model.layers."


@dataclass(frozen=True)
class WidenResult:
    out_dir: str
    source: str
    layers: tuple[int, int]  # original, widened
    intermediate_size: tuple[int, int]
    parameters: tuple[int, int]
    # widened target vs the original's, both built as f32 OpenVINO IRs: "logits", "layer i" (the
    # hidden state at target layer id i, i = 0..N-2), "final norm" (id N-1 before, N'-1 after)
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


def read_qwen3_config(target_hf_dir: Path) -> dict:
    """The config.json of a Qwen3 checkpoint folder, refused for any other model."""
    if not (target_hf_dir / CONFIG_FILE).is_file():
        raise Gguf2ovError(f"{target_hf_dir} is not a Hugging Face checkpoint folder: config.json is missing")
    config = read_json_object(target_hf_dir / CONFIG_FILE)
    if config.get("model_type") != "qwen3":
        raise Gguf2ovError(f"{target_hf_dir} is a {config.get('model_type')!r} model; only qwen3 targets "
                           "can be widened")
    return config


def widened_config(config: dict, extra_layers: int, intermediate_size: int) -> dict:
    """The HF config of the widened model (plain dict in, plain dict out), stored as float32."""
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
    for key in ("dtype", "torch_dtype"):  # the widened weights are written as float32
        if key in new:
            new[key] = "float32"
    return new


def widen_tensors(state: dict[str, np.ndarray], n_layers: int, extra_layers: int,
                  intermediate_size: int) -> dict[str, np.ndarray]:
    """The widened weights (float32): padded MLPs everywhere, appended layers whose output projections are zero."""
    def pad(w, axis):  # gate/up rows [intermediate, hidden] (axis 0), down columns [hidden, intermediate] (axis 1)
        width = [(0, 0)] * w.ndim
        width[axis] = (0, intermediate_size - w.shape[axis])
        return np.pad(w, width)

    out = {}
    for name, value in state.items():
        value = np.array(value, dtype=np.float32) if np.issubdtype(value.dtype, np.floating) else np.array(value)
        rest = name[len(LAYER_PREFIX):] if name.startswith(LAYER_PREFIX) else ""
        if rest.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.bias")):
            value = pad(value, 0)
        elif rest.endswith("mlp.down_proj.weight"):
            value = pad(value, 1)
        out[name] = np.ascontiguousarray(value)

    for j in range(extra_layers):
        src, dst = j % n_layers, n_layers + j
        src_prefix, dst_prefix = f"{LAYER_PREFIX}{src}.", f"{LAYER_PREFIX}{dst}."
        for name in [k for k in out if k.startswith(src_prefix)]:
            rest = name[len(src_prefix):]
            value = out[name].copy()
            if rest.startswith(("self_attn.o_proj.", "mlp.down_proj.")):
                value[...] = 0  # the two residual branches: zero output makes the layer a no-op
            elif rest.endswith("norm.weight"):
                value[...] = 1
            out[dst_prefix + rest] = value
    return out


def parameter_count(state: dict[str, np.ndarray], config: dict) -> int:
    """The model's parameters (a tied lm_head stored beside the embedding counts once)."""
    tied = config.get("tie_word_embeddings", True)
    return sum(int(v.size) for k, v in state.items() if not (tied and k == "lm_head.weight"))


def write_widened_checkpoint(target_hf_dir, out_dir, extra_layers: int, intermediate_size: int) -> dict:
    """Write the widened float32 checkpoint of `target_hf_dir` to `out_dir` with the source's other
    files (tokenizer, generation config); returns {"config", "parameters": (original, widened)}."""
    from ..hf.write import TensorSpec, write_checkpoint

    target_hf_dir = Path(target_hf_dir)
    config = read_qwen3_config(target_hf_dir)
    checkpoint = Checkpoint(target_hf_dir)  # safetensors only: a checkpoint is never unpickled
    # f32 whatever the checkpoint holds (the fixture's is fp16): fp16 and bf16 -> f32 are exact
    state = {name: checkpoint.load(name) for name in checkpoint.shapes}
    if not any(name.startswith(LAYER_PREFIX) for name in state):
        raise Gguf2ovError(f"{target_hf_dir} holds no {LAYER_PREFIX}* tensors: not a Qwen3 checkpoint")
    new_config = widened_config(config, extra_layers, intermediate_size)
    original = parameter_count(state, config)
    wide = widen_tensors(state, int(config["num_hidden_layers"]), extra_layers, intermediate_size)
    del state
    specs = [TensorSpec(name, tuple(v.shape), "F32" if v.dtype == np.float32 else _int_dtype(v)) for name, v in wide.items()]
    write_checkpoint(out_dir, new_config, specs, iter(wide.items()), progress=False)
    weights = {SAFETENSORS_FILE, SAFETENSORS_INDEX, CONFIG_FILE, PROVENANCE_FILE}
    for f in sorted(target_hf_dir.iterdir()):  # tokenizer files, generation_config.json, chat template
        if f.is_file() and f.name not in weights and not f.name.endswith(".safetensors"):
            shutil.copy2(f, Path(out_dir) / f.name)
    return {"config": new_config, "parameters": (original, parameter_count(wide, new_config))}


def _int_dtype(v: np.ndarray) -> str:
    from ..hf.write import INT_DTYPES

    if v.dtype not in INT_DTYPES:
        raise Gguf2ovError(f"a tensor of type {v.dtype} cannot be written to the widened checkpoint")
    return INT_DTYPES[v.dtype]


def same_function(original_dir, widened_dir, n_layers: int, vocab_size: int,
                  length: int = CHECK_TOKENS) -> dict[str, float]:
    """max |diff| between two OpenVINO targets on the same random token ids: the logits, the hidden
    states at target layer ids 0..N-2 of the original (what a draft reads) and the final norm."""
    from ..runtime.target import TargetIR

    ids = np.random.default_rng(0).integers(0, vocab_size, length, dtype=np.int64)
    a, b = TargetIR.open(original_dir), TargetIR.open(widened_dir)
    diffs = {"logits": float(np.abs(a.logits(ids) - b.logits(ids)).max())}
    shared = list(range(n_layers - 1))
    last_a, last_b = max(a.tap_layers), max(b.tap_layers)
    states_a = a.layer_states(ids, shared + [last_a])
    states_b = b.layer_states(ids, shared + [last_b])
    for k, i in enumerate(shared):
        diffs[f"layer {i}"] = float(np.abs(states_a[k] - states_b[k]).max())
    diffs["final norm"] = float(np.abs(states_a[-1] - states_b[-1]).max())
    a.release()
    b.release()
    return diffs


def ir_summary(xml_path: Path) -> tuple[int, dict[str, int]]:
    """(hidden-state locators, {element type of the weight constants: count}) of a target IR."""
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

"""A heavier copy of a target that computes the same function, for speed measurements.

Speculative decoding pays for itself only when a target step costs much more than the draft and
the pipeline around it: a tiny target is faster alone. To show the speedup a trained DFlash pair
gives without training a bigger pair, the target is widened so that it costs more per step but
still produces the same logits and the same hidden states at the layers the draft reads:

- every MLP's intermediate size (a mixture of experts: every expert's) is padded with zeros: the
  extra gate/up rows give silu(0) * 0 = 0 and the extra down_proj columns are zero, so the padding
  adds exactly nothing;
- decoder layers are appended after the existing ones, copied from them (cyclically, each with its
  source's layer type: a Gated DeltaNet layer stays one) but with the tensors that write their two
  branches into the residual stream zeroed (attention's o_proj, a Gated DeltaNet's out_proj, the
  MLP's or every expert's down_proj) and their norms scaling by 1: both residual branches output
  zero, so the residual stream, the final norm and the lm_head see what they saw before.

The draft's target layer ids keep pointing at the same tensors: ids 0..N-2 of the original are
decoder-layer residual outputs, which appended layers do not touch; only the last id (the
final-norm output) moves, to N'-1, and it holds the same values.

Which tensors those are is data, by the kinds of layer the target is built from (`targets/layers/`,
named by the model type's map): `BRANCH_OUTPUTS` and `MLP_WIDTHS` below.

This module works on the checkpoint in NumPy (`write_widened_checkpoint`) and compares two built
targets (`same_function`); `gguf2ov widen-target` (cli/widen.py) builds both with the target stage.
"""

import re
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
# the pipeline's overhead eat the gain. The hybrid fixture (hidden 32, 8 -> 16 layers, 0.1M -> 4.7M
# parameters) gains 2.5x with the same defaults.
DEFAULT_EXTRA_LAYERS = 8
DEFAULT_INTERMEDIATE_SIZE = 3072
# A mixture of experts is widened in depth more than in width: a verify step of K+1 tokens reads
# every expert they are routed to, up to K+1 times what a decoded token reads, where a dense MLP's
# weights are read once a step whatever the tokens; the layers' fixed cost per step is what the
# draft saves. On the MoE fixture (hidden 32, 4 layers, 8 experts of 32), at a load of 9-10 on 2 cores:
# +8 layers at 3072 1.26x, +16 at 3072 0.82x, +16 at 1024 1.48x, +24 at 512 1.91x, +32 at 64 1.89x.
MOE_EXTRA_LAYERS = 24
MOE_INTERMEDIATE_SIZE = 512

# f32 on both sides: the only differences left are summation-order rounding (~1e-6).
TOLERANCE = 1e-4
CHECK_TOKENS = 48  # random token ids the two targets are compared on
# A decoder layer's tensor: (everything up to the layer index, the index, the name inside the layer);
# transformers 5 saves a Qwen3.5 decoder under model.language_model.layers.
LAYER_TENSOR = re.compile(r"^(?P<prefix>(?:.+\.)?layers\.)(?P<index>\d+)\.(?P<rest>.+)$")

# The model types widened (each one tested against transformers' forward): their layers' kinds below.
WIDENED_TYPES = ("qwen3", "qwen3_5_text", "qwen3_moe")
# Per kind of layer (targets/layers/, as the model type's map names them): the tensors, by their name
# inside a layer, that write the kind's branch into the residual stream. Zero, the branch adds nothing.
BRANCH_OUTPUTS = {
    "attention": r"self_attn\.o_proj\.",
    "gated_attention": r"self_attn\.o_proj\.",
    "gated_deltanet": r"linear_attn\.out_proj\.",
    "dense": r"mlp\.down_proj\.",
    "moe": r"mlp\.experts\.(\d+\.)?down_proj",
}
# The norms a kind scales by w alone, where the model's other norms scale by (norm_offset + w) (its map's
# `forward`): the Gated DeltaNet's gated norm.
PLAIN_NORMS = {"gated_deltanet": r"linear_attn\.norm\.weight"}


@dataclass(frozen=True)
class MlpWidth:
    """What padding an MLP kind's width pads: the config key of the width, and the tensors (by their
    name inside a layer) padded along it: rows (gate/up, axis -2), columns (down, axis -1), and gate
    and up fused along the rows (each half padded); and the kind's default widening."""
    key: str
    rows: str
    columns: str
    fused_rows: str = r"(?!)"
    extra_layers: int = DEFAULT_EXTRA_LAYERS
    intermediate_size: int = DEFAULT_INTERMEDIATE_SIZE


MLP_WIDTHS = {
    "dense": MlpWidth("intermediate_size", r"mlp\.(gate|up)_proj\.(weight|bias)$", r"mlp\.down_proj\.weight$"),
    # one 2-D tensor per expert (save_pretrained's keys), or the experts stacked [E, I, H] / [E, H, I]
    "moe": MlpWidth("moe_intermediate_size", r"mlp\.experts\.(\d+\.(gate|up)_proj\.weight|(gate|up)_proj)$",
                    r"mlp\.experts\.(\d+\.down_proj\.weight|down_proj)$", r"mlp\.experts\.gate_up_proj$",
                    MOE_EXTRA_LAYERS, MOE_INTERMEDIATE_SIZE),
}


@dataclass(frozen=True)
class WidenResult:
    out_dir: str
    source: str
    layers: tuple[int, int]  # original, widened
    intermediate_size: tuple[int, int]  # the MLP width padded: each expert's in a mixture of experts
    parameters: tuple[int, int]
    # widened target vs the original's, both built as f32 OpenVINO IRs: "logits", "layer i" (the
    # hidden state at target layer id i, i = 0..N-2), "final norm" (id N-1 before, N'-1 after)
    max_abs_diff: dict[str, float]
    locators: int
    weight_types: dict[str, int]  # element type of the IR's weight constants -> count
    files: dict[str, int]
    seconds: float
    width_key: str = "intermediate_size"  # the config key of the MLP width padded

    def tables(self) -> list[Table]:
        rows = [
            ["decoder layers", self.layers[0], self.layers[1]],
            [self.width_key.replace("_", " "), self.intermediate_size[0], self.intermediate_size[1]],
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
            f"layers, {self.width_key.replace('_', ' ')} {self.intermediate_size[0]} -> {self.intermediate_size[1]}, "
            f"{self.parameters[0] / 1e6:.1f}M -> {self.parameters[1] / 1e6:.1f}M parameters, {human_bytes(size)}",
            f"same function: max |diff| {max(self.max_abs_diff.values()):.2e} (tolerance {TOLERANCE:g}); "
            f"{self.locators} hidden-state locators",
        ]


@dataclass(frozen=True)
class Widening:
    """How one target is widened: its config, resolved (target.config.TargetConfig), and what of it pads."""
    config: dict
    target: object
    width: MlpWidth

    @property
    def layers(self) -> int:
        return self.target.num_layers

    @property
    def intermediate_size(self) -> int:
        return int(self.config[self.width.key])


def read_widening(target_hf_dir: Path) -> Widening:
    """The config.json of a checkpoint folder of a model type that can be widened, resolved as the target
    is built from it; any other model is refused."""
    from ..targets.config import target_config
    from ..targets.decoder import batched_weights

    if not (target_hf_dir / CONFIG_FILE).is_file():
        raise Gguf2ovError(f"{target_hf_dir} is not a Hugging Face checkpoint folder: config.json is missing")
    config = read_json_object(target_hf_dir / CONFIG_FILE)
    if config.get("model_type") not in WIDENED_TYPES:
        raise Gguf2ovError(f"{target_hf_dir} is a {config.get('model_type')!r} model; only "
                           f"{', '.join(WIDENED_TYPES)} targets can be widened")
    target = target_config(config, target_hf_dir / CONFIG_FILE)
    # a sparse layer reads its experts as batched [E, N, K] weights; a layer without them is dense
    sparse_layers = {name.split(".mlp.")[0] for name in batched_weights(target)}
    if target.mlp == "moe" and len(sparse_layers) < target.num_layers:
        raise Gguf2ovError(f"{target_hf_dir}: a mixture-of-experts target with dense layers (mlp_only_layers, "
                           "decoder_sparse_step) cannot be widened")
    width = MLP_WIDTHS[target.mlp]
    if not isinstance(config.get(width.key), int):
        raise Gguf2ovError(f"{target_hf_dir / CONFIG_FILE} states no {width.key}: the MLP width to pad")
    return Widening(config, target, width)


def widened_config(widening: Widening, extra_layers: int, intermediate_size: int) -> dict:
    """The HF config of the widened model (plain dict out), stored as float32."""
    config, key = widening.config, widening.width.key
    n = widening.layers
    if extra_layers < 0:
        raise Gguf2ovError(f"extra_layers must be >= 0, got {extra_layers}")
    if intermediate_size < widening.intermediate_size:
        raise Gguf2ovError(f"intermediate_size {intermediate_size} is smaller than the target's {key} "
                           f"{widening.intermediate_size}: widening can only pad")
    new = dict(config)
    new["num_hidden_layers"] = n + extra_layers
    new[key] = int(intermediate_size)
    # Per-layer lists (attention type) must cover the new layers; each copy keeps its source's kind.
    # A hybrid's types are written out, also where its config derives them (full_attention_interval).
    types = list(widening.target.layer_types)
    if isinstance(config.get("layer_types"), list) or len(set(types)) > 1:
        new["layer_types"] = types + [types[i % n] for i in range(extra_layers)]
    for key in ("dtype", "torch_dtype"):  # the widened weights are written as float32
        if key in new:
            new[key] = "float32"
    return new


def widen_tensors(state: dict[str, np.ndarray], widening: Widening, extra_layers: int,
                  intermediate_size: int) -> dict[str, np.ndarray]:
    """The widened weights (float32): padded MLPs everywhere, appended layers whose branch outputs are zero."""
    target, width = widening.target, widening.width
    n_layers = widening.layers

    def pad(w, axis):
        widths = [(0, 0)] * w.ndim
        widths[axis] = (0, intermediate_size - w.shape[axis])
        return np.pad(w, widths)

    out, layers = {}, {}
    for name, value in state.items():
        value = np.array(value, dtype=np.float32) if np.issubdtype(value.dtype, np.floating) else np.array(value)
        m = LAYER_TENSOR.match(name)
        if m:
            rest = m["rest"]
            layers.setdefault(int(m["index"]), []).append(name)
            if re.match(width.rows, rest):
                value = pad(value, -2 if value.ndim > 1 else 0)
            elif re.match(width.columns, rest):
                value = pad(value, -1)
            elif re.match(width.fused_rows, rest):
                value = np.concatenate([pad(half, -2) for half in np.split(value, 2, axis=-2)], axis=-2)
        out[name] = np.ascontiguousarray(value)

    norm_offset = target.options["norm_offset"]
    for j in range(extra_layers):
        src, dst = j % n_layers, n_layers + j
        kinds = (target.mixers[src], target.mlp)
        for name in layers.get(src, []):
            m = LAYER_TENSOR.match(name)
            out[f"{m['prefix']}{dst}.{m['rest']}"] = noop_copy(m["rest"], out[name], kinds, norm_offset)
    return out


def noop_copy(rest: str, value: np.ndarray, kinds, norm_offset: float) -> np.ndarray:
    """A layer tensor (`rest`: its name inside the layer) copied into a layer of `kinds` (its mixer's and its MLP's,
    as `BRANCH_OUTPUTS` names them) that adds nothing to the residual stream: the tensors writing the branches are
    zero, the norms scale by 1 (a model whose norms scale by (norm_offset + w): w = 1 - norm_offset)."""
    zeroed = "|".join(BRANCH_OUTPUTS[k] for k in kinds)
    plain = "|".join(PLAIN_NORMS[k] for k in kinds if k in PLAIN_NORMS) or r"(?!)"
    value = value.copy()
    if re.match(zeroed, rest):
        value[...] = 0  # the residual branches: zero output makes the layer a no-op
    elif re.match(plain, rest):
        value[...] = 1
    elif rest.endswith("norm.weight"):
        value[...] = 1 - norm_offset  # scales by 1
    return value


def parameter_count(state: dict[str, np.ndarray], config: dict) -> int:
    """The model's parameters (a tied lm_head stored beside the embedding counts once)."""
    tied = config.get("tie_word_embeddings", True)
    return sum(int(v.size) for k, v in state.items() if not (tied and k == "lm_head.weight"))


def write_widened_checkpoint(target_hf_dir, out_dir, extra_layers: int, intermediate_size: int) -> dict:
    """Write the widened float32 checkpoint of `target_hf_dir` to `out_dir` with the source's other
    files (tokenizer, generation config); returns {"config", "parameters": (original, widened)}."""
    from ..hf.write import TensorSpec, write_checkpoint

    target_hf_dir = Path(target_hf_dir)
    widening = read_widening(target_hf_dir)
    new_config = widened_config(widening, extra_layers, intermediate_size)  # a size that cannot pad: before reading
    checkpoint = Checkpoint(target_hf_dir)  # safetensors only: a checkpoint is never unpickled
    # f32 whatever the checkpoint holds (the fixture's is fp16): fp16 and bf16 -> f32 are exact
    state = {name: checkpoint.load(name) for name in checkpoint.shapes}
    if not any(LAYER_TENSOR.match(name) for name in state):
        raise Gguf2ovError(f"{target_hf_dir} holds no decoder layer tensors (model.layers.N.*)")
    original = parameter_count(state, widening.config)
    wide = widen_tensors(state, widening, extra_layers, intermediate_size)
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

"""A target language model opened once, from a GGUF (through its map) or a checkpoint folder.

`open_target_gguf()` and `open_target_checkpoint()` read the config, resolve it the way
transformers does (`config.py`), check the tensor names and shapes strictly against the graph
`graph.py` builds (`graph.tensor_shapes`, from the layer kinds), and then hand out one tensor at a
time (`ir.tensors.TensorSource`): float32 values, row chunks of them, or the GGUF's raw quantized
bytes. Nothing holds the model in memory whole. A tensor a source stores in another layout than
the graph reads (a checkpoint's experts one per tensor, gate and up fused: `layouts.py`) is handed
out as the graph names it, made from the stored ones.
"""

import dataclasses
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..gguf.read import summarise
from ..ir.tensors import TensorSource, some, tensor_mismatch
from ..names import CONFIG_FILE
from .config import EMBEDDING, LM_HEAD, TargetConfig, target_arches, target_config
from .graph import tensor_shapes
from .layers import int8_weights, per_layer
from .layouts import resolve

# llama.cpp stores Llama 3's RoPE scaling as a tensor of per-frequency divisors (its converter's
# rope_factors; the llama map drops it), not as config keys: RoPE turns by position * inv_freq / factor.
ROPE_FACTORS = "rope_freqs.weight"
# and other RoPE scaling as {arch}.rope.scaling.* keys, which no map reads yet
ROPE_SCALING_KEY = "{arch}.rope.scaling.type"

# Tensors a checkpoint may hold that the graph does not read: a tied model's lm_head copy, and the
# RoPE buffers older checkpoints saved.
_UNUSED_SUFFIXES = ("rotary_emb.inv_freq",)


class TargetSource(TensorSource):
    """A validated target whose weights are read one tensor at a time.

    `config` the TargetConfig; `expected` the tensors the graph reads (name -> shape);
    `ignored` the tensors present but unused (a tied model's lm_head copy, RoPE buffers); `kept` the
    weights every format keeps in float32 (a router), `batched` the [E, N, K] batched-MatMul weights
    (experts), as the layer kinds state them.
    """

    embeddings = (EMBEDDING,)

    def __init__(self, path: Path, kind: str, config: TargetConfig, found: dict, mapped=None, checkpoint=None,
                 map_path=None):
        super().__init__(path, kind, mapped, checkpoint)
        self.config, self.map_path = config, map_path
        self.expected = tensor_shapes(config)
        self.last_matmul_shared = config.tie_word_embeddings  # the lm_head reads the embedding table
        self.int8_weights = int8_weights(config)  # what the layer kinds keep out of int4
        self.kept = tuple(n for names in per_layer(config, "kept") for n in names)
        self.batched = tuple(n for names in per_layer(config, "batched") for n in names)
        layouts = {k: v for found_layouts in per_layer(config, "layouts") for k, v in found_layouts.items()}
        self._recipes, found, problems = resolve(self.expected, found, layouts)
        if problems:
            raise Gguf2ovError(f"{path}: tensors do not match the {config.arch} model its config describes: shape "
                               f"mismatch ({some(list(dict.fromkeys(problems)))})",
                               hint="check that config.json belongs to these weights (or pass --map with the map "
                                    "that covers this file)")
        self.ignored = _check_tensors(self.expected, found, config, path)

    def f32(self, name: str) -> np.ndarray:
        recipe = self._recipes.get(name)
        if recipe is None:
            return super().f32(name)
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        x = self.f32_rows(name, 0, self.expected[name][0])
        x.flags.writeable = False
        self._last = (name, x)
        return x

    def f32_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        recipe = self._recipes.get(name)
        if recipe is None:
            return super().f32_rows(name, start, stop)
        return recipe.rows(super().f32, super().f32_rows, start, stop)

    def quantized(self, name: str):
        recipe = self._recipes.get(name)
        return super().quantized(name) if recipe is None else recipe.quantized(super().quantized)

    @property
    def arch(self) -> str:
        return self.config.arch

    def describe(self) -> str:
        c = self.config
        return (f"{self.path.name} ({self.kind}, {c.arch}): {c.num_layers} layers, hidden {c.hidden_size}, "
                f"vocab {c.vocab_size}, {sum(int(np.prod(s)) for s in self.expected.values()) / 1e6:.1f} M parameters")


def _check_tensors(expected: dict, found: dict, config: TargetConfig, where) -> list[str]:
    ignored = sorted(k for k in found if k not in expected and (
        k.endswith(_UNUSED_SUFFIXES) or (k == LM_HEAD and config.tie_word_embeddings)))
    if problems := tensor_mismatch(expected, {k: v for k, v in found.items() if k not in ignored}):
        raise Gguf2ovError(f"{where}: tensors do not match the {config.arch} model its config describes: {problems}",
                           hint="check that config.json belongs to these weights (or pass --map with the map that "
                                "covers this file)")
    return ignored


def open_target_checkpoint(path: Path) -> TargetSource:
    """Open a Hugging Face checkpoint folder as a target, validated and ready to stream weights."""
    from ..hf.checkpoint import Checkpoint, RenamedCheckpoint, read_json_object
    from ..maps.load import load_map

    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise Gguf2ovError(f"no {CONFIG_FILE} in {path}", hint="pass a Hugging Face checkpoint folder or a GGUF file")
    raw = read_json_object(config_path)
    config = target_config(raw, config_path)
    checkpoint = Checkpoint(path)  # memory-mapped safetensors, read one tensor at a time
    amap = load_map(config.arch)
    if amap.checkpoint:  # saved under a prefix, or beside other models' tensors (the map's `checkpoint`)
        checkpoint = RenamedCheckpoint(checkpoint, amap.checkpoint_names(checkpoint.shapes, path))
    return TargetSource(path, "checkpoint", config, dict(checkpoint.shapes), checkpoint=checkpoint)


def open_target_gguf(gguf, map_path=None) -> TargetSource:
    """Open a target GGUF (an opened, memory-mapped GgufFile) through its map, validated and ready to
    stream weights."""
    from ..maps.load import open_mapped

    path = gguf.path
    mapped = open_mapped(gguf, map_path)
    if mapped.amap.target is None:
        hint = ("a DFlash draft: export it with `gguf2ov export`" if mapped.amap.arch == "dflash"
                else f"supported: {', '.join(target_arches())}")
        raise Gguf2ovError(f"{path} is a {mapped.amap.arch} model, not a target this tool builds", hint=hint)
    scaling_key = ROPE_SCALING_KEY.format(arch=mapped.amap.arch)
    scaling = mapped.gguf.get(scaling_key)
    if scaling is not None and not isinstance(scaling, str):  # llama.cpp reads it as a string
        raise Gguf2ovError(f"{path}: {scaling_key} is {summarise(scaling, max_chars=60)}, not a string: the file is "
                           "corrupt", hint="re-download or re-convert the GGUF")
    if scaling not in (None, "none"):
        raise Gguf2ovError(f"{path}: {scaling_key} is {scaling!r}: RoPE scaling stated in GGUF metadata is not read "
                           "by the map, and the target would turn positions wrongly",
                           hint="build the target from the Hugging Face checkpoint, whose config states its RoPE")
    found = {e.hf_name: e.shape for e in mapped.plan if e.hf_name is not None}
    raw = dict(mapped.config)
    if raw.get("vocab_size") is None and EMBEDDING in found:
        raw["vocab_size"] = found[EMBEDDING][0]  # a file without a vocabulary states it by its table
    config = target_config(raw, path, arch=mapped.amap.arch, complete=True)
    if ROPE_FACTORS in mapped.gguf.tensors:
        factors = mapped.gguf.load(ROPE_FACTORS).reshape(-1)
        if factors.size * 2 != config.head_dim:
            raise Gguf2ovError(f"{path}: {ROPE_FACTORS} holds {factors.size} factors for a head_dim of {config.head_dim}")
        rope = {t: ((inv_freq / factors).astype(np.float32), scaling) for t, (inv_freq, scaling) in config.rope.items()}
        config = dataclasses.replace(config, rope=rope)
    return TargetSource(path, "gguf", config, found, mapped=mapped, map_path=map_path)

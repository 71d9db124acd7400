"""A target language model opened once, from a GGUF (through its map) or a checkpoint folder.

`open_target_gguf()` and `open_target_checkpoint()` read the config, resolve it the way
transformers does (`config.py`), check the tensor names and shapes strictly against the graph
`graph.py` builds (`decoder.tensor_shapes`, from the layer kinds), and then hand out one tensor at a
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
from ..maps.messages import capped
from ..maps.shapes import wrong_shapes
from ..names import CONFIG_FILE
from .config import TargetConfig, target_arches, target_config
from .decoder import (EMBEDDING, LM_HEAD, batched_weights, decoder_of, gathered_weights, int8_weights, kept_weights,
                      other_layouts, stored_shapes, tensor_shapes)
from .layouts import resolve

# llama.cpp stores Llama 3's RoPE scaling as a tensor of per-frequency divisors (its converter's
# rope_factors; the llama map drops it), not as config keys: RoPE turns by position * inv_freq / factor.
ROPE_FACTORS = "rope_freqs.weight"
# and other RoPE scaling as {arch}.rope.scaling.* keys, which a map reads where its architecture states
# them (gpt-oss's YaRN) and which are refused elsewhere
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
        self.kept, self.batched = kept_weights(config), batched_weights(config)
        self.embeddings = (EMBEDDING, *gathered_weights(config))  # tables read by a Gather (per-layer embeddings)
        self._recipes, found, problems = resolve(self.expected, found, other_layouts(config))
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

    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise Gguf2ovError(f"no {CONFIG_FILE} in {path}", hint="pass a Hugging Face checkpoint folder or a GGUF file")
    raw = read_json_object(config_path)
    config = target_config(raw, config_path)  # built as the map of its model type
    checkpoint = Checkpoint(path)  # memory-mapped safetensors, read one tensor at a time
    amap = config.amap
    if amap.checkpoint:  # saved under a prefix, or beside other models' tensors (the map's `checkpoint`)
        checkpoint = RenamedCheckpoint(checkpoint, amap.checkpoint.names(checkpoint.shapes, amap.arch, path))
    return TargetSource(path, "checkpoint", config, dict(checkpoint.shapes), checkpoint=checkpoint)


def open_target_gguf(gguf, map_path=None) -> TargetSource:
    """Open a target GGUF (an opened, memory-mapped GgufFile) through its map, validated and ready to
    stream weights: the map held against its layer kinds, the tensors' names against the map, the
    config resolved, then the stored shapes against the kinds'. The map (`map_path`, else the one the
    file's architecture names) is chosen once, and the target takes everything from it: names, config,
    and the layers' kinds, steps and options."""
    from ..maps.load import map_for, open_mapped

    path = gguf.path
    amap = map_for(gguf, map_path)
    if amap.target is None:
        hint = ("a DFlash draft: export it with `gguf2ov export`" if amap.arch == "dflash"
                else f"supported: {', '.join(target_arches())}")
        raise Gguf2ovError(f"{path} is a {amap.arch} model, not a target this tool builds", hint=hint)
    decoder_of(amap)
    mapped = open_mapped(gguf, amap=amap)
    scaling_key = ROPE_SCALING_KEY.format(arch=amap.arch)
    scaling = mapped.gguf.get(scaling_key)
    if scaling is not None and not isinstance(scaling, str):  # llama.cpp reads it as a string
        raise Gguf2ovError(f"{path}: {scaling_key} is {summarise(scaling, max_chars=60)}, not a string: the file is "
                           "corrupt", hint="re-download or re-convert the GGUF")
    read_by_map = any(scaling_key in rule.get("from", ()) for rule in amap.config.values())
    if scaling not in (None, "none") and not read_by_map:
        raise Gguf2ovError(f"{path}: {scaling_key} is {scaling!r}: RoPE scaling stated in GGUF metadata is not read "
                           "by the map, and the target would turn positions wrongly",
                           hint="build the target from the Hugging Face checkpoint, whose config states its RoPE")
    config = gguf_target_config(gguf, amap, mapped.config, mapped.plan)
    if wrong := wrong_kind_shapes(gguf, mapped.plan, config):
        raise Gguf2ovError(f"{path} does not fit the {amap.arch} map ({amap.path}): wrong shapes: {capped(wrong)}",
                           hint="pass --map with a map that covers this file")
    found = {e.hf_name: e.shape for e in mapped.plan if e.hf_name is not None}
    return TargetSource(path, "gguf", config, found, mapped=mapped, map_path=map_path)


def gguf_target_config(gguf, amap, config: dict, plan) -> TargetConfig:
    """The TargetConfig of a GGUF whose tensors fit its map (`plan`), from the HF config its metadata
    states: a vocabulary the file does not state is its table's, Llama 3's RoPE factors divide the
    frequencies."""
    raw = dict(config)
    table = next((e.shape for e in plan if e.hf_name == EMBEDDING), None)
    if raw.get("vocab_size") is None and table is not None:
        raw["vocab_size"] = table[0]  # a file without a vocabulary states it by its table
    factors = gguf.load(ROPE_FACTORS).reshape(-1) if ROPE_FACTORS in gguf.tensors else None
    if factors is not None:
        raw = _proportion_stated(raw, decoder_of(amap).rope_factors, factors)
    c = target_config(raw, gguf.path, amap, complete=True)
    if factors is not None:
        rope = dict(c.rope)
        for layer_type in decoder_of(amap).rope_factors or sorted(c.rope):
            if layer_type in rope:
                rope[layer_type] = _divided(gguf.path, layer_type, *rope[layer_type], factors)
        c = dataclasses.replace(c, rope=rope)
    return c


# llama.cpp states a frequency it leaves unturned (proportional RoPE) by this factor or more (its converter: 1e30)
UNTURNED = 1e20


def _proportion_stated(raw: dict, layer_types, factors: np.ndarray) -> dict:
    """`raw` with the partial rotary factor of each of `layer_types` whose RoPE is proportional as the file
    states it: the share of its rope_freqs that llama.cpp turns (Gemma 4's converter writes 1 for each
    turned frequency, 1e30 for the others)."""
    params = raw.get("rope_parameters")
    if not isinstance(params, dict):
        return raw
    stated = {t: {**params[t], "partial_rotary_factor": int(np.sum(factors < UNTURNED)) / factors.size}
              for t in layer_types if isinstance(params.get(t), dict) and params[t].get("rope_type") == "proportional"}
    return {**raw, "rope_parameters": {**params, **stated}} if stated else raw


def rope_factors_of(config: dict, amap) -> np.ndarray | None:
    """The rope_freqs tensor llama.cpp's converter writes for a model whose map turns some layer types by it
    (Gemma 4: the global layers' proportional RoPE, 1 for each turned frequency and 1e30 for the others);
    None for another model."""
    from ..ir.rope import rope_parameters

    decoder = decoder_of(amap)
    for layer_type in decoder.rope_factors:
        params = rope_parameters(config, layer_type)
        if params.get("rope_type") == "proportional":
            size = config.get(decoder.head_dim.get(layer_type, "head_dim")) or config["head_dim"]
            turned = int(params.get("partial_rotary_factor", 1.0) * size // 2)
            return np.array([1.0] * turned + [1e30] * (size // 2 - turned), np.float32)
    return None


def _divided(path, layer_type: str, inv_freq: np.ndarray, scaling: float, factors: np.ndarray) -> tuple:
    """A layer type's RoPE table divided by the file's rope_freqs, which must turn the frequencies the
    table turns (a table's 0: a frequency proportional RoPE leaves unturned, which the file states by a
    factor of 1e30; 0 / 1e30 is 0, so such a table is kept exactly)."""
    if factors.size != inv_freq.size:
        raise Gguf2ovError(f"{path}: {ROPE_FACTORS} holds {factors.size} factors for the {inv_freq.size} RoPE "
                           f"frequencies of the {layer_type} layers")
    if np.any((inv_freq == 0) != (factors >= UNTURNED)):
        raise Gguf2ovError(f"{path}: {ROPE_FACTORS} leaves {int(np.sum(factors >= UNTURNED))} of the "
                           f"{factors.size} RoPE frequencies of the {layer_type} layers unturned, and the config "
                           f"{int(np.sum(inv_freq == 0))}: the file's partial rotary factor is not the map's",
                           hint="the file was not written by llama.cpp's converter from a model this map describes")
    return (inv_freq / factors).astype(np.float32), scaling


def wrong_kind_shapes(gguf, plan, c: TargetConfig) -> list[str]:
    """The GGUF tensors whose stored shape is not what the layer kinds read (through the map's ops)."""
    expected = stored_shapes(c)
    return wrong_shapes([(e.gguf_name, gguf.tensors[e.gguf_name].shape, e.hf_name, e.ops) for e in plan if e.hf_name],
                        expected.get)


def target_problems(gguf, amap, config: dict) -> list[str]:
    """What keeps a target GGUF whose tensors fit its map from being built (for `inspect`): its config
    refused, or its shapes not the kinds' (raises the first as one error)."""
    decoder_of(amap)
    plan = amap.tensors.plan(gguf, config)
    wrong = wrong_kind_shapes(gguf, plan, gguf_target_config(gguf, amap, config, plan))
    return [f"wrong shapes: {capped(wrong)}"] if wrong else []

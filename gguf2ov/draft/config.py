"""A DFlash draft's config, validated and typed: what every stage reads of it.

A draft config is Qwen3's plus `dflash_config` (target layer ids, mask token, block size; DFlash 2
adds its convolution geometry and selector). `draft_config()` checks it once, where it enters (the
config.json of a checkpoint or IR folder, or the config a GGUF's metadata builds through the map),
and `DraftConfig` answers what the graph, the checks and the runtime ask of it.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..maps.rules import is_int
from ..names import CONFIG_FILE
from ..ir.rope import rope_table

# What only a DFlash 2 draft has: per-layer convolutions and a candidate selector.
DFLASH2_KEY_MARKERS = ("candidate_selector.", ".attention_conv.", ".mlp_conv.")
DFLASH2_CONFIG_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
# The selector re-ranks the top-k of the draft's logits along a path; GenAI's DFlash runtime takes
# the top-1 of each row, so the selector's tensors stay in the checkpoint and out of the IR.
SELECTOR_PREFIX = "candidate_selector."
SELECTOR_LEFT_OUT = ("The candidate selector stays in the checkpoint, out of the IR: GenAI proposes each row's "
                     "top-1, which is lossless but accepts fewer tokens than the selector's path "
                     "(`gguf2ov drift --target` measures the difference).")

# The map that states a draft's config keys and their defaults (tensor_maps/dflash.yaml).
DRAFT_ARCH = "dflash"
# dflash_config's keys of the embedding scale: the one the draft was trained with (llama.cpp's), and the one the
# embeddings it is fitted to be fed already carry (gguf2ov's: draft/embedding.py)
EMBEDDING_SCALE, EMBEDDING_INPUT_SCALE = "input_embedding_scale", "embedding_input_scale"
# A scale left over within this of 1 (float32 rounding of the same sqrt(hidden) on both sides) is none.
SCALE_ROUNDING = 1e-5

# transformers' Qwen3Config defaults for keys a draft config may leave out
QWEN3_DEFAULTS = {"num_key_value_heads": 32, "head_dim": 128, "rms_norm_eps": 1e-6, "sliding_window": 4096,
                  "max_window_layers": 28, "rope_theta": 10000.0, "max_position_embeddings": 32768}


@dataclass(frozen=True)
class DraftConfig:
    """The parts of a draft's config.json that the export and the checks depend on."""

    raw: dict
    hidden_size: int
    num_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int                   # the map's default when the config leaves it out
    # DFlash 2: taps and channels per group of each dynamic convolution (None for a v1 draft)
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    # what the draft multiplies its block's embeddings (inputs_embeds) by before the first layer: the scale
    # it was trained with (`trained_embedding_scale`) over the one the embeddings it is fitted for already carry
    input_embedding_scale: float = 1.0
    # the scale of the embeddings the draft is fitted to be fed, over the target table's rows: 1 for the rows
    # themselves (GenAI's graft onto an LLM target's draft), a VLM folder's text embeddings model's own
    # (draft/embedding.py)
    embedding_input_scale: float = 1.0

    @property
    def logit_scale(self) -> float | None:
        """The draft's own logit multiplier, if its config has one (DFlash 2's `output_multiplier`)."""
        return draft_value(self.raw, "output_multiplier") or draft_value(self.raw, "logit_scale")

    @property
    def final_logit_softcapping(self) -> float | None:
        return draft_value(self.raw, "final_logit_softcapping")

    @property
    def selector_top_k(self) -> int | None:
        return draft_value(self.raw, "selector_top_k")

    def shape_context(self) -> dict:
        """The config keys the dflash map's shape expressions read, with the defaults applied (a
        checkpoint may leave head_dim out, or keep DFlash 2 keys at the top level)."""
        vocab = self.raw.get("vocab_size")
        dflash = {"target_layer_ids": self.target_layer_ids, "conv_kernel_size": self.conv_kernel_size,
                  "conv_group_size": self.conv_group_size, "selector_rank": self.selector_rank}
        context = {"hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                   "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                   "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
                   "dflash_config": {k: v for k, v in dflash.items() if v is not None}}
        return context | ({"vocab_size": vocab} if is_int(vocab) else {})

    @property
    def trained_embedding_scale(self) -> float:
        """The scale the config states it was trained with: the target table's rows times this are its block's
        embeddings (1 when it states none)."""
        return _embedding_scale(self.raw, "the draft config")

    def fitted(self, input_scale: float) -> "DraftConfig":
        """This config fitted to be fed embeddings that carry `input_scale` (over the target table's rows): it
        multiplies them by what is left of the scale it was trained with, and config.json records the form."""
        raw = {**self.raw, "dflash_config": {**self.raw["dflash_config"], EMBEDDING_INPUT_SCALE: float(input_scale)}}
        return dataclasses.replace(self, raw=raw, embedding_input_scale=float(input_scale),
                                   input_embedding_scale=applied_scale(self.trained_embedding_scale, input_scale))

    @property
    def is_dflash2(self) -> bool:
        return self.conv_kernel_size is not None

    @property
    def num_heads(self) -> int:
        return self.raw["num_attention_heads"]

    # Absent keys take transformers' Qwen3Config defaults, which optimum's class would use.
    @property
    def num_kv_heads(self) -> int:
        return self.raw.get("num_key_value_heads", QWEN3_DEFAULTS["num_key_value_heads"]) or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.raw.get("head_dim") or QWEN3_DEFAULTS["head_dim"]

    @property
    def intermediate_size(self) -> int:
        return self.raw["intermediate_size"]

    @property
    def rms_norm_eps(self) -> float:
        return float(self.raw.get("rms_norm_eps", QWEN3_DEFAULTS["rms_norm_eps"]))

    @property
    def layer_types(self) -> list[str]:
        """Per layer, `sliding_attention` or `full_attention`, as Qwen3Config fills them in."""
        raw = self.raw
        sliding = raw.get("use_sliding_window")
        return raw.get("layer_types") or [
            "sliding_attention" if sliding and i >= raw.get("max_window_layers", QWEN3_DEFAULTS["max_window_layers"])
            else "full_attention" for i in range(self.num_layers)]

    @property
    def layer_windows(self) -> list[int | None]:
        """Per layer, the sliding window (None: full attention), as Qwen3Config and Qwen3Attention set it."""
        raw = self.raw
        window = raw.get("sliding_window", QWEN3_DEFAULTS["sliding_window"]) if raw.get("use_sliding_window") else None
        return [window if t == "sliding_attention" and window else None for t in self.layer_types]

    @property
    def causal_layers(self) -> list[bool]:
        """Per layer, whether a block row sees only the rows before it, as z-lab's reference decides:
        `is_causal` when the config states it, else causal exactly in the sliding layers (its rule
        for v1 drafts, which optimum-intel's class does not follow: it attends both ways)."""
        stated = self.raw.get("is_causal")
        if stated is None:
            return [t == "sliding_attention" for t in self.layer_types]
        return [bool(stated)] * self.num_layers

    def rope(self) -> tuple[np.ndarray, float]:
        """RoPE's inverse frequencies and attention scaling, as transformers' Qwen3RotaryEmbedding makes them
        from Qwen3Config (its defaults for the keys the config leaves out), computed in NumPy (`rope.py`)."""
        return rope_table({**QWEN3_DEFAULTS, **self.raw, "head_dim": self.head_dim}, where="the draft config")


def draft_config(raw: dict, where) -> DraftConfig:
    """Validate a DFlash draft's config (as read from config.json or built from GGUF metadata)."""
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise Gguf2ovError(f"{where} has no dflash_config: not a DFlash draft",
                           hint="export targets with optimum-cli; this command exports DFlash drafts")
    if raw.get("model_type") != "qwen3":
        raise Gguf2ovError(f"{where}: model_type is {raw.get('model_type')!r}; OpenVINO DFlash drafts are "
                           "exported only as model_type 'qwen3'")
    ids = dflash.get("target_layer_ids")
    if not ids or not all(is_int(i) and i >= 0 for i in ids):
        raise Gguf2ovError(f"{where}: dflash_config.target_layer_ids must be a non-empty list of ints >= 0, got {ids!r}")
    if not is_int(dflash.get("mask_token_id")):
        # GenAI refuses a draft without dflash/mask_token_id rt_info.
        raise Gguf2ovError(f"{where}: dflash_config.mask_token_id is missing",
                           hint="set it to the target tokenizer's mask token id")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if not is_int(raw.get(key)) or raw[key] <= 0:
            raise Gguf2ovError(f"{where}: {key} is missing or not a positive integer")
    for key in ("num_key_value_heads", "head_dim"):
        if raw.get(key) is not None and (not is_int(raw[key]) or raw[key] <= 0):
            raise Gguf2ovError(f"{where}: {key} is {raw[key]!r}, not a positive integer")
    if raw.get("is_causal") is not None and not isinstance(raw["is_causal"], bool):
        raise Gguf2ovError(f"{where}: is_causal is {raw['is_causal']!r}, not true or false")
    trained, fed = _embedding_scale(raw, where), _embedding_scale(raw, where, EMBEDDING_INPUT_SCALE)
    if fed <= 0:
        raise Gguf2ovError(f"{where}: dflash_config.{EMBEDDING_INPUT_SCALE} is {fed!r}, not a positive number")
    config = DraftConfig(raw=raw, hidden_size=raw["hidden_size"], num_layers=raw["num_hidden_layers"],
                         target_layer_ids=list(ids), mask_token_id=dflash["mask_token_id"],
                         block_size=block_size(raw), input_embedding_scale=applied_scale(trained, fed),
                         embedding_input_scale=fed, **_dflash2_fields(raw, where))
    if config.num_heads % config.num_kv_heads:
        raise Gguf2ovError(f"{where}: {config.num_heads} attention heads do not split into "
                           f"{config.num_kv_heads} key/value heads")
    return config


def block_size(raw: dict) -> int:
    """A draft config's dflash_config.block_size, or the dflash map's default where it has none."""
    from ..maps.load import config_default

    block = (raw.get("dflash_config") or {}).get("block_size")
    return block if is_int(block) and block > 0 else config_default(DRAFT_ARCH, "dflash_config.block_size")


def draft_value(raw: dict, name: str):
    """A DFlash key as z-lab's reference reads it: under dflash_config first, then at the top level."""
    dflash = raw.get("dflash_config") or {}
    return dflash[name] if name in dflash else raw.get(name)


def _dflash2_fields(raw: dict, where) -> dict:
    """The DFlash 2 part of a config, validated; empty for a v1 draft.

    A config that names any DFlash 2 key (or the DFlash 2 architecture) must give the whole
    convolution geometry: a v1 graph for a DFlash 2 checkpoint runs, attaches and is silently
    accepted less.
    """
    present = [k for k in DFLASH2_CONFIG_KEYS if draft_value(raw, k) is not None]
    if DFLASH2_ARCHITECTURE in (raw.get("architectures") or []):
        present.append(DFLASH2_ARCHITECTURE)
    if not present:
        return {}
    fields = {}
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank"):
        value = draft_value(raw, key)
        if value is None and key == "selector_rank":
            continue
        if not is_int(value) or value <= 0:
            raise Gguf2ovError(f"{where} is a DFlash 2 draft ({', '.join(present)}) but dflash_config.{key} is "
                               f"{value!r}, not a positive integer",
                               hint="a DFlash 2 config gives conv_kernel_size and conv_group_size under dflash_config")
        fields[key] = value
    if raw["hidden_size"] % fields["conv_group_size"]:
        raise Gguf2ovError(f"{where}: hidden_size {raw['hidden_size']} does not split into convolution groups of "
                           f"{fields['conv_group_size']} channels")
    return fields


def _embedding_scale(raw: dict, where, key: str = EMBEDDING_SCALE) -> float:
    """`input_embedding_scale`: the target's table rows times this are what the draft was trained on. A Gemma
    target scales its embedding by sqrt(hidden) inside its model, so a draft trained on that embedding states
    the scale here (llama.cpp's converter writes it as dflash.embedding_scale for v1 and DFlash 2 drafts alike).
    `embedding_input_scale`: what the embeddings the draft is fitted to be fed carry of it (draft/embedding.py).
    1 when the config states none."""
    scale = draft_value(raw, key)
    if scale is None:
        return 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
        raise Gguf2ovError(f"{where}: dflash_config.{key} is {scale!r}, not a finite number")
    return float(scale)


def applied_scale(trained: float, input_scale: float) -> float:
    """What a draft trained with `trained` multiplies embeddings that already carry `input_scale` by: what is
    left, and none (1.0) when the two are the same sqrt(hidden) apart from float32 rounding."""
    left = trained / input_scale
    return 1.0 if abs(left - 1.0) < SCALE_ROUNDING else left


def read_draft_config(checkpoint_dir) -> DraftConfig:
    """Read and validate config.json of a DFlash draft checkpoint (before any heavy work)."""
    from ..hf.checkpoint import read_json_object

    path = Path(checkpoint_dir) / CONFIG_FILE
    if not path.is_file():
        raise Gguf2ovError(f"no {CONFIG_FILE} in {checkpoint_dir}",
                           hint="pass a folder written by `gguf2ov convert` or a DFlash draft checkpoint")
    return draft_config(read_json_object(path), path)



def hf_config(draft: DraftConfig):
    """A transformers Qwen3Config for the draft (never remote code)."""
    from transformers import Qwen3Config

    raw = {k: v for k, v in draft.raw.items() if k not in ("auto_map", "transformers_version")}
    config = Qwen3Config.from_dict(raw)
    # optimum's Qwen3OpenVINOConfig switches to the DFlash inputs and writes the dflash rt_info only
    # for this architecture name; z-lab checkpoints already carry it.
    config.architectures = ["DFlashDraftModel"]
    config.tie_word_embeddings = False
    config.use_cache = True
    return config

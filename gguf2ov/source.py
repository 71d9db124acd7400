"""A DFlash draft opened once, from a GGUF file or a checkpoint folder, for every stage of a command.

`open_draft()` reads and validates the config, checks the tensor names and shapes strictly against
the draft model, and then hands out one weight at a time: float32 values (dequantized from the
memory-mapped GGUF, or read from the memory-mapped safetensors), or the GGUF's raw quantized
bytes for the `gguf` variant. Nothing holds the whole draft in memory, so a 1-3 B draft is
exported, verified and measured in bounded memory, and `run`/`drift` open the file once.
"""

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import Gguf2ovError
from .map_rules import is_int
from .names import CONFIG_FILE

# Tensors a draft may carry that the OpenVINO draft does not use: GenAI feeds the target's
# embeddings in and grafts the target's lm_head on `last_hidden_state`.
IGNORED_KEYS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")

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

# transformers' Qwen3Config defaults for keys a draft config may leave out
QWEN3_DEFAULTS = {"num_key_value_heads": 32, "head_dim": 128, "rms_norm_eps": 1e-6, "sliding_window": 4096,
                  "max_window_layers": 28, "rope_theta": 10000.0}


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
    # multiplies the block's token embeddings before the first layer (DFlash 2's optional key)
    input_embedding_scale: float = 1.0

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
        """RoPE's inverse frequencies and attention scaling, as transformers' Qwen3RotaryEmbedding makes them.

        The default RoPE (every DFlash draft so far) is computed here; another type asks transformers,
        whose import costs 10 s and 400 MB that an export otherwise does without.
        """
        params = dict(self.raw.get("rope_parameters") or {})
        scaling = self.raw.get("rope_scaling")
        if params.get("rope_type", "default") == "default" and not scaling and params.get("partial_rotary_factor", 1.0) == 1.0:
            base = float(params.get("rope_theta", self.raw.get("rope_theta", QWEN3_DEFAULTS["rope_theta"])))
            exponents = np.arange(0, self.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(self.head_dim)
            return (np.float32(1.0) / (np.float32(base) ** exponents)).astype(np.float32), 1.0
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        rotary = Qwen3RotaryEmbedding(hf_config(self))
        return rotary.inv_freq.numpy().astype(np.float32), float(rotary.attention_scaling)


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
    config = DraftConfig(raw=raw, hidden_size=raw["hidden_size"], num_layers=raw["num_hidden_layers"],
                         target_layer_ids=list(ids), mask_token_id=dflash["mask_token_id"],
                         block_size=block_size(raw), **_dflash2_fields(raw, where))
    if config.num_heads % config.num_kv_heads:
        raise Gguf2ovError(f"{where}: {config.num_heads} attention heads do not split into "
                           f"{config.num_kv_heads} key/value heads")
    return config


def block_size(raw: dict) -> int:
    """A draft config's dflash_config.block_size, or the dflash map's default where it has none."""
    from .maps import config_default

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
    scale = draft_value(raw, "input_embedding_scale")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
            raise Gguf2ovError(f"{where}: dflash_config.input_embedding_scale is {scale!r}, not a finite number")
        fields["input_embedding_scale"] = float(scale)
    return fields


def read_draft_config(checkpoint_dir) -> DraftConfig:
    """Read and validate config.json of a DFlash draft checkpoint (before any heavy work)."""
    from .checkpoint import read_json_object

    path = Path(checkpoint_dir) / CONFIG_FILE
    if not path.is_file():
        raise Gguf2ovError(f"no {CONFIG_FILE} in {checkpoint_dir}",
                           hint="pass a folder written by `gguf2ov convert` or a DFlash draft checkpoint")
    return draft_config(read_json_object(path), path)



def draft_tensor_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the draft IR is built from, with its shape, in the graph's order (NNCF's too).

    A v1 draft is optimum-intel's `Qwen3DFlashForCausalLM`; a DFlash 2 draft adds the two dynamic
    convolutions of each layer.
    """
    h, hd, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    shapes = {"fc.weight": (h, len(config.target_layer_ids) * h), "hidden_norm.weight": (h,)}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        attn, mlp = _conv_shapes(config, p + "attention_conv."), _conv_shapes(config, p + "mlp_conv.")
        shapes.update({p + "input_layernorm.weight": (h,), **attn,
                       p + "self_attn.q_proj.weight": (q, h), p + "self_attn.q_norm.weight": (hd,),
                       p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_norm.weight": (hd,),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                       p + "post_attention_layernorm.weight": (h,), **mlp,
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
    shapes["norm.weight"] = (h,)
    return shapes


def _conv_shapes(config: DraftConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    if not config.is_dflash2:
        return {}
    ks, h = config.conv_kernel_size, config.hidden_size
    return {prefix + "base_kernel": (2, ks, h),
            prefix + "kernel_projection.weight": (2 * ks * (h // config.conv_group_size), h)}


def selector_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """The candidate selector's tensors a DFlash 2 checkpoint may carry (not part of the IR)."""
    rank, vocab = config.selector_rank, config.raw.get("vocab_size")
    if not config.is_dflash2 or rank is None:
        return {}
    vocab = vocab if is_int(vocab) else None  # a GGUF without a tokenizer does not say
    return {SELECTOR_PREFIX + "hidden_projection.weight": (rank, config.hidden_size),
            SELECTOR_PREFIX + "predecessor_codebook": (vocab, rank),
            SELECTOR_PREFIX + "successor_codebook": (vocab, rank)}


def check_keys(expected: dict, found: dict, where, kept: dict | None = None) -> list[str]:
    """Compare names and shapes exactly; return the found keys the IR does not use.

    `expected` and `found` map names to shapes; `kept` names tensors a checkpoint may carry beside
    the IR's (a DFlash 2 selector), checked by shape when present (None: any size). Any missing, unexpected or
    mis-shaped tensor is one error naming them, because loading with strict=False would keep
    random weights.
    """
    kept = kept or {}
    ignored = sorted(k for k in found if k in IGNORED_KEYS or k in kept)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected) - set(ignored))
    known = {**expected, **kept}
    shapes = sorted(k for k in set(known) & set(found) if not _fits(found[k], known[k]))
    if not (missing or unexpected or shapes):
        return ignored
    # the convolutions first: they are what a v1 graph would lose
    dflash2 = sorted((k for k in unexpected if any(m in f".{k}" for m in DFLASH2_KEY_MARKERS)),
                     key=lambda k: k.startswith(SELECTOR_PREFIX))
    if dflash2 and not kept:
        # The silent failure DFlash 2 invites: a v1 graph drops the convolutions and is accepted less.
        raise Gguf2ovError(
            f"{where} holds DFlash 2 tensors ({_some(dflash2, 3)}) but its config gives no convolution geometry: "
            "exported as a DFlash v1 draft it would drop them, run without an error and be accepted less",
            hint="a DFlash 2 config sets dflash_config.conv_kernel_size and conv_group_size "
                 "(GGUF: dflash.conv_kernel_size, dflash.conv_group_size)")
    prefix = _common_prefix(unexpected, missing)
    parts = _mismatch_parts(missing, unexpected, [f"{k} {tuple(found[k])} != {tuple(known[k])}" for k in shapes])
    if prefix:
        # The silent failure: strict=False ignores these and keeps random weights.
        raise Gguf2ovError(
            f"{where}: checkpoint tensor names carry an extra {prefix!r} prefix ({_some(unexpected)}); "
            "loading them with strict=False would silently keep random weights",
            hint=f"strip the {prefix!r} prefix from the tensor names (or fix the tensor map) and convert again",
        )
    hint = "the checkpoint must hold exactly the tensors of optimum-intel's Qwen3DFlashForCausalLM"
    if any(".attention_conv." in k or ".mlp_conv." in k for k in missing + shapes):
        hint = "a DFlash 2 draft has both convolutions in every layer, shaped by conv_kernel_size and conv_group_size"
    if "fc.weight" in shapes:
        hint = "fc.weight must be [hidden_size, len(target_layer_ids) * hidden_size]: check target_layer_ids"
    raise Gguf2ovError(f"{where}: checkpoint tensors do not match the draft model: " + "; ".join(parts), hint=hint)


def tensor_mismatch(expected: dict, found: dict) -> str:
    """The missing, unexpected and mis-shaped tensors of `found` against `expected` (name -> shape),
    as one phrase; empty when they agree exactly."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [f"{k} {tuple(found[k])} != {tuple(expected[k])}" for k in sorted(set(expected) & set(found))
              if not _fits(found[k], expected[k])]
    return "; ".join(_mismatch_parts(missing, unexpected, shapes))


def _mismatch_parts(missing: list[str], unexpected: list[str], shapes: list[str]) -> list[str]:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_some(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({_some(unexpected)})")
    if shapes:
        parts.append("shape mismatch (" + _some(shapes) + ")")
    return parts


def _fits(shape, expected) -> bool:
    """`shape` equals `expected`, where a None in `expected` takes any size."""
    return len(shape) == len(expected) and all(e is None or int(n) == e for n, e in zip(shape, expected))


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


# --- the opened source ----------------------------------------------------------------------------


class TensorSource:
    """A model's tensors read one at a time, from a GGUF through its map or from a checkpoint folder.

    `kind` is "gguf" or "checkpoint". Subclasses (DraftSource, target_source.TargetSource) add the
    config and `expected`, the tensors their graph reads.
    """

    embeddings: tuple[str, ...] = ()  # the tables an embedding Gather reads
    last_matmul_shared: bool = False  # the last MatMul re-uses an earlier weight (a tied lm_head)

    def __init__(self, path: Path, kind: str, mapped=None, checkpoint=None):
        self.path, self.kind = path, kind
        self._mapped = mapped
        self._checkpoint = checkpoint
        self._entries = {e.hf_name: e for e in mapped.plan if e.hf_name} if mapped is not None else {}

    @property
    def gguf(self):
        """The opened GgufFile of a GGUF source (None for a checkpoint)."""
        return self._mapped.gguf if self._mapped is not None else None

    @cached_property
    def sha256(self) -> str:
        if self._mapped is not None:
            return self._mapped.gguf.sha256  # shared with every stage that opened the same file
        from .provenance import sha256_path

        return sha256_path(self.path)

    def f32(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch shape: dequantized with the map's ops, or read from safetensors."""
        if self._mapped is not None:
            from .map_rules import apply_ops

            entry = self._entries[name]
            x = self._mapped.gguf.load(entry.gguf_name)
            return apply_ops(entry.ops, x, self._mapped.config) if entry.ops else x
        return self._checkpoint.load(name)

    def f32_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop of the tensor as float32: only those rows are read (dequantized), unless
        a map op rearranges the whole tensor."""
        if self._mapped is not None:
            entry = self._entries[name]
            if entry.ops:
                return self.f32(name)[start:stop]
            return self._mapped.gguf.load_rows(entry.gguf_name, start, stop)
        return self._checkpoint.load_rows(name, start, stop)

    def quantized(self, name: str):
        """(raw memory-mapped bytes, GGML type) of a GGUF tensor the file stores block-quantized, else None.

        A tensor the map changes after dequantizing has no grid that matches its values, unless the
        map's ops only move whole rows (llama's q/k un-permutation): a row's blocks are its own, so
        the same op moves the stored rows. Those are returned as a callable that makes the moved
        copy when it is called.
        """
        from .map_rules import apply_ops, moves_rows_only

        entry = self._entries.get(name)
        if entry is None:
            return None
        raw = self._mapped.gguf.raw(entry.gguf_name)
        if not entry.ops:
            return raw, entry.qtype
        if not moves_rows_only(entry.ops):
            return None
        config = self._mapped.config
        return (lambda: apply_ops(entry.ops, raw, config)), entry.qtype


class DraftSource(TensorSource):
    """A validated draft whose weights are read one tensor at a time.

    `kind` is "gguf" or "checkpoint"; `config` the DraftConfig; `expected` the tensors the draft
    model uses (name -> shape); `ignored` the tensors present but unused (embedding, lm_head, d2t).
    """

    def __init__(self, path: Path, kind: str, config: DraftConfig, found: dict, mapped=None, checkpoint=None):
        super().__init__(path, kind, mapped, checkpoint)
        self.config = config
        self.expected = draft_tensor_shapes(config)
        self.ignored = check_keys(self.expected, found, path, kept=selector_shapes(config))

    @property
    def names(self) -> list[str]:
        return list(self.expected)

    def describe(self) -> str:
        c = self.config
        return (f"{self.path.name} ({self.kind}): {c.num_layers} layers, hidden {c.hidden_size}, "
                f"{sum(int(np.prod(s)) for s in self.expected.values()) / 1e6:.1f} M parameters")


def is_gguf(path: Path) -> bool:
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def open_draft(path, map_path=None, target_layer_offset: int | None = None) -> DraftSource:
    """Open a dflash GGUF (a path, or a GgufFile already opened) or a draft checkpoint folder,
    validated and ready to stream weights."""
    from .read import GgufFile

    gguf = path if isinstance(path, GgufFile) else None
    path = Path(gguf.path if gguf else path)
    if not path.exists():
        raise Gguf2ovError(f"{path} does not exist")
    if gguf or is_gguf(path):
        from .maps import open_mapped

        mapped = open_mapped(gguf or path, map_path, target_layer_offset)
        config = draft_config(mapped.config, path)
        found = {e.hf_name: e.shape for e in mapped.plan if e.hf_name is not None}
        return DraftSource(path, "gguf", config, found, mapped=mapped)
    if not path.is_dir():
        raise Gguf2ovError(f"{path} is neither a GGUF file nor a checkpoint folder")
    if target_layer_offset is not None:
        raise Gguf2ovError("--target-layer-offset applies to a GGUF source only",
                           hint="a checkpoint's config.json already holds the target layer ids")
    config = read_draft_config(path)
    from .checkpoint import Checkpoint

    checkpoint = Checkpoint(path)  # memory-mapped safetensors, read one tensor at a time
    return DraftSource(path, "checkpoint", config, dict(checkpoint.shapes), checkpoint=checkpoint)

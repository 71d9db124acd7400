"""A DFlash draft opened once, from a GGUF file or a checkpoint folder, for every stage of a command.

`open_draft_gguf()` and `open_draft_checkpoint()` read and validate the config, checks the tensor names and shapes strictly against
the draft model, and then hands out one weight at a time: float32 values (dequantized from the
memory-mapped GGUF, or read from the memory-mapped safetensors), or the GGUF's raw quantized
bytes for the `gguf` variant. Nothing holds the whole draft in memory, so a 1-3 B draft is
exported, verified and measured in bounded memory, and `run`/`drift` open the file once.
"""

from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..ir.tensors import TensorSource, fits, mismatch_parts, some
from .config import DFLASH2_KEY_MARKERS, DRAFT_ARCH, SELECTOR_PREFIX, DraftConfig, draft_config, read_draft_config

# Tensors a draft may carry that the OpenVINO draft does not use: GenAI feeds the target's
# embeddings in and grafts the target's lm_head on `last_hidden_state`.
IGNORED_KEYS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")


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
    shapes = sorted(k for k in set(known) & set(found) if not fits(found[k], known[k]))
    if not (missing or unexpected or shapes):
        return ignored
    # the convolutions first: they are what a v1 graph would lose
    dflash2 = sorted((k for k in unexpected if any(m in f".{k}" for m in DFLASH2_KEY_MARKERS)),
                     key=lambda k: k.startswith(SELECTOR_PREFIX))
    if dflash2 and not kept:
        # The silent failure DFlash 2 invites: a v1 graph drops the convolutions and is accepted less.
        raise Gguf2ovError(
            f"{where} holds DFlash 2 tensors ({some(dflash2, 3)}) but its config gives no convolution geometry: "
            "exported as a DFlash v1 draft it would drop them, run without an error and be accepted less",
            hint="a DFlash 2 config sets dflash_config.conv_kernel_size and conv_group_size "
                 "(GGUF: dflash.conv_kernel_size, dflash.conv_group_size)")
    prefix = _common_prefix(unexpected, missing)
    parts = mismatch_parts(missing, unexpected, [f"{k} {tuple(found[k])} != {tuple(known[k])}" for k in shapes])
    if prefix:
        # The silent failure: strict=False ignores these and keeps random weights.
        raise Gguf2ovError(
            f"{where}: checkpoint tensor names carry an extra {prefix!r} prefix ({some(unexpected)}); "
            "loading them with strict=False would silently keep random weights",
            hint=f"strip the {prefix!r} prefix from the tensor names (or fix the tensor map) and convert again",
        )
    hint = "the checkpoint must hold exactly the tensors of optimum-intel's Qwen3DFlashForCausalLM"
    if any(".attention_conv." in k or ".mlp_conv." in k for k in missing + shapes):
        hint = "a DFlash 2 draft has both convolutions in every layer, shaped by conv_kernel_size and conv_group_size"
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


# --- the opened source ----------------------------------------------------------------------------


def draft_layout(config: DraftConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """The draft's tensors as the dflash map states them (names and shapes), in the order the graph
    asks for them (the order NNCF walks the weights in), and apart from them the tensors a
    checkpoint may carry that the IR leaves out (a DFlash 2 selector; None in a shape: any size)."""
    from ..maps.load import load_map
    from .graph import tensor_order

    groups = {"dflash2"} if config.is_dflash2 else ()
    shapes = load_map(DRAFT_ARCH).shapes.hf_shapes(config.shape_context(), groups=groups)
    order = tensor_order(config, shapes)
    kept = {n: s for n, s in shapes.items() if n not in order}
    if unused := [n for n in kept if not n.startswith(SELECTOR_PREFIX)]:
        raise Gguf2ovError(f"the dflash map states tensors the draft graph does not use: {some(unused)}")
    return {n: shapes[n] for n in order}, kept


class DraftSource(TensorSource):
    """A validated draft whose weights are read one tensor at a time.

    `config` is the DraftConfig; `expected` the tensors the draft model uses (name -> shape, in the
    graph's order); `ignored` the tensors present but unused (embedding, lm_head, d2t, a DFlash 2
    selector). For a GGUF, `target_layer_offset` is the offset its target layer ids were read with
    and `offset_decision` the tap scan that chose it, if one did.
    """

    def __init__(self, path: Path, kind: str, config: DraftConfig, found: dict, mapped=None, checkpoint=None,
                 target_layer_offset: int | None = None, offset_decision=None):
        super().__init__(path, kind, mapped, checkpoint)
        self.config = config
        self.expected, kept = draft_layout(config)
        self.ignored = check_keys(self.expected, found, path, kept=kept)
        self.target_layer_offset, self.offset_decision = target_layer_offset, offset_decision

    @property
    def names(self) -> list[str]:
        return list(self.expected)

    def record(self) -> dict:
        """What provenance keeps of how the draft was read: its kind, map and target layer offset."""
        record = {"source_kind": self.kind, "target_layer_offset": self.target_layer_offset}
        if self._mapped is not None:
            record["map"] = str(self._mapped.amap.path)
        if self.offset_decision is not None:
            record["target_layer_offset_measured"] = self.offset_decision.record()
        return record

    def describe(self) -> str:
        c = self.config
        return (f"{self.path.name} ({self.kind}): {c.num_layers} layers, hidden {c.hidden_size}, "
                f"{sum(int(np.prod(s)) for s in self.expected.values()) / 1e6:.1f} M parameters")


def open_draft_gguf(gguf, map_path=None, target_layer_offset: int | None = None, offset_decision=None) -> DraftSource:
    """Open a dflash GGUF (an opened, memory-mapped GgufFile) through its map, validated and ready to
    stream weights. `offset_decision`: the tap scan that chose the offset."""
    from ..maps.load import open_mapped

    mapped = open_mapped(gguf, map_path, target_layer_offset)
    config = draft_config(mapped.config, gguf.path)
    found = {e.hf_name: e.shape for e in mapped.plan if e.hf_name is not None}
    applied = target_layer_offset if target_layer_offset is not None else \
        mapped.amap.metadata.flag_add("target_layer_offset")
    return DraftSource(gguf.path, "gguf", config, found, mapped=mapped, target_layer_offset=applied,
                       offset_decision=offset_decision)


def open_draft_checkpoint(path: Path) -> DraftSource:
    """Open a draft checkpoint folder, validated and ready to stream weights."""
    from ..hf.checkpoint import Checkpoint

    config = read_draft_config(path)
    checkpoint = Checkpoint(path)  # memory-mapped safetensors, read one tensor at a time
    return DraftSource(path, "checkpoint", config, dict(checkpoint.shapes), checkpoint=checkpoint)

"""A DFlash draft opened once, from a GGUF file or a checkpoint folder, for every stage of a command.

`open_draft()` reads and validates the config, checks the tensor names and shapes strictly against
the draft model, and then hands out one weight at a time: float32 values (dequantized from the
memory-mapped GGUF, or read from the memory-mapped safetensors), or the GGUF's raw quantized
bytes for the `gguf` variant. Nothing holds the whole draft in memory, so a 1-3 B draft is
exported, verified and measured in bounded memory, and `run`/`drift` open the file once.
"""

from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
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


# --- the opened source ----------------------------------------------------------------------------


def draft_layout(config: DraftConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """The draft's tensors as the dflash map states them (names and shapes), in the order the graph
    asks for them (the order NNCF walks the weights in), and apart from them the tensors a
    checkpoint may carry that the IR leaves out (a DFlash 2 selector; None in a shape: any size)."""
    from ..maps.load import load_map
    from .draft_graph import tensor_order

    shapes = load_map(DRAFT_ARCH).hf_shapes(config.shape_context(), groups={"dflash2"} if config.is_dflash2 else ())
    order = tensor_order(config, shapes)
    kept = {n: s for n, s in shapes.items() if n not in order}
    if unused := [n for n in kept if not n.startswith(SELECTOR_PREFIX)]:
        raise Gguf2ovError(f"the dflash map states tensors the draft graph does not use: {_some(unused)}")
    return {n: shapes[n] for n in order}, kept


class TensorSource:
    """A model's tensors read one at a time, from a GGUF through its map or from a checkpoint folder.

    `kind` is "gguf" or "checkpoint". Subclasses (DraftSource, target_source.TargetSource) add the
    config and `expected`, the tensors their graph reads. The last tensor read is kept: drift's
    weight meter reads the tensor a variant has just made from it (one tensor held at most).
    """

    embeddings: tuple[str, ...] = ()  # the tables an embedding Gather reads
    last_matmul_shared: bool = False  # the last MatMul re-uses an earlier weight (a tied lm_head)

    def __init__(self, path: Path, kind: str, mapped=None, checkpoint=None):
        self.path, self.kind = path, kind
        self._mapped = mapped
        self._checkpoint = checkpoint
        self._entries = {e.hf_name: e for e in mapped.plan if e.hf_name} if mapped is not None else {}
        self._last = None

    @property
    def gguf(self):
        """The opened GgufFile of a GGUF source (None for a checkpoint)."""
        return self._mapped.gguf if self._mapped is not None else None

    @property
    def origin(self):
        """Where a GGUF came from when it came from the hub (its repository, revision and file)."""
        return getattr(self.gguf, "origin", None)

    @cached_property
    def sha256(self) -> str:
        if self._mapped is not None:
            return self._mapped.gguf.sha256  # shared with every stage that opened the same file
        from ..provenance import sha256_path

        return sha256_path(self.path)

    def f32(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch shape: dequantized with the map's ops, or read from safetensors."""
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        if self._mapped is not None:
            from ..maps.rules import apply_ops

            entry = self._entries[name]
            x = self._mapped.gguf.load(entry.gguf_name)
            x = apply_ops(entry.ops, x, self._mapped.config) if entry.ops else x
        else:
            x = self._checkpoint.load(name)
        x.flags.writeable = False  # shared with the next reader of the same tensor
        self._last = (name, x)
        return x

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
        from ..maps.rules import apply_ops, moves_rows_only

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


def open_draft(path, map_path=None, target_layer_offset: int | None = None, offset_decision=None) -> DraftSource:
    """Open a dflash GGUF (a path, or a GgufFile already opened) or a draft checkpoint folder,
    validated and ready to stream weights. `offset_decision`: the tap scan that chose the offset."""
    from ..gguf.read import GgufFile, is_gguf_file

    gguf = path if isinstance(path, GgufFile) else None
    path = Path(gguf.path if gguf else path)
    if not path.exists():
        raise Gguf2ovError(f"{path} does not exist")
    if gguf or is_gguf_file(path):
        from ..maps.load import open_mapped

        mapped = open_mapped(gguf or path, map_path, target_layer_offset)
        config = draft_config(mapped.config, path)
        found = {e.hf_name: e.shape for e in mapped.plan if e.hf_name is not None}
        applied = target_layer_offset if target_layer_offset is not None else mapped.amap.flag_add("target_layer_offset")
        return DraftSource(path, "gguf", config, found, mapped=mapped, target_layer_offset=applied,
                           offset_decision=offset_decision)
    if not path.is_dir():
        raise Gguf2ovError(f"{path} is neither a GGUF file nor a checkpoint folder")
    if target_layer_offset is not None:
        raise Gguf2ovError("--target-layer-offset applies to a GGUF source only",
                           hint="a checkpoint's config.json already holds the target layer ids")
    config = read_draft_config(path)
    from ..hf.checkpoint import Checkpoint

    checkpoint = Checkpoint(path)  # memory-mapped safetensors, read one tensor at a time
    return DraftSource(path, "checkpoint", config, dict(checkpoint.shapes), checkpoint=checkpoint)

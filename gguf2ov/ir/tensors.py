"""A model's tensors read one at a time, from a GGUF through its map or from a checkpoint folder:
what both the draft (`draft/source.py`) and the target (`targets/source.py`) are opened as, and the
one strict comparison of the tensors a file holds with those a graph reads.
"""

from functools import cached_property
from pathlib import Path

import numpy as np

from ..provenance import opened_record, sha256_path, source_record


def tensor_mismatch(expected: dict, found: dict) -> str:
    """The missing, unexpected and mis-shaped tensors of `found` against `expected` (name -> shape),
    as one phrase; empty when they agree exactly."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [f"{k} {tuple(found[k])} != {tuple(expected[k])}" for k in sorted(set(expected) & set(found))
              if not fits(found[k], expected[k])]
    return "; ".join(mismatch_parts(missing, unexpected, shapes))


def mismatch_parts(missing: list[str], unexpected: list[str], shapes: list[str]) -> list[str]:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({some(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({some(unexpected)})")
    if shapes:
        parts.append("shape mismatch (" + some(shapes) + ")")
    return parts


def fits(shape, expected) -> bool:
    """`shape` equals `expected`, where a None in `expected` takes any size."""
    return len(shape) == len(expected) and all(e is None or int(n) == e for n, e in zip(shape, expected))


def some(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")


class TensorSource:
    """A model's tensors read one at a time, from a GGUF through its map or from a checkpoint folder.

    `kind` is "gguf" or "checkpoint". Subclasses (draft.source.DraftSource, target.source.TargetSource) add the
    config and `expected`, the tensors their graph reads. The last tensor read is kept: drift's
    weight meter reads the tensor a variant has just made from it (one tensor held at most).
    """

    embeddings: tuple[str, ...] = ()  # the tables an embedding Gather reads
    last_matmul_shared: bool = False  # the last MatMul re-uses an earlier weight (a tied lm_head)
    int8_weights: dict = {}           # {weight: why} that NNCF's int4 modes keep in int8
    kept: tuple[str, ...] = ()  # weights every format keeps in float32 (a mixture of experts' router)
    batched: tuple[str, ...] = ()  # [E, N, K] weights of batched MatMuls (experts), compressed like Linears

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
        """Where a GGUF came from when it came from the hub (its `gguf.hub.HubFile`; None otherwise)."""
        return self.gguf.origin if self.gguf is not None else None

    def where(self, name: str) -> str:
        """A tensor as messages name it: its name, and for a GGUF source the file's tensor and type."""
        entry = self._entries.get(name)
        return f"{name} (from {entry.gguf_name}, {entry.qtype.name})" if entry is not None else name

    @cached_property
    def sha256(self) -> str:
        if self._mapped is not None:
            return self._mapped.gguf.sha256  # shared with every stage that opened the same file
        return sha256_path(self.path)

    def f32(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch shape: dequantized with the map's ops, or read from safetensors."""
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        if self._mapped is not None:
            from ..maps.rules import apply_ops

            entry = self._entries[name]
            x = self._mapped.gguf.load(entry.gguf_name)
            x = apply_ops(entry.ops, x, self._mapped.config, where=self.where(name)) if entry.ops else x
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

    def quantized_columns(self, name: str):
        """(raw memory-mapped bytes, GGML type, input order) of a GGUF tensor whose map ops only move
        whole columns (qwen35's tiled value heads in ssm_out), else None. A block spans columns, so the
        stored grid keeps the file's column order; the IR multiplies it by the inputs taken in
        `input order` (`x[..., order]`), which is the same product."""
        from ..maps.rules import columns_moved

        entry = self._entries.get(name)
        if entry is None or not entry.ops or len(entry.shape) != 2:
            return None
        order = columns_moved(entry.ops, self._mapped.config, entry.shape[1])
        if order is None:
            return None
        return self._mapped.gguf.raw(entry.gguf_name), entry.qtype, np.argsort(order)


@source_record.register
def _tensor_source_record(source: TensorSource) -> dict:
    return opened_record(source.path, source.sha256, source.origin)

"""Other layouts a source may store a tensor of the target graph in.

The graph reads one name per tensor (`layers/` states them): a mixture-of-experts layer's experts
as one [E, N, K] tensor each, `mlp.experts.gate_proj`, `up_proj` and `down_proj`. Sources store them
otherwise: a Hugging Face checkpoint as one 2-D tensor per expert (`mlp.experts.{e}.gate_proj.weight`,
what transformers 5.5.4's save_pretrained writes for qwen3_moe, as the hub's checkpoints do), or gate
and up fused along the rows (`mlp.experts.gate_up_proj` [E, 2I, K], what it writes for qwen3_5_moe,
and llama.cpp's `ffn_gate_up_exps`). A kind names the layouts it knows (`layouts(c, i)`), and the
target source (`source.py`) hands out the graph's tensor from whichever the source holds: a stack of
the experts' tensors, or whole rows of the fused one (for a GGUF, the rows' own blocks: a block never
spans two rows, so nothing is requantized).

gpt-oss stores its experts otherwise again (`layers/clamped_moe.py`): transformers' checkpoint as
[E, K, N] (`Transposed`), gate and up fused with their rows interleaved (gate, up, gate, ...);
llama.cpp's file as [E, N, K] with gate and up apart, which the graph's fused tensor takes row by
row in turn (`Interleaved`; for a GGUF, the rows' own blocks, so nothing is requantized).
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stack:
    """The tensor is `parts` (one per expert, each `part_shape`) stacked along a new first axis."""

    parts: tuple[str, ...]
    part_shape: tuple[int, ...]

    def shape(self, found: dict) -> tuple[int, ...] | str:
        """The stacked shape, or what is wrong with the parts the source holds."""
        bad = [f"{p} {tuple(found[p])}" for p in self.parts if tuple(found[p]) != tuple(self.part_shape)]
        if bad:
            return f"{bad[0]} != {tuple(self.part_shape)}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        return (len(self.parts), *self.part_shape)

    def stored_shapes(self) -> dict[str, tuple[int, ...]]:
        return {p: tuple(self.part_shape) for p in self.parts}

    def rows(self, read_whole, read_rows, start: int, stop: int) -> np.ndarray:
        return np.stack([read_whole(p) for p in self.parts[start:stop]])

    def quantized(self, stored):
        return None  # a checkpoint's experts: no grid to carry


@dataclass(frozen=True)
class Split:
    """The tensor is rows start..stop (along axis 1) of `fused`, which must be `fused_shape`."""

    fused: str
    fused_shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def parts(self) -> tuple[str, ...]:
        return (self.fused,)

    def shape(self, found: dict) -> tuple[int, ...] | str:
        shape = tuple(found[self.fused])
        if shape != tuple(self.fused_shape):
            return f"{self.fused} {shape} != {tuple(self.fused_shape)}"
        return (shape[0], self.stop - self.start, *shape[2:])

    def stored_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.fused: tuple(self.fused_shape)}

    def rows(self, read_whole, read_rows, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(read_rows(self.fused, start, stop)[:, self.start:self.stop])

    def quantized(self, stored):
        """(raw bytes, type) of these rows of the fused tensor's stored blocks, or None."""
        found = stored(self.fused)
        if found is None or callable(found[0]):
            return None
        raw, qtype = found
        return (lambda: np.ascontiguousarray(raw[:, self.start:self.stop])), qtype


@dataclass(frozen=True)
class Transposed:
    """The tensor is `stored` ([E, K, N], `stored_shape`) with its last two axes swapped."""

    stored: str
    stored_shape: tuple[int, ...]

    @property
    def parts(self) -> tuple[str, ...]:
        return (self.stored,)

    def shape(self, found: dict) -> tuple[int, ...] | str:
        shape = tuple(found[self.stored])
        if shape != tuple(self.stored_shape):
            return f"{self.stored} {shape} != {tuple(self.stored_shape)}"
        return (*shape[:-2], shape[-1], shape[-2])

    def stored_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.stored: tuple(self.stored_shape)}

    def rows(self, read_whole, read_rows, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(read_rows(self.stored, start, stop).swapaxes(-1, -2))

    def quantized(self, stored):
        return None  # a checkpoint's experts: no grid to carry


@dataclass(frozen=True)
class Interleaved:
    """The tensor's rows along axis 1 are the rows of `parts` (each `part_shape`) in turn: a's row 0, b's
    row 0, a's row 1, ..."""

    parts: tuple[str, ...]
    part_shape: tuple[int, ...]

    def shape(self, found: dict) -> tuple[int, ...] | str:
        bad = [f"{p} {tuple(found[p])}" for p in self.parts if tuple(found[p]) != tuple(self.part_shape)]
        if bad:
            return f"{bad[0]} != {tuple(self.part_shape)}"
        e, n, *rest = self.part_shape
        return (e, len(self.parts) * n, *rest)

    def stored_shapes(self) -> dict[str, tuple[int, ...]]:
        return {p: tuple(self.part_shape) for p in self.parts}

    def _interleave(self, arrays) -> np.ndarray:
        e, n, *rest = arrays[0].shape
        return np.ascontiguousarray(np.stack(arrays, axis=2).reshape(e, len(arrays) * n, *rest))

    def rows(self, read_whole, read_rows, start: int, stop: int) -> np.ndarray:
        return self._interleave([read_rows(p, start, stop) for p in self.parts])

    def quantized(self, stored):
        """(raw bytes, type) of the parts' stored blocks interleaved row by row, or None (a part not
        quantized, or the parts of different types)."""
        found = [stored(p) for p in self.parts]
        if any(f is None or callable(f[0]) for f in found) or len({f[1] for f in found}) != 1:
            return None
        return (lambda: self._interleave([f[0] for f in found])), found[0][1]


def resolve(expected: dict, found: dict, layouts: dict) -> tuple[dict, dict, list[str]]:
    """(the recipe of each expected tensor the source holds in another layout, the source's tensors as
    the graph names them, what is wrong with the parts): `found` with each recipe's parts replaced by the
    tensor they make, so that the strict comparison with `expected` names what is missing or extra."""
    recipes, consumed, problems, view = {}, set(), [], {}
    for name, alternatives in layouts.items():
        if name in found:
            continue
        for recipe in alternatives:
            if all(p in found for p in recipe.parts):
                shape = recipe.shape(found)
                if isinstance(shape, str):
                    problems.append(shape)
                    break
                recipes[name] = recipe
                consumed.update(recipe.parts)
                view[name] = shape
                break
    shared = {p for r in recipes.values() for p in r.parts}
    view.update({k: v for k, v in found.items() if k not in shared and k not in consumed})
    return recipes, view, problems

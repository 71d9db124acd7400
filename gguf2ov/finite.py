"""NaN and Inf in the weights a command writes: counted where the values are made, refused by name.

A GGUF is untrusted input: a broken block scale, a tensor offset into other data or a flipped
alignment makes NaN or Inf weights, and a model built from them computes NaN on every token while
every structural check passes. So each writer (a checkpoint's safetensors, an IR's constants)
counts the non-finite values of what it has just made, chunk by chunk, and fails naming the tensor;
`--allow-nonfinite` writes them anyway, counted in the report, with a warning.
"""

import numpy as np

from .errors import Gguf2ovError

ALLOW_HINT = "--allow-nonfinite writes the values as they are"


class NonfiniteError(Gguf2ovError):
    """A tensor whose values (or scales) are NaN or Inf, or would be once written."""


def count_nonfinite(values) -> int:
    """How many NaN or Inf values a float array holds (0 for an integer array)."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.floating):
        return 0
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def nonfinite_error(where: str, bad: int, total: int, what: str = "values", source: str = "GGUF",
                    too_large_for: str | None = None, hint: str | None = None) -> NonfiniteError:
    """The error for a tensor whose values hold `bad` NaN or Inf of `total` `what` (values, or the
    quantization scales of a GGUF's grid), read from a `source` ("GGUF" or "checkpoint").
    `too_large_for`: the values are finite, and `bad` of what is made of them overflow that type (`hint`:
    how to keep them)."""
    if too_large_for is not None:
        return NonfiniteError(f"{where}: {bad} of its {total} {what} are too large for {too_large_for} and would be "
                              f"written as Inf", hint=hint or f"choose a wider type; {ALLOW_HINT}")
    if what != "values":
        broken = "its quantization scales in the file are broken"
    elif source == "GGUF":
        broken = "the tensor's data (or its quantization scales) in the file is broken"
    else:
        broken = f"the tensor's data in the {source} is broken"
    return NonfiniteError(f"{where} holds {bad} NaN or Inf {what} of {total}: {broken}",
                          hint=f"re-download or re-convert the {source}; {ALLOW_HINT}")


def nonfinite_warnings(counts: dict[str, int]) -> list[str]:
    """One line per tensor written with NaN or Inf values (under --allow-nonfinite)."""
    return [f"{name} was written with {count} NaN or Inf values (--allow-nonfinite): a model loading it computes NaN"
            for name, count in counts.items()]

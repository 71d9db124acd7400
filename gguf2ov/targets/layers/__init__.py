"""The kinds of layer a target is built from, one module each, by the names the maps give them.

Each kind is a `LayerKind` (`kind.py`: the contract, every hook named and defaulted) and registers
itself under its name when its module is imported: the import line below is the registry. A new
kind of layer is one module here and its name on that line; an architecture made of known kinds is
a map alone. Where the kinds sit in a decoder layer (norms and residuals) is the map's, read by
`targets/decoder.py`.
"""

# the registry: each registers
from . import (attention, clamped_moe, gated_attention, gated_deltanet, gemma4_moe, layer_scalar, mlp,  # noqa: F401
               moe, per_layer_input, shared_kv_attention)
from .kind import REGISTRY, LayerKind
from .pieces import layer_prefix

__all__ = ["REGISTRY", "LayerKind", "layer_prefix", "of_role"]


def of_role(role: str) -> dict[str, LayerKind]:
    """{name: kind} of the registered kinds of `role` (mixer, mlp, block)."""
    return {name: kind for name, kind in REGISTRY.items() if kind.ROLE == role}

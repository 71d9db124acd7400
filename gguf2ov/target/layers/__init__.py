"""The kinds of layer a target is built from, one module each, by the names the maps give them.

Each kind is a `LayerKind` (`kind.py`: the contract, every hook named and defaulted) and registers
itself under its name when its module is imported: the line below is the registry. A new kind of
layer is one module here and its name on that line; an architecture made of known kinds is a map
alone. The decoder layer around them (norms and residuals) is `graph.py`'s.
"""

from collections.abc import Iterator

from ...errors import Gguf2ovError
from . import attention, gated_attention, gated_deltanet, mlp, moe  # noqa: F401  (the registry: each registers)
from .kind import REGISTRY, LayerKind
from .pieces import layer_prefix  # noqa: F401  (named where the graph is)


def of_role(role: str) -> dict[str, LayerKind]:
    return {name: kind for name, kind in REGISTRY.items() if kind.ROLE == role}


def check_kinds(arch: str, mixers, mlp_kind: str) -> None:
    """Refuse a map that names a kind this version does not build (or a kind in the wrong place)."""
    known_mixers, known_mlps = of_role("mixer"), of_role("mlp")
    unknown = sorted({m for m in mixers if m not in known_mixers} | ({mlp_kind} - set(known_mlps)))
    if unknown:
        raise Gguf2ovError(f"the {arch} map builds its layers with {', '.join(unknown)}, which this gguf2ov does "
                           f"not know (mixers: {', '.join(known_mixers)}; MLPs: {', '.join(known_mlps)})",
                           hint="update gguf2ov, or fix the map's `target:` section")


def kinds(c, i: int) -> tuple[LayerKind, ...]:
    """The kinds of layer `i`, in graph order: its mixer, its MLP."""
    return REGISTRY[c.mixers[i]], REGISTRY[c.mlp]


def layer_kinds(c) -> Iterator[tuple[int, LayerKind]]:
    """(layer, kind) for every kind of every layer, in graph order."""
    for i in range(c.num_layers):
        for kind in kinds(c, i):
            yield i, kind


def check_config(c, where) -> None:
    """Each kind's own refusals of a resolved config."""
    for kind in dict.fromkeys(k for _, k in layer_kinds(c)):
        kind.check(c, where)


def int8_weights(c) -> dict[str, str]:
    """{weight: why} for the weights NNCF's int4 modes keep in int8, over every layer's kinds."""
    return {name: kind.INT8_WHY or kind.NAME for i, kind in layer_kinds(c) for name in kind.int8_weights(c, i)}


def kept_weights(c) -> tuple[str, ...]:
    """The weights every format keeps in float32 (a router), over every layer's kinds."""
    return tuple(name for i, kind in layer_kinds(c) for name in kind.kept(c, i))


def batched_weights(c) -> tuple[str, ...]:
    """The [E, N, K] weights of batched MatMuls (experts), over every layer's kinds."""
    return tuple(name for i, kind in layer_kinds(c) for name in kind.batched(c, i))


def other_layouts(c) -> dict:
    """{tensor: [Stack | Split, ...]}: the other layouts a source may store the tensors in (`layouts.py`)."""
    return {name: ways for i, kind in layer_kinds(c) for name, ways in kind.layouts(c, i).items()}

"""The kinds of layer a target is built from, one module each, by the names the maps give them.

A map's `target:` section names the kind that mixes tokens in each layer type (`mixers`, by the
config's `layer_types`) and the kind of every layer's MLP (`mlp`). A kind module states, from the
config alone:
- `tensors(c, i)`: the tensors it reads in layer `i` (HF names and shapes), in the order the graph
  asks for them;
- `build(g, x, i)`: its part of the graph on the normed hidden states `x`, asking `g` (the graph
  under construction, `target/graph.py`) for each weight by name and adding its state variables;
- what the IR checks must find of it (`target/checks.py`): `states(c, i)`, the state variables it
  keeps, and `paged(c, i)`, what OpenVINO's paged conversion (GenAI's, when a draft attaches) makes
  of it (mixers only): one paged op, or a list of them (a Gated DeltaNet layer becomes two).
A kind may also state (absent: nothing of the kind):
- `check(c, where)`: refuse a config it cannot be built from;
- `int8_weights(c, i)`: the weights that NNCF's int4 modes keep in int8, `INT8_WHY` saying why (the
  export reports it);
- `layouts(c, i)`: other layouts a source may store its tensors in (`target/layouts.py`);
- `kept(c, i)`: weights that stay float32 in every format (a router); `batched(c, i)`: [E, N, K]
  weights of batched MatMuls, which NNCF compresses as it does Linear weights;
- `compiled(c, i)`: op types and counts the compiled model must hold for the layer (`checks.py`);
- `probe(c, layers, width)`: its config keys in a smaller model of the same kinds (`probe.py`).

The decoder layer around them (norms and residuals) is `graph.py`'s. A new kind of layer is one
module here and one entry below; an architecture made of known kinds is a map alone.
"""

from ...errors import Gguf2ovError
from . import attention, gated_attention, gated_deltanet, mlp, moe

MIXERS = {"attention": attention, "gated_attention": gated_attention, "gated_deltanet": gated_deltanet}
MLPS = {"dense": mlp, "moe": moe}


def check_kinds(arch: str, mixers, mlp_kind: str) -> None:
    """Refuse a map that names a kind this version does not build."""
    unknown = sorted({m for m in mixers if m not in MIXERS} | ({mlp_kind} - set(MLPS)))
    if unknown:
        raise Gguf2ovError(f"the {arch} map builds its layers with {', '.join(unknown)}, which this gguf2ov does "
                           f"not know (mixers: {', '.join(MIXERS)}; MLPs: {', '.join(MLPS)})",
                           hint="update gguf2ov, or fix the map's `target:` section")


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def kinds(c, i: int) -> tuple:
    """The kind modules of layer `i`: its mixer, its MLP."""
    return MIXERS[c.mixers[i]], MLPS[c.mlp]


def per_layer(c, hook: str) -> list:
    """What every layer's kinds state through an optional `hook` (see above), concatenated in graph order."""
    out = []
    for i in range(c.num_layers):
        for kind in kinds(c, i):
            if (found := getattr(kind, hook, None)) is not None:
                out.append(found(c, i))
    return out


def check_config(c, where) -> None:
    """Each kind's own refusals of a resolved config."""
    for kind in {k for i in range(c.num_layers) for k in kinds(c, i)}:
        if (check := getattr(kind, "check", None)) is not None:
            check(c, where)


def int8_weights(c) -> dict[str, str]:
    """{weight: why} for the weights NNCF's int4 modes keep in int8, over every layer's kinds."""
    out = {}
    for i in range(c.num_layers):
        for kind in kinds(c, i):
            names = getattr(kind, "int8_weights", lambda c, i: [])(c, i)
            out.update(dict.fromkeys(names, getattr(kind, "INT8_WHY", kind.__name__.rsplit(".", 1)[-1])))
    return out

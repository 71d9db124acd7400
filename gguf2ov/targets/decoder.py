"""The decoder an architecture is built as: its map's `target:` section, read once and held against
the layer kinds (`layers/`), and every tensor the decoder reads, in the order the graph reads them.

When a target's map is read (`decoder_of`), its kinds, steps and options are checked, and so are its
tensor names against what the decoder reads: each layer type's kinds and norms, the embedding, the
final norm and the head. A map that names a tensor no part of the decoder reads, or names none for a
tensor a kind always reads, is one error naming the map, before any file is opened. The shapes are
the kinds' alone (`tensor_shapes`): a target map states none.

A map's `target:` section states:
- `mixers`: layer type -> the kind that mixes tokens in layers of that type;
- `mlp`: the kind of every layer's MLP;
- `layer`: the decoder layer as residual steps, in order, each `{block, norm, post_norm, residual, when}`:
  `block` is `mixer`, `mlp` or the name of a kind of role `block`; `norm` the RMSNorm the block reads
  the stream through (`model.layers.N.<norm>.weight`; absent: the block reads the residual stream
  itself); `post_norm` an RMSNorm of the block's output; `residual: false` makes the block's output
  the stream instead of adding it; `when: KEY` keeps the step only in models whose config sets KEY (to
  anything but 0, false or null: Gemma 4's per-layer embeddings). Absent: `PRE_NORM`, Llama's layer;
- `forward`: options, the decoder's own (`MODEL_OPTIONS`) and those its kinds read
  (`LayerKind.OPTIONS`); an option no part of the decoder reads is refused;
- `sliding`: which layers slide over the config's `sliding_window` when the config states no
  `layer_types`: `by_layer_types` (none: every layer attends fully, transformers' default) or
  `every_layer` (all of them, when a window is set: MistralModel's mask, and Mixtral's, Phi-3's);
- `head_dim`: layer type -> the config key that gives that type's head size where the config states
  one (Gemma 4's global layers: global_head_dim); other types' heads are the config's head_dim;
- `rope_factors`: the layer types llama.cpp turns by a file's rope_freqs tensor (absent: every type);
- `refuse`: config key -> why: a config that sets the key (to anything but 0, false or null) is a
  variant of the architecture this version does not build, refused in one line saying so.
So a new shape of decoder layer is a map section (and perhaps a kind), never a flag in the code.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import Gguf2ovError
from .layers import REGISTRY, LayerKind, layer_prefix, of_role

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
FINAL_NORM = "model.norm"

# The decoder's own options: RMSNorms scaling by (offset + w), Gemma's (1 + w); token embeddings scaled
# by sqrt(hidden_size); RoPE on partial_rotary_factor of each head (Qwen3.5's default RoPE reads it).
MODEL_OPTIONS = {"norm_offset": 0.0, "scaled_embedding": False, "partial_rotary": False}
STEP_KEYS = {"block", "norm", "post_norm", "residual", "when"}
SLIDING = ("by_layer_types", "every_layer")


@dataclass(frozen=True)
class Step:
    """One residual step of a decoder layer: x <- x + post_norm(block(norm(x)))."""

    block: str                   # mixer | mlp | a kind of role `block`
    norm: str | None = None      # the RMSNorm before the block (None: the block reads the stream)
    post_norm: str | None = None  # the RMSNorm of the block's output
    residual: bool = True        # False: the block's output replaces the stream
    when: str | None = None      # the config key that must be set for the step to be built (None: always)


# transformers' LlamaDecoderLayer, and every decoder whose map states no `layer`
PRE_NORM = (Step("mixer", "input_layernorm"), Step("mlp", "post_attention_layernorm"))


@dataclass(frozen=True)
class Decoder:
    """A map's `target:` section, checked: the kinds it names exist in their roles, and every option
    is read by some part of the decoder."""

    arch: str
    mixers: dict                 # layer type -> mixer kind name
    mlp: str
    layer: tuple[Step, ...]
    options: dict                # every option the decoder and its kinds read, with the map's value or the default
    sliding: str = "by_layer_types"
    head_dim: dict = field(default_factory=dict)  # layer type -> the config key of its head size
    refuse: dict = field(default_factory=dict)    # config key -> why a config that sets it is refused
    rope_factors: tuple = ()                       # the layer types a file's rope_freqs divides (): every type

    def kinds(self, layer_type: str) -> list[LayerKind]:
        """The kinds of a layer of `layer_type`, in step order."""
        return [_kind(s.block, self.mixers[layer_type], self.mlp) for s in self.layer]


def decoder_of(amap) -> Decoder:
    """The decoder `amap` (an ArchMap with a `target:` section) describes; one error line naming the map
    when it names a kind, a step or an option this version does not build."""
    key = id(amap)
    if key not in _DECODERS or _DECODERS[key][0] is not amap:
        _DECODERS[key] = (amap, _read(amap))
    return _DECODERS[key][1]


_DECODERS: dict[int, tuple] = {}


def _read(amap) -> Decoder:
    section = amap.target

    def bad(message):
        return Gguf2ovError(f"tensor map {amap.path}: target: {message}", hint="fix the map's `target:` section")

    mixers, mlp = dict(section["mixers"]), section["mlp"]
    _check_kinds(amap.arch, mixers.values(), mlp)
    layer = _steps(section.get("layer"), bad)
    kinds = {REGISTRY[m] for m in mixers.values()} | {REGISTRY[mlp]}
    kinds |= {REGISTRY[s.block] for s in layer if s.block not in ("mixer", "mlp")}
    options = dict(MODEL_OPTIONS)
    for kind in sorted(kinds, key=lambda k: k.NAME):
        options.update(kind.OPTIONS)
    forward = section.get("forward") or {}
    if unknown := sorted(set(forward) - set(options)):
        raise bad(f"forward: {', '.join(unknown)} is not an option of this decoder or its kinds "
                  f"({', '.join(sorted(k.NAME for k in kinds))}); known: {', '.join(sorted(options))}")
    sliding = section.get("sliding", SLIDING[0])
    if sliding not in SLIDING:
        raise bad(f"sliding is {sliding!r}, not one of {', '.join(SLIDING)}")
    head_dim, refuse = section.get("head_dim") or {}, section.get("refuse") or {}
    rope_factors = section.get("rope_factors") or []
    if not (isinstance(head_dim, dict) and isinstance(refuse, dict) and isinstance(rope_factors, list)) \
            or not all(isinstance(v, str) for v in [*head_dim.values(), *refuse.values()]) \
            or set(head_dim) - set(mixers) or set(rope_factors) - set(mixers):
        raise bad("head_dim maps layer types to config keys, refuse config keys to why they are refused, "
                  "rope_factors lists layer types")
    decoder = Decoder(amap.arch, mixers, mlp, layer, {**options, **forward}, sliding, head_dim, refuse,
                      tuple(rope_factors))
    _check_names(amap, decoder, bad)
    return decoder


def _check_names(amap, decoder: Decoder, bad) -> None:
    """The map's HF names against what the decoder reads (see the module docstring)."""
    rules = [r for r in amap.rules if r.hf is not None and not r.trailing]
    model_level = {EMBEDDING: True, FINAL_NORM + ".weight": True, LM_HEAD: False}
    for kind in {_kind(s.block, m, decoder.mlp) for s in decoder.layer for m in decoder.mixers.values()}:
        model_level |= kind.model_names(decoder.options)
    if stray := [r.hf for r in rules if not r.per_layer and r.hf not in model_level]:
        raise bad(f"the map names {stray[0]}, which the decoder does not read (outside its layers it reads "
                  f"{', '.join(model_level)})")
    made = {r.hf for r in rules if not r.per_layer}
    if unmade := [n for n, always in model_level.items() if always and n not in made]:
        raise bad(f"the map names no tensor for {unmade[0]}, which the decoder reads")
    prefix = layer_prefix("{N}")
    for layer_type in decoder.mixers:
        kinds = decoder.kinds(layer_type)
        reads = {f"{norm}.weight": True for s in decoder.layer for norm in (s.norm, s.post_norm) if norm}
        for kind in kinds:
            reads |= kind.names(decoder.options)
        made = {r.hf[len(prefix):] if r.hf.startswith(prefix) else r.hf: r for r in rules
                if r.per_layer and r.layer_type in (None, layer_type)}
        who = f"the {layer_type} layers' kinds ({', '.join(k.NAME for k in kinds)})"
        if unread := [name for name in made if name not in reads]:
            raise bad(f"{who} do not read {prefix}{unread[0]}, which the map names ({made[unread[0]].gguf})")
        if unmade := [name for name, always in reads.items() if always and name not in made]:
            raise bad(f"the map names no tensor for {prefix}{unmade[0]}, which {who} read")


def _check_kinds(arch: str, mixers, mlp_kind: str) -> None:
    """Refuse a map that names a kind this version does not build (or a kind in the wrong place)."""
    known_mixers, known_mlps = of_role("mixer"), of_role("mlp")
    unknown = sorted({m for m in mixers if m not in known_mixers} | ({mlp_kind} - set(known_mlps)))
    if unknown:
        raise Gguf2ovError(f"the {arch} map builds its layers with {', '.join(unknown)}, which this gguf2ov does "
                           f"not know (mixers: {', '.join(known_mixers)}; MLPs: {', '.join(known_mlps)})",
                           hint="update gguf2ov, or fix the map's `target:` section")


def _steps(section, bad) -> tuple[Step, ...]:
    if section is None:
        return PRE_NORM
    blocks = {"mixer", "mlp", *of_role("block")}
    if not isinstance(section, list) or not section:
        raise bad("layer must list the decoder layer's steps")
    steps = []
    for entry in section:
        if not isinstance(entry, dict) or set(entry) - STEP_KEYS or entry.get("block") not in blocks \
                or not all(isinstance(entry.get(k), (str, type(None))) for k in ("norm", "post_norm", "when")) \
                or not isinstance(entry.get("residual", True), bool):
            raise bad(f"layer step {entry!r}: a step is {{block, norm, post_norm, residual}}, block one of "
                      f"{', '.join(sorted(blocks))}")
        steps.append(Step(**entry))
    if [s.block for s in steps if s.block in ("mixer", "mlp")] != ["mixer", "mlp"]:
        raise bad("layer must have one mixer step, then one mlp step")
    return tuple(steps)


def _kind(block: str, mixer: str, mlp: str) -> LayerKind:
    return REGISTRY[mixer if block == "mixer" else mlp if block == "mlp" else block]


# --- the decoder's walk: the graph builds it, the tensor list follows it ------------------------

def layer_steps(c, i: int) -> Iterator[tuple[Step, LayerKind]]:
    """(step, kind) of layer `i` of config `c`, in graph order (a step whose `when` key the config does not
    set left out)."""
    for step in c.layer:
        if step.when is None or getattr(c.hf, step.when, None):
            yield step, _kind(step.block, c.mixers[i], c.mlp)


def layer_kinds(c) -> Iterator[tuple[int, LayerKind]]:
    """(layer, kind) for every kind of every layer, in graph order."""
    for i in range(c.num_layers):
        for _, kind in layer_steps(c, i):
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


def gathered_weights(c) -> tuple[str, ...]:
    """The tables read by a Gather (embeddings) besides the token embedding, over every layer's kinds."""
    return tuple(name for i, kind in layer_kinds(c) for name in kind.gathered(c, i))


def other_layouts(c) -> dict:
    """{tensor: [Stack | Split, ...]}: the other layouts a source may store the tensors in (`layouts.py`)."""
    return {name: ways for i, kind in layer_kinds(c) for name, ways in kind.layouts(c, i).items()}


def tensor_shapes(c) -> dict[str, tuple[int, ...]]:
    """Every tensor the target graph reads, with its shape, in the order the graph asks for them (the
    order NNCF walks the weights in): the embedding, each layer's steps (a norm, the kind's own
    tensors, a norm), the final norm and an untied lm_head. With the kinds' `tensors`, the one
    statement of the target's shapes."""
    h = c.hidden_size
    shapes = {EMBEDDING: (c.vocab_size, h)}
    for i in range(c.num_layers):
        p = layer_prefix(i)
        for step, kind in layer_steps(c, i):
            if step.norm:
                shapes[p + step.norm + ".weight"] = (h,)
            shapes.update(kind.tensors(c, i))
            if step.post_norm:
                shapes[p + step.post_norm + ".weight"] = (h,)
    shapes[FINAL_NORM + ".weight"] = (h,)
    if not c.tie_word_embeddings:
        shapes[LM_HEAD] = (c.vocab_size, h)
    return shapes


def stored_shapes(c) -> dict[str, tuple[int, ...]]:
    """`tensor_shapes` and the shapes of the tensors of the other layouts the kinds read (`layouts.py`):
    whatever a source may hold a target's tensors as, by HF name."""
    shapes = tensor_shapes(c)
    for ways in other_layouts(c).values():
        for way in ways:
            shapes.update(way.stored_shapes())
    return shapes

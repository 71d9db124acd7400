"""The contract of a kind of layer: every hook a kind may state, named and defaulted.

A kind is a subclass of `LayerKind` in a module of its own (`targets/layers/<kind>.py`), registered
by the class statement itself under its `NAME` (as gguf-py registers its quant kernels by type):

    class GatedDeltaNet(LayerKind, name="gated_deltanet", role="mixer"):
        RECURRENT = True
        def tensors(self, c, i): ...
        def build(self, g, x, i): ...

A map's `target:` section names the kind of each layer type's mixer (`mixers`, by the config's
`layer_types`), the kind of every layer's MLP (`mlp`), and where they and any other block sit between
the decoder layer's norms and residual adds (`layer`, `targets/decoder.py`). A kind states, from the
config alone (`c`, always a TargetConfig, `targets/config.py`; `i`, the layer's index):
- `tensors(c, i)`: the tensors it reads in layer `i`, HF names and shapes, in the order `build` asks
  for them: the one statement of those shapes (a map names the tensors only);
- `names(options)`: the names of every tensor it may read, from the map's options alone, which a
  map's tensor names are held against when it loads (`decoder.py`);
- `build(g, x, i)`: its part of the graph on `x` (the normed hidden states, or the residual stream
  where the map's layer puts no norm before the block), asking `g` (the graph under construction,
  `targets/graph.py`) for each weight by name and adding its state variables.
Every other hook has a default that states nothing. Helpers that several kinds use live in
`pieces.py`; a kind module defines no other public name (tests/targets/test_kinds.py holds it), so
a misspelt hook is an error, not a hook that silently never runs.

One thing about kinds lives outside them: how `gguf2ov widen-target` makes a kind's layer a no-op and
pads its MLP (`tools/widen.py`: BRANCH_OUTPUTS, PLAIN_NORMS, MLP_WIDTHS), a tool for speed measurements,
not the build. A model type widened must have every kind it is built of there
(tests/tools/test_widen.py holds it).
"""

from typing import ClassVar

ROLES = ("mixer", "mlp", "block")


class LayerKind:
    """One kind of layer block; the registry is `REGISTRY` (name -> the kind's one instance)."""

    NAME: ClassVar[str]
    # mixer: mixes tokens (a map's `mixers`); mlp: the MLP of every layer (`mlp`); block: another step of
    # the decoder layer, placed by the map's `layer` section by its name (`targets/decoder.py`)
    ROLE: ClassVar[str]
    # Whether a layer of this kind keeps a recurrent state (a Gated DeltaNet's): GenAI's scheduler then
    # needs its linear-attention state pool sized for the draft's proposals (`runtime/genai.py`).
    RECURRENT: ClassVar[bool] = False
    # The .xml bytes a layer of this kind adds to the IR, weights' decompression aside (measured): what
    # the disk estimate adds (`graph.target_ir_bytes`).
    IR_XML_BYTES: ClassVar[int] = 0
    # The map `target.forward` options the kind reads (from `c.options`), with their values when a map
    # does not state them.
    OPTIONS: ClassVar[dict[str, object]] = {}
    # Why NNCF's int4 modes keep `int8_weights` in int8, for reports.
    INT8_WHY: ClassVar[str] = ""

    def __init_subclass__(cls, name: str | None = None, role: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if name is None:
            return  # an abstract intermediate class
        if role not in ROLES:
            raise TypeError(f"layer kind {name}: role {role!r} is not one of {', '.join(ROLES)}")
        if missing := [hook for hook in REQUIRED if getattr(cls, hook) is getattr(LayerKind, hook)]:
            raise TypeError(f"layer kind {name} does not state {' or '.join(missing)}")
        if name in REGISTRY:
            raise TypeError(f"layer kind {name} is registered twice ({type(REGISTRY[name]).__module__}, "
                            f"{cls.__module__})")
        cls.NAME, cls.ROLE = name, role
        REGISTRY[name] = cls()

    # --- what every kind states ---------------------------------------------------------------------

    def tensors(self, c, i: int) -> dict[str, tuple[int, ...]]:
        """{HF name: shape} of the tensors the kind reads in layer `i`, in the order `build` reads them."""
        raise NotImplementedError

    def build(self, g, x, i: int):
        """The kind's output for layer `i` (the node the residual adds), from `x`."""
        raise NotImplementedError

    def names(self, options: dict) -> dict[str, bool]:
        """{name under the layer prefix: whether every layer of the kind reads it} for every tensor `tensors`
        may name under the map's forward `options` (False: the config decides, a bias), and the tensors of
        the other layouts `layouts` reads."""
        raise NotImplementedError

    def model_names(self, options: dict) -> dict[str, bool]:
        """{name: whether every model with the kind reads it} for the tensors outside the layers the kind
        reads (inputs it makes once for every layer, Gemma 4's per-layer embeddings), named in `tensors`
        of the first layer that has the kind (none)."""
        return {}

    def gathered(self, c, i: int) -> list[str]:
        """The tables of layer `i`'s `tensors` read by a Gather, as the token embedding is, not multiplied by a
        MatMul (none)."""
        return []

    # --- what the IR checks must find of it (`targets/checks.py`) ------------------------------------

    def states(self, c, i: int) -> list[str]:
        """The state variables the kind keeps in layer `i` (none)."""
        return []

    def paged(self, c, i: int) -> list[dict]:
        """What OpenVINO's paged conversion (GenAI's, when a draft attaches) makes of layer `i`: one dict
        per paged op, {"op": type, "heads": [kv heads, head size], "window": w} for an attention,
        {"op": type, "table": (input name, shape)} for a state table (none)."""
        return []

    def compiled(self, c, i: int) -> dict[str, int]:
        """{op type: count} the CPU plugin's compiled model must hold for layer `i` (nothing)."""
        return {}

    # --- refusals and weight forms ------------------------------------------------------------------

    def check(self, c, where) -> None:
        """Refuse, in one error line, a config the kind cannot be built from (it takes every config)."""
        return None

    def int8_weights(self, c, i: int) -> list[str]:
        """The weights of layer `i` that NNCF's int4 modes must keep in int8 (`INT8_WHY`; none)."""
        return []

    def kept(self, c, i: int) -> list[str]:
        """The weights of layer `i` kept in float32 in every format, a router (none)."""
        return []

    def batched(self, c, i: int) -> list[str]:
        """The [E, N, K] weights of batched MatMuls in layer `i`, compressed as Linear weights are (none)."""
        return []

    def layouts(self, c, i: int) -> dict:
        """{tensor: [Stack | Split, ...]}: other layouts a source may store layer `i`'s tensors in
        (`targets/layouts.py`; none)."""
        return {}

    def probe(self, c, layers: list[int], width: int) -> dict:
        """Config keys of a smaller model of this kind standing for the target's `layers`, `width` wide
        (`targets/probe.py`; none beyond the widths every kind shares)."""
        return {}


REGISTRY: dict[str, LayerKind] = {}
# The hooks a kind must state: the others default to stating nothing.
REQUIRED = ("tensors", "build", "names")

# What a kind may define: the hooks and constants above (tests/targets/test_kinds.py).
CONTRACT = frozenset(n for n in vars(LayerKind) if not n.startswith("_")) | {"NAME", "ROLE"}

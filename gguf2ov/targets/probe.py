"""The compiled-model check of a target (`checks.compiled_finding`), on the target itself or, when it is
too large to compile within the memory its build runs in, on a small model of its own layer kinds
and weight forms.

Compiling costs about twice the IR's weights (measured, openvino 2026.4.1, a `qwen3moe` Q4_K_M
target folded: a 238 MB .bin peaked at 467 MB RSS, 212 MB anonymous; a 755 MB one at 1448 MB,
706 MB anonymous), so a Qwen3-30B-A3B target (~25 GB of IR) cannot be compiled in the 2 GB its
build needs. What the check looks for does not depend on the size: the CPU plugin's rewrite of the
mixture-of-experts block matches the graph's pattern and the weights' decompression subgraph. The
probe is built by the same code from the same kinds and forms: one layer for each distinct layer
of the target (its kinds, its tensors and each tensor's form: the GGUF's type, NNCF's mode and
group, float), with the target's head geometry, experts and top k, and widths of `WIDTH` (every
GGUF block and NNCF group size divides it), random values on the file's types.
"""

import math
import tempfile
import zlib
from pathlib import Path

import numpy as np

from ..ir.tensors import TensorSource

# The IR's weights up to which the target itself is compiled to check it (~2x as much memory).
COMPILE_BUDGET = 512 << 20
WIDTH = 256
VOCAB = 512


def compiled_check(folder, source, forms):
    """The compiled-model finding of the target written in `folder` (None: no kind expects anything of
    the compiled model): the IR itself below COMPILE_BUDGET, else a probe of it."""
    from ..ir.weights import ir_size
    from ..names import IR_XML
    from .checks import compiled_finding, expected_compiled

    if not expected_compiled(source.config):
        return None
    size = ir_size(folder)
    if size <= COMPILE_BUDGET:
        return compiled_finding(Path(folder) / IR_XML, source.config)
    with tempfile.TemporaryDirectory(prefix="gguf2ov-probe-") as tmp:
        probe, layers = write_probe(tmp, source, forms)
        note = (f"checked on a {len(layers)}-layer model of the target's layer kinds and weight forms (standing "
                f"for layers {', '.join(map(str, layers))}, widths {probe.config.hidden_size}): compiling the "
                f"{size / 2**30:.1f} GiB target itself would take about twice that in memory")
        return compiled_finding(Path(tmp) / IR_XML, probe.config, note)


def write_probe(folder, source, forms) -> tuple["ProbeSource", list[int]]:
    """The probe IR of `source` built as `forms` builds the target, saved in `folder`: (its source, the
    target's layers it stands for)."""
    from ..ir.weights import WeightForms, save_ir
    from .graph import build_target_ir

    layers = distinct_layers(source, forms)
    probe = ProbeSource(source, forms, layers)
    probe_forms = WeightForms(probe, forms.variant, streamed=True, grid=forms.grid, whole=forms.whole,
                              allow_nonfinite=forms.allow_nonfinite)
    if forms.plan:  # NNCF: each weight compressed as its target counterpart is
        probe_forms.plan = {name: forms.plan[probe.counterpart[name]] for name in probe_forms.plan}
    save_ir(build_target_ir(probe_forms), folder, probe_forms)
    return probe, layers


def _layer_names(source, i: int) -> dict[str, str]:
    """{name without the layer prefix: name} of layer i's tensors."""
    prefix = f"model.layers.{i}."
    return {n[len(prefix):]: n for n in source.expected if n.startswith(prefix)}


def form_of(source, forms, name: str):
    """How a weight enters the IR: what makes two layers different for the CPU plugin."""
    if name in source.kept or len(source.expected[name]) < 2:
        return "f32"
    if forms.plan:
        spec = forms.plan.get(name)
        return (spec.mode, spec.group_size) if spec is not None else "f32"
    if forms.variant.format.needs_gguf:
        stored = source.quantized(name)
        return stored[1] if stored is not None else "f32"
    return forms.variant.weight_format


def distinct_layers(source, forms) -> list[int]:
    """The first layer of each distinct kind of layer: its layer type, its tensors and their forms."""
    seen, layers = set(), []
    c = source.config
    for i in range(c.num_layers):
        names = _layer_names(source, i)
        key = (c.layer_types[i], tuple(sorted((k, form_of(source, forms, n)) for k, n in names.items())))
        if key not in seen:
            seen.add(key)
            layers.append(i)
    return layers


class ProbeSource(TensorSource):
    """A small model of `source`'s kinds (its `layers`, in order), whose tensors are random values on the
    types the target's counterparts have."""

    def __init__(self, source, forms, layers: list[int]):
        from .config import target_config
        from .decoder import batched_weights, kept_weights, layer_steps, tensor_shapes

        super().__init__(source.path, source.kind)
        c = source.config
        group = (forms.variant.group_size or 1) if forms.variant.nncf else 1
        width = math.lcm(WIDTH, group)
        raw = dict(c.hf.to_dict(), hidden_size=width, intermediate_size=width, head_dim=c.head_dim,
                   vocab_size=VOCAB, num_hidden_layers=len(layers), layer_types=[c.layer_types[i] for i in layers])
        if raw.get("vocab_size_per_layer_input"):  # Gemma 4's per-layer table is a vocabulary long too
            raw["vocab_size_per_layer_input"] = VOCAB
        for kind in dict.fromkeys(k for i in layers for _, k in layer_steps(c, i)):  # each kind's widths and keys
            raw.update(kind.probe(c, layers, width))
        raw.pop("auto_map", None)
        self.config = target_config(raw, f"{source.path} (probe)", c.amap)  # the target's map: its kinds and options
        self.expected = tensor_shapes(self.config)
        self.embeddings, self.last_matmul_shared = source.embeddings, source.last_matmul_shared
        self.kept, self.batched = kept_weights(self.config), batched_weights(self.config)
        self.counterpart = {}
        for j, i in enumerate(layers):
            target = _layer_names(source, i)
            self.counterpart.update({n: target[k] for k, n in _layer_names(self, j).items()})
        self.counterpart.update({n: n for n in self.expected if not n.startswith("model.layers.")})
        self._source, self._forms = source, forms

    def _values(self, name: str) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        values = rng.standard_normal(self.expected[name]).astype(np.float32) * np.float32(0.05)
        return values + np.float32(1.0) if len(self.expected[name]) == 1 else values

    def f32(self, name: str) -> np.ndarray:
        return self._values(name)

    def f32_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return self._values(name)[start:stop]

    def quantized(self, name: str):
        from ..gguf.quants import quantize

        if not self._forms.variant.format.needs_gguf or name in self.kept:
            return None
        stored = self._source.quantized(self.counterpart[name])
        if stored is None:
            return None
        qtype = stored[1]
        shape = self.expected[name]
        # one matrix's blocks, repeated over the experts: the values do not matter, the type does
        rows = quantize(self._values(name).reshape(-1, shape[-1])[:shape[-2]], qtype)
        return np.ascontiguousarray(np.broadcast_to(rows, (*shape[:-1], rows.shape[-1]))), qtype

"""Gemma 4's attention: transformers 5.5.4's Gemma4TextAttention, built from the attention pieces
(`pieces.py`).

What sets it apart from `attention.py`'s:
- each layer type has its own geometry: the global layers' head size is the config's global_head_dim
  (the map's `head_dim`), and where attention_k_eq_v is set they have num_global_key_value_heads
  key/value heads and no v_proj: the keys' projection, before its norm, is the values';
- q and k are RMSNormed per head (w, not 1 + w), v too, by an RMSNorm without a weight;
- the attention scale is 1.0 (the norms scale q and k);
- shared KV: the last num_kv_shared_layers layers project no keys or values of their own and attend
  over those of the last earlier layer of their own type (its cached keys and values, past and new),
  so they keep no state of their own.

One K and one V state variable per layer that has its own (`past_key_values.N.keypresent.N.key`, ...),
reordered by `beam_idx`.
"""

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import linear, rms_norm
from ...maps.rules import is_int
from .kind import LayerKind
from .pieces import PAGED_ATTENTION, Heads, attend_cached, cached_kv, heads_first, layer_prefix, project, rotate


def _state(i: int, kind: str) -> str:
    return f"past_key_values.{i}.{kind}present.{i}.{kind}"


def _sliding(c, i: int) -> bool:
    return c.layer_types[i] == "sliding_attention"


def _k_as_v(c, i: int) -> bool:
    """Whether layer `i` has no v_proj (Gemma4TextAttention's use_alternative_attention)."""
    return bool(getattr(c.hf, "attention_k_eq_v", False)) and not _sliding(c, i)


def _geometry(c, i: int) -> Heads:
    kv = c.hf.num_global_key_value_heads if _k_as_v(c, i) else c.num_kv_heads
    return Heads(c.num_heads, kv, c.head_dims[c.layer_types[i]])


def _first_shared(c) -> int:
    """The first layer that reads another's keys and values (num_layers: none does)."""
    shared = getattr(c.hf, "num_kv_shared_layers", 0) or 0
    first = c.num_layers - shared
    return first if 0 < first < c.num_layers else c.num_layers


def _donor(c, i: int) -> int | None:
    """The layer whose keys and values layer `i` attends over: the last layer of its type before the shared
    ones (None: layer `i` has its own)."""
    first = _first_shared(c)
    if i < first:
        return None
    same = [j for j in range(first) if c.layer_types[j] == c.layer_types[i]]
    return same[-1] if same else None


def _window(c, i: int) -> int | None:
    return c.sliding_window if _sliding(c, i) else None


class SharedKvAttention(LayerKind, name="shared_kv_attention", role="mixer"):
    # a layer of this kind with a dense MLP and its layer_scalar, weights' decompression aside (measured on the
    # fp32 targets of tests/targets/test_gemma4_target.py: 72.9 KB a layer over 5 layers, two of them shared;
    # 86.1 KB over 4 layers with keys and values of their own)
    IR_XML_BYTES = 80_000

    def check(self, c, where):
        """Refuse a config whose layers cannot be built: global key/value heads that do not divide the
        heads, a shared layer with no earlier layer of its type, a share count outside the layers."""
        shared = getattr(c.hf, "num_kv_shared_layers", 0) or 0
        if not (is_int(shared) and 0 <= shared < c.num_layers):
            raise Gguf2ovError(f"{where}: num_kv_shared_layers is {shared!r}, not from 0 to {c.num_layers - 1}")
        for i in range(c.num_layers):
            if _k_as_v(c, i):
                kv = c.hf.num_global_key_value_heads
                if not (is_int(kv) and kv > 0 and c.num_heads % kv == 0):
                    raise Gguf2ovError(f"{where}: attention_k_eq_v needs num_global_key_value_heads dividing the "
                                       f"{c.num_heads} attention heads, got {kv!r}")
            if i >= _first_shared(c) and _donor(c, i) is None:
                raise Gguf2ovError(f"{where}: layer {i} ({c.layer_types[i]}) shares the keys and values of an "
                                   f"earlier {c.layer_types[i]} layer, and the layers before the shared ones have none")

    def tensors(self, c, i):
        p, (heads, kv, hd), h = layer_prefix(i) + "self_attn.", _geometry(c, i), c.hidden_size
        bias = c.attention_bias
        shapes = {}

        def add(name, out, inp):
            shapes[p + name + ".weight"] = (out, inp)
            if bias:
                shapes[p + name + ".bias"] = (out,)

        add("q_proj", heads * hd, h)
        shapes[p + "q_norm.weight"] = (hd,)
        if _donor(c, i) is None:
            add("k_proj", kv * hd, h)
            if not _k_as_v(c, i):
                add("v_proj", kv * hd, h)
            shapes[p + "k_norm.weight"] = (hd,)
        add("o_proj", h, heads * hd)
        return shapes

    def names(self, options):
        always = {f"self_attn.{n}.weight": True for n in ("q_proj", "q_norm", "o_proj")}
        # a shared layer has no k; a global layer with attention_k_eq_v no v; biases as the config says
        return always | {f"self_attn.{n}.weight": False for n in ("k_proj", "k_norm", "v_proj")} | \
            {f"self_attn.{n}_proj.bias": False for n in "qkvo"}

    def build(self, g, x, i):
        c = g.config
        p = layer_prefix(i) + "self_attn."
        geometry, layer_type, bias = _geometry(c, i), c.layer_types[i], c.attention_bias
        q = g.norm(project(g, x, p + "q_proj", geometry.count, geometry.size, bias), p + "q_norm.weight", p + "q_norm")
        donor = _donor(c, i)
        if donor is None:
            k = project(g, x, p + "k_proj", geometry.kv, geometry.size, bias)
            v = k if _k_as_v(c, i) else project(g, x, p + "v_proj", geometry.kv, geometry.size, bias)
            k = g.norm(k, p + "k_norm.weight", p + "k_norm")
            v = rms_norm(v, np.ones(geometry.size, np.float32), c.rms_norm_eps, p + "v_norm")
            q, k = rotate(g, heads_first(q), heads_first(k), layer_type, geometry.size)
            keys, values = cached_kv(g, k, heads_first(v), _state(i, "key"), _state(i, "value"), geometry)
            g.shared[("kv", i)] = keys, values  # for the shared layers that read this one's
        else:
            q, _ = rotate(g, heads_first(q), None, layer_type, geometry.size)
            keys, values = g.shared[("kv", donor)]
        attn = attend_cached(g, q, keys, values, p, _window(c, i), geometry, scale=1.0)
        return linear(attn, g.weight(p + "o_proj.weight"), p + "o_proj", g.bias(p + "o_proj.bias", bias))

    def states(self, c, i):
        return [] if _donor(c, i) is not None else [_state(i, "key"), _state(i, "value")]

    def probe(self, c, layers, width):
        """The probe shares keys and values over the probed layers that share them in the target, not over
        the target's count: they come last (the shared layers are the target's last), and each reads the
        last probed layer of its type before them, of which there is one (the first layer of each type is
        probed, and a shared layer's type has a layer of its own)."""
        return {"num_kv_shared_layers": sum(_donor(c, i) is not None for i in layers)}

    def paged(self, c, i):
        """One paged attention per layer with the layer's key/value heads, head size and window (0: full);
        a shared layer's reads the key/value cache of the layer it shares (`cache`: that layer)."""
        geometry, donor = _geometry(c, i), _donor(c, i)
        return [{"op": PAGED_ATTENTION, "heads": [geometry.kv, geometry.size], "window": _window(c, i) or 0,
                 "layer": i, "cache": i if donor is None else donor}]
